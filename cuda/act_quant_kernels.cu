// Per-token-group FP8 quantization of activations (act_quant_ops.h). No abseil here: nvcc must never
// see it.
//
// One warp per (row, 128-column group): each lane holds 4 consecutive columns (one 16-byte load of
// f32, 8 bytes of bf16, where the row allows), the group's amax is a warp max, lane 0 writes the
// scale and each lane stores its 4 codes as one 32-bit word. Warps walk the groups column-group
// major, so that consecutive warps write consecutive scales of the outer-dimension-major layout.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "act_quant_ops.h"
#include "programmatic_launch.cuh"

namespace eagle3::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kPerLane = 4;  // 32 lanes x 4 columns = one 128-column group
constexpr float kE4m3Max = 448.0f;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // the kernel loops past it

static_assert(32 * kPerLane == kFp8W8A8Block);

__device__ __forceinline__ float Bf16ToF32(uint16_t bits) { return __uint_as_float(static_cast<uint32_t>(bits) << 16); }

// Loads columns [c0, c0 + 4) of a row (those < k; 0 past it).
__device__ __forceinline__ void Load4(const float* row, int64_t c0, int64_t k, bool vector, float (&v)[kPerLane]) {
  if (vector && c0 + kPerLane <= k) {
    const float4 q = *reinterpret_cast<const float4*>(row + c0);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    return;
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) v[j] = c0 + j < k ? row[c0 + j] : 0.0f;
}
__device__ __forceinline__ void Load4(const uint16_t* row, int64_t c0, int64_t k, bool vector,
                                      float (&v)[kPerLane]) {
  if (vector && c0 + kPerLane <= k) {
    const uint2 q = *reinterpret_cast<const uint2*>(row + c0);
    v[0] = Bf16ToF32(static_cast<uint16_t>(q.x & 0xffffu)), v[1] = Bf16ToF32(static_cast<uint16_t>(q.x >> 16));
    v[2] = Bf16ToF32(static_cast<uint16_t>(q.y & 0xffffu)), v[3] = Bf16ToF32(static_cast<uint16_t>(q.y >> 16));
    return;
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) v[j] = c0 + j < k ? Bf16ToF32(row[c0 + j]) : 0.0f;
}

template <typename T>
__global__ void Fp8ActQuantKernel(const T* __restrict__ x, int64_t ldx, int64_t m, int64_t k,
                                  uint8_t* __restrict__ codes, int64_t ld_codes, float* __restrict__ scales,
                                  int64_t scale_ld, bool vector_in, bool vector_out) {
  PdlEnter();
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t groups = Fp8W8A8KBlocks(k);
  const int64_t total = groups * m;
  for (int64_t g = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32; g < total;
       g += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const int64_t j = g / m, r = g % m;
    const int64_t c0 = j * kFp8W8A8Block + lane * kPerLane;
    float v[kPerLane];
    Load4(x + r * ldx, c0, k, vector_in, v);
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    float scale = __fdiv_rn(amax, kE4m3Max);
    if (scale == 0.0f) scale = 1.0f;
    if (lane == 0) scales[j * scale_ld + r] = scale;
    uint32_t word = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(__fdiv_rn(v[i], scale), __NV_SATFINITE, __NV_E4M3);
      word |= static_cast<uint32_t>(q) << (8 * i);
    }
    uint8_t* out = codes + r * ld_codes + c0;
    if (vector_out && c0 + kPerLane <= k) {
      *reinterpret_cast<uint32_t*>(out) = word;
    } else {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        if (c0 + i < k) out[i] = static_cast<uint8_t>(word >> (8 * i));
      }
    }
  }
}

bool Aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

template <typename T>
cudaError_t LaunchFp8ActQuant(const T* x, int64_t ldx, int64_t m, int64_t k, uint8_t* codes, int64_t ld_codes,
                              float* scales, int64_t scale_ld, bool programmatic, cudaStream_t stream) {
  if (m < 0 || k < 0) return cudaErrorInvalidValue;
  if (m == 0 || k == 0) return cudaSuccess;
  if (x == nullptr || codes == nullptr || scales == nullptr || scale_ld < m) return cudaErrorInvalidValue;
  if (m > 1 && (ldx < k || ld_codes < k)) return cudaErrorInvalidValue;
  // Vector accesses need every row's start aligned: the pointer, and the row stride when m > 1.
  const int64_t in_bytes = kPerLane * static_cast<int64_t>(sizeof(T));
  const bool vector_in = Aligned(x, in_bytes) && (m == 1 || (ldx * static_cast<int64_t>(sizeof(T))) % in_bytes == 0);
  const bool vector_out = Aligned(codes, kPerLane) && (m == 1 || ld_codes % kPerLane == 0);
  const int64_t warps = Fp8W8A8KBlocks(k) * m;
  const int64_t blocks = std::min((warps + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxBlocks);
  return LaunchKernel(programmatic, Fp8ActQuantKernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                      stream, x, ldx, m, k, codes, ld_codes, scales, scale_ld, vector_in, vector_out);
}

template cudaError_t LaunchFp8ActQuant<float>(const float*, int64_t, int64_t, int64_t, uint8_t*, int64_t, float*,
                                              int64_t, bool, cudaStream_t);
template cudaError_t LaunchFp8ActQuant<uint16_t>(const uint16_t*, int64_t, int64_t, int64_t, uint8_t*, int64_t,
                                                 float*, int64_t, bool, cudaStream_t);

}  // namespace eagle3::cuda
