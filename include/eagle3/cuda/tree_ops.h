// Launchers for EAGLE-2 draft-tree construction on the device: a batch of sequences builds its
// trees step by step on the engine's own buffers. Semantics (candidate indices, ties, double
// scoring, the final pick) are eagle3::BuildDraftTree's (eagle3/draft_tree.h): for the same logits
// the device builds the same trees. Raw pointers, stream last, cudaError_t out; no allocation and no
// host synchronization; callable from any C++ compiler (no nvcc needed to include this header).
//
// Use, per decode step (B sequences, k = topk, S = num_steps, N = num_draft_tokens):
//   for s in [0, S): the engine runs its draft model on the current frontier (s = 0: the root of
//     each sequence, 1 row; s >= 1: the k rows written by step s - 1, in that order) and calls
//     LaunchTreeBuildStep(s) on the logits [B * F, V] (F = 1 at s = 0, else k; row b * F + f);
//     for s + 1 < S the step writes the next frontier (TreeFrontier) for the next draft pass;
//   then LaunchTreeBuildFinalize writes the trees [B, N] (tokens, parents, depths, positions,
//     scores, dense mask): exactly the DraftTree BuildDraftTree returns for the same logits.
// The candidate store lives in the workspace between the calls; every call of one build must use
// the same TreeBuildParams.
//
// Work per step: one read of every logit. Rows x splits blocks (a row is split over up to
// kTreeMaxSplits blocks when B * F is small) each keep, in one pass over their slice, a running max
// and Σ exp(x - max) in double (double exp), the lowest NaN / +inf id, and the slice's top-k; the
// last block of a sequence to finish (an atomic counter) combines its partials: per row the
// normalizer lse = M + log(Σ_s sum_s · exp(max_s - M)) over the splits in order, the row's top-k, the
// k·F cumulative scores, and the next frontier (top-k by score). Finalize: one block per sequence.
//
// Arithmetic and where it can differ from the CPU reference: the reference sums exp(x - max)
// sequentially over the row; here each split sums its slice in its own order and the splits are
// combined by rescaling, so lse can differ from the reference's in the last bits (relative ~1e-15).
// Within a row this changes nothing (all candidates of a row share lse: ranking by score is ranking
// by logit, ties by draft id, exactly). Across rows (the frontier and the final pick) two candidates
// whose reference scores differ by less than ~1e-14 may swap ranks; equal scores from rows whose
// logits are bit-identical stay tied (the device sum is deterministic: the same row gives the same
// lse) and break to the lower candidate index as in the reference. Scores match within ~1e-15
// relative (double) before their rounding to float.
//
// Errors are data, never a host sync: each sequence has a TreeBuildError; step 0 initializes it,
// a sequence in error is skipped by the later steps and by finalize, and writes nothing else once in
// error. Checked in the reference's order: rows in order; in a row, the lowest draft id holding NaN
// or +inf, else the row is all -inf. d2t is not checked on the device (validate it once on the host,
// as BuildDraftTree does: target = draft + d2t[draft] >= 0).
//
// programmatic: the kernel is launched as a programmatic dependent of the kernel before it on
// `stream` (programmatic dependent launch, sm_90 and later; CudaBackendOptions::programmatic_launch):
// its launch overlaps the end of that kernel, and it waits for the earlier work before it touches
// memory, so the trees are the same either way.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "eagle3/export.h"

namespace eagle3::cuda {

// Largest topk: the merges hold a list of up to 16 keys of 64 bits per lane in registers, a step
// keeps k² <= 256 candidates per sequence (one per thread of the combining block), and EAGLE-2 /
// SGLang configurations use topk <= 10.
inline constexpr int kTreeMaxTopk = 16;
inline constexpr int kTreeMaxSteps = 16;     // draft passes (the candidate store grows as S · k²)
inline constexpr int kTreeMaxNodes = 256;    // num_draft_tokens, the root included (as kVerifyMaxNodes)
inline constexpr int64_t kTreeMaxVocab = int64_t{1} << 24;  // draft vocabulary
inline constexpr int kTreeMaxSplits = 32;    // blocks sharing one logits row
// Sequences per build: the workspace starts with one counter per possible sequence, so that a
// buffer zeroed once keeps its (self-resetting) counters in place for builds of any shape.
inline constexpr int32_t kTreeMaxBatch = 4096;

// What went wrong in one sequence (TreeBuildError::kind).
enum class TreeBuildErrorKind : int64_t {
  kNone = 0,
  kNaN = 1,            // logits row `row` of step `step` holds NaN at `draft_id` (the lowest bad id)
  kPosInf = 2,         // ... holds +inf at `draft_id` (the lowest bad id)
  kNoFiniteLogit = 3,  // ... is all -inf (draft_id = -1)
};

// One sequence's error record: four int64 values.
struct TreeBuildError {
  int64_t kind;      // a TreeBuildErrorKind
  int64_t step;      // draft pass
  int64_t row;       // frontier row within the sequence (0 at step 0)
  int64_t draft_id;  // draft vocabulary id (see TreeBuildErrorKind)
};

// The shape of a build, shared by every call of it.
struct TreeBuildParams {
  int32_t batch = 0;             // sequences, in [0, kTreeMaxBatch]
  int32_t topk = 4;              // in [1, min(kTreeMaxTopk, vocab)]
  int32_t num_steps = 3;         // in [1, kTreeMaxSteps]
  int32_t num_draft_tokens = 8;  // in [2, min(kTreeMaxNodes, 1 + topk + (num_steps - 1) · topk²)]
  int64_t vocab = 0;             // draft vocabulary, in [1, kTreeMaxVocab]
  // Scratch: TreeBuildWorkspaceBytes(batch, topk, num_steps) bytes, device, 16-byte aligned,
  // zero-filled once before its first use (it holds counters that every launch leaves at zero, so
  // the same buffer serves every later build whose workspace size it covers).
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  TreeBuildError* errors = nullptr;  // [batch], device: written by step 0, read by the later calls
};

// Scratch bytes for a build of `batch` sequences; 0 when an argument is out of the ranges above.
// Non-decreasing in each argument.
EAGLE3_API size_t TreeBuildWorkspaceBytes(int32_t batch, int32_t topk, int32_t num_steps);

// The next frontier, written by step s when s + 1 < num_steps: for sequence b, rows [b * k, (b + 1) * k)
// in decreasing score (ties: lower candidate index), the rows of the next step's logits. Every
// pointer may be null (that output is not written).
struct TreeFrontier {
  int32_t* candidates = nullptr;   // [batch, topk], i32, device: candidate index (draft_tree.h)
  int64_t* draft_ids = nullptr;    // [batch, topk], i64, device: draft vocabulary id
  int64_t* tokens = nullptr;       // [batch, topk], i64, device: target id, draft id + d2t[draft id]
  int32_t* parents = nullptr;      // [batch, topk], i32, device: parent candidate index (0 = root)
  int32_t* parent_rows = nullptr;  // [batch, topk], i32, device: the parent's row in this step's
                                   // logits (local to the sequence: 0 at step 0, else in [0, topk))
  int32_t* depths = nullptr;       // [batch, topk], i32, device: step + 1
  float* scores = nullptr;         // [batch, topk], f32, device: cumulative log-probability
  int32_t* parent_global_rows = nullptr;  // [batch, topk], i32, device: the parent's row in this
                                          // step's logits, b * F + parent_rows (a row gather's index)
};

// Draft pass `step` (0 <= step < num_steps, in order, once each).
//   logits: [batch * F, ld] f32, device, unit stride along V, ld >= vocab; F = 1 at step 0, else topk;
//           row b * F + f = the draft's logits after frontier row f of sequence b
//   d2t:    [vocab] i64 offsets, device, or null for the identity
// cudaErrorInvalidValue for a parameter outside the ranges above, a null logits / workspace / errors,
// a small or misaligned workspace (checked on the host; nothing launched).
EAGLE3_API cudaError_t LaunchTreeBuildStep(const TreeBuildParams& params, int32_t step, const float* logits, int64_t ld,
                                           const int64_t* d2t, const TreeFrontier& frontier, bool programmatic,
                                           cudaStream_t stream);

// The trees, after the last step: node 0 is the root, nodes in candidate order (parents first).
struct TreeBuildOutputs {
  const int64_t* root_tokens = nullptr;     // [batch], i64, device: tokens[b][0]
  const int64_t* root_positions = nullptr;  // [batch], i64, device: RoPE position of the root
  int64_t* tokens = nullptr;     // [batch, N], i64, device (N = num_draft_tokens)
  int32_t* parents = nullptr;    // [batch, N], i32, device: node index, -1 for the root
  int32_t* depths = nullptr;     // [batch, N], i32, device, or null (not written)
  int64_t* positions = nullptr;  // [batch, N], i64, device: root position + depth
  float* scores = nullptr;       // [batch, N], f32, device: 0 for the root; or null (not written)
  uint8_t* mask = nullptr;       // [batch, N, N], u8, device: mask[i][j] = 1 iff j is i or an ancestor
};

// The final pick: the best N - 1 candidates over all steps (ties: lower candidate index), sorted by
// candidate index, the root prepended. Sequences in error write nothing. cudaErrorInvalidValue as
// for LaunchTreeBuildStep, or for a null pointer in `outputs` other than depths and scores.
EAGLE3_API cudaError_t LaunchTreeBuildFinalize(const TreeBuildParams& params, const TreeBuildOutputs& outputs,
                                               bool programmatic, cudaStream_t stream);

}  // namespace eagle3::cuda
