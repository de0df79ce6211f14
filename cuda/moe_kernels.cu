// MoE routing and routed-expert kernels. No abseil here: nvcc must never see it.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>

#include <cuda_bf16.h>

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

__device__ __forceinline__ bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// kVec weights from 16 bytes at chunk i of a 16-byte aligned row, as floats.
__device__ __forceinline__ void LoadChunk(const float* row, int64_t i, float (&w)[4]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(row) + i);
  w[0] = a.x;
  w[1] = a.y;
  w[2] = a.z;
  w[3] = a.w;
}
__device__ __forceinline__ void LoadChunk(const uint16_t* row, int64_t i, float (&w)[8]) {
  const uint4 a = __ldg(reinterpret_cast<const uint4*>(row) + i);
  const uint32_t words[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {  // little endian: the lower half is the earlier element
    w[2 * q] = __uint_as_float(words[q] << 16);
    w[2 * q + 1] = __uint_as_float(words[q] & 0xffff0000u);
  }
}
__device__ __forceinline__ float LoadWeight(const float* row, int64_t i) { return __ldg(row + i); }
__device__ __forceinline__ float LoadWeight(const uint16_t* row, int64_t i) {
  return __uint_as_float(static_cast<uint32_t>(__ldg(row + i)) << 16);
}

__device__ __forceinline__ float RoundToBf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
__device__ __forceinline__ float4 RoundQuadToBf16(float4 q) {
  return make_float4(RoundToBf16(q.x), RoundToBf16(q.y), RoundToBf16(q.z), RoundToBf16(q.w));
}

// dots[r] = rows[r][0, n) . v[0, n) for R rows by one warp, in a fixed order (reproducible); every
// lane gets the results. W is the weight storage: float, or uint16_t holding bf16 (widened to f32
// exactly); v stays f32, in global or shared memory, rounded to bf16 as it is read with round_v.
// 16-byte loads of the rows (4 floats or 8 bf16, and the matching floats of v) when every pointer
// is 16-byte aligned and n is a multiple of that; products are summed in groups of 4 before they
// join the lane's accumulator.
template <int R, typename W>
__device__ void WarpDots(const W* const (&rows)[R], const float* v, int64_t n, int lane,
                         float (&dots)[R], bool round_v = false) {
  constexpr int kVec = 16 / sizeof(W);
  float acc[R];
  bool vec = (n % kVec == 0) && Aligned16(v);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    acc[r] = 0.0f;
    vec = vec && Aligned16(rows[r]);
  }
  if (vec) {
    const float4* v4 = reinterpret_cast<const float4*>(v);
    // Many rows hold enough loads in flight per iteration; unrolled further they spill.
    constexpr int kUnroll = R >= 4 ? 2 : 4;
#pragma unroll kUnroll
    for (int64_t i = lane; i < n / kVec; i += kWarpSize) {
      float4 b[kVec / 4];
#pragma unroll
      for (int q = 0; q < kVec / 4; ++q) {
        b[q] = v4[i * (kVec / 4) + q];
        if (round_v) b[q] = RoundQuadToBf16(b[q]);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float a[kVec];
        LoadChunk(rows[r], i, a);
#pragma unroll
        for (int q = 0; q < kVec / 4; ++q) {
          acc[r] += a[4 * q] * b[q].x + a[4 * q + 1] * b[q].y + a[4 * q + 2] * b[q].z +
                    a[4 * q + 3] * b[q].w;
        }
      }
    }
  } else {
#pragma unroll 4
    for (int64_t i = lane; i < n; i += kWarpSize) {
      const float b = round_v ? RoundToBf16(v[i]) : v[i];
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] += LoadWeight(rows[r], i) * b;
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) dots[r] = WarpSum(acc[r]);
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

// ---- Routed experts -------------------------------------------------------------------------

constexpr int kGemvWarps = 8;  // output rows per block, one warp each
constexpr int64_t kMaxGridY = 65535;

// act[t, j, i] = silu(gate_e[i] . x[t]) * (up_e[i] . x[t]) for slot (t, j) = blockIdx.x and rows
// i of blockIdx.y; for an expert flagged bf16_activations, x and act rounded to bf16. With
// `stage_x` the block first copies x[t] into shared memory (hidden floats, 16-byte aligned rows):
// its eight warps then read it there instead of each loading all of it.
template <typename W>
__global__ void MoeActKernel(const float* __restrict__ x, int64_t x_stride,
                             const int32_t* __restrict__ ids, int64_t ids_stride,
                             const MoeExpertPointers* __restrict__ experts, int64_t num_experts,
                             int64_t top_k, int64_t hidden, int64_t inter, float* __restrict__ act,
                             bool stage_x, int* error_flag, int error_code) {
  extern __shared__ float4 x_staged[];  // [hidden / 4] with stage_x
  PdlLaunchDependents();  // lets a weight-streaming kernel after this one start early
  PdlWait();
  const int64_t slot = blockIdx.x;
  const int64_t t = slot / top_k;
  const int32_t e = ids[t * ids_stride + slot % top_k];
  if (e < 0 || e >= num_experts) {
    if (threadIdx.x == 0 && blockIdx.y == 0) RecordDeviceError(error_flag, error_code, t);
    return;
  }
  const float* v = x + t * x_stride;
  if (stage_x) {
    const float4* x4 = reinterpret_cast<const float4*>(v);
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < hidden / 4; i += blockDim.x) x_staged[i] = x4[i];
    __syncthreads();
    v = reinterpret_cast<const float*>(x_staged);
  }
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kGemvWarps + threadIdx.x / kWarpSize;
  if (row >= inter) return;
  const int lane = threadIdx.x % kWarpSize;
  const MoeExpertPointers w = experts[e];
  const W* gate_up = static_cast<const W*>(w.gate_up);
  const W* const rows[2] = {gate_up + row * w.gate_up_stride,
                            gate_up + (inter + row) * w.gate_up_stride};
  float dots[2];
  WarpDots<2, W>(rows, v, hidden, lane, dots, w.bf16_activations != 0);
  if (lane == 0) {
    const float g = dots[0];
    const float a = g / (1.0f + expf(-g)) * dots[1];
    act[slot * inter + row] = w.bf16_activations != 0 ? RoundToBf16(a) : a;
  }
}

// Hidden rows of one MoeDownKernel block. Its warps take the token's slots in turn and compute all
// of the block's rows for each: one expert's rows are consecutive, so a warp streams kDownRows rows
// of one weight matrix at once and reads each element of act once for all of them.
constexpr int kDownRows = 8;
static_assert(kMoeExpertsMaxSlots * kDownRows * sizeof(float) <= (48 << 10),
              "MoeDownKernel's slot dots fit in shared memory without opt-in");

// out[t, h] = (accumulate ? out[t, h] : 0) + sum over j in order of weights[t, j] * down_e[h] .
// act[t, j] for token t = blockIdx.x and rows h = blockIdx.y * kDownRows + [0, kDownRows). Warp w
// computes the dots of slots w, w + kGemvWarps, ... (WarpDots: each row's sum in the order of a
// one-row call), then thread r adds row r's up in slot order. A token with a bad id is left alone.
template <typename W>
__global__ void __launch_bounds__(kGemvWarps * kWarpSize, 2)
    MoeDownKernel(const int32_t* __restrict__ ids, int64_t ids_stride,
                  const float* __restrict__ weights, int64_t weights_stride,
                  const MoeExpertPointers* __restrict__ experts, int64_t num_experts,
                  int64_t top_k, int64_t hidden, int64_t inter, const float* __restrict__ act,
                  float* __restrict__ out, int64_t out_stride, bool accumulate, int* error_flag,
                  int error_code) {
  PdlLaunchDependents();  // lets a weight-streaming kernel after this one start early
  PdlWait();
  extern __shared__ float slot_dots[];  // [top_k][kDownRows]
  const int64_t t = blockIdx.x;
  const int32_t* id = ids + t * ids_stride;
  for (int64_t j = 0; j < top_k; ++j) {
    if (id[j] < 0 || id[j] >= num_experts) {
      if (threadIdx.x == 0 && blockIdx.y == 0) RecordDeviceError(error_flag, error_code, t);
      return;
    }
  }
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * kDownRows;
  if (h0 >= hidden) return;
  const int lane = threadIdx.x % kWarpSize;
  for (int64_t j = threadIdx.x / kWarpSize; j < top_k; j += kGemvWarps) {
    const MoeExpertPointers w = experts[id[j]];
    const W* rows[kDownRows];
#pragma unroll
    for (int r = 0; r < kDownRows; ++r) {  // rows past hidden repeat the last (results unused)
      rows[r] = static_cast<const W*>(w.down) + min(h0 + r, hidden - 1) * w.down_stride;
    }
    float dots[kDownRows];
    WarpDots<kDownRows, W>(rows, act + (t * top_k + j) * inter, inter, lane, dots);
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kDownRows; ++r) slot_dots[j * kDownRows + r] = dots[r];
    }
  }
  __syncthreads();
  const int64_t h = h0 + threadIdx.x;
  if (threadIdx.x >= kDownRows || h >= hidden) return;
  float* o = out + t * out_stride + h;
  float acc = accumulate ? *o : 0.0f;  // without accumulate out is write-only (may hold NaN)
  for (int64_t j = 0; j < top_k; ++j) {
    acc += weights[t * weights_stride + j] * slot_dots[j * kDownRows + threadIdx.x];
  }
  *o = acc;
}

// ---- Grouped routed experts ----------------------------------------------------------------
//
// One round per chunk of tokens: MoeGroupKernel sorts the chunk's (token, slot) pairs by expert and
// lists the expert tiles of up to kTileM pairs; MoeGroupedGemmKernel<W, false> computes act for
// every tile x 64 intermediate rows (gate and up), MoeGroupedGemmKernel<W, true> y = act W_down^T
// for every tile x 128 hidden columns, and MoeGroupedReduceKernel sums y into out per token in slot
// order. See moe_ops.h for the numerics (three-way bf16 split of f32 operands on tensor cores).

constexpr int kTileM = static_cast<int>(kMoeGroupedTileRows);  // pairs per tile
constexpr int kTileN = 128;  // weight rows per block (stage 1: 64 gate + the 64 matching up rows)
constexpr int kTileK = 32;   // k per shared-memory tile (two m16n8k16 steps)
constexpr int kTileThreads = 256;  // 8 warps: 2 along M x 4 along N, 32 x 32 outputs each
// Shared row stride (elements) of every tile: fragment reads of 8 rows x 4 lanes hit distinct
// banks.
constexpr int kTileStride = kTileK + 8;
constexpr int kGroupThreads = 1024;
constexpr int kReduceThreads = 256;

static_assert(kTileM == 64, "the warp layout covers 64 rows");

// Inclusive prefix sums of two ints over the lanes of a warp.
__device__ int2 WarpInclusiveScan(int2 v, int lane) {
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const int x = __shfl_up_sync(kFullMask, v.x, offset);
    const int y = __shfl_up_sync(kFullMask, v.y, offset);
    if (lane >= offset) {
      v.x += x;
      v.y += y;
    }
  }
  return v;
}

// Exclusive block-wide prefix sums of two ints (blockDim.x == kGroupThreads); *total gets the sums.
__device__ int2 BlockExclusiveScan(int2 v, int2* total) {
  __shared__ int2 warp_totals[kGroupThreads / kWarpSize];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int2 inclusive = WarpInclusiveScan(v, lane);
  if (lane == kWarpSize - 1) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {  // kGroupThreads / kWarpSize == kWarpSize warps
    warp_totals[lane] = WarpInclusiveScan(warp_totals[lane], lane);  // inclusive over warps
  }
  __syncthreads();
  const int2 base = warp > 0 ? warp_totals[warp - 1] : make_int2(0, 0);
  *total = warp_totals[kWarpSize - 1];
  return make_int2(base.x + inclusive.x - v.x, base.y + inclusive.y - v.y);
}
static_assert(kGroupThreads == kWarpSize * kWarpSize, "BlockExclusiveScan's layout");

// Counting sort of the chunk's tokens * top_k pairs by expert (one block): pairs[] gets the pair
// indices t * top_k + j in expert-major order, tiles[3 * i] = (expert, first sorted pair, pairs)
// for each tile of up to kTileM pairs of one expert, *num_tiles their count. A pair with an id
// outside [0, experts) is left out and its token (chunk offset t0 added) recorded.
__global__ void __launch_bounds__(kGroupThreads)
    MoeGroupKernel(const int32_t* __restrict__ ids, int64_t ids_stride, int tokens, int top_k,
                   int experts, int64_t t0, int32_t* __restrict__ pairs,
                   int32_t* __restrict__ tiles, int32_t* __restrict__ num_tiles, int* error_flag,
                   int error_code) {
  PdlEnter();
  __shared__ int count[kMoeGroupedMaxExperts];  // per expert: pairs, then the scatter cursor
  const int n = tokens * top_k;
  for (int e = threadIdx.x; e < experts; e += kGroupThreads) count[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < n; p += kGroupThreads) {
    const int t = p / top_k;
    const int32_t e = ids[t * ids_stride + (p - t * top_k)];
    if (e < 0 || e >= experts) {
      RecordDeviceError(error_flag, error_code, t0 + t);
    } else {
      atomicAdd(&count[e], 1);
    }
  }
  __syncthreads();
  // Thread i owns the experts [begin, end): their pairs and tiles are consecutive.
  const int per = (experts + kGroupThreads - 1) / kGroupThreads;
  const int begin = min(static_cast<int>(threadIdx.x) * per, experts);
  const int end = min(begin + per, experts);
  int2 mine = make_int2(0, 0);
  for (int e = begin; e < end; ++e) {
    mine.x += count[e];
    mine.y += (count[e] + kTileM - 1) / kTileM;
  }
  int2 total;
  int2 at = BlockExclusiveScan(mine, &total);  // (first pair, first tile) of `begin`
  for (int e = begin; e < end; ++e) {
    const int c = count[e];
    for (int first = 0; first < c; first += kTileM) {
      tiles[3 * at.y] = e;
      tiles[3 * at.y + 1] = at.x + first;
      tiles[3 * at.y + 2] = min(kTileM, c - first);
      ++at.y;
    }
    count[e] = at.x;  // cursor: this expert's first sorted position
    at.x += c;
  }
  if (threadIdx.x == 0) *num_tiles = total.y;
  __syncthreads();
  for (int p = threadIdx.x; p < n; p += kGroupThreads) {
    const int t = p / top_k;
    const int32_t e = ids[t * ids_stride + (p - t * top_k)];
    if (e >= 0 && e < experts) pairs[atomicAdd(&count[e], 1)] = p;
  }
}

// v = hi + mid + lo exactly (to 2^-26 relative), each a bf16, for both halves of a pair of f32
// values; the packed words hold the element of the lower index in their low half (mma operands).
__device__ __forceinline__ void Split3(float2 v, uint32_t (&parts)[3]) {
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(v.x, v.y);
    const float2 f = __bfloat1622float2(b);
    v.x -= f.x;  // exact: f is v rounded to 8 significant bits
    v.y -= f.y;
    parts[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
}

struct GroupedGemmArgs {
  const float* x = nullptr;  // stage 1: the chunk's token rows [tokens, hidden]
  int64_t x_stride = 0;
  float* act = nullptr;  // [pairs, inter], sorted order: stage 1 writes it, stage 2 reads it
  float* partial = nullptr;  // stage 2: [pairs, hidden], chunk-local pair order
  const int32_t* pairs = nullptr;
  const int32_t* tiles = nullptr;
  const int32_t* num_tiles = nullptr;
  const MoeExpertPointers* experts = nullptr;
  int64_t top_k = 0, hidden = 0, inter = 0;
};

// 16 bytes global -> shared without registers (zero-filled when !valid; src must be a valid address
// either way), completing at the matching CpAsyncWait.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Pipeline depth (shared-memory stages) of MoeGroupedGemmKernel<W>: (kStages - 1) k tiles of
// weights in flight per block while one is multiplied.
template <typename W>
constexpr int GroupedStages() {
  return sizeof(W) == 2 ? 4 : 3;
}
template <typename W>
constexpr size_t GroupedStageBytes() {
  return static_cast<size_t>(kTileM) * kTileStride * sizeof(float) +
         static_cast<size_t>(kTileN) * kTileStride * sizeof(W);
}
template <typename W>
constexpr size_t GroupedSharedBytes() {  // 80 KiB (bf16) or 90 KiB (f32): 2 blocks per SM fit
  return GroupedStages<W>() * GroupedStageBytes<W>();
}

// Stage 1 (kDown false): act[s, i] = silu(gate_e[i] . x[t]) * (up_e[i] . x[t]) for the sorted
// pairs s of tile blockIdx.y (token t = pairs[s] / top_k) and the 64 rows i of blockIdx.x.
// Stage 2 (kDown true): partial[pairs[s], h] = down_e[h] . act[s] for the 128 rows h of
// blockIdx.x. Blocks past *num_tiles return at once. Dynamic shared memory:
// GroupedSharedBytes<W>(), kStages slots of [kTileM][kTileStride] f32 (A) then
// [kTileN][kTileStride] W (B). Operand rows are copied with cp.async 16 bytes at a time when every
// row is 16-byte aligned and k a multiple of 16 bytes, else element by element (odd shapes).
template <typename W, bool kDown>
__global__ void __launch_bounds__(kTileThreads, 2) MoeGroupedGemmKernel(GroupedGemmArgs args) {
  constexpr int kStages = GroupedStages<W>();
  constexpr int kBVec = 16 / sizeof(W);              // weights per 16-byte chunk
  constexpr int kBChunksPerRow = kTileK / kBVec;     // 4 (bf16) or 8 (f32)
  constexpr int kBLoads = kTileN * kBChunksPerRow / kTileThreads;  // 2 or 4
  constexpr int kALoads = kTileM * (kTileK / 4) / kTileThreads;   // 2
  constexpr int kParts = sizeof(W) == 2 ? 1 : 3;  // bf16 parts per weight
  extern __shared__ __align__(16) unsigned char grouped_shared[];
  const auto a_tile = [&](int stage) {
    return reinterpret_cast<float(*)[kTileStride]>(grouped_shared + stage * GroupedStageBytes<W>());
  };
  const auto b_tile = [&](int stage) {
    return reinterpret_cast<W(*)[kTileStride]>(grouped_shared + stage * GroupedStageBytes<W>() +
                                               kTileM * kTileStride * sizeof(float));
  };

  PdlEnter();
  const int tile = blockIdx.y;
  if (tile >= *args.num_tiles) return;
  const int expert = args.tiles[3 * tile];
  const int start = args.tiles[3 * tile + 1];
  const int rows = args.tiles[3 * tile + 2];
  const MoeExpertPointers w = args.experts[expert];
  const int64_t k_len = kDown ? args.inter : args.hidden;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * (kDown ? kTileN : kTileN / 2);
  const int tid = threadIdx.x;

  // The rows this thread copies (fixed over k); nullptr: zeros (padding).
  const float* a_row[kALoads];
  const float* a_base = kDown ? args.act : args.x;  // a valid address for zero-filling copies
  const bool a_vec = kDown ? Aligned16(args.act) && args.inter % 4 == 0
                           : Aligned16(args.x) && args.x_stride % 4 == 0 && args.hidden % 4 == 0;
#pragma unroll
  for (int i = 0; i < kALoads; ++i) {
    const int r = (tid + i * kTileThreads) / (kTileK / 4);
    a_row[i] = nullptr;
    if (r < rows) {
      a_row[i] = kDown ? args.act + static_cast<int64_t>(start + r) * args.inter
                       : args.x + (args.pairs[start + r] / args.top_k) * args.x_stride;
    }
  }
  const W* b_row[kBLoads];
  const W* b_base = static_cast<const W*>(kDown ? w.down : w.gate_up);
  const int64_t b_stride = kDown ? w.down_stride : w.gate_up_stride;
  const bool b_vec = Aligned16(b_base) && b_stride % kBVec == 0 && k_len % kBVec == 0;
#pragma unroll
  for (int i = 0; i < kBLoads; ++i) {
    const int r = (tid + i * kTileThreads) / kBChunksPerRow;
    int64_t row;
    bool valid;
    if (kDown) {
      row = n0 + r;
      valid = row < args.hidden;
    } else {  // r < 64: gate row n0 + r; else the up row of n0 + r - 64
      const int64_t i_row = n0 + (r % (kTileN / 2));
      valid = i_row < args.inter;
      row = r < kTileN / 2 ? i_row : args.inter + i_row;
    }
    b_row[i] = valid ? b_base + row * b_stride : nullptr;
  }

  // Copies k tile [k0, k0 + kTileK) into `stage` (asynchronously on the vector path).
  const auto issue = [&](int64_t k0, int stage) {
    float(*a_s)[kTileStride] = a_tile(stage);
    W(*b_s)[kTileStride] = b_tile(stage);
#pragma unroll
    for (int i = 0; i < kALoads; ++i) {
      const int c = tid + i * kTileThreads;
      const int col = (c % (kTileK / 4)) * 4;
      float* dst = &a_s[c / (kTileK / 4)][col];
      if (a_vec) {
        const bool valid = a_row[i] != nullptr && k0 + col < k_len;
        CpAsync16(dst, valid ? a_row[i] + k0 + col : a_base, valid);
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const bool valid = a_row[i] != nullptr && k0 + col + q < k_len;
          dst[q] = valid ? __ldg(a_row[i] + k0 + col + q) : 0.0f;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kBLoads; ++i) {
      const int c = tid + i * kTileThreads;
      const int col = (c % kBChunksPerRow) * kBVec;
      W* dst = &b_s[c / kBChunksPerRow][col];
      if (b_vec) {
        const bool valid = b_row[i] != nullptr && k0 + col < k_len;
        CpAsync16(dst, valid ? b_row[i] + k0 + col : b_base, valid);
      } else {
#pragma unroll
        for (int e = 0; e < kBVec; ++e) {
          const bool valid = b_row[i] != nullptr && k0 + col + e < k_len;
          dst[e] = valid ? __ldg(b_row[i] + k0 + col + e) : W{0};
        }
      }
    }
  };

  const int warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int wm = warp % 2, wn = warp / 2;
  const int g = lane / 4, c2 = (lane % 4) * 2;  // fragment row (group) and first column
  bool active[2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) active[mt] = wm * 32 + mt * 16 < rows;  // warp-uniform
  int b_local[4];  // the shared row of each n8 tile's column g
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    b_local[nt] = kDown ? wn * 32 + nt * 8 + g
                        : (nt < 2 ? 0 : kTileN / 2) + wn * 16 + (nt % 2) * 8 + g;
  }
  float acc[2][4][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mt][nt][q] = 0.0f;
    }
  }

  // kStages - 1 tiles ahead; one commit group per tile (empty past the end) keeps the count.
  const int64_t k_tiles = (k_len + kTileK - 1) / kTileK;
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (stage < k_tiles) issue(stage * kTileK, stage);
    CpAsyncCommit();
  }
  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    CpAsyncWait<kStages - 2>();  // this thread's copies of tile kt have landed
    __syncthreads();  // everyone's have; and tile kt - 1's slot is free (all done with it)
    if (kt + kStages - 1 < k_tiles) {
      issue((kt + kStages - 1) * kTileK, static_cast<int>((kt + kStages - 1) % kStages));
    }
    CpAsyncCommit();
    if (!active[0]) continue;  // a warp whose rows are all padding only helps copy
    const int stage = static_cast<int>(kt % kStages);
    float(*a_s)[kTileStride] = a_tile(stage);
    W(*b_s)[kTileStride] = b_tile(stage);
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      uint32_t af[2][3][4];  // [m tile][hi, mid, lo][register]
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        if (!active[mt]) continue;
        const int r = wm * 32 + mt * 16 + g;
        const float2 v[4] = {*reinterpret_cast<const float2*>(&a_s[r][kk + c2]),
                             *reinterpret_cast<const float2*>(&a_s[r + 8][kk + c2]),
                             *reinterpret_cast<const float2*>(&a_s[r][kk + c2 + 8]),
                             *reinterpret_cast<const float2*>(&a_s[r + 8][kk + c2 + 8])};
#pragma unroll
        for (int reg = 0; reg < 4; ++reg) {
          uint32_t parts[3];
          Split3(v[reg], parts);
#pragma unroll
          for (int p = 0; p < 3; ++p) af[mt][p][reg] = parts[p];
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        uint32_t bf[kParts][2];
        if constexpr (kParts == 1) {
          bf[0][0] = *reinterpret_cast<const uint32_t*>(&b_s[b_local[nt]][kk + c2]);
          bf[0][1] = *reinterpret_cast<const uint32_t*>(&b_s[b_local[nt]][kk + c2 + 8]);
        } else {
#pragma unroll
          for (int reg = 0; reg < 2; ++reg) {
            uint32_t parts[3];
            Split3(*reinterpret_cast<const float2*>(&b_s[b_local[nt]][kk + c2 + 8 * reg]), parts);
#pragma unroll
            for (int p = 0; p < 3; ++p) bf[p][reg] = parts[p];
          }
        }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          if (!active[mt]) continue;
          // This k16 step's sum on the tensor cores (3 or 6 products of 16 terms each, smallest
          // first; with split weights, the six of order >= 2^-16 of the nine), then into acc in
          // f32: the tensor core's own accumulation never runs long.
          float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int order = 2; order >= 0; --order) {
#pragma unroll
            for (int p = 0; p < kParts; ++p) {
              if (order - p >= 0) MmaBf16(part, af[mt][order - p], bf[p][0], bf[p][1]);
            }
          }
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[mt][nt][q] += part[q];
        }
      }
    }
  }
  CpAsyncWait<0>();  // (only empty groups can be pending here)

#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    if (!active[mt]) continue;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int r = wm * 32 + mt * 16 + g + (q / 2) * 8;
      if (r >= rows) continue;
      if constexpr (kDown) {
        float* y = args.partial + static_cast<int64_t>(args.pairs[start + r]) * args.hidden;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int64_t h = n0 + wn * 32 + nt * 8 + c2 + q % 2;
          if (h < args.hidden) y[h] = acc[mt][nt][q];
        }
      } else {
        float* a = args.act + static_cast<int64_t>(start + r) * args.inter;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int64_t i = n0 + wn * 16 + nt * 8 + c2 + q % 2;
          const float gate = acc[mt][nt][q];
          if (i < args.inter) a[i] = gate / (1.0f + expf(-gate)) * acc[mt][nt + 2][q];
        }
      }
    }
  }
}

// Sets the dynamic shared memory MoeGroupedGemmKernel<W, kDown> needs (above the 48 KiB default)
// and launches it.
template <typename W, bool kDown>
cudaError_t LaunchGroupedGemm(const GroupedGemmArgs& a, dim3 grid, bool programmatic,
                              cudaStream_t stream) {
  constexpr size_t kBytes = GroupedSharedBytes<W>();
  const cudaError_t error = cudaFuncSetAttribute(
      MoeGroupedGemmKernel<W, kDown>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(kBytes));
  if (error != cudaSuccess) return error;
  return LaunchKernel(programmatic, MoeGroupedGemmKernel<W, kDown>, grid, dim3(kTileThreads),
                      kBytes, stream, a);
}

// out[t, h] = (accumulate ? out[t, h] : 0) + sum over j in order of weights[t, j] * partial[t *
// top_k + j, h] for token t = blockIdx.x and h of blockIdx.y's block; a token with a bad id is left
// alone (MoeGroupKernel recorded it).
__global__ void __launch_bounds__(kReduceThreads)
    MoeGroupedReduceKernel(const int32_t* __restrict__ ids, int64_t ids_stride,
                           const float* __restrict__ weights, int64_t weights_stride,
                           int64_t num_experts, int64_t top_k, int64_t hidden,
                           const float* __restrict__ partial, float* __restrict__ out,
                           int64_t out_stride, bool accumulate) {
  PdlEnter();
  const int64_t t = blockIdx.x;
  const int32_t* id = ids + t * ids_stride;
  for (int64_t j = 0; j < top_k; ++j) {
    if (id[j] < 0 || id[j] >= num_experts) return;
  }
  const int64_t h = static_cast<int64_t>(blockIdx.y) * kReduceThreads + threadIdx.x;
  if (h >= hidden) return;
  float* o = out + t * out_stride + h;
  float acc = accumulate ? *o : 0.0f;  // without accumulate out is write-only (may hold NaN)
  const float* y = partial + t * top_k * hidden + h;
  for (int64_t j = 0; j < top_k; ++j) acc += weights[t * weights_stride + j] * y[j * hidden];
  *o = acc;
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

cudaError_t LaunchMoeExperts(const float* x, int64_t x_stride, const int32_t* ids,
                             int64_t ids_stride, const float* weights, int64_t weights_stride,
                             const MoeExpertPointers* experts, MoeWeightType weight_type,
                             int64_t num_experts, int64_t tokens, int64_t top_k, int64_t hidden,
                             int64_t inter, float* act, float* out, int64_t out_stride,
                             bool accumulate, int* error_flag, int error_code,
                             bool programmatic, cudaStream_t stream) {
  if (weight_type != MoeWeightType::kF32 && weight_type != MoeWeightType::kBF16) {
    return cudaErrorInvalidValue;
  }
  if (tokens < 0 || top_k < 0 || hidden < 0 || inter < 0 || num_experts < 0 || x_stride < 0 ||
      ids_stride < 0 || weights_stride < 0 || out_stride < 0) {
    return cudaErrorInvalidValue;
  }
  if (tokens == 0) return cudaSuccess;
  const int64_t inter_blocks = (inter + kGemvWarps - 1) / kGemvWarps;
  // At least one row block, so that bad ids are reported even when there is nothing to write.
  const int64_t hidden_blocks = hidden == 0 ? 1 : (hidden + kDownRows - 1) / kDownRows;
  if (tokens > INT_MAX || tokens * top_k > INT_MAX || inter_blocks > kMaxGridY ||
      hidden_blocks > kMaxGridY || top_k > kMoeExpertsMaxSlots) {
    return cudaErrorInvalidValue;
  }
  const bool gemv = top_k > 0 && inter > 0;
  if (out == nullptr || error_flag == nullptr ||
      (top_k > 0 && (ids == nullptr || weights == nullptr)) ||
      (gemv && (x == nullptr || act == nullptr)) || (num_experts > 0 && experts == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const auto launch = [&](auto weight) {  // weight: a W value, selecting the instantiation
    using W = decltype(weight);
    if (gemv) {
      const dim3 grid(static_cast<unsigned>(tokens * top_k), static_cast<unsigned>(inter_blocks));
      // x's row in shared memory where it fits in the 48 KiB a block gets without opt-in and loads
      // as aligned quads; otherwise each warp reads it from L2.
      const bool stage_x = hidden % 4 == 0 && hidden * sizeof(float) <= (48 << 10) &&
                           reinterpret_cast<uintptr_t>(x) % 16 == 0 && x_stride % 4 == 0;
      const size_t shared = stage_x ? static_cast<size_t>(hidden) * sizeof(float) : 0;
      if (const cudaError_t error =
              LaunchKernel(programmatic, MoeActKernel<W>, grid, dim3(kGemvWarps * kWarpSize),
                           shared, stream, x, x_stride, ids, ids_stride, experts, num_experts,
                           top_k, hidden, inter, act, stage_x, error_flag, error_code);
          error != cudaSuccess) {
        return error;
      }
    }
    const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(hidden_blocks));
    const size_t shared = static_cast<size_t>(top_k) * kDownRows * sizeof(float);
    return LaunchKernel(programmatic, MoeDownKernel<W>, grid, dim3(kGemvWarps * kWarpSize), shared,
                        stream, ids, ids_stride, weights, weights_stride, experts, num_experts,
                        top_k, hidden, inter, act, out, out_stride, accumulate, error_flag,
                        error_code);
  };
  return weight_type == MoeWeightType::kBF16 ? launch(uint16_t{0}) : launch(0.0f);
}

cudaError_t LaunchMoeExpertsGrouped(const float* x, int64_t x_stride, const int32_t* ids,
                                    int64_t ids_stride, const float* weights,
                                    int64_t weights_stride, const MoeExpertPointers* experts,
                                    MoeWeightType weight_type, int64_t num_experts, int64_t tokens,
                                    int64_t top_k, int64_t hidden, int64_t inter, float* act,
                                    const MoeGroupedWorkspace& workspace, float* out,
                                    int64_t out_stride, bool accumulate, int* error_flag,
                                    int error_code, bool programmatic, cudaStream_t stream) {
  const MoeGroupedWorkspace& ws = workspace;
  if (weight_type != MoeWeightType::kF32 && weight_type != MoeWeightType::kBF16) {
    return cudaErrorInvalidValue;
  }
  if (tokens < 0 || top_k < 1 || hidden < 1 || inter < 1 || num_experts < 1 ||
      num_experts > kMoeGroupedMaxExperts || x_stride < 0 || ids_stride < 0 ||
      weights_stride < 0 || out_stride < 0 || ws.max_pairs < top_k ||
      ws.max_experts < num_experts || ws.hidden < hidden) {
    return cudaErrorInvalidValue;
  }
  if (tokens == 0) return cudaSuccess;
  if (x == nullptr || ids == nullptr || weights == nullptr || experts == nullptr ||
      act == nullptr || out == nullptr || error_flag == nullptr || ws.pairs == nullptr ||
      ws.tiles == nullptr || ws.num_tiles == nullptr || ws.partial == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int64_t chunk = std::min<int64_t>({tokens, ws.max_pairs / top_k, INT_MAX / top_k});
  const int64_t max_tiles = MoeGroupedMaxTiles(chunk * top_k, num_experts);
  const int64_t act_blocks = (inter + kTileN / 2 - 1) / (kTileN / 2);
  const int64_t down_blocks = (hidden + kTileN - 1) / kTileN;
  const int64_t reduce_blocks = (hidden + kReduceThreads - 1) / kReduceThreads;
  if (max_tiles > kMaxGridY || reduce_blocks > kMaxGridY || act_blocks > INT_MAX ||
      down_blocks > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  const auto launch = [&](auto weight) {  // weight: a W value, selecting the instantiation
    using W = decltype(weight);
    for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
      const int64_t n = std::min(chunk, tokens - t0);
      cudaError_t error = LaunchKernel(
          programmatic, MoeGroupKernel, dim3(1), dim3(kGroupThreads), 0, stream,
          ids + t0 * ids_stride, ids_stride, static_cast<int>(n), static_cast<int>(top_k),
          static_cast<int>(num_experts), t0, ws.pairs, ws.tiles, ws.num_tiles, error_flag,
          error_code);
      if (error != cudaSuccess) return error;
      GroupedGemmArgs a;
      a.x = x + t0 * x_stride;
      a.x_stride = x_stride;
      a.act = act;
      a.partial = ws.partial;
      a.pairs = ws.pairs;
      a.tiles = ws.tiles;
      a.num_tiles = ws.num_tiles;
      a.experts = experts;
      a.top_k = top_k;
      a.hidden = hidden;
      a.inter = inter;
      const unsigned tiles = static_cast<unsigned>(MoeGroupedMaxTiles(n * top_k, num_experts));
      error = LaunchGroupedGemm<W, false>(a, dim3(static_cast<unsigned>(act_blocks), tiles),
                                          programmatic, stream);
      if (error == cudaSuccess) {
        error = LaunchGroupedGemm<W, true>(a, dim3(static_cast<unsigned>(down_blocks), tiles),
                                           programmatic, stream);
      }
      if (error == cudaSuccess) {
        error = LaunchKernel(
            programmatic, MoeGroupedReduceKernel,
            dim3(static_cast<unsigned>(n), static_cast<unsigned>(reduce_blocks)),
            dim3(kReduceThreads), 0, stream, ids + t0 * ids_stride, ids_stride,
            weights + t0 * weights_stride, weights_stride, num_experts, top_k, hidden, ws.partial,
            out + t0 * out_stride, out_stride, accumulate);
      }
      if (error != cudaSuccess) return error;
    }
    return cudaSuccess;
  };
  return weight_type == MoeWeightType::kBF16 ? launch(uint16_t{0}) : launch(0.0f);
}

}  // namespace eagle3::cuda
