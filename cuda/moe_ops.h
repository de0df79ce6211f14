// Launchers for DeepSeek MoE routing and routed experts on the device (the kernels behind
// CudaBackend::MoeRoute / MoeExperts; semantics in eagle3/backend.h). Raw pointers, stream last,
// cudaError_t out; no allocation; callable from any C++ compiler (no nvcc needed to include this
// header). fp32 math throughout; routed expert weights may be stored f32 or bf16. Row strides are
// in elements.
//
// Bad data (a non-finite logit or bias, an expert id out of range) does not fail the launch: the
// kernel leaves that token's output row unwritten and records error_code | index in *error_flag
// (the device error flag protocol of cuda/core_ops.h: one device int, 0 = no error; the
// first op to fail is kept, within it the lowest index); the host reads it later
// (CudaBackend::Synchronize).
//
// programmatic: the launcher's kernels are launched as programmatic dependents of the kernel before
// them on `stream` (programmatic_launch.cuh; CudaBackendOptions::programmatic_launch): each waits
// for the earlier kernels before it touches memory, so results are the same either way.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace eagle3::cuda {

// The routing rule, resolved from MoeRoutingParams by the caller.
struct MoeRouteLaunchParams {
  int top_k = 1;            // 1 <= top_k <= experts kept after the group limit
  int n_group = 1;          // experts form n_group groups of experts / n_group consecutive ids
  int topk_group = 1;       // groups kept, 1 <= topk_group <= n_group (== n_group: no group limit)
  bool sigmoid = false;     // scores = sigmoid(logits) (V3/K2), else softmax over the row (V2)
  bool group_top2 = false;  // group score = sum of its two best biased scores (noaux_tc), else max
  bool normalize = false;   // divide the chosen scores by their sum + 1e-20
  float scale = 1.0f;       // then multiply by this (1 where the method does not scale)
  // Tests only: route with the one-warp-per-row kernel at any expert count (see LaunchMoeRoute),
  // to hold the two kernels to the same outputs.
  bool warp_per_row = false;
};

// Largest expert count LaunchMoeRoute takes (per-row working set in shared memory).
inline constexpr int64_t kMoeRouteMaxExperts = 4096;
// Largest expert count LaunchMoeRoute routes with one thread block per row (one thread per expert).
inline constexpr int64_t kMoeRouteMaxBlockExperts = 1024;

// Per token row t: selection score c[e] = score[e] + correction_bias[e] (bias only when given);
// with topk_group < n_group, keep the topk_group groups of highest group score and exclude the
// other groups' experts; take the top_k remaining experts by c, descending, ties to the lower id
// (groups likewise); weights = their scores (unbiased), normalized and scaled as params say.
// logits:          [tokens, experts], f32, row stride logits_stride, device
// correction_bias: [experts], f32, device; nullptr for none
// ids:             [tokens, top_k], i32, row stride ids_stride, device (written)
// weights:         [tokens, top_k], f32, row stride weights_stride, device (written)
// error_flag:      [1], i32, device; a row with a non-finite logit records error_code | row; a
//                  non-finite bias leaves every row unwritten and records bias_error_code | the
//                  lowest such expert (when both happen, either may be the one kept)
// 1 <= experts <= kMoeRouteMaxExperts; n_group divides experts; group_top2 needs >= 2 per group.
// Two kernels, the same outputs: up to kMoeRouteMaxBlockExperts experts, one thread block per row
// with a thread per expert (block-wide reductions: the latency of a decode step's few rows);
// above, one warp per row, each lane scanning experts / 32 of them. Both give the same bits: the
// same float operations in the same order where the order matters (the softmax's fp64 sum, the
// sum of the chosen scores in slot order).
cudaError_t LaunchMoeRoute(const float* logits, int64_t logits_stride, const float* correction_bias,
                           int64_t tokens, int64_t experts, const MoeRouteLaunchParams& params,
                           int32_t* ids, int64_t ids_stride, float* weights, int64_t weights_stride,
                           int* error_flag, int error_code, int bias_error_code,
                           bool programmatic, cudaStream_t stream);

// How every routed expert's weights are stored (one type for all experts of a call).
enum class MoeWeightType : int {
  kF32 = 0,   // float
  kBF16 = 1,  // bf16 bit patterns (uint16_t), widened exactly to f32 as they are read
};

// One routed expert's weights, as the device-side pointer table holds them (elements of the
// call's MoeWeightType).
struct MoeExpertPointers {
  const void* gate_up = nullptr;  // [2 * inter, hidden], row stride gate_up_stride, device
  const void* down = nullptr;     // [hidden, inter], row stride down_stride, device
  int64_t gate_up_stride = 0;
  int64_t down_stride = 0;
  // ExpertWeights::bf16_activations: x and the activation rounded to bf16 before their products
  // (the per-pair kernels only: CudaBackend runs calls with such experts there).
  int32_t bf16_activations = 0;
};

// out[t] = (accumulate ? out[t] : 0) + sum_j weights[t, j] * down_e(silu(gate_e x[t]) * up_e x[t]),
// e = ids[t, j], summed in order j = 0, 1, ... (no atomics: bitwise reproducible). Two kernels: a
// batched GEMV per (token, slot) into act, then one per (token, block of 8 output rows), whose
// warps stream the 8 rows of one slot's expert at a time. Only the
// selected experts' weights are read (a decode-time design: each (token, slot) reads its expert's
// weights again). A token t with an id outside [0, num_experts) records error_code | t and its out
// row is left as it was. With bf16 weights, x and act stay f32 (only the weights are bf16), and
// rows are read 8 weights (16 bytes) at a time where pointers are 16-byte aligned and the row
// length a multiple of 8.
// x:        [tokens, hidden], f32, row stride x_stride, device
// ids:      [tokens, top_k], i32, row stride ids_stride, device
// weights:  [tokens, top_k], f32, row stride weights_stride, device
// experts:  [num_experts], device table of device pointers to weights of type weight_type
// act:      [tokens, top_k, inter], f32, contiguous, device scratch (overwritten)
// out:      [tokens, hidden], f32, row stride out_stride, device; no overlap with the inputs
// error_flag: [1], i32, device
// hidden and inter <= 8 * 65535 (grid rows); inter may be 0; top_k <= kMoeExpertsMaxSlots (the
// slots' dots of a row block wait in 48 KiB of shared memory).
inline constexpr int64_t kMoeExpertsMaxSlots = 1536;
cudaError_t LaunchMoeExperts(const float* x, int64_t x_stride, const int32_t* ids,
                             int64_t ids_stride, const float* weights, int64_t weights_stride,
                             const MoeExpertPointers* experts, MoeWeightType weight_type,
                             int64_t num_experts, int64_t tokens, int64_t top_k, int64_t hidden,
                             int64_t inter, float* act, float* out, int64_t out_stride,
                             bool accumulate, int* error_flag, int error_code, bool programmatic,
                             cudaStream_t stream);

// ---- Grouped routed experts (many tokens: verify trees, prefill) ------------------------------
//
// The same op as LaunchMoeExperts, with the same results up to fp32 summation order and the same
// error semantics, but each selected expert's weights are read once per tile of up to
// kMoeGroupedTileRows of its (token, slot) pairs instead of once per pair:
//  1. on the device (no host sync), the pairs are grouped by expert (counting sort into
//     expert-major order; pairs with a bad id are left out and the token recorded in the error
//     flag);
//  2. act = silu(x W_gate^T) * (x W_up^T) per expert tile of pairs, then y = act W_down^T per pair,
//     on tensor cores (mma.sync m16n8k16 bf16, fp32 accumulation). x and act stay f32: each value
//     is split exactly into three bf16 parts (hi + mid + lo = the f32 value) and every part is
//     multiplied (3 MMAs; f32 weights are split likewise and the 6 products above 2^-24 taken), so
//     the products are those of fp32 math; each 16-wide k step's tensor-core sum starts from zero
//     and is then added into an f32 register accumulator (the tensor core's truncating internal
//     accumulation never runs over more than 3 or 6 MMAs);
//  3. out[t] = (accumulate ? out[t] : 0) + sum_j weights[t, j] * y[t, j], j = 0, 1, ... in order,
//     per token (deterministic, no atomics on out; a token with a bad id keeps its row).
// Tokens are processed in chunks of workspace.max_pairs / top_k (one round of 4 kernels each).

// Rows (pairs) of one expert tile; the tile list holds at most
// MoeGroupedMaxTiles(max_pairs, num_experts) entries.
inline constexpr int64_t kMoeGroupedTileRows = 64;
// Largest expert count the grouping kernel takes (its per-expert counters live in shared memory).
inline constexpr int64_t kMoeGroupedMaxExperts = 4096;

inline constexpr int64_t MoeGroupedMaxTiles(int64_t max_pairs, int64_t num_experts) {
  return max_pairs / kMoeGroupedTileRows + (num_experts < max_pairs ? num_experts : max_pairs) + 1;
}

// Device scratch of the grouped path for chunks of up to max_pairs pairs (contents are scratch,
// overwritten by every call).
struct MoeGroupedWorkspace {
  int32_t* pairs = nullptr;      // [max_pairs]: chunk-local pair index t * top_k + j, expert-major
  int32_t* tiles = nullptr;      // [MoeGroupedMaxTiles(max_pairs, max_experts), 3]: expert, first
                                 // sorted pair, pair count
  int32_t* num_tiles = nullptr;  // [1]
  float* partial = nullptr;      // [max_pairs, hidden]: y per pair, chunk-local pair order
  int64_t max_pairs = 0;         // >= top_k
  int64_t max_experts = 0;       // the tile list's sizing; >= num_experts
  int64_t hidden = 0;            // partial's row length; >= the call's hidden
};

// Bytes of one buffer holding the workspace above (MoeGroupedWorkspaceAt carves it).
inline size_t MoeGroupedWorkspaceBytes(int64_t max_pairs, int64_t max_experts, int64_t hidden) {
  const auto round = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  return round(static_cast<size_t>(max_pairs) * 4) +
         round(static_cast<size_t>(MoeGroupedMaxTiles(max_pairs, max_experts)) * 12 + 4) +
         round(static_cast<size_t>(max_pairs * hidden) * 4);
}
inline MoeGroupedWorkspace MoeGroupedWorkspaceAt(void* buffer, int64_t max_pairs,
                                                 int64_t max_experts, int64_t hidden) {
  const auto round = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  char* at = static_cast<char*>(buffer);  // 256-byte aligned
  MoeGroupedWorkspace w;
  w.pairs = reinterpret_cast<int32_t*>(at);
  at += round(static_cast<size_t>(max_pairs) * 4);
  const int64_t tiles = MoeGroupedMaxTiles(max_pairs, max_experts);
  w.tiles = reinterpret_cast<int32_t*>(at);
  w.num_tiles = w.tiles + 3 * tiles;
  at += round(static_cast<size_t>(tiles) * 12 + 4);
  w.partial = reinterpret_cast<float*>(at);
  w.max_pairs = max_pairs;
  w.max_experts = max_experts;
  w.hidden = hidden;
  return w;
}

// Whether the grouped path should run a call (and can: 1 <= num_experts <= kMoeGroupedMaxExperts,
// top_k, hidden and inter >= 1): from tokens * top_k >= 2 E pairs and min_tokens on
// (CudaBackendOptions::moe_grouped_min_tokens). Per-pair reads tokens * top_k expert weight sets
// (repeats mostly from L2), grouped the distinct experts touched (about E (1 - exp(-pairs / E)) of
// them), but pays a grouping round and tile padding. Both bounds are where the measurements put
// the switch (benchmarks/NOTES.md, "grouped path"): below 2 E pairs the narrow TP 8 ranks' experts
// favour per-pair, and wide experts (V2-Lite at TP 1, whose per-pair rows fill the GPU) keep
// per-pair ahead for some tokens past 2 E pairs.
inline bool MoeExpertsUseGrouped(int64_t tokens, int64_t top_k, int64_t num_experts,
                                 int64_t hidden, int64_t inter, int64_t min_tokens) {
  if (top_k < 1 || hidden < 1 || inter < 1 || num_experts < 1 ||
      num_experts > kMoeGroupedMaxExperts) {
    return false;
  }
  return tokens >= min_tokens && tokens * top_k >= 2 * num_experts;
}

// The op of LaunchMoeExperts on the grouped path (any token count; MoeExpertsUseGrouped says when
// it pays). Shapes, strides and error semantics as for LaunchMoeExperts, and:
// act:       [min(tokens, max_pairs / top_k) * top_k, inter], f32, device scratch (overwritten)
// workspace: device scratch as above, with max_pairs >= top_k, max_experts >= num_experts,
//            hidden >= hidden
// 1 <= top_k, hidden, inter; 1 <= num_experts <= kMoeGroupedMaxExperts (cudaErrorInvalidValue
// otherwise: the per-pair launcher covers the rest).
cudaError_t LaunchMoeExpertsGrouped(const float* x, int64_t x_stride, const int32_t* ids,
                                    int64_t ids_stride, const float* weights,
                                    int64_t weights_stride, const MoeExpertPointers* experts,
                                    MoeWeightType weight_type, int64_t num_experts, int64_t tokens,
                                    int64_t top_k, int64_t hidden, int64_t inter, float* act,
                                    const MoeGroupedWorkspace& workspace, float* out,
                                    int64_t out_stride, bool accumulate, int* error_flag,
                                    int error_code, bool programmatic, cudaStream_t stream);

}  // namespace eagle3::cuda
