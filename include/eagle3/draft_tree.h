// EAGLE-2 dynamic draft trees (docs/semantics.md, trees).
//
// Build (as SGLang's EAGLE worker and build_tree_kernel_efficient do it): step 0 takes the top-k of
// the draft distribution at the root (the last verified token); each later step expands every
// frontier node by its top-k children (cumulative score = parent score + child log-prob) and keeps
// the top-k of those k² candidates as the next frontier; finally the best num_draft_tokens - 1
// candidates over all steps are kept (a child never outscores its parent and always comes later, so
// the kept set is closed under parents) and sorted by candidate index, so that parents precede
// children.
//
// Candidate index: the root is candidate 0; step 0 appends the root's k children (candidates
// 1..k, best first); step s >= 1 appends, for the f-th frontier node (frontier in decreasing score),
// its k children best first: candidate 1 + k + (s - 1)·k² + f·k + j. This is SGLang's flattened
// score_list index plus one. Ties: a node's top-k prefers the lower draft id among equal logits;
// the frontier and the final selection prefer the lower candidate index among equal scores.
// Log-probs come from a log-softmax of the callback's f32 logits computed in double; scores are
// accumulated in double and stored as float.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/export.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

struct EAGLE3_API DraftTreeParams {
  int topk = 4;              // children per expanded node; 1 gives a chain
  int num_steps = 3;         // draft passes = maximum depth
  int num_draft_tokens = 8;  // tree nodes including the root; <= 1 + topk + (num_steps - 1) * topk²

  // InvalidArgument naming the parameter when out of range: topk in [1, draft_vocab], num_steps >= 1,
  // num_draft_tokens in [2, 1 + topk + (num_steps - 1) * topk²].
  absl::Status Validate(int64_t draft_vocab) const;
};

// A draft tree. Node 0 is the root; nodes are in topological order (parents first). Built trees
// list siblings in node order, which is also decreasing draft score; an engine's tree may order its
// sibling lists differently (verification follows the lists).
struct EAGLE3_API DraftTree {
  std::vector<int64_t> tokens;        // [N] target vocabulary ids; tokens[0] = the root token
  std::vector<int32_t> parents;       // [N] parent node, -1 for the root
  std::vector<int32_t> depths;        // [N] 0 for the root
  std::vector<int32_t> first_child;   // [N] first child in sibling order, -1 for a leaf
  std::vector<int32_t> next_sibling;  // [N] next sibling, -1 for the last
  std::vector<float> scores;          // [N] cumulative draft log-probability, 0 for the root

  int size() const { return static_cast<int>(tokens.size()); }
  // Largest depth (0 for a root-only tree); needs valid depths.
  int max_depth() const;

  // From tokens and parents (parents[0] = -1, parents[i] < i): fills depths, first_child and
  // next_sibling (siblings in node order) and zero scores; validated.
  static absl::StatusOr<DraftTree> FromParents(std::span<const int64_t> tokens,
                                               std::span<const int32_t> parents);

  // Checks the structure: N >= 1, sizes agree (scores may also be empty), node 0 is the only root,
  // parents precede children, depths match the parents, and each node's first_child/next_sibling
  // chain lists exactly its children, each once, in any order. Every failure names the node and
  // what is wrong. For trees handed in by an engine.
  absl::Status Validate() const;

  // RoPE positions of the nodes: root_position + depth.
  std::vector<int64_t> Positions(int64_t root_position) const;
  // [N * N] row-major: mask[i * N + j] = 1 iff j is i or an ancestor of i.
  std::vector<uint8_t> DenseMask() const;
  // Bit-packed rows: row i is words [i * W, (i + 1) * W) with W = ceil(N / 32); column j is bit
  // (j % 32) of word j / 32, least significant bit first (TensorRT-LLM's packed mask order).
  std::vector<uint32_t> PackedMask() const;
};

// One candidate of the build, as the draft callback sees it. candidates[0] is the root.
struct DraftCandidate {
  int64_t token = 0;     // target vocabulary id
  int64_t draft_id = -1; // draft vocabulary id (-1 for the root)
  int32_t parent = -1;   // candidate index
  int32_t depth = 0;
  float score = 0.0f;    // cumulative log-probability
};

// Runs the draft on candidates[frontier[i]] (all at the same depth; their ancestors are earlier
// candidates) and writes its logits over the draft vocabulary to row i of `logits`.
//   logits: [frontier.size(), draft_vocab], f32, host, contiguous
using DraftExpandFn = std::function<absl::Status(std::span<const DraftCandidate> candidates,
                                                 std::span<const int32_t> frontier,
                                                 const TensorView& logits)>;

// Builds the tree for one sequence, calling `expand` num_steps times (frontier sizes 1, k, k, ...).
//   d2t: [draft_vocab] offsets, target = draft + d2t[draft], or empty for the identity; a target id
//        below 0 is InvalidArgument (the upper bound, the target vocabulary, is the caller's check).
// Logits that are NaN or +inf, or a row with no finite logit, are InvalidArgument naming the step,
// the row and the draft id; -inf is a masked token. Errors from `expand` are returned unchanged.
EAGLE3_API absl::StatusOr<DraftTree> BuildDraftTree(int64_t root_token, const DraftTreeParams& params,
                                                    int64_t draft_vocab, std::span<const int64_t> d2t,
                                                    const DraftExpandFn& expand);

}  // namespace eagle3
