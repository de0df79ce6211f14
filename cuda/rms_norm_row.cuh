// One RmsNorm row by one block (the device half of LaunchRmsNorm, cuda/core_ops.h), for the
// kernels that norm a row before more work on it: RmsNormKernel / RmsNormPairKernel
// (core_kernels.cu) and the latent rows kernel (latent_rows_kernels.cu), which then give the same
// bits. No abseil here: nvcc must never see it.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core_kernels.cuh"

namespace eagle3::cuda {

// Rows of a row-strided matrix: ld >= cols is needed only when there is more than one row.
inline bool ValidRowMatrix(const void* p, int64_t ld, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) return false;
  if (rows == 0 || cols == 0) return true;
  return p != nullptr && (rows == 1 || ld >= cols);
}

// One RmsNorm's operands (LaunchRmsNorm's arguments) and the way its rows are computed: one block
// per row, by the block's first `threads` threads (whole warps). A block may have more threads
// (RmsNormPair's narrower half): they add zeros to the block sum, which leaves the sum's bits as
// `threads` threads alone give them, so a row's result does not depend on the block it runs in.
// x and out may be the same memory (in-place), so neither is __restrict__.
struct NormOperands {
  const float* x;
  int64_t ldx;
  float* residual;  // nullptr for plain RmsNorm
  int64_t ldr;
  const float* weight;
  float* out;
  int64_t ldo;
  int64_t hidden;
  int threads;
  bool registers;  // RmsNormRegistersRow, else RmsNormLoopRow
};

// Rows of any width: each thread strides over the row.
__device__ inline void RmsNormLoopRow(const NormOperands& p, float eps, int64_t t) {
  const float* __restrict__ weight = p.weight;
  const float* xr = p.x + t * p.ldx;
  float* rr = p.residual != nullptr ? p.residual + t * p.ldr : nullptr;
  float* o = p.out + t * p.ldo;
  const int64_t first = static_cast<int>(threadIdx.x) < p.threads ? threadIdx.x : p.hidden;
  float sum = 0.0f;
  for (int64_t h = first; h < p.hidden; h += p.threads) {
    float v = xr[h];
    if (rr != nullptr) {
      v = rr[h] + v;
      rr[h] = v;  // read back below by this same thread
    }
    sum += v * v;
  }
  const float inv_rms = 1.0f / sqrtf(BlockSum(sum) / static_cast<float>(p.hidden) + eps);
  for (int64_t h = first; h < p.hidden; h += p.threads) {
    const float v = rr != nullptr ? rr[h] : xr[h];
    o[h] = v * inv_rms * weight[h];
  }
}

// Rows of at most threads * kNormPerThread elements (every model's hidden size): each thread
// keeps its kNormPerThread elements (h = threadIdx.x + i * threads) in registers, so all loads of
// the row are issued before the first store. RmsNormLoopRow's loops, whose loads may alias their
// stores (x, residual and out are not __restrict__), wait one memory latency per element per
// thread, one after another; here a thread's loads of the row are in flight together.
constexpr int kNormPerThread = 8;
constexpr int kNormMaxThreads = 1024;
constexpr int kNormLoopThreads = 256;  // RmsNormLoopRow's threads (rows too wide for registers)

// Thread threadIdx.x's elements h = threadIdx.x + i * threads of a row (0 past its end, and for
// the threads past `threads`).
__device__ inline void LoadRowSlice(const float* row, int64_t hidden, int threads,
                                    float (&out)[kNormPerThread]) {
  const int64_t end = static_cast<int>(threadIdx.x) < threads ? hidden : 0;
#pragma unroll
  for (int i = 0; i < kNormPerThread; ++i) {
    const int64_t h = threadIdx.x + static_cast<int64_t>(i) * threads;
    out[i] = h < end ? row[h] : 0.0f;
  }
}

__device__ inline void RmsNormRegistersRow(const NormOperands& p, float eps, int64_t t) {
  const int64_t end = static_cast<int>(threadIdx.x) < p.threads ? p.hidden : 0;  // 0: stores nothing
  float* rr = p.residual != nullptr ? p.residual + t * p.ldr : nullptr;
  float* o = p.out + t * p.ldo;
  float v[kNormPerThread];
  LoadRowSlice(p.x + t * p.ldx, p.hidden, p.threads, v);
  if (rr != nullptr) {
    float r[kNormPerThread];
    LoadRowSlice(rr, p.hidden, p.threads, r);
#pragma unroll
    for (int i = 0; i < kNormPerThread; ++i) {
      const int64_t h = threadIdx.x + static_cast<int64_t>(i) * p.threads;
      v[i] = r[i] + v[i];
      if (h < end) rr[h] = v[i];
    }
  }
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kNormPerThread; ++i) sum += v[i] * v[i];
  const float inv_rms = 1.0f / sqrtf(BlockSum(sum) / static_cast<float>(p.hidden) + eps);
  float w[kNormPerThread];
  LoadRowSlice(p.weight, p.hidden, p.threads, w);
#pragma unroll
  for (int i = 0; i < kNormPerThread; ++i) {
    const int64_t h = threadIdx.x + static_cast<int64_t>(i) * p.threads;
    if (h < end) o[h] = v[i] * inv_rms * w[i];
  }
}

__device__ inline void RmsNormRow(const NormOperands& p, float eps, int64_t t) {
  if (p.registers) {
    RmsNormRegistersRow(p, eps, t);
  } else {
    RmsNormLoopRow(p, eps, t);
  }
}

// The operands of one RmsNorm and the threads its rows take (LaunchRmsNorm's launch shape), or
// false for arguments the launcher cannot take.
inline bool MakeNormOperands(const float* x, int64_t ldx, float* residual, int64_t ldr, const float* weight,
                             float* out, int64_t ldo, int64_t rows, int64_t hidden, NormOperands* p) {
  if (!ValidRowMatrix(x, ldx, rows, hidden) || !ValidRowMatrix(out, ldo, rows, hidden) ||
      (residual != nullptr && !ValidRowMatrix(residual, ldr, rows, hidden)) ||
      (rows > 0 && hidden > 0 && weight == nullptr)) {
    return false;
  }
  const bool registers = hidden <= int64_t{kNormMaxThreads} * kNormPerThread;
  // Registers: whole warps, enough that kNormPerThread elements each cover the row.
  const int64_t threads =
      registers ? std::max<int64_t>(32, (hidden + kNormPerThread * 32 - 1) / (kNormPerThread * 32) * 32)
                : kNormLoopThreads;
  *p = {x, ldx, residual, ldr, weight, out, ldo, hidden, static_cast<int>(threads), registers};
  return true;
}

}  // namespace eagle3::cuda
