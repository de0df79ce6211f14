// Fp8W8A8Gemm (fp8_w8a8_gemm.h): one cuBLASLt matmul with block-scaled e4m3 operands.
//
// Row-major c = a w^T is column-major c^T = w a^T, as in gemm.cc: cuBLASLt's A is our w (column-major
// [K, N], transposed: the TN form Hopper's FP8 kernels require), its B our a (column-major [K, M]),
// its C and D our c (column-major [N, M]). A takes BLK128x128_32F (the weight's 128 x 128 blocks),
// B VEC128_32F (the activations' 1 x 128 groups): the pairing PyTorch's _scaled_mm passes for a
// DeepSeek-style linear layer. The descriptors are plain opaque structs set up per call (the scale
// pointers are attributes of the matmul descriptor, so it changes with every weight); only the
// heuristic's answer is cached.
#include "fp8_w8a8_gemm.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cublaslt_status.h"
#include "eagle3/status.h"

namespace eagle3::cuda {
namespace {

absl::Status Check(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return CublasLtStatus(status, absl::StrCat("QuantizedGemm (W8A8): ", what));
}

// Largest power of two (<= 256) dividing the address.
uint32_t AlignmentOf(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lowest_bit = address & (~address + 1);
  return lowest_bit == 0 ? 256u : static_cast<uint32_t>(std::min<uintptr_t>(lowest_bit, 256));
}

int64_t Ld(int64_t ld, int64_t rows, int64_t cols) { return rows > 1 ? ld : cols; }

struct Descriptors {
  cublasLtMatmulDescOpaque_t desc;
  cublasLtMatrixLayoutOpaque_t w_layout, a_layout, c_layout;
};

absl::Status Describe(const Fp8W8A8Operands& p, Descriptors& d) {
  const cublasOperation_t transpose = CUBLAS_OP_T, no_transpose = CUBLAS_OP_N;
  const int32_t w_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  cublasLtMatmulDesc_t desc = &d.desc;
  EAGLE3_RETURN_IF_ERROR(Check(cublasLtMatmulDescInit(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescInit"));
  EAGLE3_RETURN_IF_ERROR(Check(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose), "TRANSA"));
  EAGLE3_RETURN_IF_ERROR(Check(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &no_transpose, sizeof no_transpose), "TRANSB"));
  EAGLE3_RETURN_IF_ERROR(Check(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &w_mode, sizeof w_mode), "A scale mode"));
  EAGLE3_RETURN_IF_ERROR(Check(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &a_mode, sizeof a_mode), "B scale mode"));
  EAGLE3_RETURN_IF_ERROR(Check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &p.w_scales,
                                                              sizeof p.w_scales),
                               "A scale pointer"));
  EAGLE3_RETURN_IF_ERROR(Check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &p.a_scales,
                                                              sizeof p.a_scales),
                               "B scale pointer"));
  EAGLE3_RETURN_IF_ERROR(Check(cublasLtMatrixLayoutInit(&d.w_layout, CUDA_R_8F_E4M3, p.k, p.n, Ld(p.ldw, p.n, p.k)),
                               "layout of w"));
  EAGLE3_RETURN_IF_ERROR(Check(cublasLtMatrixLayoutInit(&d.a_layout, CUDA_R_8F_E4M3, p.k, p.m, Ld(p.lda, p.m, p.k)),
                               "layout of a"));
  return Check(cublasLtMatrixLayoutInit(&d.c_layout, CUDA_R_32F, p.n, p.m, Ld(p.ldc, p.m, p.n)), "layout of c");
}

}  // namespace

absl::StatusOr<const Fp8W8A8Gemm::Found*> Fp8W8A8Gemm::Find(cublasLtHandle_t lt, size_t workspace_bytes,
                                                           const Fp8W8A8Operands& p, bool reads_c) {
  const uint32_t align_w = AlignmentOf(p.w), align_a = AlignmentOf(p.a), align_c = AlignmentOf(p.c);
  const Key key = {p.m,    p.n,     p.k,     Ld(p.lda, p.m, p.k), Ld(p.ldw, p.n, p.k), Ld(p.ldc, p.m, p.n),
                   align_a, align_w, align_c, std::min(AlignmentOf(p.a_scales), AlignmentOf(p.w_scales)),
                   reads_c ? 1 : 0};
  auto found = algos_.find(key);
  if (found != algos_.end()) return &found->second;
  Descriptors d;
  EAGLE3_RETURN_IF_ERROR(Describe(p, d));
  cublasLtMatmulPreferenceOpaque_t preference_storage;
  cublasLtMatmulPreference_t preference = &preference_storage;
  EAGLE3_RETURN_IF_ERROR(Check(cublasLtMatmulPreferenceInit(preference), "cublasLtMatmulPreferenceInit"));
  const uint64_t workspace = workspace_bytes;
  EAGLE3_RETURN_IF_ERROR(Check(cublasLtMatmulPreferenceSetAttribute(
                                   preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace),
                               "workspace size"));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_w},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c},
  };
  for (const auto& [attribute, bytes] : alignments) {
    EAGLE3_RETURN_IF_ERROR(
        Check(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &bytes, sizeof bytes), "operand alignment"));
  }
  cublasLtMatmulHeuristicResult_t result = {};
  int results = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(lt, &d.desc, &d.w_layout, &d.a_layout, &d.c_layout,
                                                                &d.c_layout, preference, 1, &result, &results);
  Found entry;
  if (status == CUBLAS_STATUS_SUCCESS && results > 0) {
    entry.ok = true;
    entry.algo = result.algo;
  } else if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED) {
    return Check(status, "cublasLtMatmulAlgoGetHeuristic");
  }
  return &algos_.emplace(key, entry).first->second;
}

absl::StatusOr<bool> Fp8W8A8Gemm::Available(cublasLtHandle_t lt, size_t workspace_bytes, const Fp8W8A8Operands& p,
                                            bool reads_c) {
  EAGLE3_ASSIGN_OR_RETURN(const Found* found, Find(lt, workspace_bytes, p, reads_c));
  return found->ok;
}

absl::Status Fp8W8A8Gemm::Run(cublasLtHandle_t lt, void* workspace, size_t workspace_bytes, const Fp8W8A8Operands& p,
                              float alpha, float beta, cudaStream_t stream) {
  EAGLE3_ASSIGN_OR_RETURN(const Found* found, Find(lt, workspace_bytes, p, beta != 0.0f));
  if (!found->ok) {
    return absl::UnimplementedError(absl::StrCat(
        "QuantizedGemm (W8A8): cuBLASLt has no block-scaled FP8 algorithm for M ", p.m, ", N ", p.n, ", K ", p.k));
  }
  Descriptors d;
  EAGLE3_RETURN_IF_ERROR(Describe(p, d));
  return Check(cublasLtMatmul(lt, &d.desc, &alpha, p.w, &d.w_layout, p.a, &d.a_layout, &beta, p.c, &d.c_layout, p.c,
                              &d.c_layout, &found->algo, workspace, workspace_bytes, stream),
               "cublasLtMatmul");
}

}  // namespace eagle3::cuda
