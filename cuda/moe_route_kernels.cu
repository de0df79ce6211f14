// MoE routing kernels (LaunchMoeRoute, cuda/moe_ops.h): a warp per token row, or a block per row
// for many experts. No abseil here: nvcc must never see it.
#include <climits>
#include <cstdint>
#include <limits>

#include "core_kernels.cuh"
#include "moe_ops.h"
#include "programmatic_launch.cuh"

namespace eagle3::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpSize = 32;
// Marks an expert (or group) that can no longer be chosen; finite scores always beat it.
constexpr float kExcluded = -std::numeric_limits<float>::infinity();

// ---- Warp helpers ---------------------------------------------------------------------------

// (WarpSum / WarpMax for floats and RecordDeviceError come from core_kernels.cuh.)
__device__ __forceinline__ double WarpSumF64(double value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(kFullMask, value, offset);
  }
  return value;
}

// Index of the largest of v[0, n) over the warp, ties to the lowest index; every lane gets it.
// Lane l reads only the entries i with i % 32 == l, so the lane that owns an entry may update it
// afterwards without a warp barrier. kExcluded entries never win (callers guarantee a finite one).
__device__ int WarpArgmax(const float* v, int n, int lane) {
  float best = kExcluded;
  int index = INT_MAX;
  for (int i = lane; i < n; i += kWarpSize) {
    const float x = v[i];
    if (x > best) {  // strict: the first (lowest) index wins within a lane
      best = x;
      index = i;
    }
  }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(kFullMask, best, offset);
    const int other_index = __shfl_xor_sync(kFullMask, index, offset);
    if (other > best || (other == best && other_index < index)) {
      best = other;
      index = other_index;
    }
  }
  return index;
}

// ---- Routing --------------------------------------------------------------------------------

constexpr int kRouteMaxRowsPerBlock = 4;
constexpr size_t kRouteSharedBytes = 48 << 10;  // no opt-in needed up to this

// One warp per token row; each warp's shared slice holds scores[E], choice[E], group[n_group].
// Only __syncwarp is used, so a warp past the last token may leave early.
__global__ void MoeRouteKernel(const float* __restrict__ logits, int64_t logits_stride,
                               const float* __restrict__ bias, int64_t tokens, int experts,
                               MoeRouteLaunchParams p, int32_t* __restrict__ ids,
                               int64_t ids_stride, float* __restrict__ weights,
                               int64_t weights_stride, int* error_flag, int error_code,
                               int bias_error_code) {
  PdlLaunchDependents();  // lets a weight-streaming kernel after this one start early
  PdlWait();
  extern __shared__ float shared[];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + warp;
  if (t >= tokens) return;
  float* scores = shared + warp * (2 * experts + p.n_group);
  float* choice = scores + experts;  // what selection ranks; kExcluded once taken or dropped
  float* group = choice + experts;
  const float* x = logits + t * logits_stride;

  bool finite = true;
  int bad_bias = INT_MAX;  // lowest expert with a non-finite bias
  float max = kExcluded;
  for (int e = lane; e < experts; e += kWarpSize) {
    const float v = x[e];
    finite = finite && isfinite(v);
    if (bias != nullptr && bad_bias == INT_MAX && !isfinite(bias[e])) bad_bias = e;
    max = fmaxf(max, v);
  }
  finite = __all_sync(kFullMask, finite);
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    bad_bias = min(bad_bias, __shfl_xor_sync(kFullMask, bad_bias, offset));
  }
  if (!finite || bad_bias != INT_MAX) {  // the row is left unwritten
    if (lane == 0 && !finite) RecordDeviceError(error_flag, error_code, t);
    if (lane == 0 && finite && t == 0) RecordDeviceError(error_flag, bias_error_code, bad_bias);
    return;
  }

  if (p.sigmoid) {
    for (int e = lane; e < experts; e += kWarpSize) scores[e] = 1.0f / (1.0f + expf(-x[e]));
  } else {
    // The sum in fp64: the fp32 result is then (nearly) the correctly rounded sum, whatever the
    // reduction order.
    max = WarpMax(max);
    double sum = 0.0;
    for (int e = lane; e < experts; e += kWarpSize) {
      const float ex = expf(x[e] - max);
      scores[e] = ex;
      sum += ex;
    }
    const float total = static_cast<float>(WarpSumF64(sum));
    for (int e = lane; e < experts; e += kWarpSize) scores[e] = scores[e] / total;
  }
  for (int e = lane; e < experts; e += kWarpSize) {
    choice[e] = scores[e] + (bias != nullptr ? bias[e] : 0.0f);
  }
  __syncwarp();

  if (p.topk_group < p.n_group) {
    const int per_group = experts / p.n_group;
    for (int g = lane; g < p.n_group; g += kWarpSize) {
      const float* c = choice + g * per_group;
      float first = kExcluded, second = kExcluded;
      for (int i = 0; i < per_group; ++i) {
        if (c[i] > first) {
          second = first;
          first = c[i];
        } else if (c[i] > second) {
          second = c[i];
        }
      }
      group[g] = p.group_top2 ? first + second : first;
    }
    // Take the topk_group best groups, marking each taken one kExcluded (owner lane writes, see
    // WarpArgmax); then drop every expert of a group left unmarked.
    for (int kept = 0; kept < p.topk_group; ++kept) {
      const int g = WarpArgmax(group, p.n_group, lane);
      if (lane == g % kWarpSize) group[g] = kExcluded;
    }
    __syncwarp();
    for (int e = lane; e < experts; e += kWarpSize) {
      if (group[e / per_group] != kExcluded) choice[e] = kExcluded;
    }
    __syncwarp();
  }

  int32_t* id_row = ids + t * ids_stride;
  float* weight_row = weights + t * weights_stride;
  float sum = 0.0f;  // in slot order, as the reference sums
  for (int j = 0; j < p.top_k; ++j) {
    const int e = WarpArgmax(choice, experts, lane);
    const float w = scores[e];
    sum += w;
    if (lane == e % kWarpSize) choice[e] = kExcluded;
    if (lane == j % kWarpSize) {
      id_row[j] = e;
      weight_row[j] = w;
    }
  }
  const float denominator = sum + 1e-20f;
  for (int j = lane; j < p.top_k; j += kWarpSize) {  // the lane that wrote slot j above
    float w = weight_row[j];
    if (p.normalize) w = w / denominator;
    weight_row[j] = w * p.scale;
  }
}

// ---- Routing, one block per row --------------------------------------------------------------
//
// The rule of MoeRouteKernel with one thread per expert: the serial scans of the warp kernel
// (32 experts a lane, group scores by one lane each, group and expert picks over shared memory)
// become block-wide reductions, which is what decides the latency at decode sizes, where the
// grid has only a few rows.

// Per-warp winners of one BlockArgmax round. Two buffers, alternating by round: a warp may start
// writing round r + 1 while another still reads round r, but reaches round r + 2's write only after
// round r + 1's barrier, which every warp passes after its reads of round r.
struct RouteArgmaxScratch {
  uint32_t key[2][kWarpSize];
  int index[2][kWarpSize];
  float value[2][kWarpSize];
};

// The thread holding the largest key over the block, ties to the lowest thread (threads are in
// expert or group order, so to the lower id), and that thread's `value`; every thread gets both.
// Key 0 is no candidate (OrderedKey of a non-NaN float is never 0); some thread must hold one.
// Every thread of the block calls it, with a `round` that counts up from call to call.
__device__ int BlockArgmax(uint32_t key, float value, int round, RouteArgmaxScratch& scratch,
                          float* winner_value) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  const int buffer = round & 1;
  const uint32_t warp_best = __reduce_max_sync(kFullMask, key);
  if (lane == __ffs(__ballot_sync(kFullMask, key == warp_best)) - 1) {
    scratch.key[buffer][warp] = warp_best;
    scratch.index[buffer][warp] = threadIdx.x;
    scratch.value[buffer][warp] = value;
  }
  __syncthreads();
  // Every warp reduces the warp winners itself: no second barrier to hand the result out.
  const uint32_t k = lane < warps ? scratch.key[buffer][lane] : 0u;
  const uint32_t best = __reduce_max_sync(kFullMask, k);
  const int w = __ffs(__ballot_sync(kFullMask, lane < warps && k == best)) - 1;
  *winner_value = scratch.value[buffer][w];
  return scratch.index[buffer][w];
}

// One block per token row (blockIdx.x), thread e for expert e; blockDim.x = experts rounded up to
// a multiple of 32 (<= 1024); the threads past the last expert only join the reductions. Dynamic
// shared memory: experts + n_group floats (the softmax's exponentials, then choice[experts] and
// group[n_group] for the group limit). The float operations that make the scores, group scores
// and weights are those of MoeRouteKernel, in its order wherever the order matters (the fp64 sum,
// the sum of the chosen scores), so both kernels give the same bits.
__global__ void MoeRouteBlockKernel(const float* __restrict__ logits, int64_t logits_stride,
                                    const float* __restrict__ bias, int experts,
                                    MoeRouteLaunchParams p, int32_t* __restrict__ ids,
                                    int64_t ids_stride, float* __restrict__ weights,
                                    int64_t weights_stride, int* error_flag, int error_code,
                                    int bias_error_code) {
  PdlLaunchDependents();  // lets a weight-streaming kernel after this one start early
  PdlWait();
  extern __shared__ float shared[];
  __shared__ RouteArgmaxScratch argmax;
  __shared__ float warp_max[kWarpSize];
  __shared__ float row_total;
  __shared__ int warp_bad[kWarpSize];
  const int e = threadIdx.x;
  const int lane = e % kWarpSize;
  const int warp = e / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  const int64_t t = blockIdx.x;
  const bool is_expert = e < experts;
  const float x = is_expert ? logits[t * logits_stride + e] : 0.0f;
  const float b = is_expert && bias != nullptr ? bias[e] : 0.0f;
  const bool bad_logit = !isfinite(x);
  const bool bad_bias = !isfinite(b);
  if (__syncthreads_or(bad_logit || bad_bias)) {  // the row is left unwritten
    if (__syncthreads_or(bad_logit)) {
      if (e == 0) RecordDeviceError(error_flag, error_code, t);
    } else if (t == 0) {  // every block sees a bad bias; token 0's reports its lowest expert
      const int lowest = __reduce_min_sync(kFullMask, bad_bias ? e : INT_MAX);
      if (lane == 0) warp_bad[warp] = lowest;
      __syncthreads();
      if (e == 0) {
        int bad = INT_MAX;
        for (int w = 0; w < warps; ++w) bad = min(bad, warp_bad[w]);
        RecordDeviceError(error_flag, bias_error_code, bad);
      }
    }
    return;
  }

  float score;
  if (p.sigmoid) {
    score = 1.0f / (1.0f + expf(-x));
  } else {
    // As MoeRouteKernel: the max, then the sum of the exponentials in fp64.
    const float row_max = WarpMax(is_expert ? x : kExcluded);
    if (lane == 0) warp_max[warp] = row_max;
    __syncthreads();
    const float max = WarpMax(lane < warps ? warp_max[lane] : kExcluded);
    const float ex = is_expert ? expf(x - max) : 0.0f;
    // Summed by warp 0 in MoeRouteKernel's order (lane l adds experts l, l + 32, ... in turn, then
    // the warp's butterfly), so that both kernels divide by the same total.
    float* exps = shared;  // reused as choice below, after the barrier that publishes the total
    if (is_expert) exps[e] = ex;
    __syncthreads();
    if (warp == 0) {
      double sum = 0.0;
      for (int i = lane; i < experts; i += kWarpSize) sum += exps[i];
      sum = WarpSumF64(sum);
      if (lane == 0) row_total = static_cast<float>(sum);
    }
    __syncthreads();
    score = ex / row_total;
  }
  const float c = score + (bias != nullptr ? b : 0.0f);  // the selection score

  bool eligible = is_expert;
  int round = 0;  // BlockArgmax rounds so far
  float unused;
  if (p.topk_group < p.n_group) {
    const int per_group = experts / p.n_group;
    float* choice = shared;
    float* group = shared + experts;
    if (is_expert) choice[e] = c;
    __syncthreads();
    // One warp per group: each lane keeps the top two of its share, then the lanes merge them.
    for (int g = warp; g < p.n_group; g += warps) {
      const float* members = choice + g * per_group;
      float first = kExcluded, second = kExcluded;
      for (int i = lane; i < per_group; i += kWarpSize) {
        const float v = members[i];
        second = fmaxf(second, fminf(first, v));
        first = fmaxf(first, v);
      }
      for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
        const float other_first = __shfl_xor_sync(kFullMask, first, offset);
        const float other_second = __shfl_xor_sync(kFullMask, second, offset);
        second = fmaxf(fmaxf(second, other_second), fminf(first, other_first));
        first = fmaxf(first, other_first);
      }
      if (lane == 0) group[g] = p.group_top2 ? first + second : first;
    }
    __syncthreads();
    // Thread g holds group g's key; each round's winner is dropped from the next rounds.
    uint32_t group_key = e < p.n_group ? OrderedKey(group[e]) : 0u;
    const int my_group = e / per_group;  // >= n_group past the last expert: never kept
    bool kept = false;
    for (int i = 0; i < p.topk_group; ++i) {
      const int g = BlockArgmax(group_key, 0.0f, round++, argmax, &unused);
      if (e == g) group_key = 0;
      kept = kept || g == my_group;
    }
    eligible = eligible && kept;
  }

  // Slot j's expert and weight end up in thread j (top_k <= experts <= blockDim.x); every thread
  // adds the weights up in slot order, as the reference does.
  uint32_t key = eligible ? OrderedKey(c) : 0u;
  int32_t slot_id = 0;
  float slot_weight = 0.0f;
  float sum = 0.0f;
  for (int j = 0; j < p.top_k; ++j) {
    float w;
    const int winner = BlockArgmax(key, score, round++, argmax, &w);
    sum += w;
    if (e == winner) key = 0;
    if (e == j) {
      slot_id = winner;
      slot_weight = w;
    }
  }
  if (e < p.top_k) {
    float w = slot_weight;
    if (p.normalize) w = w / (sum + 1e-20f);
    ids[t * ids_stride + e] = slot_id;
    weights[t * weights_stride + e] = w * p.scale;
  }
}

}  // namespace

cudaError_t LaunchMoeRoute(const float* logits, int64_t logits_stride, const float* correction_bias,
                           int64_t tokens, int64_t experts, const MoeRouteLaunchParams& params,
                           int32_t* ids, int64_t ids_stride, float* weights, int64_t weights_stride,
                           int* error_flag, int error_code, int bias_error_code,
                           bool programmatic, cudaStream_t stream) {
  const MoeRouteLaunchParams& p = params;
  if (tokens < 0 || experts < 1 || experts > kMoeRouteMaxExperts || p.n_group < 1 ||
      experts % p.n_group != 0 || p.topk_group < 1 || p.topk_group > p.n_group || p.top_k < 1 ||
      p.top_k > static_cast<int64_t>(p.topk_group) * (experts / p.n_group) ||
      (p.group_top2 && experts / p.n_group < 2) || logits_stride < 0 || ids_stride < 0 ||
      weights_stride < 0) {
    return cudaErrorInvalidValue;
  }
  if (tokens == 0) return cudaSuccess;
  if (logits == nullptr || ids == nullptr || weights == nullptr || error_flag == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (experts <= kMoeRouteMaxBlockExperts && !p.warp_per_row) {
    // One block per row, one thread per expert (rounded up to whole warps).
    if (tokens > INT_MAX) return cudaErrorInvalidValue;
    const unsigned threads =
        static_cast<unsigned>((experts + kWarpSize - 1) / kWarpSize * kWarpSize);
    const size_t shared_bytes = (static_cast<size_t>(experts) + p.n_group) * sizeof(float);
    return LaunchKernel(programmatic, MoeRouteBlockKernel, dim3(static_cast<unsigned>(tokens)),
                        dim3(threads), shared_bytes, stream, logits, logits_stride,
                        correction_bias, static_cast<int>(experts), p, ids, ids_stride, weights,
                        weights_stride, error_flag, error_code, bias_error_code);
  }
  // One warp per row, up to kRouteMaxRowsPerBlock rows a block as their shared slices fit.
  const size_t row_bytes = (2 * static_cast<size_t>(experts) + p.n_group) * sizeof(float);
  const int64_t fit = static_cast<int64_t>(kRouteSharedBytes / row_bytes);  // >= 1 by the bound
  const int64_t rows = fit < kRouteMaxRowsPerBlock ? fit : kRouteMaxRowsPerBlock;
  const int64_t blocks = (tokens + rows - 1) / rows;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  return LaunchKernel(programmatic, MoeRouteKernel, dim3(static_cast<unsigned>(blocks)),
                      dim3(static_cast<unsigned>(rows * kWarpSize)), rows * row_bytes, stream,
                      logits, logits_stride, correction_bias, tokens, static_cast<int>(experts), p,
                      ids, ids_stride, weights, weights_stride, error_flag, error_code,
                      bias_error_code);
}

}  // namespace eagle3::cuda
