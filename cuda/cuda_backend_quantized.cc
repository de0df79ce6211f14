// CudaBackend::QuantizedGemm: c = alpha * a W^T + beta * c + bias with W an FP8 block-scaled or
// INT4 group weight kept in its stored form in device memory (eagle3/quantized_weight_view.h).
//
// Paths:
//  - Up to CudaBackendOptions::quantized_gemv_max_rows activation rows (decode and tree-verify
//    steps), on the launchers' layout: the quantized GEMV kernels of quant_gemv_ops.h, which stream
//    the stored bytes. A kernel pass takes at most kQuantGemvMaxRows = 32 rows (each weight widened
//    once for all of them), so M <= 32 is one launch, and a larger M one batched launch over its
//    full 32-row chunks (the items share the weights: item stride 0, so they read the same bytes,
//    mostly from L2, but widen them again) plus one launch for the remaining rows. The launchers'
//    layout: FP8 in 128 x 128 blocks with the slice's column offset a multiple of 16, INT4 groups of
//    a power of two >= 32 with the column offset a multiple of 8, and codes rows on 16-byte
//    boundaries (LoadLinearWeight lays out hub checkpoints and their TP slices so).
//  - Otherwise (prefill; views off that layout): W dequantized into a bf16 scratch [N, K]
//    (quant_dequant_ops.h), then Gemm on it (cuBLASLt; the bf16 GEMV for M <= kGemvMaxRows). The
//    GEMV path re-streams the quantized bytes once per 32 rows, the dequantized one writes and
//    re-reads 2 bytes per weight once: the bound between them (default 64, a tree-verify step's
//    rows) is a CudaBackendOptions field so that benchmarks/cuda/quantized_gemm_benchmark.cc can
//    place it.
//  - W8A8, for FP8 calls of at least CudaBackendOptions::fp8_w8a8_min_rows rows (0, the default:
//    never), a multiple of 4 rows (Fp8W8A8RowsTaken), whose slice the path takes (fp8_w8a8_layout.h:
//    128 x 128 blocks, the slice on block boundaries, K a multiple of 128, N of 16) and whose shape
//    cuBLASLt's heuristic has a kernel for;
//    it is tried first, and a call it does not take goes on to the paths above. `a` is quantized
//    into the scratch as DeepSeek's kernels quantize activations (act_quant_ops.h: e4m3 codes, one
//    f32 scale per row per 128 columns), the weight's scale blocks are copied into cuBLASLt's
//    layout where the checkpoint's rows are not already in it (column slices), and cuBLASLt's
//    block-scaled FP8 product (fp8_w8a8_gemm.h) writes c; the bias follows in a small kernel.
// Codes may be row-major or in warp-step tiles (QuantCodesLayout::kWarpTiles, which loads give the
// weights the GEMV path takes: CudaBackend::tiles_gemm_codes): the GEMV kernels stream tiles as
// whole 1 KiB blocks, the dequantizing kernels read them through QuantTileOffset, the W8A8 path
// takes row-major codes only; the results are the same bits either way.
// With b_is_weights, the GEMV launches start streaming the weights early (programmatic dependent
// launch), as Gemm's GEMV does; the dequantization kernel does not, since it writes the scratch,
// which the previous dequantized product may still be reading.
//
// Numerics against the CPU reference (exact f32 weights, f32 activations): `a` is rounded to bf16
// on the GEMV and dequantized paths, as the bf16-weight Gemm rounds it. Weights enter exactly on
// the GEMV path (exact code x bf16 products, each FP8 128-column block's or INT4 32-column group's
// fp32 sum times its scale) and as bf16(code * scale) on the dequantized path (INT4's q * a bf16
// scale has up to 11 significant bits). Accumulation is fp32 everywhere. The W8A8 path rounds
// `a` further, to e4m3 with a per-128-column scale (3 mantissa bits: relative rounding up to 2^-4 per
// element, 2% to 4% RMS depending on where a value falls in its binade, which random signs carry
// into each result as about that fraction of its magnitude), and multiplies the exact FP8 weights; its
// 128-deep partial sums come from the FP8 tensor cores, whose accumulator keeps fewer bits than
// fp32 (DeepSeek-V3's report, section 3.3.2), before they are scaled and summed in fp32.
//
// Scratch (State::dequant_scratch, which also holds the W8A8 path's e4m3 activations, their scales
// and copied weight scales): allocated at the first call that dequantizes, grown (at least
// doubling) when a larger weight comes, outgrown buffers kept until the backend is destroyed since
// a captured graph may still read them. Growing is refused while the stream is being captured
// (FailedPrecondition: run the shapes once before capturing); GEMV-path calls never touch it, so
// captured decode and verify steps of up to quantized_gemv_max_rows rows need none.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "act_quant_ops.h"
#include "core_ops.h"
#include "cuda_backend_checks.h"
#include "cuda_backend_state.h"
#include "cuda_status.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/detail/int4_packing.h"
#include "eagle3/status.h"
#include "fp8_w8a8_gemm.h"
#include "fp8_w8a8_layout.h"
#include "quant_dequant_ops.h"
#include "quant_gemv_ops.h"
#include "quant_tile_ops.h"

namespace eagle3::cuda {
namespace {

constexpr const char* kOp = "QuantizedGemm";
// Largest column offset and K the quantized GEMV launchers take.
constexpr int64_t kMaxGemvColumn = int64_t{1} << 29;

struct DequantScratch {
  explicit DequantScratch(DeviceAllocator* allocator) : allocator(allocator) {}
  ~DequantScratch() {
    for (const auto& [buffer, bytes] : buffers) allocator->Deallocate(buffer, bytes);
  }
  DequantScratch(const DequantScratch&) = delete;
  DequantScratch& operator=(const DequantScratch&) = delete;

  DeviceAllocator* allocator;  // State::allocator, which outlives this
  std::vector<std::pair<void*, size_t>> buffers;  // the current (largest) last
};

// `bytes` of the scratch (see the file comment); `what` names the copy it holds, for the message.
absl::StatusOr<void*> ScratchBuffer(CudaBackend::State& s, size_t bytes, const char* what) {
  if (!s.dequant_scratch) s.dequant_scratch = std::make_shared<DequantScratch>(&s.allocator);
  auto& scratch = *static_cast<DequantScratch*>(s.dequant_scratch.get());
  const size_t have = scratch.buffers.empty() ? 0 : scratch.buffers.back().second;
  if (have >= bytes) return scratch.buffers.back().first;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  EAGLE3_RETURN_IF_ERROR(
      CudaStatus(cudaStreamIsCapturing(s.stream, &capture), "QuantizedGemm: cudaStreamIsCapturing"));
  if (capture != cudaStreamCaptureStatusNone) {
    return absl::FailedPreconditionError(absl::StrCat(
        "QuantizedGemm: ", what, " needs ", bytes, " bytes of scratch but ", have,
        " are allocated, and the stream is being captured into a CUDA graph (no allocation there); run the "
        "step once before capturing"));
  }
  const size_t grown = std::max(bytes, 2 * have);
  EAGLE3_ASSIGN_OR_RETURN(void* buffer, s.allocator.Allocate(grown, 256));
  scratch.buffers.emplace_back(buffer, grown);
  return buffer;
}

// Leading dimension of a row-strided [rows, cols] view (any stride is allowed for one row).
int64_t LeadingDim(const TensorView& t) { return t.dim(0) > 1 ? t.stride(0) : t.dim(1); }

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// w's column offset from the first column of its scale tensor's first block: the col0 the
// launchers take (they index scales from the pointer they are given).
int64_t LocalCol0(const QuantizedWeightView& w) { return w.col0 - w.scale_col0 * w.block_cols; }
int64_t LocalRow0(const QuantizedWeightView& w) { return w.row0 - w.scale_row0 * w.block_rows; }

// Scale (i, 0) of w's scale tensor, as bytes.
const char* ScaleRow(const QuantizedWeightView& w, int64_t i) {
  return static_cast<const char*>(w.scales.data()) +
         i * w.scales.stride(0) * static_cast<int64_t>(DTypeSize(w.scales.dtype()));
}

// Whether the quantized GEMV launchers take the slice w describes, wherever its codes lie: the
// scale blocks or groups, the column offset and the sizes (see the file comment).
bool SliceOnGemvLayout(const QuantizedWeightView& w) {
  if (w.k > kMaxGemvColumn || LocalCol0(w) > kMaxGemvColumn) return false;
  if (w.format == WeightFormat::kFp8Block) {
    return w.block_rows == kFp8ScaleBlock && w.block_cols == kFp8ScaleBlock && LocalCol0(w) % 16 == 0;
  }
  const int64_t group = w.block_cols;
  return group >= 32 && group <= (int64_t{1} << 30) && (group & (group - 1)) == 0 && w.col0 % kInt4PerWord == 0;
}

// Whether the quantized GEMV launchers take w as it lies: its slice, and its codes on 16-byte
// boundaries (rows of fp8 codes a multiple of 16 bytes apart, of int4 words a multiple of 4 words).
bool GemvLayout(const QuantizedWeightView& w) {
  if (!Aligned16(w.codes.data()) || !SliceOnGemvLayout(w)) return false;
  const int64_t row_multiple = w.format == WeightFormat::kFp8Block ? 16 : 4;
  return w.rows() <= 1 || w.codes.stride(0) % row_multiple == 0;
}

// The GEMV path for checked operands with m, n, k > 0 on the launchers' layout: the rows in chunks of
// kQuantGemvMaxRows (all full chunks in one batched launch, then the rest).
absl::Status GemvProduct(CudaBackend::State& s, const TensorView& a, const QuantizedWeightView& w,
                         const TensorView& c, const GemmOptions& options) {
  const int64_t m = a.dim(0), n = w.rows(), k = w.k;
  const GemvType a_type = a.dtype() == DType::kBF16 ? GemvType::kBF16 : GemvType::kF32;
  const int64_t a_size = static_cast<int64_t>(DTypeSize(a.dtype()));
  const int64_t lda = LeadingDim(a), ldc = LeadingDim(c);
  const float* bias = options.bias != nullptr ? options.bias->data_as<const float>() : nullptr;
  const bool programmatic = s.options.programmatic_launch && options.b_is_weights;
  const bool fp8 = w.format == WeightFormat::kFp8Block;
  Fp8BlockWeights fp8_weights;
  Int4GroupWeights int4_weights;
  if (fp8) {
    fp8_weights.codes = w.codes.data_as<const uint8_t>();
    fp8_weights.ld = LeadingDim(w.codes);
    fp8_weights.scale_inv = w.scales.data_as<const float>();
    fp8_weights.scale_ld = LeadingDim(w.scales);
    fp8_weights.row0 = LocalRow0(w);
    fp8_weights.col0 = LocalCol0(w);
    fp8_weights.tiled = w.warp_tiled();
  } else {
    int4_weights.packed = w.codes.data_as<const int32_t>();
    int4_weights.ld = LeadingDim(w.codes);
    int4_weights.scale = reinterpret_cast<const uint16_t*>(ScaleRow(w, LocalRow0(w)));
    int4_weights.scale_ld = LeadingDim(w.scales);
    int4_weights.col0 = LocalCol0(w);
    int4_weights.group_size = w.block_cols;
    int4_weights.tiled = w.warp_tiled();
  }
  // Rows [first, first + batch * rows) as `batch` items of `rows` rows sharing the weights.
  auto launch = [&](int64_t first, int64_t batch, int64_t rows) {
    const void* a_rows = static_cast<const char*>(a.data()) + first * lda * a_size;
    float* c_rows = c.data_as<float>() + first * ldc;
    const int64_t stride_a = rows * lda, stride_c = rows * ldc;
    const cudaError_t error =
        fp8 ? LaunchFp8BlockGemv(a_rows, a_type, lda, stride_a, fp8_weights, c_rows, ldc, stride_c, bias, batch, rows,
                                 n, k, options.alpha, options.beta, programmatic, s.stream)
            : LaunchInt4GroupGemv(a_rows, a_type, lda, stride_a, int4_weights, c_rows, ldc, stride_c, bias, batch,
                                  rows, n, k, options.alpha, options.beta, programmatic, s.stream);
    return CudaStatus(error, "QuantizedGemm: quantized GEMV kernel launch");
  };
  const int64_t full = m / kQuantGemvMaxRows, rest = m % kQuantGemvMaxRows;
  if (full > 0) EAGLE3_RETURN_IF_ERROR(launch(0, full, kQuantGemvMaxRows));
  if (rest > 0) EAGLE3_RETURN_IF_ERROR(launch(full * kQuantGemvMaxRows, 1, rest));
  return absl::OkStatus();
}

// The dequantized path for checked operands with m, n, k > 0: W into bf16 scratch, then Gemm.
absl::Status DequantizedProduct(CudaBackend& backend, CudaBackend::State& s, const TensorView& a,
                                const QuantizedWeightView& w, const TensorView& c, const GemmOptions& options) {
  const int64_t n = w.rows(), k = w.k;
  EAGLE3_ASSIGN_OR_RETURN(void* buffer, ScratchBuffer(s, static_cast<size_t>(n * k) * sizeof(uint16_t),
                                                      "the bf16 copy of a dequantized weight"));
  auto* scratch = static_cast<uint16_t*>(buffer);
  const DequantTiles tiles{.tiled = w.warp_tiled(), .global_col0 = w.col0};
  const cudaError_t error =
      w.format == WeightFormat::kFp8Block
          ? LaunchFp8BlockDequant(w.codes.data_as<const uint8_t>(), LeadingDim(w.codes),
                                  w.scales.data_as<const float>(), LeadingDim(w.scales), LocalRow0(w), LocalCol0(w),
                                  w.block_rows, w.block_cols, scratch, k, n, k, s.options.programmatic_launch, s.stream,
                                  tiles)
          : LaunchInt4GroupDequant(w.codes.data_as<const int32_t>(), LeadingDim(w.codes),
                                   static_cast<int>(w.col0 % kInt4PerWord),
                                   reinterpret_cast<const uint16_t*>(ScaleRow(w, LocalRow0(w))),
                                   LeadingDim(w.scales), LocalCol0(w), w.block_cols, scratch, k, n, k,
                                   s.options.programmatic_launch, s.stream, tiles);
  EAGLE3_RETURN_IF_ERROR(CudaStatus(error, "QuantizedGemm: dequantization kernel launch"));
  GemmOptions product = options;
  product.b_is_weights = false;  // the scratch was written just before: no early start
  const absl::Status status = backend.Gemm(a, TensorView(scratch, DType::kBF16, Shape{n, k}, a.device()), c, product);
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("QuantizedGemm (on the dequantized weight): ", status.message()));
}

size_t RoundUp256(int64_t bytes) { return static_cast<size_t>((bytes + 255) / 256 * 256); }

// The W8A8 path (see the file comment) for checked FP8 operands with m, n, k > 0: whether it took
// the product (what it does not take it leaves untouched, for the other paths).
absl::StatusOr<bool> W8A8Product(CudaBackend::State& s, const TensorView& a, const QuantizedWeightView& w,
                                 const TensorView& c, const GemmOptions& options) {
  const int64_t m = a.dim(0), n = w.rows(), k = w.k;
  const Fp8W8A8Slice slice{.n = n,
                           .k = k,
                           .row0 = w.row0,
                           .col0 = w.col0,
                           .block_rows = w.block_rows,
                           .block_cols = w.block_cols,
                           .codes = reinterpret_cast<uintptr_t>(w.codes.data()),
                           .codes_ld = LeadingDim(w.codes)};
  if (!Fp8W8A8Takes(slice)) return false;
  // The slice's first scale block in w's scale tensor, and whether cuBLASLt can read the tensor in
  // place (else its blocks are copied into the scratch in cuBLASLt's layout).
  const int64_t block_row = w.row0 / kFp8W8A8Block - w.scale_row0, block_col = w.col0 / kFp8W8A8Block - w.scale_col0;
  const float* first = reinterpret_cast<const float*>(ScaleRow(w, block_row)) + block_col;
  const int64_t scale_ld = LeadingDim(w.scales);
  const bool direct =
      Fp8W8A8ScalesDirect(n, k, reinterpret_cast<uintptr_t>(first), scale_ld, w.scales.dim(1) - block_col);
  // Scratch: the activations' codes [m, k], their scales, the weight's scales when copied.
  const size_t codes_bytes = RoundUp256(m * k);
  const size_t a_scale_bytes = RoundUp256(Fp8ActScaleCount(m, k) * static_cast<int64_t>(sizeof(float)));
  const size_t w_scale_bytes = direct ? 0 : RoundUp256(Fp8WeightScaleCount(n, k) * static_cast<int64_t>(sizeof(float)));
  EAGLE3_ASSIGN_OR_RETURN(void* buffer, ScratchBuffer(s, codes_bytes + a_scale_bytes + w_scale_bytes,
                                                      "the e4m3 copy of the activations (W8A8)"));
  auto* bytes = static_cast<char*>(buffer);
  Fp8W8A8Operands p;
  p.m = m, p.n = n, p.k = k;
  p.a = reinterpret_cast<uint8_t*>(bytes);
  p.lda = k;
  p.a_scales = reinterpret_cast<float*>(bytes + codes_bytes);
  p.w = w.codes.data_as<const uint8_t>();
  p.ldw = LeadingDim(w.codes);
  p.w_scales = direct ? first : reinterpret_cast<float*>(bytes + codes_bytes + a_scale_bytes);
  p.c = c.data_as<float>();
  p.ldc = LeadingDim(c);
  const size_t workspace_bytes = s.gemm_workspace != nullptr ? s.options.gemm_workspace_bytes : 0;
  EAGLE3_ASSIGN_OR_RETURN(const bool available, s.fp8_w8a8.Available(s.lt, workspace_bytes, p, options.beta != 0.0f));
  if (!available) return false;

  auto* a_codes = const_cast<uint8_t*>(p.a);
  auto* a_scales = const_cast<float*>(p.a_scales);
  const int64_t a_scale_ld = Fp8ActScaleLd(m);
  const cudaError_t quantized =
      a.dtype() == DType::kBF16
          ? LaunchFp8ActQuant(a.data_as<const uint16_t>(), LeadingDim(a), m, k, a_codes, k, a_scales, a_scale_ld,
                              s.options.programmatic_launch, s.stream)
          : LaunchFp8ActQuant(a.data_as<const float>(), LeadingDim(a), m, k, a_codes, k, a_scales, a_scale_ld,
                              s.options.programmatic_launch, s.stream);
  EAGLE3_RETURN_IF_ERROR(CudaStatus(quantized, "QuantizedGemm: activation quantization kernel launch"));
  if (!direct) {
    // The slice's blocks, rows L4 apart; the padding past its K blocks zeroed (never used).
    auto* w_scales = const_cast<float*>(p.w_scales);
    const int64_t rows = (n + kFp8W8A8Block - 1) / kFp8W8A8Block, used = Fp8W8A8KBlocks(k), l4 = Fp8WeightScaleLd(k);
    EAGLE3_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy2DAsync(w_scales, l4 * sizeof(float), first, scale_ld * sizeof(float), used * sizeof(float), rows,
                          cudaMemcpyDeviceToDevice, s.stream),
        "QuantizedGemm: copying the weight scales"));
    if (l4 > used) {
      EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaMemset2DAsync(w_scales + used, l4 * sizeof(float), 0,
                                                          (l4 - used) * sizeof(float), rows, s.stream),
                                        "QuantizedGemm: padding the weight scales"));
    }
  }
  EAGLE3_RETURN_IF_ERROR(
      s.fp8_w8a8.Run(s.lt, s.gemm_workspace, workspace_bytes, p, options.alpha, options.beta, s.stream));
  if (options.bias != nullptr) {
    EAGLE3_RETURN_IF_ERROR(CudaStatus(
        LaunchScaleAddBias(p.c, p.ldc, m, n, 1.0f, options.bias->data_as<const float>(),
                           s.options.programmatic_launch, s.stream),
        "QuantizedGemm: bias kernel launch"));
  }
  return true;
}

}  // namespace

absl::Status CudaBackend::TileQuantizedCodes(const QuantizedWeightView& w, const TensorView& tiles) {
  EAGLE3_RETURN_IF_ERROR(CheckTileQuantizedCodes(w, tiles));
  if (w.rows() == 0 || w.k == 0) return absl::OkStatus();
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "TileQuantizedCodes: cudaSetDevice"));
  const int64_t elem = static_cast<int64_t>(DTypeSize(w.codes.dtype()));
  return CudaStatus(LaunchTileQuantizedCodes(w.format == WeightFormat::kInt4Group,
                                             static_cast<const uint8_t*>(w.codes.data()), w.codes.stride(0) * elem,
                                             w.rows(), w.k, w.col0, static_cast<uint8_t*>(tiles.data()), s.stream),
                    absl::StrCat("TileQuantizedCodes of w.codes ", w.codes.ToString()));
}

bool CudaBackend::tiles_gemm_codes(const QuantizedWeightView& w) const {
  const CudaBackendOptions& o = state_->options;
  // With W8A8 on, large products could take cuBLASLt, which reads row-major codes only.
  if (!o.quant_gemm_tiled_weights || o.fp8_w8a8_min_rows > 0 || w.warp_tiled() || !w.Check(kOp).ok()) return false;
  // The codes are placed as a loader places tiles (16-byte aligned, contiguous); the other paths
  // read any tiled view.
  return SliceOnGemvLayout(w);
}

absl::Status CudaBackend::QuantizedGemm(const TensorView& a, const QuantizedWeightView& w, const TensorView& c,
                                        const GemmOptions& options) {
  EAGLE3_RETURN_IF_ERROR(CheckQuantizedGemm(a, w, c, options));
  if (a.dtype() != DType::kF32 && a.dtype() != DType::kBF16) {
    return Invalid(kOp, "a ", a.ToString(), " must be f32 or bf16 on CudaBackend");
  }
  if (c.dtype() != DType::kF32) {
    return Invalid(kOp, "c ", c.ToString(), " must be f32 on CudaBackend (outputs accumulate in fp32)");
  }
  if (options.bias != nullptr && options.bias->dtype() != DType::kF32) {
    return Invalid(kOp, "bias ", options.bias->ToString(), " must be f32 on CudaBackend");
  }
  const bool fp8 = w.format == WeightFormat::kFp8Block;
  if (w.scales.dtype() != (fp8 ? DType::kF32 : DType::kBF16)) {
    return Invalid(kOp, "w.scales ", w.scales.ToString(), " must be ",
                   fp8 ? "f32 for fp8-block weights" : "bf16 for int4-group weights (as the hub stores them)",
                   " on CudaBackend");
  }
  const int64_t m = a.dim(0), n = w.rows(), k = w.k;
  if (m == 0 || n == 0) return absl::OkStatus();
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "QuantizedGemm: cudaSetDevice"));
  if (k == 0) {  // empty product: c = beta * c + bias
    const float* bias = options.bias != nullptr ? options.bias->data_as<const float>() : nullptr;
    return CudaStatus(LaunchScaleAddBias(c.data_as<float>(), LeadingDim(c), m, n, options.beta, bias,
                                         s.options.programmatic_launch, s.stream),
                      "QuantizedGemm: bias kernel launch");
  }
  // cuBLASLt reads row-major codes only: warp-tiled weights take the other paths.
  if (fp8 && !w.warp_tiled() && s.options.fp8_w8a8_min_rows > 0 && m >= s.options.fp8_w8a8_min_rows &&
      Fp8W8A8RowsTaken(m)) {
    EAGLE3_ASSIGN_OR_RETURN(const bool done, W8A8Product(s, a, w, c, options));
    if (done) return absl::OkStatus();
  }
  if (m <= s.options.quantized_gemv_max_rows && GemvLayout(w)) return GemvProduct(s, a, w, c, options);
  return DequantizedProduct(*this, s, a, w, c, options);
}

}  // namespace eagle3::cuda
