// The routed experts' decode kernels (LaunchMoeExperts, cuda/moe_ops.h): a batched GEMV per
// (token, slot) into act, then the down product per (token, block of hidden rows). No abseil here:
// nvcc must never see it.
#include <climits>
#include <cstdint>

#include <cuda_bf16.h>

#include "core_kernels.cuh"
#include "moe_ops.h"
#include "programmatic_launch.cuh"

namespace eagle3::cuda {
namespace {

constexpr int kWarpSize = 32;

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

__device__ __forceinline__ float4 RoundQuadToBf16(float4 q) {
  return make_float4(RoundToBf16(q.x), RoundToBf16(q.y), RoundToBf16(q.z), RoundToBf16(q.w));
}

// dots[r] = rows[r][0, n) . v[0, n) for R rows by one warp, in a fixed order (reproducible); every
// lane gets the results. W is the weight storage: float, or uint16_t holding bf16 (widened to f32
// exactly); v stays f32, in global or shared memory, rounded to bf16 as it is read with kRoundV (a
// template argument: as a runtime flag the compiler kept its branches inside the unrolled loop).
// 16-byte loads of the rows (4 floats or 8 bf16, and the matching floats of v) when every pointer
// is 16-byte aligned and n is a multiple of that; products are summed in groups of 4 before they
// join the lane's accumulator.
template <int R, typename W, bool kRoundV = false>
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
    // Many rows hold enough loads in flight per iteration; unrolled further they spill.
    constexpr int kUnroll = R >= 4 ? 2 : 4;
#pragma unroll kUnroll
    for (int64_t i = lane; i < n / kVec; i += kWarpSize) {
      float4 b[kVec / 4];
#pragma unroll
      for (int q = 0; q < kVec / 4; ++q) {
        b[q] = v4[i * (kVec / 4) + q];
        if constexpr (kRoundV) b[q] = RoundQuadToBf16(b[q]);
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
      const float b = kRoundV ? RoundToBf16(v[i]) : v[i];
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] += LoadWeight(rows[r], i) * b;
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) dots[r] = WarpSum(acc[r]);
}

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
  const bool flagged = w.bf16_activations != 0;
  if (flagged) {
    WarpDots<2, W, true>(rows, v, hidden, lane, dots);
  } else {
    WarpDots<2, W, false>(rows, v, hidden, lane, dots);
  }
  if (lane == 0) {
    const float g = dots[0];
    const float a = g / (1.0f + expf(-g)) * dots[1];
    act[slot * inter + row] = flagged ? RoundToBf16(a) : a;
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

}  // namespace

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

}  // namespace eagle3::cuda
