// Helpers the kernel files behind cuda/attention_ops.h share: launch geometry, the check kernels'
// flagging, the cache row of a paged position, the rotary pair and the cache element conversions.
// No abseil here: nvcc must never see it.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_bf16.h>

#include "core_kernels.cuh"

namespace eagle3::cuda {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items (n > 0); the loop covers what the cap leaves out.
inline unsigned GridFor(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::min<int64_t>(blocks, int64_t{1} << 16));
}

// Blocks for a loop with one block per row (rows > 0).
inline unsigned RowGrid(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 16));
}

// Marks the op's call bad (its writers then write nothing) and records the entry for Synchronize.
__device__ inline void Flag(int* bad, int* error_flag, int error_code, int64_t index) {
  *bad = 1;
  RecordDeviceError(error_flag, error_code, index);
}

// Cache row of sequence position `pos` (validated by the check kernels).
__device__ inline int64_t SlotOf(int64_t pos, const int32_t* __restrict__ page_table,
                                 int64_t page_size) {
  const int64_t page = NonNegativeDiv(pos, page_size);
  return static_cast<int64_t>(page_table[page]) * page_size + (pos - page * page_size);
}

// One rotary pair (a, b) by (cos c, sin s): (a c - b s, b c + a s), ApplyRope's rule; every kernel
// that rotates calls this one, so that they give the same bits.
__device__ __forceinline__ void RotatePair(float a, float b, float c, float s, float* out_a, float* out_b) {
  *out_a = a * c - b * s;
  *out_b = b * c + a * s;
}

// Cache elements: f32, or bf16 bit patterns (stored rounded to nearest even, read exactly).
__device__ inline float LoadCached(const float* p) { return *p; }
__device__ inline float LoadCached(const uint16_t* p) { return __uint_as_float(static_cast<unsigned>(*p) << 16); }
__device__ inline void StoreCached(float* p, float v) { *p = v; }
__device__ inline void StoreCached(uint16_t* p, float v) { *p = __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

}  // namespace eagle3::cuda
