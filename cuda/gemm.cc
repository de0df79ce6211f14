// CudaBackend::Gemm on cuBLASLt: c = alpha * a * b^T + beta * c + bias, row-major, row-strided.
//
// Types: a and b both f32 or both bf16 (weights and activations in bf16), c and bias f32;
// accumulation in fp32 (CUBLAS_COMPUTE_32F: no TF32, so f32 inputs keep full precision and match
// the CPU reference). cuBLASLt has no f32 x bf16 matmul, so a bf16 b with an f32 a is refused: the
// caller converts a (LaunchF32ToBf16) or b. The bias is added by a small kernel after the matmul
// (one pass over c, whatever the pointers' alignment), and an empty product (K = 0) is that same
// kernel alone.
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cuda_backend_state.h"
#include "cuda_status.h"
#include "eagle3/cuda/core_ops.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/status.h"

namespace eagle3::cuda {
namespace {

template <typename... Args>
absl::Status Invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat("Gemm: ", args...));
}

absl::Status LtError(cublasStatus_t status, const std::string& what) {
  const std::string message = absl::StrCat("Gemm: ", what, ": ", cublasLtGetStatusName(status),
                                           " (", cublasLtGetStatusString(status), ")");
  switch (status) {
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(message);
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::UnimplementedError(message);
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

// Builds no string unless the call failed: Gemm runs many times per decode step.
absl::Status LtCheck(cublasStatus_t status, const char* what) {
  return status == CUBLAS_STATUS_SUCCESS ? absl::OkStatus() : LtError(status, what);
}

std::string Operands(const TensorView& a, const TensorView& b, const TensorView& c) {
  return absl::StrCat("a ", a.ToString(), ", b ", b.ToString(), ", c ", c.ToString());
}

// Leading dimension of a row-major [rows, cols] operand for cuBLASLt (>= cols even for one row,
// whose stride the Backend checks leave free).
int64_t LeadingDim(const TensorView& t) { return t.dim(0) > 1 ? t.stride(0) : t.dim(1); }

// Largest power of two (<= 256, cuBLASLt's default assumption) dividing the address.
uint32_t AlignmentOf(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lowest_bit = address & (~address + 1);
  return lowest_bit == 0 ? 256u : static_cast<uint32_t>(std::min<uintptr_t>(lowest_bit, 256));
}

}  // namespace

absl::Status CudaBackend::Gemm(const TensorView& a, const TensorView& b, const TensorView& c,
                               const GemmOptions& options) {
  EAGLE3_RETURN_IF_ERROR(CheckGemm(a, b, c, options));
  const bool f32 = a.dtype() == DType::kF32 && b.dtype() == DType::kF32;
  const bool bf16 = a.dtype() == DType::kBF16 && b.dtype() == DType::kBF16;
  if (!f32 && !bf16) {
    return Invalid(
        "a ", a.ToString(), " and b ", b.ToString(),
        " must be both f32 or both bf16 on CudaBackend (cuBLASLt has no mixed f32 x bf16 "
        "matmul; convert one side with LaunchF32ToBf16 / LaunchBf16ToF32)");
  }
  if (c.dtype() != DType::kF32) {
    return Invalid("c ", c.ToString(), " must be f32 on CudaBackend (outputs accumulate in fp32)");
  }
  if (options.bias != nullptr && options.bias->dtype() != DType::kF32) {
    return Invalid("bias ", options.bias->ToString(), " must be f32 on CudaBackend");
  }
  const int64_t m = a.dim(0);
  const int64_t n = b.dim(0);
  const int64_t k = a.dim(1);
  if (m == 0 || n == 0) return absl::OkStatus();
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "Gemm: cudaSetDevice"));
  float* c_data = c.data_as<float>();
  const int64_t ldc = LeadingDim(c);
  const float* bias = options.bias != nullptr ? options.bias->data_as<const float>() : nullptr;
  if (k == 0) {  // empty product: c = beta * c + bias
    return CudaStatus(LaunchScaleAddBias(c_data, ldc, m, n, options.beta, bias, s.stream),
                      "Gemm: bias kernel launch");
  }

  // Row-major c = a b^T is column-major c^T = b a^T: cuBLASLt's A is our b (column-major [K, N],
  // transposed), its B our a (column-major [K, M]), its C and D our c (column-major [N, M]).
  const cudaDataType_t ab_type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const int64_t lda = LeadingDim(a);
  const int64_t ldb = LeadingDim(b);
  cublasLtMatmulDescOpaque_t desc_storage;
  cublasLtMatmulDesc_t desc = &desc_storage;
  cublasLtMatrixLayoutOpaque_t b_layout, a_layout, c_layout;
  const cublasOperation_t transpose = CUBLAS_OP_T;
  const cublasOperation_t no_transpose = CUBLAS_OP_N;
  EAGLE3_RETURN_IF_ERROR(LtCheck(cublasLtMatmulDescInit(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                                 "cublasLtMatmulDescInit"));
  EAGLE3_RETURN_IF_ERROR(LtCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                                &transpose, sizeof transpose),
                                 "setting TRANSA"));
  EAGLE3_RETURN_IF_ERROR(LtCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                                &no_transpose, sizeof no_transpose),
                                 "setting TRANSB"));
  EAGLE3_RETURN_IF_ERROR(
      LtCheck(cublasLtMatrixLayoutInit(&b_layout, ab_type, k, n, ldb), "layout of b"));
  EAGLE3_RETURN_IF_ERROR(
      LtCheck(cublasLtMatrixLayoutInit(&a_layout, ab_type, k, m, lda), "layout of a"));
  EAGLE3_RETURN_IF_ERROR(
      LtCheck(cublasLtMatrixLayoutInit(&c_layout, CUDA_R_32F, n, m, ldc), "layout of c"));

  // The heuristic is a host-side search worth tens of microseconds: run it once per problem
  // (shape, strides, types, pointer alignments, whether c is read).
  const uint64_t workspace_bytes = s.gemm_workspace != nullptr ? s.options.gemm_workspace_bytes : 0;
  const uint32_t align_b = AlignmentOf(b.data());
  const uint32_t align_a = AlignmentOf(a.data());
  const uint32_t align_c = AlignmentOf(c_data);
  const std::array<int64_t, 11> key = {m,
                                       n,
                                       k,
                                       lda,
                                       ldb,
                                       ldc,
                                       bf16 ? 1 : 0,
                                       align_a,
                                       align_b,
                                       align_c,
                                       options.beta == 0.0f ? 0 : 1};
  auto found = s.gemm_algos.find(key);
  if (found == s.gemm_algos.end()) {
    cublasLtMatmulPreferenceOpaque_t preference_storage;
    cublasLtMatmulPreference_t preference = &preference_storage;
    EAGLE3_RETURN_IF_ERROR(
        LtCheck(cublasLtMatmulPreferenceInit(preference), "cublasLtMatmulPreferenceInit"));
    EAGLE3_RETURN_IF_ERROR(LtCheck(
        cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace_bytes, sizeof workspace_bytes),
        "setting the workspace size"));
    // cuBLASLt assumes 256-byte aligned operands unless told otherwise (views start anywhere).
    const std::array<std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t>, 4> alignments = {{
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c},
    }};
    for (const auto& [attribute, bytes] : alignments) {
      EAGLE3_RETURN_IF_ERROR(
          LtCheck(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &bytes, sizeof bytes),
                  "setting an operand alignment"));
    }
    cublasLtMatmulHeuristicResult_t result = {};
    int results = 0;
    if (const cublasStatus_t status =
            cublasLtMatmulAlgoGetHeuristic(s.lt, desc, &b_layout, &a_layout, &c_layout, &c_layout,
                                           preference, 1, &result, &results);
        status != CUBLAS_STATUS_SUCCESS) {
      return LtError(status, "cublasLtMatmulAlgoGetHeuristic for " + Operands(a, b, c));
    }
    if (results == 0) {
      return absl::UnimplementedError("Gemm: cuBLASLt has no algorithm for " + Operands(a, b, c));
    }
    found = s.gemm_algos.emplace(key, result.algo).first;
  }
  const float alpha = options.alpha;
  const float beta = options.beta;  // 0: cuBLASLt does not read c
  if (const cublasStatus_t status = cublasLtMatmul(
          s.lt, desc, &alpha, b.data(), &b_layout, a.data(), &a_layout, &beta, c_data, &c_layout,
          c_data, &c_layout, &found->second, s.gemm_workspace, workspace_bytes, s.stream);
      status != CUBLAS_STATUS_SUCCESS) {
    return LtError(status, "cublasLtMatmul for " + Operands(a, b, c));
  }
  if (bias == nullptr) return absl::OkStatus();
  return CudaStatus(LaunchScaleAddBias(c_data, ldc, m, n, 1.0f, bias, s.stream),
                    "Gemm: bias kernel launch");
}

}  // namespace eagle3::cuda
