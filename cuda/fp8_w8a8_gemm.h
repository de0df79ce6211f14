// The W8A8 FP8 product on cuBLASLt's block-scaled FP8 kernels (Hopper, cuBLAS >= 12.9): e4m3
// activations with one f32 scale per row per 128 columns (act_quant_ops.h) times e4m3 weights with
// one f32 scale per 128 x 128 block (a DeepSeek-V3 checkpoint's weight_scale_inv), products on the
// FP8 tensor cores, each 128-deep partial sum scaled by its two scales and accumulated in fp32. The
// layouts the scales must have are in fp8_w8a8_layout.h. Host code (the CudaBackend op files).
//
//   c = alpha * (A_q * sa) (W_q * sw)^T + beta * c     (beta == 0: c is never read)
//
// No bias (cuBLASLt has no f32-output bias in this mode: the caller adds it), no fast accumulation
// (cuBLASLt refuses it with block scales).
#pragma once

#include <array>
#include <cstdint>
#include <map>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace eagle3::cuda {

// One product's operands, all on the device.
struct Fp8W8A8Operands {
  int64_t m = 0, n = 0, k = 0;  // >= 1
  // [m, k] e4m3 activation codes, row stride lda (bytes, >= k; any when m == 1).
  const uint8_t* a = nullptr;
  int64_t lda = 0;
  // The activations' scales in the VEC128_32F layout: Fp8ActScaleCount(m, k) f32.
  const float* a_scales = nullptr;
  // [n, k] e4m3 weight codes, row stride ldw (bytes, >= k; any when n == 1).
  const uint8_t* w = nullptr;
  int64_t ldw = 0;
  // The weights' scales in the BLK128x128_32F layout: Fp8WeightScaleCount(n, k) f32.
  const float* w_scales = nullptr;
  // [m, n] f32 output, row stride ldc (>= n; any when m == 1).
  float* c = nullptr;
  int64_t ldc = 0;
};

// The cuBLASLt algorithm per problem, chosen once by the heuristic (a host-side search worth tens
// of microseconds) and kept for the backend's life; a problem cuBLASLt has no algorithm for is
// remembered as such.
class Fp8W8A8Gemm {
 public:
  // Whether cuBLASLt runs the product of `p` (the shape, strides, pointer alignments and whether c
  // is read: beta != 0), asking its heuristic once per such problem. Launches nothing.
  // Errors: cuBLASLt's, other than "not supported".
  absl::StatusOr<bool> Available(cublasLtHandle_t lt, size_t workspace_bytes, const Fp8W8A8Operands& p, bool reads_c);

  // Enqueues the product on `stream`. Unimplemented when Available(...) is false for it.
  absl::Status Run(cublasLtHandle_t lt, void* workspace, size_t workspace_bytes, const Fp8W8A8Operands& p,
                   float alpha, float beta, cudaStream_t stream);

 private:
  using Key = std::array<int64_t, 11>;
  struct Found {
    bool ok = false;
    cublasLtMatmulAlgo_t algo{};
  };
  absl::StatusOr<const Found*> Find(cublasLtHandle_t lt, size_t workspace_bytes, const Fp8W8A8Operands& p,
                                    bool reads_c);

  std::map<Key, Found> algos_;
};

}  // namespace eagle3::cuda
