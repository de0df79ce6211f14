// Private: the passes of an EAGLE-2 tree build (eagle3/draft_tree.h), shared by BuildDraftTree and
// CpuBackend's batched TreeBuildStep / TreeBuildFinalize (src/cpu/cpu_backend_tree.cc), so that
// candidate indices, ties and scoring are written once. The build's state is a CandidateStore over
// storage the caller owns (BuildDraftTree's vectors, or one sequence's slice of a Backend
// workspace): plain data, so that it can live in a byte buffer between calls.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "eagle3/draft_tree.h"

namespace eagle3::draft_tree_internal {

// Candidates a build holds after its last pass: the root, k at step 0, k² per later step.
int64_t MaxCandidates(int topk, int num_steps);

// Candidates before draft pass `step`: 1 at step 0, then 1 + k + (step - 1) k².
int64_t CandidatesBefore(int topk, int step);

// One build's candidates and frontier.
struct CandidateStore {
  DraftCandidate* candidates;  // [MaxCandidates]: candidate 0 is the root
  double* scores;              // [MaxCandidates]: exact cumulative scores (candidates[i].score is
                               // their float copy, what the draft callback sees)
  int32_t* frontier;           // [topk]: the next pass's frontier, best first (the root at step 0)
  int64_t* count;              // candidates so far
};

// Why a pass cannot rank a logits row: the kinds of a Backend tree-build error record
// (eagle3/backend.h kTreeBuildErrorWidth; eagle3::cuda::TreeBuildErrorKind).
enum class RowProblem : int64_t { kNone = 0, kNaN = 1, kPosInf = 2, kNoFiniteLogit = 3 };

struct RowError {
  RowProblem kind = RowProblem::kNone;
  int64_t row = 0;        // frontier row of the pass
  int64_t draft_id = -1;  // the lowest NaN / +inf id; -1 for kNoFiniteLogit
};

// Candidate 0 = the root (root_token, score 0) and nothing else; the first frontier is the root.
void StartBuild(int64_t root_token, const CandidateStore& store);

// Draft pass `step` (params validated; passes in order from 0). Row r of `logits` (row stride ld,
// `vocab` columns; 1 row at step 0, else topk) holds the draft's logits after store.frontier[r].
// Appends each row's top-k children (log-softmax in double, ties to the lower draft id, cumulative
// scores, token = draft id + d2t[draft id], or the draft id when d2t is empty), then, when
// step + 1 < num_steps, sets the next frontier: the pass's best k candidates (higher score, then
// lower candidate index). The first row holding NaN / +inf or nothing finite is returned; the
// frontier is then unchanged but the candidates are not (the build cannot go on).
RowError ExpandPass(const DraftTreeParams& params, int step, const float* logits, int64_t ld,
                    int64_t vocab, std::span<const int64_t> d2t, const CandidateStore& store);

// The final pick after the last pass: the best num_draft_tokens - 1 candidates (higher score, then
// lower candidate index) in candidate order, so parents precede children; node 0 is the root with
// root_token; scores are the candidates' float scores.
absl::StatusOr<DraftTree> PickTree(const CandidateStore& store, int64_t root_token,
                                   int num_draft_tokens);

}  // namespace eagle3::draft_tree_internal
