// CudaBackend::Gemm and BatchedGemm: c = alpha * a * b^T + beta * c + bias, row-major, row-strided.
//
// Up to kGemvMaxRows activation rows (decode steps) take the GEMV kernel of gemv_ops.h whenever the
// weight rows are 16-byte aligned: one launch that streams the weights once, rounds a f32 `a` to
// bf16 in registers for bf16 weights (no scratch, no conversion kernel) and applies alpha, beta and
// the bias itself, for a plain product and for every item of a batch alike. Everything else runs
// on cuBLASLt as follows.
//
// Types: a and b both f32, both bf16, or a f32 with b bf16 (bf16 weights, f32 activations); c and
// bias f32; accumulation in fp32 (CUBLAS_COMPUTE_32F: no TF32, so f32 inputs keep full precision
// and match the CPU reference). cuBLASLt has no f32 x bf16 matmul, so for the mixed case `a` is
// first rounded into a contiguous bf16 copy in backend-owned scratch (State::activation_scratch,
// LaunchF32ToBf16Rows) and the product runs as bf16 x bf16. The scratch grows when a larger `a`
// comes (refused while the stream is being captured: capture after one eager step); outgrown
// buffers stay allocated until the backend is destroyed, since a captured graph may read them.
// The bias is added by a small kernel after the matmul (one pass over c, whatever the pointers'
// alignment), and an empty product (K = 0) is that same kernel alone.
//
// GemmOptions::keep_f32_activations with `a` f32 and `b` bf16 (a MoE router kept in bf16): `a` is
// never rounded. Up to kGemvMaxRows rows the GEMV kernel multiplies it as stored
// (GemvActivations::kKeepF32: the f32 weights' GEMV of the same values at half the bytes). Other
// calls (more rows, weights off the GEMV's alignment, small_m_gemv off) widen `b` exactly into f32
// in the same scratch (its row stride kept: one conversion over the view's whole span) and run
// the f32 x f32 product: what the f32 weights gave, bit for bit, plus the conversion's pass. A
// BatchedGemm of such items that the GEMV does not take runs item by item (Backend::BatchedGemm).
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cublaslt_status.h"
#include "cuda_backend_state.h"
#include "cuda_status.h"
#include "convert.h"
#include "core_ops.h"
#include "eagle3/cuda/cuda_backend.h"
#include "gemv_ops.h"
#include "eagle3/status.h"

namespace eagle3::cuda {
namespace {

template <typename... Args>
absl::Status Invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat("Gemm: ", args...));
}

absl::Status LtError(cublasStatus_t status, const std::string& what) {
  return CublasLtStatus(status, absl::StrCat("Gemm: ", what));
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

// Scratch for `bytes` of `what` (a converted operand): the current buffer, or a new one at least
// twice its size (the old one is kept: see the file comment).
absl::StatusOr<void*> OperandScratch(CudaBackend::State& s, size_t bytes, const char* what) {
  if (!s.activation_scratch.empty() && s.activation_scratch.back().second >= bytes) {
    return s.activation_scratch.back().first;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  EAGLE3_RETURN_IF_ERROR(
      CudaStatus(cudaStreamIsCapturing(s.stream, &capture), "Gemm: cudaStreamIsCapturing"));
  const size_t have = s.activation_scratch.empty() ? 0 : s.activation_scratch.back().second;
  if (capture != cudaStreamCaptureStatusNone) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Gemm: ", what, " needs ", bytes, " bytes of scratch but ", have,
        " are allocated, and the stream is being captured into a CUDA graph (no allocation "
        "there); run the step once before capturing, or raise "
        "CudaBackendOptions::activation_scratch_bytes"));
  }
  const size_t grown = std::max(bytes, 2 * have);
  EAGLE3_ASSIGN_OR_RETURN(void* buffer, s.allocator.Allocate(grown, 256));
  s.activation_scratch.emplace_back(buffer, grown);
  return buffer;
}

// The storage types CudaBackend's products take (see the file comment).
absl::Status CheckTypes(const TensorView& a, const TensorView& b, const TensorView& c,
                        const GemmOptions& options) {
  const bool f32 = a.dtype() == DType::kF32 && b.dtype() == DType::kF32;
  const bool mixed = a.dtype() == DType::kF32 && b.dtype() == DType::kBF16;
  const bool bf16 = mixed || (a.dtype() == DType::kBF16 && b.dtype() == DType::kBF16);
  if (!f32 && !bf16) {
    return Invalid("a ", a.ToString(), " and b ", b.ToString(),
                   " must be both f32, both bf16, or a f32 with b bf16 on CudaBackend");
  }
  if (c.dtype() != DType::kF32) {
    return Invalid("c ", c.ToString(), " must be f32 on CudaBackend (outputs accumulate in fp32)");
  }
  if (options.bias != nullptr && options.bias->dtype() != DType::kF32) {
    return Invalid("bias ", options.bias->ToString(), " must be f32 on CudaBackend");
  }
  return absl::OkStatus();
}

// A strided batch of products (BatchedGemm): item i of each operand starts stride_* elements after
// item i - 1. count 1 is a plain Gemm.
struct Batch {
  int64_t count = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

GemvType GemvTypeOf(const TensorView& t) {
  return t.dtype() == DType::kBF16 ? GemvType::kBF16 : GemvType::kF32;
}

// Whether the product keeps a f32 `a` unrounded against bf16 weights (see the file comment).
bool KeepsF32Activations(const TensorView& a, const TensorView& b, const GemmOptions& options) {
  return options.keep_f32_activations && a.dtype() == DType::kF32 && b.dtype() == DType::kBF16;
}

// The GEMV path for checked operands (item 0 of `batch`, k > 0): whether it took the product (it
// leaves what it does not take, untouched, to cuBLASLt).
absl::StatusOr<bool> TryGemv(CudaBackend::State& s, const TensorView& a, const TensorView& b,
                             const TensorView& c, const GemmOptions& options, const Batch& batch,
                             const char* op) {
  const int64_t m = a.dim(0), n = b.dim(0), k = a.dim(1);
  if (!s.options.small_m_gemv || m > kGemvMaxRows || batch.count > 65535 ||
      !GemvWeightsAligned(b.data(), GemvTypeOf(b), LeadingDim(b), batch.stride_b, n, batch.count)) {
    return false;
  }
  const float* bias = options.bias != nullptr ? options.bias->data_as<const float>() : nullptr;
  const GemvActivations activations =
      KeepsF32Activations(a, b, options) ? GemvActivations::kKeepF32 : GemvActivations::kRoundToBf16;
  const cudaError_t error =
      LaunchGemv(a.data(), GemvTypeOf(a), LeadingDim(a), batch.stride_a, b.data(), GemvTypeOf(b),
                 LeadingDim(b), batch.stride_b, activations, c.data_as<float>(), LeadingDim(c),
                 batch.stride_c, bias, batch.count, m, n, k, options.alpha, options.beta,
                 s.options.programmatic_launch && options.b_is_weights, s.stream);
  if (error != cudaSuccess) return CudaStatus(error, absl::StrCat(op, ": GEMV kernel launch"));
  return true;
}

// The cuBLASLt product for checked operands of one storage type (both f32 or both bf16), m, n, k
// > 0; a, b, c are item 0 of `batch` (no bias when batch.count > 1).
absl::Status Matmul(CudaBackend::State& s, const TensorView& a, const TensorView& b,
                    const TensorView& c, const GemmOptions& options, const Batch& batch = {}) {
  const bool bf16 = a.dtype() == DType::kBF16;
  const int64_t m = a.dim(0);
  const int64_t n = b.dim(0);
  const int64_t k = a.dim(1);
  float* c_data = c.data_as<float>();
  const int64_t ldc = LeadingDim(c);
  const float* bias = options.bias != nullptr ? options.bias->data_as<const float>() : nullptr;

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
  if (batch.count > 1) {
    const int32_t count = static_cast<int32_t>(batch.count);
    const std::array<std::pair<cublasLtMatrixLayout_t, int64_t>, 3> strided = {{
        {&b_layout, batch.stride_b}, {&a_layout, batch.stride_a}, {&c_layout, batch.stride_c}}};
    for (const auto& [layout, stride] : strided) {
      EAGLE3_RETURN_IF_ERROR(LtCheck(cublasLtMatrixLayoutSetAttribute(
                                         layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
                                     "setting the batch count"));
      EAGLE3_RETURN_IF_ERROR(LtCheck(cublasLtMatrixLayoutSetAttribute(layout,
                                                                      CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                                      &stride, sizeof stride),
                                     "setting a batch stride"));
    }
  }

  // The heuristic is a host-side search worth tens of microseconds: run it once per problem
  // (shape, strides, types, pointer alignments, whether c is read).
  const uint64_t workspace_bytes = s.gemm_workspace != nullptr ? s.options.gemm_workspace_bytes : 0;
  // Every item's start must meet the alignment: item 0's address and the batch strides in bytes.
  const size_t ab_size = bf16 ? 2 : 4;
  auto aligned = [](const void* p, int64_t stride_bytes) {
    return std::min(AlignmentOf(p), AlignmentOf(reinterpret_cast<const void*>(stride_bytes)));
  };
  const uint32_t align_b = aligned(b.data(), batch.stride_b * static_cast<int64_t>(ab_size));
  const uint32_t align_a = aligned(a.data(), batch.stride_a * static_cast<int64_t>(ab_size));
  const uint32_t align_c = aligned(c_data, batch.stride_c * 4);
  const std::array<int64_t, 15> key = {batch.count,
                                       batch.stride_a,
                                       batch.stride_b,
                                       batch.stride_c,
                                       m,
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
  return CudaStatus(LaunchScaleAddBias(c_data, ldc, m, n, 1.0f, bias, s.options.programmatic_launch, s.stream),
                    "Gemm: bias kernel launch");
}

}  // namespace

absl::Status CudaBackend::Gemm(const TensorView& a, const TensorView& b, const TensorView& c,
                               const GemmOptions& options) {
  EAGLE3_RETURN_IF_ERROR(CheckGemm(a, b, c, options));
  EAGLE3_RETURN_IF_ERROR(CheckTypes(a, b, c, options));
  const bool mixed = a.dtype() == DType::kF32 && b.dtype() == DType::kBF16;
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
    return CudaStatus(LaunchScaleAddBias(c_data, ldc, m, n, options.beta, bias, s.options.programmatic_launch,
                                         s.stream),
                      "Gemm: bias kernel launch");
  }
  EAGLE3_ASSIGN_OR_RETURN(const bool gemv, TryGemv(s, a, b, c, options, Batch{}, "Gemm"));
  if (gemv) return absl::OkStatus();
  if (KeepsF32Activations(a, b, options)) {
    // b widened into f32 scratch with its own row stride (the gaps between rows, inside the view's
    // span, are converted too and never read), then the f32 x f32 product.
    const int64_t ldb = LeadingDim(b);
    const int64_t span = (n - 1) * ldb + k;
    EAGLE3_ASSIGN_OR_RETURN(void* scratch, OperandScratch(s, static_cast<size_t>(span) * sizeof(float),
                                                          "the f32 copy of bf16 weights"));
    EAGLE3_RETURN_IF_ERROR(CudaStatus(
        LaunchBf16ToF32(b.data_as<const uint16_t>(), static_cast<float*>(scratch), span,
                        s.options.programmatic_launch, s.stream),
        "Gemm: widening b to f32"));
    const TensorView b_f32(scratch, DType::kF32, Shape{n, k}, Shape{ldb, 1}, b.device());
    return Matmul(s, a, b_f32, c, options);
  }
  if (mixed) {  // a rounded to bf16 into contiguous scratch, then the bf16 x bf16 product
    EAGLE3_ASSIGN_OR_RETURN(void* scratch,
                            OperandScratch(s, static_cast<size_t>(m * k) * sizeof(uint16_t),
                                           "the bf16 copy of an f32 activation"));
    EAGLE3_RETURN_IF_ERROR(CudaStatus(
        LaunchF32ToBf16Rows(a.data_as<const float>(), LeadingDim(a),
                            static_cast<uint16_t*>(scratch), k, m, k, s.options.programmatic_launch,
                            s.stream),
        "Gemm: converting a to bf16"));
    const TensorView a_bf16(scratch, DType::kBF16, Shape{m, k}, a.device());
    return Matmul(s, a_bf16, b, c, options);
  }
  return Matmul(s, a, b, c, options);
}

absl::Status CudaBackend::BatchedGemm(const TensorView& a, const TensorView& b, const TensorView& c,
                                      const GemmOptions& options) {
  EAGLE3_RETURN_IF_ERROR(CheckBatchedGemm(a, b, c));
  const int64_t items = a.dim(0), m = a.dim(1), n = b.dim(1), k = a.dim(2);
  if (items == 0 || m == 0 || n == 0) return absl::OkStatus();
  if (items == 1 || k == 0) return Backend::BatchedGemm(a, b, c, options);
  // Every item shares item 0's shape, strides and dtypes: its checks are every item's, except
  // where the bias lies against the other items of c.
  const TensorView a0 = BatchItem(a, 0), b0 = BatchItem(b, 0), c0 = BatchItem(c, 0);
  EAGLE3_RETURN_IF_ERROR(CheckGemm(a0, b0, c0, options));
  EAGLE3_RETURN_IF_ERROR(CheckTypes(a0, b0, c0, options));
  if (options.bias != nullptr) {
    for (int64_t i = 1; i < items; ++i) {
      if (absl::Status st = CheckGemm(BatchItem(a, i), BatchItem(b, i), BatchItem(c, i), options);
          !st.ok()) {
        return absl::Status(st.code(), absl::StrCat("BatchedGemm item ", i, ": ", st.message()));
      }
    }
  }
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "BatchedGemm: cudaSetDevice"));
  Batch batch{items, a.stride(0), b.stride(0), c.stride(0)};
  EAGLE3_ASSIGN_OR_RETURN(const bool gemv, TryGemv(s, a0, b0, c0, options, batch, "BatchedGemm"));
  if (gemv) return absl::OkStatus();
  // cuBLASLt's batched product has no bias here, nor an unrounded f32 x bf16 product: the per-item
  // calls take those.
  if (options.bias != nullptr || KeepsF32Activations(a0, b0, options)) {
    return Backend::BatchedGemm(a, b, c, options);
  }
  if (a.dtype() == DType::kF32 && b.dtype() == DType::kBF16) {
    // Every item's activation rounded to bf16 in one pass, into contiguous [B, M, K] scratch.
    EAGLE3_ASSIGN_OR_RETURN(void* scratch,
                            OperandScratch(s, static_cast<size_t>(items * m * k) * sizeof(uint16_t),
                                           "the bf16 copy of an f32 activation"));
    EAGLE3_RETURN_IF_ERROR(CudaStatus(
        LaunchF32ToBf16Batched(a.data_as<const float>(), a.stride(0), a.stride(1),
                               static_cast<uint16_t*>(scratch), items, m, k,
                               s.options.programmatic_launch, s.stream),
        "BatchedGemm: converting a to bf16"));
    batch.stride_a = m * k;
    return Matmul(s, TensorView(scratch, DType::kBF16, Shape{m, k}, a.device()), b0, c0, options, batch);
  }
  return Matmul(s, a0, b0, c0, options, batch);
}

}  // namespace eagle3::cuda
