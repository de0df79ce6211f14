// Launcher for tree verification on the device (greedy and lossless stochastic), the kernels behind
// eagle3::cuda::DeviceTreeVerifier. Semantics, coins included, are eagle3::TreeVerifier's
// (eagle3/tree_verifier.h). Raw pointers, stream last, cudaError_t out; no allocation and no host
// synchronization (a decode step continues on the device with the outputs); callable from any C++
// compiler (no nvcc needed to include this header).
//
// A batch of trees is flattened: sequence b owns the global rows [row_offsets[b], row_offsets[b + 1])
// of the logits and of the per-node arrays; its local node i is global row row_offsets[b] + i.
//
// Work: one read of every logit row (per row: max, argmax with ties to the lowest id, NaN / +inf
// check, and for sampling the sum of exp((z - max) / T)), split over several blocks per row when the
// rows are few; then one block per sequence walks its tree. Sampling additionally reads the rows it
// visits: the final token (correction or bonus) is sampled over one row, a rejection after the first
// child re-sums the residual mass over the row, and top-k / top-p find the kept set of a visited row
// by radix search over its keys (a few passes over that row, which is then L2-resident).
//
// Arithmetic and where it can differ from the double-precision CPU reference: every weight is
// w(z) = expf((z - max) * (1 / T)) in float; the row pass adds the weights of one 16-byte load (8
// bf16 or 4 f32 logits) in float and those partial sums in double; the accept test is
// u < w(x) / m in double, with m the residual mass (the row total before any rejection at a node,
// else the row re-summed without the children's tokens plus the untried children). The emitted
// tokens can differ from the reference only when a coin lies within ~1e-6 of its threshold, or when
// the top-p cumulative mass at the cut lies within ~1e-6 (relative) of top_p. The last remaining
// token of a residual is accepted with probability exactly 1, as in the reference.
//
// Errors are data, never a host sync: each sequence gets a VerifyError (below); a failing sequence
// has num_accepted = -1 and writes nothing else. Checked in the reference's order: the tree
// structure as far as the walk needs it, then drafted tokens in [0, V) by node, then the logit rows
// by row (the lowest bad token id of the row).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace eagle3::cuda {

// Largest tree (nodes, root included) and vocabulary the launcher accepts.
inline constexpr int kVerifyMaxNodes = 256;
inline constexpr int64_t kVerifyMaxVocab = int64_t{1} << 20;

enum class VerifyLogitsType : int { kF32 = 0, kBf16 = 1 };

// What went wrong in one sequence (VerifyError::kind).
enum class VerifyErrorKind : int64_t {
  kNone = 0,
  kBadTree = 1,          // node `row`: a first_child / next_sibling entry the walk cannot follow
                         // (a child must have a larger id than its parent, a sibling id in [1, N)),
                         // or N outside [1, max_nodes] (row = -1, token = N)
  kTokenOutOfRange = 2,  // node `row` has token `token` outside [0, V)
  kNaN = 3,              // logits row `row` holds NaN at token id `token` (the lowest bad id)
  kPosInf = 4,           // logits row `row` holds +inf at token id `token` (the lowest bad id)
  kNoFiniteLogit = 5,    // logits row `row` is all -inf
};

// One sequence's error record: three int64 values.
struct VerifyError {
  int64_t kind;   // a VerifyErrorKind
  int64_t row;    // local node / row id within the sequence
  int64_t token;  // token id (see VerifyErrorKind)
};

struct TreeVerifyLaunchParams {
  int32_t batch = 0;  // sequences, >= 0
  // Trees, flattened (see the top of this file). Every tree must be a valid DraftTree (checked on
  // the host by DeviceTreeVerifier; the device checks only what keeps the walk in bounds).
  const int32_t* row_offsets = nullptr;   // [batch + 1], i32, device; row_offsets[0] = 0, increasing
  int64_t total_rows = 0;                 // host copy of row_offsets[batch], <= 2^31 / 64
  int32_t max_nodes = 0;                  // host: >= every N_b, in [1, kVerifyMaxNodes]
  const int64_t* tokens = nullptr;        // [total_rows], i64, device: node tokens (the root's unused)
  const int32_t* first_child = nullptr;   // [total_rows], i32, device: local node id, -1 for a leaf
  const int32_t* next_sibling = nullptr;  // [total_rows], i32, device: local node id, -1 for the last
  // Target logits: row r = the target's logits after global node r.
  const void* logits = nullptr;  // [total_rows, vocab], f32 or bf16 (bit patterns), row stride
                                 // `ld` elements, unit stride along V, device
  VerifyLogitsType logits_type = VerifyLogitsType::kF32;
  int64_t ld = 0;     // >= vocab
  int64_t vocab = 0;  // in [1, kVerifyMaxVocab]
  // Sampling (eagle3::SamplingParams): temperature 0 = greedy; else finite > 0 with top_k >= 0 (0 or
  // >= V: off) and top_p in (0, 1] (1: off).
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;    // Philox key; sequence b draws from stream b
  uint64_t offset = 0;  // Philox counter base
  // Optional [2] u64, device: {seed, offset}. When set, the kernels read the Philox key and counter
  // base from it (seed and offset above are ignored), so a launch captured in a CUDA graph draws
  // the coins of whatever the buffer holds at each replay.
  const uint64_t* seed_offset = nullptr;
  // Scratch: TreeVerifyWorkspaceBytes(total_rows, vocab) bytes, device, 16-byte aligned.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Outputs, device.
  int32_t* num_accepted = nullptr;    // [batch], i32: accepted drafted nodes, -1 on error
  int32_t* accepted_nodes = nullptr;  // [batch, max_nodes], i32: the accepted local node ids,
                                      // root to leaf (root excluded), num_accepted entries
  int64_t* out_tokens = nullptr;      // [batch, max_nodes], i64: the accepted nodes' tokens, then
                                      // the bonus / correction token (num_accepted + 1 entries)
  VerifyError* errors = nullptr;      // [batch]: kind kNone when the sequence is fine
};

// Scratch bytes the launcher needs for `total_rows` rows of `vocab` logits; non-decreasing in both,
// so a buffer sized for the largest batch serves every smaller one.
size_t TreeVerifyWorkspaceBytes(int64_t total_rows, int64_t vocab);

// Verifies every sequence of the batch (two kernels on `stream`). cudaErrorInvalidValue for a size
// or pointer outside what the parameters above document (checked on the host; nothing launched).
// programmatic: the kernels are launched as programmatic dependents (programmatic_launch.cuh), each
// waiting for the kernels before it before it touches memory, so results are the same either way.
cudaError_t LaunchTreeVerify(const TreeVerifyLaunchParams& params, bool programmatic,
                             cudaStream_t stream);

}  // namespace eagle3::cuda
