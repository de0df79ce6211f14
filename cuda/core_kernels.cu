// Kernels of the CudaBackend's core ops (launchers: cuda/core_ops.h). Each mirrors the CPU
// reference's arithmetic (same operation order per element, fp32, IEEE division and sqrt) so that
// only reduction order differs. No abseil here: nvcc must never see it.
#include <math_constants.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core_kernels.cuh"
#include "core_ops.h"
#include "programmatic_launch.cuh"
#include "rms_norm_row.cuh"

namespace eagle3::cuda {
namespace {

constexpr int kThreads = 256;              // elementwise kernels and hidden-wide rows
constexpr int kRowThreads = 1024;          // vocabulary-wide rows: softmax, argmax, top-k
constexpr int64_t kMaxBlocks = 65535 * 8;  // grid-stride beyond this

unsigned GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// ---- Strided copy -------------------------------------------------------------------------------

struct StridedCopyParams {
  int rank;
  int64_t shape[kStridedCopyMaxRank];
  int64_t src_stride[kStridedCopyMaxRank];
  int64_t dst_stride[kStridedCopyMaxRank];
};

// Element e in row-major order of the shape, so consecutive threads walk the innermost dim.
template <typename T>
__global__ void StridedCopyKernel(const T* __restrict__ src, T* __restrict__ dst,
                                  StridedCopyParams p, int64_t n) {
  PdlEnter();
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = e;
    int64_t from = 0;
    int64_t to = 0;
#pragma unroll
    for (int d = kStridedCopyMaxRank - 1; d >= 0; --d) {
      if (d < p.rank) {
        const int64_t i = rest % p.shape[d];
        rest /= p.shape[d];
        from += i * p.src_stride[d];
        to += i * p.dst_stride[d];
      }
    }
    dst[to] = src[from];
  }
}

template <typename T>
cudaError_t StridedCopy(const void* src, void* dst, const StridedCopyParams& p, int64_t n,
                        bool programmatic, cudaStream_t stream) {
  return LaunchKernel(programmatic, StridedCopyKernel<T>, dim3(GridFor(n)), dim3(kThreads), 0,
                      stream, static_cast<const T*>(src), static_cast<T*>(dst), p, n);
}

// ---- GEMM completion ----------------------------------------------------------------------------

__global__ void ScaleAddBiasKernel(float* c, int64_t ldc, int64_t rows, int64_t cols, float beta,
                                   const float* __restrict__ bias) {
  PdlEnter();
  const int64_t n = rows * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / cols;
    const int64_t j = e - r * cols;
    float* p = c + r * ldc + j;
    const float scaled = beta == 0.0f ? 0.0f : beta * *p;  // beta == 0: never read c
    *p = bias != nullptr ? scaled + bias[j] : scaled;
  }
}

// ---- Row ops ------------------------------------------------------------------------------------

// Row blockIdx.x of one RmsNorm.
__global__ void __launch_bounds__(kNormMaxThreads) RmsNormKernel(NormOperands p, float eps) {
  PdlLaunchDependents();  // lets the weight-streaming GEMV after this one start early
  PdlWait();
  RmsNormRow(p, eps, blockIdx.x);
}

// Row blockIdx.x of half blockIdx.y: two RmsNorms in one launch.
__global__ void __launch_bounds__(kNormMaxThreads)
    RmsNormPairKernel(NormOperands p0, NormOperands p1, float eps) {
  PdlLaunchDependents();  // lets the weight-streaming GEMV after this one start early
  PdlWait();
  RmsNormRow(blockIdx.y == 0 ? p0 : p1, eps, blockIdx.x);
}

__global__ void SiluMulKernel(const float* __restrict__ gate_up, int64_t ldg,
                              float* __restrict__ out, int64_t ldo, int64_t rows, int64_t inter) {
  PdlLaunchDependents();  // lets the weight-streaming GEMV after this one start early
  PdlWait();
  const int64_t n = rows * inter;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / inter;
    const int64_t i = e - t * inter;
    const float gate = gate_up[t * ldg + i];
    const float up = gate_up[t * ldg + inter + i];
    out[t * ldo + i] = gate / (1.0f + expf(-gate)) * up;
  }
}

// One block per token.
// table holds f32, or bf16 bit patterns when `bf16` (a uniform branch: one instantiation per
// index type).
template <typename Index>
__global__ void EmbeddingKernel(const Index* __restrict__ ids, const void* __restrict__ table,
                                bool bf16, int64_t ldt, int64_t shard_rows, int64_t vocab_start,
                                float* __restrict__ out, int64_t ldo, int64_t hidden,
                                int* error_flag, int error_code) {
  PdlEnter();
  const int64_t t = blockIdx.x;
  const int64_t id = static_cast<int64_t>(ids[t]);
  if (id < 0 && threadIdx.x == 0) RecordDeviceError(error_flag, error_code, t);
  const int64_t local = id - vocab_start;
  const bool in_shard = id >= 0 && local >= 0 && local < shard_rows;
  const int64_t offset = (in_shard ? local : 0) * ldt;
  float* o = out + t * ldo;
  if (!in_shard) {
    for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) o[h] = 0.0f;
  } else if (bf16) {
    const uint16_t* row = static_cast<const uint16_t*>(table) + offset;
    for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
      o[h] = __uint_as_float(static_cast<uint32_t>(row[h]) << 16);
    }
  } else {
    const float* row = static_cast<const float*>(table) + offset;
    for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) o[h] = row[h];
  }
}

// One block per row: max (and the NaN / +inf check), sum of exponentials, normalized write.
__global__ void __launch_bounds__(kRowThreads)
    SoftmaxKernel(const float* logits, int64_t ldl, float temperature, float* out, int64_t ldo,
                  int64_t cols, int* error_flag, int error_code) {
  PdlEnter();
  const int64_t r = blockIdx.x;
  const float* x = logits + r * ldl;
  float* o = out + r * ldo;
  float max = -CUDART_INF_F;
  bool bad = false;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float v = x[i];
    bad |= isnan(v) || v == CUDART_INF_F;
    max = fmaxf(max, v);
  }
  bad = __syncthreads_or(bad);
  max = BlockMax(max);
  if (bad || max == -CUDART_INF_F) {
    if (threadIdx.x == 0) RecordDeviceError(error_flag, error_code, r);
    return;
  }
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) sum += expf((x[i] - max) / temperature);
  const float inv_sum = 1.0f / BlockSum(sum);
  // In place, each thread reads x[i] before writing o[i] at the same address.
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
    o[i] = expf((x[i] - max) / temperature) * inv_sum;
}

__device__ inline bool Better(float v, int64_t i, float best, int64_t best_i) {
  return v > best || (v == best && i < best_i);
}

// One block per row: each thread scans a strided slice, then a warp and a block reduction keep the
// larger value, ties to the lower index.
template <typename Index>
__global__ void __launch_bounds__(kRowThreads)
    ArgmaxKernel(const float* __restrict__ logits, int64_t ldl, int64_t cols,
                 Index* __restrict__ out, int* error_flag, int error_code) {
  PdlEnter();
  __shared__ float warp_best[32];
  __shared__ int64_t warp_best_i[32];
  const int64_t r = blockIdx.x;
  const float* x = logits + r * ldl;
  float best = -CUDART_INF_F;
  int64_t best_i = INT64_MAX;
  bool nan = false;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float v = x[i];
    if (isnan(v)) {
      nan = true;
    } else if (Better(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
  if (__syncthreads_or(nan)) {
    if (threadIdx.x == 0) RecordDeviceError(error_flag, error_code, r);
    return;
  }
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, offset);
    const int64_t i = __shfl_xor_sync(0xffffffffu, best_i, offset);
    if (Better(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
  if (lane == 0) {
    warp_best[warp] = best;
    warp_best_i[warp] = best_i;
  }
  __syncthreads();
  if (warp != 0) return;
  const bool live = lane < static_cast<int>(blockDim.x >> 5);
  best = live ? warp_best[lane] : -CUDART_INF_F;
  best_i = live ? warp_best_i[lane] : INT64_MAX;
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, offset);
    const int64_t i = __shfl_xor_sync(0xffffffffu, best_i, offset);
    if (Better(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
  if (lane == 0) out[r] = static_cast<Index>(best_i);
}

// One block per row:
//  1. radix select, 8 bits per pass from the top, finds the k-th largest key `prefix` and how many
//     keys equal to it belong to the top k (`remaining`; every larger key does);
//  2. an ordered pass (block-wide prefix sums) gathers the larger keys and the first `remaining`
//     equal keys by index into shared memory;
//  3. a bitonic sort there orders them by (key descending, index ascending).
template <typename Index>
__global__ void __launch_bounds__(kRowThreads)
    TopKKernel(const float* __restrict__ values, int64_t ldv, int64_t cols, int k,
               float* __restrict__ out_values, int64_t ldov, Index* __restrict__ out_indices,
               int64_t ldoi, int* error_flag, int error_code) {
  PdlEnter();
  __shared__ uint32_t histogram[256];
  __shared__ uint32_t keys[kTopKMaxK];
  __shared__ int indices[kTopKMaxK];
  __shared__ uint32_t chosen_prefix;
  __shared__ int chosen_remaining;
  const int64_t r = blockIdx.x;
  const float* x = values + r * ldv;

  uint32_t prefix = 0;
  uint32_t mask = 0;
  int remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) histogram[b] = 0;
    __syncthreads();
    bool nan = false;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      const float v = x[i];
      nan |= isnan(v);
      const uint32_t key = OrderedKey(v);
      if ((key & mask) == prefix) atomicAdd(&histogram[(key >> shift) & 255u], 1u);
    }
    if (__syncthreads_or(nan)) {
      if (threadIdx.x == 0) RecordDeviceError(error_flag, error_code, r);
      return;
    }
    if (threadIdx.x == 0) {
      uint32_t above = 0;  // keys under the prefix with a larger digit
      int digit = 255;
      for (; digit > 0; --digit) {
        if (above + histogram[digit] >= static_cast<uint32_t>(remaining)) break;
        above += histogram[digit];
      }
      chosen_prefix = prefix | (static_cast<uint32_t>(digit) << shift);
      chosen_remaining = remaining - static_cast<int>(above);
    }
    __syncthreads();
    prefix = chosen_prefix;
    remaining = chosen_remaining;
    mask |= 255u << shift;
  }

  const int greater = k - remaining;
  int greater_seen = 0;
  int equal_seen = 0;
  for (int64_t base = 0; base < cols; base += blockDim.x) {
    if (greater_seen == greater && equal_seen >= remaining) break;  // uniform: from scan totals
    const int64_t i = base + threadIdx.x;
    uint32_t key = 0;
    bool gt = false;
    bool eq = false;
    if (i < cols) {
      key = OrderedKey(x[i]);
      gt = key > prefix;
      eq = key == prefix;
    }
    if (!__syncthreads_or(gt || eq)) continue;
    int total = 0;
    const int before =
        BlockExclusiveScan((gt ? 1 : 0) | (eq ? 1 << 16 : 0), &total);  // <= 1024 each
    if (gt) {
      const int slot = greater_seen + (before & 0xffff);
      keys[slot] = key;
      indices[slot] = static_cast<int>(i);
    }
    if (eq) {
      const int e = equal_seen + (before >> 16);
      if (e < remaining) {
        keys[greater + e] = key;
        indices[greater + e] = static_cast<int>(i);
      }
    }
    greater_seen += total & 0xffff;
    equal_seen += total >> 16;
  }

  int padded = 1;
  while (padded < k) padded <<= 1;
  for (int j = k + threadIdx.x; j < padded; j += blockDim.x) {
    keys[j] = 0;  // below every real key (the smallest, -inf, is 0x007fffff)
    indices[j] = INT_MAX;
  }
  __syncthreads();
  for (int size = 2; size <= padded; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < padded; i += blockDim.x) {
        const int j = i ^ stride;
        if (j <= i) continue;
        const bool j_better = keys[j] > keys[i] || (keys[j] == keys[i] && indices[j] < indices[i]);
        if (j_better == ((i & size) == 0)) {  // best first in this half-block, else worst first
          const uint32_t key = keys[i];
          keys[i] = keys[j];
          keys[j] = key;
          const int index = indices[i];
          indices[i] = indices[j];
          indices[j] = index;
        }
      }
      __syncthreads();
    }
  }
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    const int i = indices[j];
    out_indices[r * ldoi + j] = static_cast<Index>(i);
    out_values[r * ldov + j] = x[i];  // the stored value itself (a -0 stays -0)
  }
}

template <typename Index>
cudaError_t EmbeddingLookup(const Index* ids, int64_t tokens, const void* table, bool bf16,
                            int64_t ldt, int64_t shard_rows, int64_t vocab_start, float* out,
                            int64_t ldo, int64_t hidden, int* error_flag, int error_code,
                            bool programmatic, cudaStream_t stream) {
  if (tokens < 0 || vocab_start < 0 || !ValidRowMatrix(table, ldt, shard_rows, hidden) ||
      !ValidRowMatrix(out, ldo, tokens, hidden) ||
      (tokens > 0 && (ids == nullptr || error_flag == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (tokens == 0) return cudaSuccess;
  return LaunchKernel(programmatic, EmbeddingKernel<Index>, dim3(static_cast<unsigned>(tokens)),
                      dim3(kThreads), 0, stream, ids, table, bf16, ldt, shard_rows, vocab_start, out,
                      ldo, hidden, error_flag, error_code);
}

template <typename Index>
cudaError_t Argmax(const float* logits, int64_t ldl, int64_t rows, int64_t cols, Index* out,
                   int* error_flag, int error_code, bool programmatic, cudaStream_t stream) {
  if (cols < 1 || !ValidRowMatrix(logits, ldl, rows, cols) ||
      (rows > 0 && (out == nullptr || error_flag == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  return LaunchKernel(programmatic, ArgmaxKernel<Index>, dim3(static_cast<unsigned>(rows)),
                      dim3(kRowThreads), 0, stream, logits, ldl, cols, out, error_flag, error_code);
}

template <typename Index>
cudaError_t TopK(const float* values, int64_t ldv, int64_t rows, int64_t cols, int k,
                 float* out_values, int64_t ldov, Index* out_indices, int64_t ldoi, int* error_flag,
                 int error_code, bool programmatic, cudaStream_t stream) {
  if (cols < 1 || cols > INT_MAX || k < 1 || k > cols || k > kTopKMaxK ||
      !ValidRowMatrix(values, ldv, rows, cols) || !ValidRowMatrix(out_values, ldov, rows, k) ||
      !ValidRowMatrix(out_indices, ldoi, rows, k) || (rows > 0 && error_flag == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  return LaunchKernel(programmatic, TopKKernel<Index>, dim3(static_cast<unsigned>(rows)),
                      dim3(kRowThreads), 0, stream, values, ldv, cols, k, out_values, ldov,
                      out_indices, ldoi, error_flag, error_code);
}

}  // namespace

cudaError_t LaunchStridedCopy(const void* src, const int64_t* src_strides, void* dst,
                              const int64_t* dst_strides, const int64_t* shape, int rank,
                              int element_size, bool programmatic, cudaStream_t stream) {
  if (rank < 0 || rank > kStridedCopyMaxRank ||
      (rank > 0 && (shape == nullptr || src_strides == nullptr || dst_strides == nullptr))) {
    return cudaErrorInvalidValue;
  }
  StridedCopyParams p{};
  p.rank = rank;
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) {
    if (shape[d] < 0 || src_strides[d] < 0 || dst_strides[d] < 0) return cudaErrorInvalidValue;
    p.shape[d] = shape[d];
    p.src_stride[d] = src_strides[d];
    p.dst_stride[d] = dst_strides[d];
    n *= shape[d];
  }
  if (n == 0) return cudaSuccess;
  if (src == nullptr || dst == nullptr) return cudaErrorInvalidValue;
  switch (element_size) {
    case 1:
      return StridedCopy<uint8_t>(src, dst, p, n, programmatic, stream);
    case 2:
      return StridedCopy<uint16_t>(src, dst, p, n, programmatic, stream);
    case 4:
      return StridedCopy<uint32_t>(src, dst, p, n, programmatic, stream);
    case 8:
      return StridedCopy<uint64_t>(src, dst, p, n, programmatic, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchScaleAddBias(float* c, int64_t ldc, int64_t rows, int64_t cols, float beta,
                               const float* bias, bool programmatic, cudaStream_t stream) {
  if (!ValidRowMatrix(c, ldc, rows, cols)) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  return LaunchKernel(programmatic, ScaleAddBiasKernel, dim3(GridFor(rows * cols)),
                      dim3(kThreads), 0, stream, c, ldc, rows, cols, beta, bias);
}

cudaError_t LaunchRmsNorm(const float* x, int64_t ldx, float* residual, int64_t ldr,
                          const float* weight, float eps, float* out, int64_t ldo, int64_t rows,
                          int64_t hidden, bool programmatic, cudaStream_t stream) {
  NormOperands p;
  if (!MakeNormOperands(x, ldx, residual, ldr, weight, out, ldo, rows, hidden, &p) || !(eps >= 0.0f)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0 || hidden == 0) return cudaSuccess;
  return LaunchKernel(programmatic, RmsNormKernel, dim3(static_cast<unsigned>(rows)),
                      dim3(static_cast<unsigned>(p.threads)), 0, stream, p, eps);
}

cudaError_t LaunchRmsNormPair(const float* x0, int64_t ldx0, const float* weight0, float* out0, int64_t ldo0,
                              int64_t hidden0, const float* x1, int64_t ldx1, const float* weight1, float* out1,
                              int64_t ldo1, int64_t hidden1, int64_t rows, float eps, bool programmatic,
                              cudaStream_t stream) {
  NormOperands p0;
  NormOperands p1;
  if (!MakeNormOperands(x0, ldx0, nullptr, 0, weight0, out0, ldo0, rows, hidden0, &p0) ||
      !MakeNormOperands(x1, ldx1, nullptr, 0, weight1, out1, ldo1, rows, hidden1, &p1) || !(eps >= 0.0f)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0 || (hidden0 == 0 && hidden1 == 0)) return cudaSuccess;
  // An empty half's blocks store nothing; the wider half sets the block size.
  return LaunchKernel(programmatic, RmsNormPairKernel, dim3(static_cast<unsigned>(rows), 2),
                      dim3(static_cast<unsigned>(std::max(p0.threads, p1.threads))), 0, stream, p0, p1, eps);
}

cudaError_t LaunchSiluMul(const float* gate_up, int64_t ldg, float* out, int64_t ldo, int64_t rows,
                          int64_t inter, bool programmatic, cudaStream_t stream) {
  if (inter < 0 || !ValidRowMatrix(gate_up, ldg, rows, 2 * inter) ||
      !ValidRowMatrix(out, ldo, rows, inter)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0 || inter == 0) return cudaSuccess;
  return LaunchKernel(programmatic, SiluMulKernel, dim3(GridFor(rows * inter)), dim3(kThreads), 0,
                      stream, gate_up, ldg, out, ldo, rows, inter);
}

template <typename T, typename IdType>
cudaError_t LaunchEmbeddingLookup(const IdType* ids, int64_t tokens, const T* table, int64_t ldt,
                                  int64_t shard_rows, int64_t vocab_start, float* out, int64_t ldo,
                                  int64_t hidden, int* error_flag, int error_code,
                                  bool programmatic, cudaStream_t stream) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, uint16_t>, "f32 or bf16 bits");
  return EmbeddingLookup(ids, tokens, table, std::is_same_v<T, uint16_t>, ldt, shard_rows,
                         vocab_start, out, ldo, hidden, error_flag, error_code, programmatic,
                         stream);
}
template cudaError_t LaunchEmbeddingLookup<float, int32_t>(const int32_t*, int64_t, const float*,
                                                            int64_t, int64_t, int64_t, float*,
                                                            int64_t, int64_t, int*, int,
                                                            bool, cudaStream_t);
template cudaError_t LaunchEmbeddingLookup<float, int64_t>(const int64_t*, int64_t, const float*,
                                                            int64_t, int64_t, int64_t, float*,
                                                            int64_t, int64_t, int*, int,
                                                            bool, cudaStream_t);
template cudaError_t LaunchEmbeddingLookup<uint16_t, int32_t>(const int32_t*, int64_t,
                                                               const uint16_t*, int64_t, int64_t,
                                                               int64_t, float*, int64_t, int64_t,
                                                               int*, int, bool, cudaStream_t);
template cudaError_t LaunchEmbeddingLookup<uint16_t, int64_t>(const int64_t*, int64_t,
                                                               const uint16_t*, int64_t, int64_t,
                                                               int64_t, float*, int64_t, int64_t,
                                                               int*, int, bool, cudaStream_t);

cudaError_t LaunchSoftmax(const float* logits, int64_t ldl, float temperature, float* out,
                          int64_t ldo, int64_t rows, int64_t cols, int* error_flag, int error_code,
                          bool programmatic, cudaStream_t stream) {
  if (cols < 1 || !ValidRowMatrix(logits, ldl, rows, cols) || !ValidRowMatrix(out, ldo, rows, cols) ||
      !(temperature > 0.0f) || !std::isfinite(temperature) || (rows > 0 && error_flag == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  return LaunchKernel(programmatic, SoftmaxKernel, dim3(static_cast<unsigned>(rows)),
                      dim3(kRowThreads), 0, stream, logits, ldl, temperature, out, ldo, cols,
                      error_flag, error_code);
}

template <typename IdType>
cudaError_t LaunchArgmax(const float* logits, int64_t ldl, int64_t rows, int64_t cols, IdType* out,
                         int* error_flag, int error_code, bool programmatic, cudaStream_t stream) {
  if (std::is_same_v<IdType, int32_t> && cols > INT32_MAX) return cudaErrorInvalidValue;
  return Argmax(logits, ldl, rows, cols, out, error_flag, error_code, programmatic, stream);
}
template cudaError_t LaunchArgmax<int32_t>(const float*, int64_t, int64_t, int64_t, int32_t*, int*,
                                           int, bool, cudaStream_t);
template cudaError_t LaunchArgmax<int64_t>(const float*, int64_t, int64_t, int64_t, int64_t*, int*,
                                           int, bool, cudaStream_t);

template <typename IdType>
cudaError_t LaunchTopK(const float* values, int64_t ldv, int64_t rows, int64_t cols, int k,
                       float* out_values, int64_t ldov, IdType* out_indices, int64_t ldoi,
                       int* error_flag, int error_code, bool programmatic, cudaStream_t stream) {
  return TopK(values, ldv, rows, cols, k, out_values, ldov, out_indices, ldoi, error_flag,
              error_code, programmatic, stream);
}
template cudaError_t LaunchTopK<int32_t>(const float*, int64_t, int64_t, int64_t, int, float*,
                                         int64_t, int32_t*, int64_t, int*, int, bool, cudaStream_t);
template cudaError_t LaunchTopK<int64_t>(const float*, int64_t, int64_t, int64_t, int, float*,
                                         int64_t, int64_t*, int64_t, int*, int, bool, cudaStream_t);

}  // namespace eagle3::cuda
