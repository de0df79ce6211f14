// Launcher for the small-M product behind CudaBackend::Gemm and BatchedGemm (decode steps: a few
// activation rows against a large weight matrix). Raw pointers, stream last, cudaError_t out; no
// allocation, no host synchronization (capturable); callable from any C++ compiler (no nvcc needed
// to include this header). Semantics are Gemm's (eagle3/backend.h):
//   c = alpha * a b^T + beta * c + bias      (beta == 0: c is never read)
// with the bias added last (cuBLASLt's epilogue order). Weights are streamed once with 16-byte
// loads, the activation rows are staged in shared memory (rounded to bf16 there when the weights are
// bf16 and `a` is f32 under GemvActivations::kRoundToBf16, exactly as the cuBLASLt path's
// conversion rounds them; kept f32 under kKeepF32), and products accumulate in fp32 in a fixed
// order: same result every run, and only the fp32 summation order differs from the cuBLASLt path.
// Row strides and batch strides are in elements.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace eagle3::cuda {

// Most activation rows the GEMV path takes: with bf16 weights and rounded activations, 2 to 8 rows
// run on the tensor cores as one m16n8k16 tile of activation rows (one row, f32 weights, and f32
// activations kept f32, on CUDA cores: each weight element feeds M fp32 FMAs, which past a few rows
// stops the kernel being bandwidth-bound). Beyond 8 rows cuBLASLt's tiles are the better product.
inline constexpr int64_t kGemvMaxRows = 8;

// Storage type of a GEMV operand.
enum class GemvType : int {
  kF32 = 0,   // float
  kBF16 = 1,  // bf16 bit patterns (uint16_t)
};

// How f32 activations meet bf16 weights (GemmOptions::keep_f32_activations selects kKeepF32).
// With f32 weights either value gives the same product.
enum class GemvActivations : int {
  // `a` rounded to bf16 (round to nearest, ties to even) before it is multiplied, as cuBLASLt's
  // bf16 product takes it; 2 to kGemvMaxRows rows run on the tensor cores.
  kRoundToBf16 = 0,
  // `a` kept f32 (f32 activations only): each product is a times the weight widened to f32 (exact),
  // in fp32, on the CUDA cores at every row count. The result is the f32-weight GEMV's of the same
  // values at half the weight bytes: the f32 path's summation order rules (each lane's chunks in
  // order, the lanes of a row by an xor butterfly, warps in order, cluster ranks in rank order) and
  // its K split for the shape (GemvKSplit), only the chunk width (8 weights, not 4) differing.
  kKeepF32 = 1,
};

// Whether LaunchGemv takes weights stored like this: every weight row of every item must start on
// a 16-byte boundary (b itself, the row stride when n > 1 and the item stride when batch > 1, in
// bytes). `a` and `c` may start anywhere.
inline bool GemvWeightsAligned(const void* b, GemvType b_type, int64_t ldb, int64_t batch_stride_b,
                               int64_t n, int64_t batch) {
  const int64_t size = b_type == GemvType::kBF16 ? 2 : 4;
  return reinterpret_cast<uintptr_t>(b) % 16 == 0 && (n <= 1 || (ldb * size) % 16 == 0) &&
         (batch <= 1 || (batch_stride_b * size) % 16 == 0);
}

// For each item i < batch: c_i = alpha * a_i b_i^T + beta * c_i + bias, where x_i starts
// i * batch_stride_x elements after x. fp32 accumulation; with b bf16 and a f32, a is rounded to
// bf16 (round to nearest, ties to even) before it is multiplied under kRoundToBf16 and taken as
// stored under kKeepF32 (GemvActivations); f32 x f32 is full fp32 (no TF32).
// a:    [batch, m, k], a_type (f32, or bf16 with b bf16 under kRoundToBf16), row stride lda >= k
//       (any when m == 1), item stride batch_stride_a >= 0, device, any alignment
// b:    [batch, n, k], b_type, row stride ldb >= k (any when n == 1), item stride batch_stride_b
//       >= 0, device; GemvWeightsAligned must hold
// activations: how a f32 `a` meets bf16 weights (GemvActivations)
// c:    [batch, m, n], f32, row stride ldc >= n (any when m == 1), item stride batch_stride_c,
//       device, any alignment; items and rows must not overlap one another, a, b or bias
// bias: [n], f32, device, added to every row of every item; nullptr for none
// 1 <= m <= kGemvMaxRows, n >= 1, k >= 1, 1 <= batch <= 65535; alpha and beta finite.
// programmatic: b and bias are not written by any work enqueued on `stream` before this call
// (weights): the kernel is launched as a programmatic dependent (programmatic_launch.cuh) and
// starts streaming b while that work drains; a and c are touched only after it has completed.
// Returns cudaErrorInvalidValue for sizes or strides outside this, a missing pointer, f32 weights
// with bf16 activations, bf16 activations under kKeepF32, or misaligned weights.
cudaError_t LaunchGemv(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a,
                       const void* b, GemvType b_type, int64_t ldb, int64_t batch_stride_b,
                       GemvActivations activations, float* c, int64_t ldc, int64_t batch_stride_c,
                       const float* bias, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                       float beta, bool programmatic, cudaStream_t stream);

// The K split LaunchGemv uses for these sizes (f32 activations under kKeepF32) on a device of
// sm_count multiprocessors: how many blocks of a thread-block cluster share each weight row's K (1:
// none; always 1 on the tensor-core path, bf16 weights with 2 or more rows under kRoundToBf16). A
// few rows over a long K (a MoE router) split so that the grid fills the GPU; the rank sums add in
// rank order, so results stay deterministic, but differ in fp32 rounding from an unsplit product.
// bf16 weights under kKeepF32 split as f32 weights of the same shape do. Sizes outside
// LaunchGemv's contract: 1.
int GemvKSplit(GemvType b_type, GemvActivations activations, int64_t m, int64_t n, int64_t k,
               int64_t batch, int sm_count);

}  // namespace eagle3::cuda
