// Device helpers shared by the CUDA backend's kernels: the device error flag protocol and
// block-wide reductions, an order-preserving float key, bf16 rounding, alignment. No abseil here:
// nvcc must never see it.
#pragma once

#include <cuda_bf16.h>
#include <math_constants.h>

#include <cstdint>

#include "core_ops.h"
// The inline-PTX wrappers (MmaBf16, cp.async, ...): included here too because gemv_kernels.cu and
// moe_grouped_kernels.cu reach MmaBf16 through this header.
#include "ptx.cuh"

namespace eagle3::cuda {

// Records a bad row / token in the backend's error flag (see cuda/core_ops.h). The first op
// to fail keeps the flag; another index of the same op replaces its own entry only when lower, so
// the op reports its lowest bad index, as the CPU reference does.
__device__ inline void RecordDeviceError(int* flag, int error_code, int64_t index) {
  const int64_t clamped =
      index < 0 ? 0 : (index > kDeviceErrorMaxIndex ? kDeviceErrorMaxIndex : index);
  const int code = error_code | static_cast<int>(clamped);
  int seen = atomicCAS(flag, 0, code);
  while (seen != 0 && (seen & ~kDeviceErrorMaxIndex) == error_code && code < seen) {
    const int previous = atomicCAS(flag, seen, code);
    if (previous == seen) return;
    seen = previous;
  }
}

// n / d for n >= 0, d >= 1, in 32 bits when both fit: a 64-bit division is a long subroutine on
// the GPU (dozens of instructions), a 32-bit one a few, and index math such as page lookups runs
// per key.
__device__ __forceinline__ int64_t NonNegativeDiv(int64_t n, int64_t d) {
  if (((n | d) >> 31) == 0) return static_cast<uint32_t>(n) / static_cast<uint32_t>(d);
  return n / d;
}

// Unsigned key with the order of the floats (NaN excluded); -0 maps like +0 so that they tie. Every
// non-NaN float, -inf included, maps above 0, which callers may use as "no candidate".
__device__ inline uint32_t OrderedKey(float v) {
  const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// v rounded to bf16 (nearest, ties to even) and widened back: the value a bf16 operand holds.
__device__ __forceinline__ float RoundToBf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// Whether p may be read with 16-byte vector loads or copies.
__device__ __forceinline__ bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

__device__ inline float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ inline float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Block-wide sum / max, returned to every thread. blockDim.x must be a multiple of 32 (<= 1024);
// every thread of the block must call it (it synchronizes).
__device__ inline float BlockSum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // an earlier call may still be reading partial
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? partial[lane] : 0.0f;
    v = WarpSum(v);
    if (lane == 0) partial[0] = v;
  }
  __syncthreads();
  return partial[0];
}

__device__ inline float BlockMax(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? partial[lane] : -CUDART_INF_F;
    v = WarpMax(v);
    if (lane == 0) partial[0] = v;
  }
  __syncthreads();
  return partial[0];
}

// Block-wide exclusive prefix sum of v in thread order; *total receives the sum over the block.
// Same calling rules as BlockSum.
__device__ inline int BlockExclusiveScan(int v, int* total) {
  __shared__ int warp_offsets[32];
  __shared__ int block_total;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = static_cast<int>(blockDim.x >> 5);
  int inclusive = v;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int up = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += up;
  }
  __syncthreads();  // an earlier call may still be reading warp_offsets / block_total
  if (lane == 31) warp_offsets[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int sum = lane < warps ? warp_offsets[lane] : 0;
    int scan = sum;
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int up = __shfl_up_sync(0xffffffffu, scan, offset);
      if (lane >= offset) scan += up;
    }
    if (lane < warps) warp_offsets[lane] = scan - sum;
    if (lane == 31) block_total = scan;
  }
  __syncthreads();
  *total = block_total;
  return warp_offsets[warp] + inclusive - v;
}

}  // namespace eagle3::cuda
