// Launchers for the CudaBackend's core ops: strided copy, GEMM bias, RMSNorm (+residual), SiLU-mul,
// embedding lookup, softmax, argmax and top-k. Raw pointers, stream last, cudaError_t out; no
// allocation; callable from any C++ compiler (no nvcc needed to include this header). The math
// matches the CPU reference (eagle3/cpu/cpu_backend.h) operation for operation, in fp32.
//
// Matrices are row-major and row-strided: element (r, c) of a matrix with leading dimension `ld`
// is at p[r * ld + c]; ld >= cols whenever rows > 1. A launcher returns cudaErrorInvalidValue for
// negative sizes, a missing pointer, or a parameter outside what it documents.
//
// Device error flag. Launchers that check data take `error_flag` (one device int, 0 = no error)
// and `error_code` (an op id shifted left by kDeviceErrorIndexBits). When a row or token is bad
// they store error_code | index (the index saturates at kDeviceErrorMaxIndex) with the rule of
// RecordDeviceError in cuda/core_kernels.cuh: the first op to fail is kept; within it, the lowest
// index. The host reads and clears the flag (CudaBackend::Synchronize).
//
// programmatic: the kernel is launched as a programmatic dependent of the kernel before it on
// `stream` (cuda/programmatic_launch.cuh; CudaBackendOptions::programmatic_launch): it waits for
// the earlier kernels before it touches memory, so results are the same either way.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace eagle3::cuda {

inline constexpr int kDeviceErrorIndexBits = 24;
inline constexpr int kDeviceErrorMaxIndex = (1 << kDeviceErrorIndexBits) - 1;

// Largest k that LaunchTopK accepts (the selection is sorted in shared memory).
inline constexpr int kTopKMaxK = 4096;

// Largest rank that LaunchStridedCopy accepts (Shape::kMaxRank).
inline constexpr int kStridedCopyMaxRank = 6;

// dst[i] = src[i] for every index i of `shape`; element offsets are sum_d i_d * stride_d (strides
// in elements, >= 0; a 0 stride broadcasts a source dim). Destination elements must be distinct and
// must not overlap the source.
// src:          [shape], elements of element_size bytes (1, 2, 4 or 8), device
// dst:          [shape], same element size, device
// shape, src_strides, dst_strides: host arrays of `rank` entries, 0 <= rank <= 6 (rank 0: one
// element)
cudaError_t LaunchStridedCopy(const void* src, const int64_t* src_strides, void* dst,
                              const int64_t* dst_strides, const int64_t* shape, int rank,
                              int element_size, bool programmatic, cudaStream_t stream);

// c[r][j] = beta * c[r][j] + bias[j], with beta == 0 meaning c is write-only (never read) and a
// null bias adding nothing. Completes a GEMM whose product is empty (K = 0) or adds a bias after
// one. c:    [rows, cols], f32, leading dimension ldc, device bias: [cols], f32, device, or nullptr
cudaError_t LaunchScaleAddBias(float* c, int64_t ldc, int64_t rows, int64_t cols, float beta,
                               const float* bias, bool programmatic, cudaStream_t stream);

// RMSNorm over each row, fp32: out = x * (1 / sqrt(mean(x^2) + eps)) * weight. With a residual,
// first residual += x and the norm reads the updated residual (AddRmsNorm).
// x:        [rows, hidden], f32, leading dimension ldx, device
// residual: [rows, hidden], f32, leading dimension ldr, device, in/out; nullptr for plain RmsNorm
// weight:   [hidden], f32, device
// out:      [rows, hidden], f32, leading dimension ldo, device; may be x itself (same ld), never
//           the residual or the weight
cudaError_t LaunchRmsNorm(const float* x, int64_t ldx, float* residual, int64_t ldr,
                          const float* weight, float eps, float* out, int64_t ldo, int64_t rows,
                          int64_t hidden, bool programmatic, cudaStream_t stream);

// Two RMSNorms over the same rows in one launch (RmsNormPair): out0 = RmsNorm(x0) * weight0 and
// out1 = RmsNorm(x1) * weight1, each half bit for bit as LaunchRmsNorm computes it alone.
// x0:      [rows, hidden0], f32, leading dimension ldx0, device
// weight0: [hidden0], f32, device
// out0:    [rows, hidden0], f32, leading dimension ldo0, device; may be x0 itself (same ld)
// x1, weight1, out1: the same with hidden1, ldx1, ldo1. No out shares an element with the other
// half's x, weight or out (column slices of the same rows may interleave).
cudaError_t LaunchRmsNormPair(const float* x0, int64_t ldx0, const float* weight0, float* out0, int64_t ldo0,
                              int64_t hidden0, const float* x1, int64_t ldx1, const float* weight1, float* out1,
                              int64_t ldo1, int64_t hidden1, int64_t rows, float eps, bool programmatic,
                              cudaStream_t stream);

// out[t][i] = silu(gate_up[t][i]) * gate_up[t][inter + i], silu(g) = g / (1 + exp(-g)).
// gate_up: [rows, 2 * inter], f32, leading dimension ldg, device
// out:     [rows, inter], f32, leading dimension ldo, device, no overlap with gate_up
cudaError_t LaunchSiluMul(const float* gate_up, int64_t ldg, float* out, int64_t ldo, int64_t rows,
                          int64_t inter, bool programmatic, cudaStream_t stream);

// Vocab-parallel embedding: out[t] = table[ids[t] - vocab_start] when 0 <= ids[t] - vocab_start <
// shard_rows, else zeros. A negative id writes zeros and records index t in the error flag.
// ids:   [tokens], IdType = int32_t or int64_t, device
// table: [shard_rows, hidden], T = float, or uint16_t holding bf16 bit patterns (widened exactly to
//        f32), leading dimension ldt, device
// out:   [tokens, hidden], f32, leading dimension ldo, device, no overlap with ids or table
template <typename T, typename IdType>
cudaError_t LaunchEmbeddingLookup(const IdType* ids, int64_t tokens, const T* table, int64_t ldt,
                                  int64_t shard_rows, int64_t vocab_start, float* out, int64_t ldo,
                                  int64_t hidden, int* error_flag, int error_code,
                                  bool programmatic, cudaStream_t stream);

// out[r] = softmax((logits[r] - max(logits[r])) / temperature), temperature > 0 and finite. A row
// holding NaN or +inf, or no finite logit, is left unwritten and its index recorded in the flag.
// logits: [rows, cols], f32, leading dimension ldl, device, cols >= 1
// out:    [rows, cols], f32, leading dimension ldo, device; may be logits itself (same ld)
cudaError_t LaunchSoftmax(const float* logits, int64_t ldl, float temperature, float* out,
                          int64_t ldo, int64_t rows, int64_t cols, int* error_flag, int error_code,
                          bool programmatic, cudaStream_t stream);

// out[r] = index of the largest logit of row r, ties to the lowest index. A row holding NaN is left
// unwritten and its index recorded in the flag.
// logits: [rows, cols], f32, leading dimension ldl, device, 1 <= cols (<= INT32_MAX for i32 out)
// out:    [rows], IdType = int32_t or int64_t, device
template <typename IdType>
cudaError_t LaunchArgmax(const float* logits, int64_t ldl, int64_t rows, int64_t cols, IdType* out,
                         int* error_flag, int error_code, bool programmatic, cudaStream_t stream);

// The k largest values of each row, best first, ties to the lowest index (-0 and +0 tie). A row
// holding NaN is left unwritten and its index recorded in the flag.
// values:      [rows, cols], f32, leading dimension ldv, device, 1 <= cols <= INT32_MAX
// k:           1 <= k <= min(cols, kTopKMaxK)
// out_values:  [rows, k], f32, leading dimension ldov, device
// out_indices: [rows, k], i32 or i64, leading dimension ldoi, device
template <typename IdType>
cudaError_t LaunchTopK(const float* values, int64_t ldv, int64_t rows, int64_t cols, int k,
                       float* out_values, int64_t ldov, IdType* out_indices, int64_t ldoi,
                       int* error_flag, int error_code, bool programmatic, cudaStream_t stream);

}  // namespace eagle3::cuda
