// MoE routing and routed-expert kernels. No abseil here: nvcc must never see it.
#include <climits>
#include <cstdint>
#include <limits>

#include "core_kernels.cuh"
#include "eagle3/cuda/moe_ops.h"

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

// dots[r] = rows[r][0, n) . v[0, n) for R rows by one warp, in a fixed order (reproducible); every
// lane gets the results. W is the weight storage: float, or uint16_t holding bf16 (widened to f32
// exactly; v stays f32). 16-byte loads of the rows (4 floats or 8 bf16, and the matching floats of
// v) when every pointer is 16-byte aligned and n is a multiple of that; products are summed in
// groups of 4 before they join the lane's accumulator.
template <int R, typename W>
__device__ void WarpDots(const W* const (&rows)[R], const float* v, int64_t n, int lane,
                         float (&dots)[R]) {
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
#pragma unroll 4
    for (int64_t i = lane; i < n / kVec; i += kWarpSize) {
      float4 b[kVec / 4];
#pragma unroll
      for (int q = 0; q < kVec / 4; ++q) b[q] = __ldg(v4 + i * (kVec / 4) + q);
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
      const float b = __ldg(v + i);
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

// ---- Routed experts -------------------------------------------------------------------------

constexpr int kGemvWarps = 8;  // output rows per block, one warp each
constexpr int64_t kMaxGridY = 65535;

// act[t, j, i] = silu(gate_e[i] . x[t]) * (up_e[i] . x[t]) for slot (t, j) = blockIdx.x and rows
// i of blockIdx.y; e = ids[t, j].
template <typename W>
__global__ void MoeActKernel(const float* __restrict__ x, int64_t x_stride,
                             const int32_t* __restrict__ ids, int64_t ids_stride,
                             const MoeExpertPointers* __restrict__ experts, int64_t num_experts,
                             int64_t top_k, int64_t hidden, int64_t inter, float* __restrict__ act,
                             int* error_flag, int error_code) {
  const int64_t slot = blockIdx.x;
  const int64_t t = slot / top_k;
  const int32_t e = ids[t * ids_stride + slot % top_k];
  if (e < 0 || e >= num_experts) {
    if (threadIdx.x == 0 && blockIdx.y == 0) RecordDeviceError(error_flag, error_code, t);
    return;
  }
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kGemvWarps + threadIdx.x / kWarpSize;
  if (row >= inter) return;
  const int lane = threadIdx.x % kWarpSize;
  const MoeExpertPointers w = experts[e];
  const W* gate_up = static_cast<const W*>(w.gate_up);
  const W* const rows[2] = {gate_up + row * w.gate_up_stride,
                            gate_up + (inter + row) * w.gate_up_stride};
  float dots[2];
  WarpDots<2, W>(rows, x + t * x_stride, hidden, lane, dots);
  if (lane == 0) {
    const float g = dots[0];
    act[slot * inter + row] = g / (1.0f + expf(-g)) * dots[1];
  }
}

// out[t, h] = (accumulate ? out[t, h] : 0) + sum over j in order of weights[t, j] * down_e[h] .
// act[t, j] for token t = blockIdx.x and rows h of blockIdx.y. A token with a bad id is left alone.
template <typename W>
__global__ void MoeDownKernel(const int32_t* __restrict__ ids, int64_t ids_stride,
                              const float* __restrict__ weights, int64_t weights_stride,
                              const MoeExpertPointers* __restrict__ experts, int64_t num_experts,
                              int64_t top_k, int64_t hidden, int64_t inter,
                              const float* __restrict__ act, float* __restrict__ out,
                              int64_t out_stride, bool accumulate, int* error_flag,
                              int error_code) {
  const int64_t t = blockIdx.x;
  const int32_t* id = ids + t * ids_stride;
  for (int64_t j = 0; j < top_k; ++j) {
    if (id[j] < 0 || id[j] >= num_experts) {
      if (threadIdx.x == 0 && blockIdx.y == 0) RecordDeviceError(error_flag, error_code, t);
      return;
    }
  }
  const int64_t h = static_cast<int64_t>(blockIdx.y) * kGemvWarps + threadIdx.x / kWarpSize;
  if (h >= hidden) return;
  const int lane = threadIdx.x % kWarpSize;
  float* o = out + t * out_stride + h;
  float acc = accumulate ? *o : 0.0f;  // without accumulate out is write-only (may hold NaN)
  for (int64_t j = 0; j < top_k; ++j) {
    const MoeExpertPointers w = experts[id[j]];
    const W* const rows[1] = {static_cast<const W*>(w.down) + h * w.down_stride};
    float dot[1];
    WarpDots<1, W>(rows, act + (t * top_k + j) * inter, inter, lane, dot);
    acc += weights[t * weights_stride + j] * dot[0];
  }
  if (lane == 0) *o = acc;
}

}  // namespace

cudaError_t LaunchMoeRoute(const float* logits, int64_t logits_stride, const float* correction_bias,
                           int64_t tokens, int64_t experts, const MoeRouteLaunchParams& params,
                           int32_t* ids, int64_t ids_stride, float* weights, int64_t weights_stride,
                           int* error_flag, int error_code, int bias_error_code,
                           cudaStream_t stream) {
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
  const size_t row_bytes = (2 * static_cast<size_t>(experts) + p.n_group) * sizeof(float);
  const int64_t fit = static_cast<int64_t>(kRouteSharedBytes / row_bytes);  // >= 1 by the bound
  const int64_t rows = fit < kRouteMaxRowsPerBlock ? fit : kRouteMaxRowsPerBlock;
  const int64_t blocks = (tokens + rows - 1) / rows;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  MoeRouteKernel<<<static_cast<unsigned>(blocks), static_cast<unsigned>(rows * kWarpSize),
                   rows * row_bytes, stream>>>(
      logits, logits_stride, correction_bias, tokens, static_cast<int>(experts), p, ids, ids_stride,
      weights, weights_stride, error_flag, error_code, bias_error_code);
  return cudaGetLastError();
}

cudaError_t LaunchMoeExperts(const float* x, int64_t x_stride, const int32_t* ids,
                             int64_t ids_stride, const float* weights, int64_t weights_stride,
                             const MoeExpertPointers* experts, MoeWeightType weight_type,
                             int64_t num_experts, int64_t tokens, int64_t top_k, int64_t hidden,
                             int64_t inter, float* act, float* out, int64_t out_stride,
                             bool accumulate, int* error_flag, int error_code,
                             cudaStream_t stream) {
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
  const int64_t hidden_blocks = hidden == 0 ? 1 : (hidden + kGemvWarps - 1) / kGemvWarps;
  if (tokens > INT_MAX || tokens * top_k > INT_MAX || inter_blocks > kMaxGridY ||
      hidden_blocks > kMaxGridY) {
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
      MoeActKernel<W><<<grid, kGemvWarps * kWarpSize, 0, stream>>>(
          x, x_stride, ids, ids_stride, experts, num_experts, top_k, hidden, inter, act,
          error_flag, error_code);
      if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
    }
    const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(hidden_blocks));
    MoeDownKernel<W><<<grid, kGemvWarps * kWarpSize, 0, stream>>>(
        ids, ids_stride, weights, weights_stride, experts, num_experts, top_k, hidden, inter, act,
        out, out_stride, accumulate, error_flag, error_code);
    return cudaGetLastError();
  };
  return weight_type == MoeWeightType::kBF16 ? launch(uint16_t{0}) : launch(0.0f);
}

}  // namespace eagle3::cuda
