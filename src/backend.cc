#include "eagle3/backend.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <span>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "eagle3/detail/int4_packing.h"
#include "eagle3/draft_tree.h"
#include "eagle3/status.h"

namespace eagle3 {
namespace {

template <typename... Args>
absl::Status Invalid(const char* op, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", args...));
}

// Dims and strides non-negative, data present.
absl::Status CheckLayout(const char* op, const char* name, const TensorView& t) {
  for (int i = 0; i < t.rank(); ++i) {
    if (t.dim(i) < 0) return Invalid(op, name, " ", t.ToString(), " has a negative dim");
    if (t.stride(i) < 0) {
      return Invalid(op, name, " ", t.ToString(), " has negative stride ", t.stride(i), " in dim ",
                     i);
    }
  }
  if (t.data() == nullptr && t.numel() > 0) {
    return Invalid(op, name, " ", t.ToString(), " has no data");
  }
  return absl::OkStatus();
}

absl::Status CheckCommon(const char* op, const char* name, const TensorView& t, Device device) {
  if (t.device() != device) {
    return Invalid(op, name, " is ", t.ToString(), " but this backend runs on ", device.ToString());
  }
  return CheckLayout(op, name, t);
}

// A [rows, cols] operand, row-strided allowed. `layout` names the dims for the message ("[M, K]").
absl::Status CheckMatrix(const char* op, const char* name, const char* layout, const TensorView& t,
                         Device device) {
  EAGLE3_RETURN_IF_ERROR(CheckCommon(op, name, t, device));
  if (t.rank() != 2) return Invalid(op, name, " must be 2-D ", layout, ", got ", t.ToString());
  if (t.dim(1) > 1 && t.stride(1) != 1) {
    return Invalid(op, name, " ", t.ToString(), " needs unit stride along dim 1, got strides ",
                   t.strides().ToString());
  }
  if (t.dim(0) > 1 && t.stride(0) < t.dim(1)) {
    return Invalid(op, name, " ", t.ToString(), " has row stride ", t.stride(0),
                   " < its row length ", t.dim(1));
  }
  return absl::OkStatus();
}

absl::Status CheckVector(const char* op, const char* name, const char* layout, const TensorView& t,
                         Device device) {
  EAGLE3_RETURN_IF_ERROR(CheckCommon(op, name, t, device));
  if (t.rank() != 1) return Invalid(op, name, " must be 1-D ", layout, ", got ", t.ToString());
  if (t.dim(0) > 1 && t.stride(0) != 1) {
    return Invalid(op, name, " ", t.ToString(), " must be contiguous, got stride ", t.stride(0));
  }
  return absl::OkStatus();
}

absl::Status CheckIndexDType(const char* op, const char* name, const TensorView& t) {
  if (t.dtype() != DType::kI32 && t.dtype() != DType::kI64) {
    return Invalid(op, name, " ", t.ToString(), " must be i32 or i64, got ",
                   std::string(DTypeName(t.dtype())));
  }
  return absl::OkStatus();
}

// Bytes a view can touch: [first element, last element] with non-negative strides.
struct Span {
  uintptr_t begin = 0;
  uintptr_t end = 0;  // exclusive; == begin for an empty view
};

Span SpanOf(const TensorView& t) {
  const auto begin = reinterpret_cast<uintptr_t>(t.data());
  if (t.numel() == 0) return {begin, begin};
  int64_t last = 0;
  for (int i = 0; i < t.rank(); ++i) last += (t.dim(i) - 1) * t.stride(i);
  return {begin, begin + static_cast<uintptr_t>(last + 1) * DTypeSize(t.dtype())};
}

bool SameView(const TensorView& a, const TensorView& b) {
  return a.data() == b.data() && a.shape() == b.shape() && a.strides() == b.strides() &&
         a.dtype() == b.dtype();
}

// `out` must not share memory with `in`, except that with allow_identical it may be `in` itself.
absl::Status CheckNoOverlap(const char* op, const char* in_name, const TensorView& in,
                            const char* out_name, const TensorView& out, bool allow_identical) {
  if (allow_identical && SameView(in, out)) return absl::OkStatus();
  const Span a = SpanOf(in);
  const Span b = SpanOf(out);
  if (a.begin < a.end && b.begin < b.end && a.begin < b.end && b.begin < a.end) {
    return Invalid(op, out_name, " ", out.ToString(), " overlaps ", in_name, " ", in.ToString(),
                   allow_identical ? " (only exact in-place use is allowed)" : "");
  }
  return absl::OkStatus();
}

// A view as rows at one period: its dimension of the largest stride (extent > 1) is the row
// dimension, and every row's elements lie in one band of `band` bytes from the row's start, which
// fits in the period (a row-strided matrix; a head-major [n, rows, cols] view into a row-strided
// buffer). ok is false where the view is not of that form (one row, or bands longer than rows).
struct Bands {
  bool ok = false;
  int64_t period = 0, band = 0;
  uintptr_t begin = 0;
};

Bands BandsOf(const TensorView& t) {
  Bands b;
  if (t.numel() == 0) return b;
  int row_dim = -1;
  for (int i = 0; i < t.rank(); ++i) {
    if (t.dim(i) > 1 && (row_dim < 0 || t.stride(i) > t.stride(row_dim))) row_dim = i;
  }
  if (row_dim < 0) return b;
  const auto size = static_cast<int64_t>(DTypeSize(t.dtype()));
  int64_t last = 0;
  for (int i = 0; i < t.rank(); ++i) {
    if (i != row_dim) last += (t.dim(i) - 1) * t.stride(i);
  }
  b.period = t.stride(row_dim) * size;
  b.band = (last + 1) * size;
  b.begin = reinterpret_cast<uintptr_t>(t.data());
  b.ok = b.band <= b.period;
  return b;
}

// CheckNoOverlap, exact where both views are rows at one period (BandsOf): each row's bytes then
// repeat with that period, and disjoint bands of the same rows (one product's [a | b] output, a
// head-major view of either part) share none. Other cases are CheckNoOverlap's span test.
absl::Status CheckNoBandOverlap(const char* op, const char* in_name, const TensorView& in, const char* out_name,
                                const TensorView& out, bool allow_identical = false) {
  if (allow_identical && SameView(in, out)) return absl::OkStatus();
  const Bands a = BandsOf(in), b = BandsOf(out);
  if (a.ok && b.ok && a.period == b.period) {
    // Offsets within one period: the later view's rows start `shift` bytes after the earlier one's.
    const bool out_later = b.begin >= a.begin;
    const auto shift =
        static_cast<int64_t>((out_later ? b.begin - a.begin : a.begin - b.begin) % static_cast<uintptr_t>(a.period));
    const int64_t first_bytes = out_later ? a.band : b.band;
    const int64_t later_bytes = out_later ? b.band : a.band;
    if (shift >= first_bytes && shift + later_bytes <= a.period) return absl::OkStatus();
  }
  return CheckNoOverlap(op, in_name, in, out_name, out, allow_identical);
}

absl::Status CheckRowsLike(const char* op, const char* name, const TensorView& t,
                           const char* ref_name, const TensorView& ref) {
  if (!(t.shape() == ref.shape())) {
    return Invalid(op, name, " ", t.ToString(), " must have the shape of ", ref_name, " ",
                   ref.ToString());
  }
  return absl::OkStatus();
}

// A [d0, d1, d2] operand whose last dim is contiguous and whose dims 0/1 may have any stride.
absl::Status CheckHeads(const char* op, const char* name, const char* layout, const TensorView& t,
                        Device device) {
  EAGLE3_RETURN_IF_ERROR(CheckCommon(op, name, t, device));
  if (t.rank() != 3) return Invalid(op, name, " must be 3-D ", layout, ", got ", t.ToString());
  if (t.dim(2) > 1 && t.stride(2) != 1) {
    return Invalid(op, name, " ", t.ToString(),
                   " needs unit stride along its last dim, got strides ", t.strides().ToString());
  }
  return absl::OkStatus();
}

// A written operand must not map two elements to one address: with the dims of size > 1 sorted by
// stride, each stride must step past everything the smaller-strided dims span.
absl::Status CheckDistinctElements(const char* op, const char* name, const TensorView& t) {
  if (t.numel() == 0) return absl::OkStatus();  // nothing is mapped (a [T, 0, D] view has stride 0)
  std::array<int, Shape::kMaxRank> order{};  // dims of size > 1 by increasing stride
  int n = 0;
  for (int i = 0; i < t.rank(); ++i) {
    if (t.dim(i) <= 1) continue;
    int j = n++;
    for (; j > 0 && t.stride(order[j - 1]) > t.stride(i); --j) order[j] = order[j - 1];
    order[j] = i;
  }
  int64_t span = 1;  // elements covered by the dims visited so far
  for (int j = 0; j < n; ++j) {
    const int d = order[j];
    if (t.stride(d) < span) {
      return Invalid(op, name, " ", t.ToString(), " with strides ", t.strides().ToString(),
                     " maps several elements to one address");
    }
    span = (t.dim(d) - 1) * t.stride(d) + span;
  }
  return absl::OkStatus();
}

absl::Status CheckMaskDType(const char* op, const TensorView& mask) {
  if (mask.dtype() != DType::kU8 && mask.dtype() != DType::kBool) {
    return Invalid(op, "mask ", mask.ToString(), " must be u8 or bool, got ",
                   std::string(DTypeName(mask.dtype())));
  }
  return absl::OkStatus();
}

absl::Status CheckDTypeIs(const char* op, const char* name, const TensorView& t, DType dtype) {
  if (t.dtype() != dtype) {
    return Invalid(op, name, " ", t.ToString(), " must be ", std::string(DTypeName(dtype)),
                   ", got ", std::string(DTypeName(t.dtype())));
  }
  return absl::OkStatus();
}

absl::Status CheckI32(const char* op, const char* name, const TensorView& t) {
  return CheckDTypeIs(op, name, t, DType::kI32);
}

// A contiguous operand of `rank` dims and the given dtype: what a device kernel addresses with
// strides of its own (per-sequence arrays of the speculative step).
absl::Status CheckDense(const char* op, const char* name, const char* layout, const TensorView& t,
                        int rank, DType dtype, Device device) {
  EAGLE3_RETURN_IF_ERROR(CheckCommon(op, name, t, device));
  if (t.rank() != rank) {
    return Invalid(op, name, " must be ", rank, "-D ", layout, ", got ", t.ToString());
  }
  if (!t.is_contiguous()) {
    return Invalid(op, name, " ", t.ToString(), " must be contiguous, got strides ",
                   t.strides().ToString());
  }
  return CheckDTypeIs(op, name, t, dtype);
}

// The paged latent cache of LatentAttention, BatchedLatentAttention, PagedWrite and PagedRead:
// f32 or bf16 (eagle3/backend.h), on every backend.
absl::Status CheckLatentCacheDType(const char* op, const TensorView& cache) {
  if (cache.dtype() == DType::kF32 || cache.dtype() == DType::kBF16) return absl::OkStatus();
  return Invalid(op, "cache is ", cache.ToString(), " but ", op, " takes an f32 or bf16 cache (got ",
                 std::string(DTypeName(cache.dtype())), ")");
}

// [num_pages, page_size, W], contiguous, page_size >= 1.
absl::Status CheckCache(const char* op, const TensorView& cache, Device device) {
  EAGLE3_RETURN_IF_ERROR(CheckCommon(op, "cache", cache, device));
  if (cache.rank() != 3) {
    return Invalid(op, "cache must be 3-D [num_pages, page_size, W], got ", cache.ToString());
  }
  if (!cache.is_contiguous()) {
    return Invalid(op, "cache ", cache.ToString(), " must be contiguous, got strides ",
                   cache.strides().ToString());
  }
  if (cache.dim(1) < 1) return Invalid(op, "cache ", cache.ToString(), " needs page_size >= 1");
  return absl::OkStatus();
}

absl::Status CheckScale(const char* op, float scale) {
  if (!std::isfinite(scale)) return Invalid(op, "scale must be finite, got ", scale);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<UploadRing>> Backend::CreateUploadRing() { return std::unique_ptr<UploadRing>(); }

absl::Status Backend::PrefetchWeights(std::span<const TensorView> weights) {
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i].empty()) continue;
    const std::string name = absl::StrCat("weights[", i, "]");
    EAGLE3_RETURN_IF_ERROR(CheckCommon("PrefetchWeights", name.c_str(), weights[i], device()));
  }
  return absl::OkStatus();
}

absl::Status Backend::CheckCopy(const TensorView& src, const TensorView& dst) const {
  EAGLE3_RETURN_IF_ERROR(CheckLayout("Copy", "src", src));
  EAGLE3_RETURN_IF_ERROR(CheckLayout("Copy", "dst", dst));
  if (!(src.shape() == dst.shape()) || src.dtype() != dst.dtype()) {
    return Invalid("Copy", "src ", src.ToString(), " and dst ", dst.ToString(),
                   " must have the same shape and dtype");
  }
  if (src.device() != dst.device()) return absl::OkStatus();  // distinct address spaces
  return CheckNoBandOverlap("Copy", "src", src, "dst", dst, /*allow_identical=*/true);
}

absl::Status Backend::CheckGemm(const TensorView& a, const TensorView& b, const TensorView& c,
                                const GemmOptions& options) const {
  const Device dev = device();
  EAGLE3_RETURN_IF_ERROR(CheckMatrix("Gemm", "a", "[M, K]", a, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix("Gemm", "b", "[N, K]", b, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix("Gemm", "c", "[M, N]", c, dev));
  if (a.dim(1) != b.dim(1)) {
    return Invalid("Gemm", "K mismatch: a ", a.ToString(), " is [M, K] with K = ", a.dim(1), ", b ",
                   b.ToString(), " is [N, K] with K = ", b.dim(1));
  }
  if (c.dim(0) != a.dim(0) || c.dim(1) != b.dim(0)) {
    return Invalid("Gemm", "c ", c.ToString(), " must be [M, N] = [", a.dim(0), ", ", b.dim(0),
                   "] for a ", a.ToString(), " and b ", b.ToString());
  }
  if (options.bias != nullptr) {
    const TensorView& bias = *options.bias;
    EAGLE3_RETURN_IF_ERROR(CheckVector("Gemm", "bias", "[N]", bias, dev));
    if (bias.dim(0) != b.dim(0)) {
      return Invalid("Gemm", "bias ", bias.ToString(), " must be [N] = [", b.dim(0), "] for b ",
                     b.ToString());
    }
    EAGLE3_RETURN_IF_ERROR(CheckNoOverlap("Gemm", "bias", bias, "c", c, false));
  }
  if (!std::isfinite(options.alpha) || !std::isfinite(options.beta)) {
    return Invalid("Gemm", "alpha ", options.alpha, " and beta ", options.beta, " must be finite");
  }
  EAGLE3_RETURN_IF_ERROR(CheckNoBandOverlap("Gemm", "a", a, "c", c));
  return CheckNoOverlap("Gemm", "b", b, "c", c, false);
}

absl::Status Backend::CheckQuantizedGemm(const TensorView& a, const QuantizedWeightView& w, const TensorView& c,
                                         const GemmOptions& options) const {
  constexpr const char* kOp = "QuantizedGemm";
  const Device dev = device();
  if (options.keep_f32_activations) {
    return Invalid(kOp, "options.keep_f32_activations is for Gemm's bf16 weights; expected false, got true (w.codes ",
                   w.codes.ToString(), ")");
  }
  EAGLE3_RETURN_IF_ERROR(w.Check(kOp));
  if (w.codes.device() != dev) {
    return Invalid(kOp, "w.codes is ", w.codes.ToString(), " but this backend runs on ", dev.ToString());
  }
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(kOp, "a", "[M, K]", a, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(kOp, "c", "[M, N]", c, dev));
  if (a.dim(1) != w.k) {
    return Invalid(kOp, "K mismatch: a ", a.ToString(), " is [M, K] with K = ", a.dim(1), ", w.k is ", w.k,
                   " (w.codes ", w.codes.ToString(), ")");
  }
  if (c.dim(0) != a.dim(0) || c.dim(1) != w.rows()) {
    return Invalid(kOp, "c ", c.ToString(), " must be [M, N] = [", a.dim(0), ", ", w.rows(), "] for a ",
                   a.ToString(), " and w.codes ", w.codes.ToString());
  }
  if (options.bias != nullptr) {
    const TensorView& bias = *options.bias;
    EAGLE3_RETURN_IF_ERROR(CheckVector(kOp, "bias", "[N]", bias, dev));
    if (bias.dim(0) != w.rows()) {
      return Invalid(kOp, "bias ", bias.ToString(), " must be [N] = [", w.rows(), "] for w.codes ",
                     w.codes.ToString());
    }
    EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(kOp, "bias", bias, "c", c, false));
  }
  if (!std::isfinite(options.alpha) || !std::isfinite(options.beta)) {
    return Invalid(kOp, "alpha ", options.alpha, " and beta ", options.beta, " must be finite");
  }
  EAGLE3_RETURN_IF_ERROR(CheckNoBandOverlap(kOp, "a", a, "c", c));
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(kOp, "w.codes", w.codes, "c", c, false));
  return CheckNoOverlap(kOp, "w.scales", w.scales, "c", c, false);
}

absl::Status Backend::CheckTileQuantizedCodes(const QuantizedWeightView& w, const TensorView& tiles) const {
  constexpr const char* kOp = "TileQuantizedCodes";
  const Device dev = device();
  EAGLE3_RETURN_IF_ERROR(w.Check(kOp));
  if (w.warp_tiled()) {
    return Invalid(kOp, "w.codes ", w.codes.ToString(), " are warp-tiled already; expected row-major");
  }
  if (w.codes.device() != dev) {
    return Invalid(kOp, "w.codes is ", w.codes.ToString(), " but this backend runs on ", dev.ToString());
  }
  if (w.format == WeightFormat::kInt4Group && w.col0 % kInt4PerWord != 0) {
    return Invalid(kOp, "w.col0 ", w.col0, " must be a multiple of ", kInt4PerWord,
                   " (a whole packed word) to tile int4 codes");
  }
  const Shape want = WarpTiledCodesShape(w);
  if (tiles.dtype() != w.codes.dtype() || tiles.shape() != want || tiles.device() != dev ||
      (tiles.numel() > 0 && (tiles.data() == nullptr || tiles.stride(1) != 1 || tiles.stride(0) != want[1]))) {
    return Invalid(kOp, "tiles ", tiles.ToString(), " (strides ", tiles.strides().ToString(), ") must be ",
                   std::string(DTypeName(w.codes.dtype())), want.ToString(), ", contiguous, on ", dev.ToString(),
                   " for w.codes ",
                   w.codes.ToString(), " (k ", w.k, ", col0 ", w.col0, ")");
  }
  return CheckNoOverlap(kOp, "w.codes", w.codes, "tiles", tiles, false);
}

absl::Status Backend::CheckBatchedGemm(const TensorView& a, const TensorView& b,
                                       const TensorView& c) const {
  const Device dev = device();
  EAGLE3_RETURN_IF_ERROR(CheckHeads("BatchedGemm", "a", "[B, M, K]", a, dev));
  EAGLE3_RETURN_IF_ERROR(CheckHeads("BatchedGemm", "b", "[B, N, K]", b, dev));
  EAGLE3_RETURN_IF_ERROR(CheckHeads("BatchedGemm", "c", "[B, M, N]", c, dev));
  if (b.dim(0) != a.dim(0) || c.dim(0) != a.dim(0)) {
    return Invalid("BatchedGemm", "batch mismatch: a ", a.ToString(), ", b ", b.ToString(), ", c ",
                   c.ToString(), " must share dim 0 (B)");
  }
  if (a.dim(2) != b.dim(2)) {
    return Invalid("BatchedGemm", "K mismatch: a ", a.ToString(), " is [B, M, K] with K = ", a.dim(2), ", b ",
                   b.ToString(), " is [B, N, K] with K = ", b.dim(2));
  }
  if (c.dim(1) != a.dim(1) || c.dim(2) != b.dim(1)) {
    return Invalid("BatchedGemm", "c ", c.ToString(), " must be [B, M, N] = [", a.dim(0), ", ", a.dim(1), ", ",
                   b.dim(1), "] for a ", a.ToString(), " and b ", b.ToString());
  }
  const int64_t items = c.dim(0), m = c.dim(1), n = c.dim(2);
  if (items > 1 && m > 0 && n > 0) {
    const int64_t extent = (m - 1) * c.stride(1) + n;  // elements item 0 spans (rows row-strided)
    const bool item_major = c.stride(0) >= extent;
    const bool interleaved = c.stride(0) >= n && (m == 1 || c.stride(1) >= items * c.stride(0));
    if (!item_major && !interleaved) {
      return Invalid("BatchedGemm", "the items of c ", c.ToString(),
                     " overlap one another (need stride(0) >= the item extent ", extent,
                     ", or stride(0) >= N and stride(1) >= B * stride(0))");
    }
  }
  EAGLE3_RETURN_IF_ERROR(CheckNoBandOverlap("BatchedGemm", "a", a, "c", c));
  return CheckNoOverlap("BatchedGemm", "b", b, "c", c, false);
}

TensorView Backend::BatchItem(const TensorView& t, int64_t i) {
  auto* data = static_cast<char*>(t.data()) + i * t.stride(0) * static_cast<int64_t>(DTypeSize(t.dtype()));
  return TensorView(data, t.dtype(), Shape{t.dim(1), t.dim(2)}, Shape{t.stride(1), 1}, t.device());
}

absl::Status Backend::BatchedGemm(const TensorView& a, const TensorView& b, const TensorView& c,
                                  const GemmOptions& options) {
  EAGLE3_RETURN_IF_ERROR(CheckBatchedGemm(a, b, c));
  for (int64_t i = 0; i < a.dim(0); ++i) {
    if (absl::Status st = Gemm(BatchItem(a, i), BatchItem(b, i), BatchItem(c, i), options); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("BatchedGemm item ", i, ": ", st.message()));
    }
  }
  return absl::OkStatus();
}

namespace {

// The operand names a norm's messages use (RmsNorm's "x", "weight", "out"; one half's of RmsNormPair).
struct NormNames {
  const char* x;
  const char* weight;
  const char* out;
};

absl::Status CheckNorm(const char* op, const NormNames& n, const TensorView& x, const TensorView* residual,
                       const TensorView& weight, float eps, const TensorView& out, Device dev) {
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, n.x, "[T, H]", x, dev));
  EAGLE3_RETURN_IF_ERROR(CheckVector(op, n.weight, "[H]", weight, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, n.out, "[T, H]", out, dev));
  if (weight.dim(0) != x.dim(1)) {
    return Invalid(op, n.weight, " ", weight.ToString(), " must be [H] = [", x.dim(1), "] for ", n.x, " ",
                   x.ToString());
  }
  EAGLE3_RETURN_IF_ERROR(CheckRowsLike(op, n.out, out, n.x, x));
  if (!(eps >= 0.0f) || !std::isfinite(eps)) {
    return Invalid(op, "eps must be finite and >= 0, got ", eps);
  }
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, n.x, x, n.out, out, true));
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, n.weight, weight, n.out, out, false));
  if (residual != nullptr) {
    EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "residual", "[T, H]", *residual, dev));
    EAGLE3_RETURN_IF_ERROR(CheckRowsLike(op, "residual", *residual, n.x, x));
    EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, n.x, x, "residual", *residual, false));
    EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, n.weight, weight, "residual", *residual, false));
    EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "residual", *residual, n.out, out, false));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Backend::CheckRmsNorm(const char* op, const TensorView& x, const TensorView* residual,
                                   const TensorView& weight, float eps,
                                   const TensorView& out) const {
  return CheckNorm(op, {"x", "weight", "out"}, x, residual, weight, eps, out, device());
}

absl::Status Backend::CheckRmsNormPair(const TensorView& x0, const TensorView& weight0, const TensorView& out0,
                                       const TensorView& x1, const TensorView& weight1, const TensorView& out1,
                                       float eps, DTypeCheck check_dtype) const {
  constexpr const char* kOp = "RmsNormPair";
  EAGLE3_RETURN_IF_ERROR(CheckNorm(kOp, {"x0", "weight0", "out0"}, x0, nullptr, weight0, eps, out0, device()));
  EAGLE3_RETURN_IF_ERROR(CheckNorm(kOp, {"x1", "weight1", "out1"}, x1, nullptr, weight1, eps, out1, device()));
  if (x1.dim(0) != x0.dim(0)) {
    return Invalid(kOp, "x1 ", x1.ToString(), " must have x0's row count T = ", x0.dim(0), ", got ", x1.dim(0));
  }
  // Matrices: the two halves may be column slices of the same rows.
  EAGLE3_RETURN_IF_ERROR(CheckNoBandOverlap(kOp, "x1", x1, "out0", out0));
  EAGLE3_RETURN_IF_ERROR(CheckNoBandOverlap(kOp, "x0", x0, "out1", out1));
  EAGLE3_RETURN_IF_ERROR(CheckNoBandOverlap(kOp, "out0", out0, "out1", out1));
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(kOp, "weight1", weight1, "out0", out0, false));
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(kOp, "weight0", weight0, "out1", out1, false));
  const std::pair<const char*, const TensorView*> operands[] = {{"x0", &x0}, {"weight0", &weight0}, {"out0", &out0},
                                                                {"x1", &x1}, {"weight1", &weight1}, {"out1", &out1}};
  for (const auto& [name, t] : operands) EAGLE3_RETURN_IF_ERROR(check_dtype(kOp, name, *t));
  return absl::OkStatus();
}

absl::Status Backend::RmsNormPair(const TensorView& x0, const TensorView& weight0, const TensorView& out0,
                                  const TensorView& x1, const TensorView& weight1, const TensorView& out1,
                                  float eps) {
  // No dtype policy here: each RmsNorm applies its backend's (see the contract in backend.h).
  const auto any_dtype = [](const char*, const char*, const TensorView&) { return absl::OkStatus(); };
  EAGLE3_RETURN_IF_ERROR(CheckRmsNormPair(x0, weight0, out0, x1, weight1, out1, eps, any_dtype));
  EAGLE3_RETURN_IF_ERROR(RmsNorm(x0, weight0, eps, out0));
  return RmsNorm(x1, weight1, eps, out1);
}

absl::Status Backend::CheckSiluMul(const TensorView& gate_up, const TensorView& out) const {
  const Device dev = device();
  EAGLE3_RETURN_IF_ERROR(CheckMatrix("SiluMul", "gate_up", "[T, 2 * I]", gate_up, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix("SiluMul", "out", "[T, I]", out, dev));
  if (out.dim(0) != gate_up.dim(0) || gate_up.dim(1) != 2 * out.dim(1)) {
    return Invalid("SiluMul", "gate_up ", gate_up.ToString(), " must be [T, 2 * I] for out ",
                   out.ToString(), " = [T, I]");
  }
  return CheckNoOverlap("SiluMul", "gate_up", gate_up, "out", out, false);
}

absl::Status Backend::CheckEmbeddingLookup(const TensorView& ids, const TensorView& table,
                                           int64_t vocab_start, const TensorView& out) const {
  const Device dev = device();
  EAGLE3_RETURN_IF_ERROR(CheckVector("EmbeddingLookup", "ids", "[T]", ids, dev));
  EAGLE3_RETURN_IF_ERROR(CheckIndexDType("EmbeddingLookup", "ids", ids));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix("EmbeddingLookup", "table", "[V_shard, H]", table, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix("EmbeddingLookup", "out", "[T, H]", out, dev));
  if (out.dim(0) != ids.dim(0) || out.dim(1) != table.dim(1)) {
    return Invalid("EmbeddingLookup", "out ", out.ToString(), " must be [T, H] = [", ids.dim(0),
                   ", ", table.dim(1), "] for ids ", ids.ToString(), " and table ",
                   table.ToString());
  }
  if (vocab_start < 0) {
    return Invalid("EmbeddingLookup", "vocab_start must be >= 0, got ", vocab_start);
  }
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap("EmbeddingLookup", "ids", ids, "out", out, false));
  return CheckNoOverlap("EmbeddingLookup", "table", table, "out", out, false);
}

absl::Status Backend::CheckSoftmax(const TensorView& logits, float temperature,
                                   const TensorView& out) const {
  const Device dev = device();
  EAGLE3_RETURN_IF_ERROR(CheckMatrix("Softmax", "logits", "[R, V]", logits, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix("Softmax", "out", "[R, V]", out, dev));
  if (logits.dim(1) < 1) return Invalid("Softmax", "logits ", logits.ToString(), " needs V >= 1");
  EAGLE3_RETURN_IF_ERROR(CheckRowsLike("Softmax", "out", out, "logits", logits));
  if (!(temperature > 0.0f) || !std::isfinite(temperature)) {
    return Invalid("Softmax", "temperature must be finite and > 0 (use Argmax for greedy), got ",
                   temperature);
  }
  return CheckNoOverlap("Softmax", "logits", logits, "out", out, true);
}

absl::Status Backend::CheckArgmax(const TensorView& logits, const TensorView& out) const {
  const Device dev = device();
  EAGLE3_RETURN_IF_ERROR(CheckMatrix("Argmax", "logits", "[R, V]", logits, dev));
  EAGLE3_RETURN_IF_ERROR(CheckVector("Argmax", "out", "[R]", out, dev));
  EAGLE3_RETURN_IF_ERROR(CheckIndexDType("Argmax", "out", out));
  if (logits.dim(1) < 1) return Invalid("Argmax", "logits ", logits.ToString(), " needs V >= 1");
  if (out.dim(0) != logits.dim(0)) {
    return Invalid("Argmax", "out ", out.ToString(), " must be [R] = [", logits.dim(0),
                   "] for logits ", logits.ToString());
  }
  if (out.dtype() == DType::kI32 && logits.dim(1) > std::numeric_limits<int32_t>::max()) {
    return Invalid("Argmax", "out ", out.ToString(), " cannot index V = ", logits.dim(1));
  }
  return CheckNoOverlap("Argmax", "logits", logits, "out", out, false);
}

absl::Status Backend::CheckTopK(const TensorView& values, int k, const TensorView& out_values,
                                const TensorView& out_indices) const {
  const Device dev = device();
  EAGLE3_RETURN_IF_ERROR(CheckMatrix("TopK", "values", "[R, V]", values, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix("TopK", "out_values", "[R, k]", out_values, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix("TopK", "out_indices", "[R, k]", out_indices, dev));
  EAGLE3_RETURN_IF_ERROR(CheckIndexDType("TopK", "out_indices", out_indices));
  if (k < 1 || k > values.dim(1)) {
    return Invalid("TopK", "k = ", k, " must be in [1, V] for values ", values.ToString());
  }
  for (const TensorView* t : {&out_values, &out_indices}) {
    if (t->dim(0) != values.dim(0) || t->dim(1) != k) {
      return Invalid("TopK", t == &out_values ? "out_values " : "out_indices ", t->ToString(),
                     " must be [R, k] = [", values.dim(0), ", ", k, "]");
    }
  }
  if (out_indices.dtype() == DType::kI32 && values.dim(1) > std::numeric_limits<int32_t>::max()) {
    return Invalid("TopK", "out_indices ", out_indices.ToString(),
                   " cannot index V = ", values.dim(1));
  }
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap("TopK", "values", values, "out_values", out_values, false));
  EAGLE3_RETURN_IF_ERROR(
      CheckNoOverlap("TopK", "values", values, "out_indices", out_indices, false));
  return CheckNoOverlap("TopK", "out_values", out_values, "out_indices", out_indices, false);
}

absl::Status Backend::CheckApplyRope(const TensorView& x, int64_t offset, int64_t rope_dim,
                                     const TensorView& positions, const TensorView& cos_sin) const {
  const Device dev = device();
  EAGLE3_RETURN_IF_ERROR(CheckHeads("ApplyRope", "x", "[T, N, D]", x, dev));
  EAGLE3_RETURN_IF_ERROR(CheckDistinctElements("ApplyRope", "x", x));
  EAGLE3_RETURN_IF_ERROR(CheckVector("ApplyRope", "positions", "[T]", positions, dev));
  EAGLE3_RETURN_IF_ERROR(CheckIndexDType("ApplyRope", "positions", positions));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix("ApplyRope", "cos_sin", "[P, rope_dim]", cos_sin, dev));
  if (rope_dim < 2 || rope_dim % 2 != 0) {
    return Invalid("ApplyRope", "rope_dim must be even and >= 2, got ", rope_dim);
  }
  if (offset < 0 || offset > x.dim(2) - rope_dim) {
    return Invalid("ApplyRope", "dims [offset, offset + rope_dim) = [", offset, ", ",
                   offset + rope_dim, ") must lie within the D = ", x.dim(2), " dims of x ",
                   x.ToString());
  }
  if (positions.dim(0) != x.dim(0)) {
    return Invalid("ApplyRope", "positions ", positions.ToString(), " must be [T] = [", x.dim(0),
                   "] for x ", x.ToString());
  }
  if (cos_sin.dim(1) != rope_dim) {
    return Invalid("ApplyRope", "cos_sin ", cos_sin.ToString(),
                   " must be [P, rope_dim = ", rope_dim, "]");
  }
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap("ApplyRope", "positions", positions, "x", x, false));
  return CheckNoOverlap("ApplyRope", "cos_sin", cos_sin, "x", x, false);
}

absl::Status Backend::CheckAttention(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& mask, float scale,
                                     const TensorView& out) const {
  const Device dev = device();
  EAGLE3_RETURN_IF_ERROR(CheckHeads("Attention", "q", "[T, N, Dk]", q, dev));
  EAGLE3_RETURN_IF_ERROR(CheckHeads("Attention", "k", "[S, N, Dk]", k, dev));
  EAGLE3_RETURN_IF_ERROR(CheckHeads("Attention", "v", "[S, N, Dv]", v, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix("Attention", "mask", "[T, S]", mask, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMaskDType("Attention", mask));
  EAGLE3_RETURN_IF_ERROR(CheckHeads("Attention", "out", "[T, N, Dv]", out, dev));
  EAGLE3_RETURN_IF_ERROR(CheckDistinctElements("Attention", "out", out));
  const int64_t t = q.dim(0), n = q.dim(1), dk = q.dim(2), s = k.dim(0), dv = v.dim(2);
  if (k.dim(1) != n || k.dim(2) != dk) {
    return Invalid("Attention", "k ", k.ToString(), " must be [S, N, Dk] with N = ", n,
                   ", Dk = ", dk, " from q ", q.ToString());
  }
  if (v.dim(0) != s || v.dim(1) != n) {
    return Invalid("Attention", "v ", v.ToString(), " must be [S, N, Dv] with S = ", s, " from k ",
                   k.ToString(), " and N = ", n);
  }
  if (mask.dim(0) != t || mask.dim(1) != s) {
    return Invalid("Attention", "mask ", mask.ToString(), " must be [T, S] = [", t, ", ", s, "]");
  }
  if (out.dim(0) != t || out.dim(1) != n || out.dim(2) != dv) {
    return Invalid("Attention", "out ", out.ToString(), " must be [T, N, Dv] = [", t, ", ", n, ", ",
                   dv, "]");
  }
  EAGLE3_RETURN_IF_ERROR(CheckScale("Attention", scale));
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap("Attention", "q", q, "out", out, false));
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap("Attention", "k", k, "out", out, false));
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap("Attention", "v", v, "out", out, false));
  return CheckNoOverlap("Attention", "mask", mask, "out", out, false);
}

namespace {

// What LatentAttention and BatchedLatentAttention share: q / cache widths, value_dim, out's shape,
// the scale, and no overlap of out with q or the cache.
absl::Status CheckLatentShapes(const char* op, const TensorView& q, const TensorView& cache,
                               float scale, int64_t value_dim, const TensorView& out) {
  const int64_t t = q.dim(0), n = q.dim(1), w = q.dim(2);
  if (cache.dim(2) != w) {
    return Invalid(op, "cache ", cache.ToString(), " rows must have q's width W = ", w, " (q ",
                   q.ToString(), ")");
  }
  if (value_dim < 1 || value_dim > w) {
    return Invalid(op, "value_dim must be in [1, W = ", w, "], got ", value_dim);
  }
  if (out.dim(0) != t || out.dim(1) != n || out.dim(2) != value_dim) {
    return Invalid(op, "out ", out.ToString(), " must be [T, N, value_dim] = [", t, ", ", n, ", ",
                   value_dim, "]");
  }
  EAGLE3_RETURN_IF_ERROR(CheckScale(op, scale));
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "q", q, "out", out, false));
  return CheckNoOverlap(op, "cache", cache, "out", out, false);
}

// The batch metadata of BatchedLatentAttention and BatchedPagedAttention: page_tables [B, P] i32,
// q_start [B + 1] i32, kv_len [B] i32, max_kv_len >= 1, none overlapping `out`.
absl::Status CheckBatchMetadata(const char* op, const TensorView& page_tables, const TensorView& q_start,
                                const TensorView& kv_len, int64_t max_kv_len, const TensorView& out,
                                Device dev) {
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "page_tables", "[B, P]", page_tables, dev));
  EAGLE3_RETURN_IF_ERROR(CheckI32(op, "page_tables", page_tables));
  EAGLE3_RETURN_IF_ERROR(CheckVector(op, "q_start", "[B + 1]", q_start, dev));
  EAGLE3_RETURN_IF_ERROR(CheckI32(op, "q_start", q_start));
  EAGLE3_RETURN_IF_ERROR(CheckVector(op, "kv_len", "[B]", kv_len, dev));
  EAGLE3_RETURN_IF_ERROR(CheckI32(op, "kv_len", kv_len));
  const int64_t b = page_tables.dim(0);
  if (q_start.dim(0) != b + 1) {
    return Invalid(op, "q_start ", q_start.ToString(), " must be [B + 1] = [", b + 1,
                   "] for page_tables ", page_tables.ToString());
  }
  if (kv_len.dim(0) != b) {
    return Invalid(op, "kv_len ", kv_len.ToString(), " must be [B] = [", b, "] for page_tables ",
                   page_tables.ToString());
  }
  if (max_kv_len < 1) return Invalid(op, "max_kv_len must be >= 1, got ", max_kv_len);
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "page_tables", page_tables, "out", out, false));
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "q_start", q_start, "out", out, false));
  return CheckNoOverlap(op, "kv_len", kv_len, "out", out, false);
}

}  // namespace

absl::Status Backend::CheckLatentAttention(const TensorView& q, const TensorView& cache,
                                           const TensorView& page_table, int64_t context_len,
                                           const TensorView& mask, float scale, int64_t value_dim,
                                           const TensorView& out) const {
  const Device dev = device();
  const char* op = "LatentAttention";
  EAGLE3_RETURN_IF_ERROR(CheckHeads(op, "q", "[T, N, W]", q, dev));
  EAGLE3_RETURN_IF_ERROR(CheckCache(op, cache, dev));
  EAGLE3_RETURN_IF_ERROR(CheckLatentCacheDType(op, cache));
  EAGLE3_RETURN_IF_ERROR(CheckVector(op, "page_table", "[pages]", page_table, dev));
  EAGLE3_RETURN_IF_ERROR(CheckI32(op, "page_table", page_table));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "mask", "[T, S]", mask, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMaskDType(op, mask));
  EAGLE3_RETURN_IF_ERROR(CheckHeads(op, "out", "[T, N, value_dim]", out, dev));
  EAGLE3_RETURN_IF_ERROR(CheckDistinctElements(op, "out", out));
  EAGLE3_RETURN_IF_ERROR(CheckLatentShapes(op, q, cache, scale, value_dim, out));
  const int64_t t = q.dim(0);
  const int64_t page_size = cache.dim(1);
  if (context_len < 1) return Invalid(op, "context_len must be >= 1, got ", context_len);
  const int64_t pages_needed = (context_len + page_size - 1) / page_size;
  if (page_table.dim(0) < pages_needed) {
    return Invalid(op, "page_table ", page_table.ToString(), " has fewer than the ceil(",
                   context_len, " / ", page_size, ") = ", pages_needed, " pages context_len needs");
  }
  if (mask.dim(0) != t || mask.dim(1) != context_len) {
    return Invalid(op, "mask ", mask.ToString(), " must be [T, S] = [", t, ", ", context_len, "]");
  }
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "page_table", page_table, "out", out, false));
  return CheckNoOverlap(op, "mask", mask, "out", out, false);
}

absl::Status Backend::CheckBatchedLatentAttention(const TensorView& q, const TensorView& cache,
                                                  const TensorView& page_tables,
                                                  const TensorView& q_start, const TensorView& kv_len,
                                                  int64_t max_kv_len, const TensorView& tree_mask,
                                                  float scale, int64_t value_dim,
                                                  const TensorView& out) const {
  const Device dev = device();
  const char* op = "BatchedLatentAttention";
  EAGLE3_RETURN_IF_ERROR(CheckHeads(op, "q", "[T, N, W]", q, dev));
  EAGLE3_RETURN_IF_ERROR(CheckCache(op, cache, dev));
  EAGLE3_RETURN_IF_ERROR(CheckLatentCacheDType(op, cache));
  EAGLE3_RETURN_IF_ERROR(CheckHeads(op, "out", "[T, N, value_dim]", out, dev));
  EAGLE3_RETURN_IF_ERROR(CheckDistinctElements(op, "out", out));
  EAGLE3_RETURN_IF_ERROR(CheckBatchMetadata(op, page_tables, q_start, kv_len, max_kv_len, out, dev));
  EAGLE3_RETURN_IF_ERROR(CheckLatentShapes(op, q, cache, scale, value_dim, out));
  const int64_t t = q.dim(0);
  if (HasTreeMask(tree_mask)) {
    EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "tree_mask", "[T, M]", tree_mask, dev));
    EAGLE3_RETURN_IF_ERROR(CheckMaskDType(op, tree_mask));
    if (tree_mask.dim(0) != t) {
      return Invalid(op, "tree_mask ", tree_mask.ToString(), " must have T = ", t, " rows (q ",
                     q.ToString(), ")");
    }
    EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "tree_mask", tree_mask, "out", out, false));
  }
  return absl::OkStatus();
}

absl::Status Backend::CheckBatchedLatentAttentionKeyMask(const TensorView& q, const TensorView& cache,
                                                         const TensorView& page_tables, const TensorView& q_start,
                                                         const TensorView& kv_len, int64_t max_kv_len,
                                                         const TensorView& key_mask, float scale, int64_t value_dim,
                                                         const TensorView& out) const {
  const Device dev = device();
  const char* op = "BatchedLatentAttentionKeyMask";
  EAGLE3_RETURN_IF_ERROR(CheckBatchedLatentAttention(q, cache, page_tables, q_start, kv_len, max_kv_len, TensorView(),
                                                     scale, value_dim, out));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "key_mask", "[T, max_kv_len]", key_mask, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMaskDType(op, key_mask));
  if (key_mask.dim(0) != q.dim(0) || key_mask.dim(1) != max_kv_len) {
    return Invalid(op, "key_mask ", key_mask.ToString(), " must be [T, max_kv_len] = [", q.dim(0), ", ", max_kv_len,
                   "]");
  }
  return CheckNoOverlap(op, "key_mask", key_mask, "out", out, false);
}

absl::Status Backend::BatchedLatentAttentionKeyMask(const TensorView& q, const TensorView& cache,
                                                    const TensorView& page_tables, const TensorView& q_start,
                                                    const TensorView& kv_len, int64_t max_kv_len,
                                                    const TensorView& key_mask, float scale, int64_t value_dim,
                                                    const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckBatchedLatentAttentionKeyMask(q, cache, page_tables, q_start, kv_len, max_kv_len,
                                                            key_mask, scale, value_dim, out));
  return absl::UnimplementedError(
      "BatchedLatentAttentionKeyMask (latent attention with a mask over every key, as an MLA draft's tree passes "
      "need) is not implemented by this backend");
}

absl::Status Backend::CheckBatchedPagedAttention(const TensorView& q, const TensorView& cache,
                                                 const TensorView& page_tables,
                                                 const TensorView& q_start, const TensorView& kv_len,
                                                 int64_t max_kv_len, const TensorView& mask,
                                                 float scale, const TensorView& out) const {
  const Device dev = device();
  const char* op = "BatchedPagedAttention";
  EAGLE3_RETURN_IF_ERROR(CheckHeads(op, "q", "[T, Nq, D]", q, dev));
  EAGLE3_RETURN_IF_ERROR(CheckCache(op, cache, dev));
  EAGLE3_RETURN_IF_ERROR(CheckHeads(op, "out", "[T, Nq, D]", out, dev));
  EAGLE3_RETURN_IF_ERROR(CheckDistinctElements(op, "out", out));
  EAGLE3_RETURN_IF_ERROR(CheckBatchMetadata(op, page_tables, q_start, kv_len, max_kv_len, out, dev));
  const int64_t t = q.dim(0), nq = q.dim(1), d = q.dim(2);
  if (d < 1 || cache.dim(2) % (2 * d) != 0 || cache.dim(2) == 0) {
    return Invalid(op, "cache ", cache.ToString(), " rows must be 2 * Nkv * D wide with Nkv >= 1 and D = ", d,
                   " from q ", q.ToString());
  }
  const int64_t nkv = cache.dim(2) / (2 * d);
  if (nq % nkv != 0) {
    return Invalid(op, "q ", q.ToString(), " has Nq = ", nq, " heads, not a multiple of the Nkv = ", nkv,
                   " kv heads of cache ", cache.ToString());
  }
  if (!(out.shape() == q.shape())) {
    return Invalid(op, "out ", out.ToString(), " must be [T, Nq, D] = [", t, ", ", nq, ", ", d, "] like q");
  }
  EAGLE3_RETURN_IF_ERROR(CheckScale(op, scale));
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "q", q, "out", out, false));
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "cache", cache, "out", out, false));
  if (!HasTreeMask(mask)) return absl::OkStatus();  // causal
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "mask", "[T, max_kv_len]", mask, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMaskDType(op, mask));
  if (mask.dim(0) != t || mask.dim(1) != max_kv_len) {
    return Invalid(op, "mask ", mask.ToString(), " must be [T, max_kv_len] = [", t, ", ", max_kv_len, "]");
  }
  return CheckNoOverlap(op, "mask", mask, "out", out, false);
}

absl::Status Backend::CheckPaged(const char* op, const TensorView& rows,
                                 const TensorView& positions, const TensorView& page_table,
                                 const TensorView& cache) const {
  const Device dev = device();
  const bool write = std::string(op) == "PagedWrite";
  const char* rows_name = write ? "rows" : "out";
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, rows_name, "[T, W]", rows, dev));
  EAGLE3_RETURN_IF_ERROR(CheckVector(op, "positions", "[T]", positions, dev));
  EAGLE3_RETURN_IF_ERROR(CheckIndexDType(op, "positions", positions));
  EAGLE3_RETURN_IF_ERROR(CheckVector(op, "page_table", "[pages]", page_table, dev));
  EAGLE3_RETURN_IF_ERROR(CheckI32(op, "page_table", page_table));
  EAGLE3_RETURN_IF_ERROR(CheckCache(op, cache, dev));
  EAGLE3_RETURN_IF_ERROR(CheckLatentCacheDType(op, cache));
  if (positions.dim(0) != rows.dim(0)) {
    return Invalid(op, "positions ", positions.ToString(), " must be [T] = [", rows.dim(0),
                   "] for ", rows_name, " ", rows.ToString());
  }
  if (cache.dim(2) != rows.dim(1)) {
    return Invalid(op, "cache ", cache.ToString(), " rows must have the width W = ", rows.dim(1),
                   " of ", rows_name, " ", rows.ToString());
  }
  // The written tensor must not overlap any other operand.
  const TensorView& dst = write ? cache : rows;
  const char* dst_name = write ? "cache" : rows_name;
  if (write) EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, rows_name, rows, dst_name, dst, false));
  if (!write) EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "cache", cache, dst_name, dst, false));
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "positions", positions, dst_name, dst, false));
  return CheckNoOverlap(op, "page_table", page_table, dst_name, dst, false);
}

namespace {

// The views LatentRowsAndQueries' sub-ops take: k_pe of every row as [T, 1, W] (ApplyRope at offset
// latent) and c as [T, latent].
TensorView RowsAsHeads(const TensorView& rows) {
  return TensorView(rows.data(), rows.dtype(), Shape{rows.dim(0), 1, rows.dim(1)},
                    Shape{rows.stride(0), rows.dim(1), 1}, rows.device());
}

TensorView LatentColumns(const TensorView& rows, int64_t latent) { return rows.Narrow(1, 0, latent); }

absl::Status Prefixed(const char* op, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(op, ": ", status.message()));
}

}  // namespace

absl::Status Backend::CheckLatentRowsAndQueries(const TensorView& rows, const TensorView& norm_weight, float eps,
                                                const TensorView& q_pe, const TensorView& q_rot,
                                                const TensorView& positions, const TensorView& cos_sin,
                                                const TensorView& slots, const TensorView& slot_table,
                                                const TensorView& cache) const {
  constexpr char kOp[] = "LatentRowsAndQueries";
  const Device dev = device();
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(kOp, "rows", "[T, W]", rows, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(kOp, "cos_sin", "[P, rope_dim]", cos_sin, dev));
  const int64_t rope = cos_sin.dim(1), latent = rows.dim(1) - rope;
  if (latent < 1) {
    return Invalid(kOp, "rows ", rows.ToString(), " must be wider than rope_dim = ", rope, " (cos_sin ",
                   cos_sin.ToString(), ")");
  }
  EAGLE3_RETURN_IF_ERROR(Prefixed(kOp, CheckApplyRope(RowsAsHeads(rows), latent, rope, positions, cos_sin)));
  if (!Absent(norm_weight)) {
    const TensorView c = LatentColumns(rows, latent);
    EAGLE3_RETURN_IF_ERROR(CheckNorm(kOp, {"c", "norm_weight", "c"}, c, nullptr, norm_weight, eps, c, dev));
  }
  if (!Absent(q_pe) || !Absent(q_rot)) {
    EAGLE3_RETURN_IF_ERROR(CheckHeads(kOp, "q_pe", "[T, H, rope_dim]", q_pe, dev));
    if (!(q_pe.shape() == q_rot.shape()) || q_pe.dim(0) != rows.dim(0) || q_pe.dim(2) != rope) {
      return Invalid(kOp, "q_pe ", q_pe.ToString(), " and q_rot ", q_rot.ToString(),
                     " must both be [T, H, rope_dim] = [", rows.dim(0), ", H, ", rope, "]");
    }
    EAGLE3_RETURN_IF_ERROR(Prefixed(kOp, CheckApplyRope(q_rot, 0, rope, positions, cos_sin)));
    EAGLE3_RETURN_IF_ERROR(CheckNoBandOverlap(kOp, "q_pe", q_pe, "q_rot", q_rot));
    EAGLE3_RETURN_IF_ERROR(CheckNoBandOverlap(kOp, "rows", rows, "q_rot", q_rot));
    EAGLE3_RETURN_IF_ERROR(CheckNoBandOverlap(kOp, "q_pe", q_pe, "rows", rows));
  }
  return Prefixed(kOp, CheckPaged("PagedWrite", rows, slots, slot_table, cache));
}

absl::Status Backend::LatentRowsAndQueries(const TensorView& rows, const TensorView& norm_weight, float eps,
                                           const TensorView& q_pe, const TensorView& q_rot,
                                           const TensorView& positions, const TensorView& cos_sin, RopeStyle style,
                                           const TensorView& slots, const TensorView& slot_table,
                                           const TensorView& cache) {
  EAGLE3_RETURN_IF_ERROR(
      CheckLatentRowsAndQueries(rows, norm_weight, eps, q_pe, q_rot, positions, cos_sin, slots, slot_table, cache));
  const int64_t rope = cos_sin.dim(1), latent = rows.dim(1) - rope;
  // k_pe first: ApplyRope checks every position before it writes anything.
  EAGLE3_RETURN_IF_ERROR(ApplyRope(RowsAsHeads(rows), latent, rope, positions, cos_sin, style));
  const TensorView c = LatentColumns(rows, latent);
  if (!Absent(norm_weight)) EAGLE3_RETURN_IF_ERROR(RmsNorm(c, norm_weight, eps, c));
  if (!Absent(q_pe)) {
    EAGLE3_RETURN_IF_ERROR(Copy(q_pe, q_rot));
    EAGLE3_RETURN_IF_ERROR(ApplyRope(q_rot, 0, rope, positions, cos_sin, style));
  }
  return PagedWrite(rows, slots, slot_table, cache);
}

absl::Status Backend::CheckCompactAccepted(const TensorView& cache, const TensorView& page_tables,
                                           const TensorView& cache_len, const TensorView& accepted,
                                           const TensorView& num_accepted) const {
  const Device dev = device();
  const char* op = "CompactAccepted";
  EAGLE3_RETURN_IF_ERROR(CheckCache(op, cache, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "page_tables", "[B, P]", page_tables, dev));
  EAGLE3_RETURN_IF_ERROR(CheckI32(op, "page_tables", page_tables));
  EAGLE3_RETURN_IF_ERROR(CheckVector(op, "cache_len", "[B]", cache_len, dev));
  EAGLE3_RETURN_IF_ERROR(CheckIndexDType(op, "cache_len", cache_len));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "accepted", "[B, max_nodes]", accepted, dev));
  EAGLE3_RETURN_IF_ERROR(CheckI32(op, "accepted", accepted));
  EAGLE3_RETURN_IF_ERROR(CheckVector(op, "num_accepted", "[B]", num_accepted, dev));
  EAGLE3_RETURN_IF_ERROR(CheckI32(op, "num_accepted", num_accepted));
  const int64_t b = page_tables.dim(0);
  const std::pair<const char*, const TensorView*> per_sequence[] = {
      {"cache_len", &cache_len}, {"accepted", &accepted}, {"num_accepted", &num_accepted}};
  for (const auto& [name, view] : per_sequence) {
    if (view->dim(0) != b) {
      return Invalid(op, name, " ", view->ToString(), " must have B = ", b,
                     " rows (one per sequence of page_tables ", page_tables.ToString(), ")");
    }
  }
  const std::pair<const char*, const TensorView*> inputs[] = {
      {"page_tables", &page_tables}, {"cache_len", &cache_len}, {"accepted", &accepted},
      {"num_accepted", &num_accepted}};
  for (const auto& [name, view] : inputs) {
    EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, name, *view, "cache", cache, false));
  }
  return absl::OkStatus();
}

absl::Status Backend::CheckMoeRoute(const TensorView& logits, const TensorView* correction_bias,
                                    const MoeRoutingParams& params, const TensorView& ids,
                                    const TensorView& weights) const {
  const Device dev = device();
  const char* op = "MoeRoute";
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "logits", "[T, E]", logits, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "ids", "[T, top_k]", ids, dev));
  EAGLE3_RETURN_IF_ERROR(CheckI32(op, "ids", ids));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "weights", "[T, top_k]", weights, dev));
  const int64_t experts = logits.dim(1);
  const std::string method(TopkMethodName(params.topk_method));
  const std::string scoring(ScoringFuncName(params.scoring_func));
  const bool noaux = params.topk_method == TopkMethod::kNoauxTc;
  if ((params.scoring_func == ScoringFunc::kSigmoid) != noaux) {
    return Invalid(op, "scoring_func ", scoring, " does not go with topk_method ", method,
                   " (softmax pairs with greedy/group_limited_greedy, sigmoid with noaux_tc)");
  }
  if (params.top_k < 1 || params.top_k > experts) {
    return Invalid(op, "top_k = ", params.top_k, " must be in [1, E] for logits ",
                   logits.ToString());
  }
  if (params.topk_method != TopkMethod::kGreedy) {
    if (params.n_group < 1 || experts % params.n_group != 0) {
      return Invalid(op, "n_group = ", params.n_group, " must divide the E = ", experts,
                     " experts of logits ", logits.ToString(), " (", method, ")");
    }
    const int64_t per_group = experts / params.n_group;
    if (params.topk_group < 1 || params.topk_group > params.n_group) {
      return Invalid(op, "topk_group = ", params.topk_group,
                     " must be in [1, n_group = ", params.n_group, "] (", method, ")");
    }
    if (params.top_k > params.topk_group * per_group) {
      return Invalid(op, "top_k = ", params.top_k, " exceeds the ", params.topk_group * per_group,
                     " experts in the topk_group = ", params.topk_group, " kept groups of ",
                     per_group, " (", method, ")");
    }
    if (noaux && per_group < 2) {
      return Invalid(op, "noaux_tc scores a group by its two best experts but the groups have ",
                     per_group, " (E = ", experts, ", n_group = ", params.n_group, ")");
    }
  }
  if (!std::isfinite(params.routed_scaling_factor)) {
    return Invalid(op, "routed_scaling_factor must be finite, got ", params.routed_scaling_factor);
  }
  if (noaux != (correction_bias != nullptr)) {
    return Invalid(op,
                   noaux ? "noaux_tc needs correction_bias [E]"
                         : "correction_bias is only for noaux_tc, got one with topk_method ",
                   noaux ? "" : method);
  }
  if (correction_bias != nullptr) {
    EAGLE3_RETURN_IF_ERROR(CheckVector(op, "correction_bias", "[E]", *correction_bias, dev));
    if (correction_bias->dim(0) != experts) {
      return Invalid(op, "correction_bias ", correction_bias->ToString(), " must be [E] = [",
                     experts, "]");
    }
  }
  for (const TensorView* t : {&ids, &weights}) {
    if (t->dim(0) != logits.dim(0) || t->dim(1) != params.top_k) {
      return Invalid(op, t == &ids ? "ids " : "weights ", t->ToString(), " must be [T, top_k] = [",
                     logits.dim(0), ", ", params.top_k, "]");
    }
  }
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "logits", logits, "ids", ids, false));
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "logits", logits, "weights", weights, false));
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "ids", ids, "weights", weights, false));
  if (correction_bias != nullptr) {
    EAGLE3_RETURN_IF_ERROR(
        CheckNoOverlap(op, "correction_bias", *correction_bias, "ids", ids, false));
    EAGLE3_RETURN_IF_ERROR(
        CheckNoOverlap(op, "correction_bias", *correction_bias, "weights", weights, false));
  }
  return absl::OkStatus();
}

namespace {

// The token-side operands of MoeExperts and QuantizedMoeExperts: x [T, H], ids [T, k] i32,
// weights [T, k], out [T, H], out overlapping none of them.
absl::Status CheckMoeTokens(const char* op, const TensorView& x, const TensorView& ids,
                            const TensorView& weights, const TensorView& out, Device dev) {
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "x", "[T, H]", x, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "ids", "[T, k]", ids, dev));
  EAGLE3_RETURN_IF_ERROR(CheckI32(op, "ids", ids));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "weights", "[T, k]", weights, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "out", "[T, H]", out, dev));
  EAGLE3_RETURN_IF_ERROR(CheckRowsLike(op, "out", out, "x", x));
  if (ids.dim(0) != x.dim(0)) {
    return Invalid(op, "ids ", ids.ToString(), " must be [T, k] with T = ", x.dim(0), " from x ",
                   x.ToString());
  }
  EAGLE3_RETURN_IF_ERROR(CheckRowsLike(op, "weights", weights, "ids", ids));
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "x", x, "out", out, false));
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "ids", ids, "out", out, false));
  return CheckNoOverlap(op, "weights", weights, "out", out, false);
}

}  // namespace

absl::Status Backend::CheckMoeExperts(const TensorView& x, const TensorView& ids,
                                      const TensorView& weights,
                                      std::span<const ExpertWeights> experts,
                                      const TensorView& out) const {
  const Device dev = device();
  const char* op = "MoeExperts";
  EAGLE3_RETURN_IF_ERROR(CheckMoeTokens(op, x, ids, weights, out, dev));
  const int64_t hidden = x.dim(1);
  int64_t inter = 0;  // from experts[0]
  for (size_t e = 0; e < experts.size(); ++e) {
    const std::string gate_up_name = absl::StrCat("experts[", e, "].gate_up");
    const std::string down_name = absl::StrCat("experts[", e, "].down");
    const TensorView& gate_up = experts[e].gate_up;
    const TensorView& down = experts[e].down;
    EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, gate_up_name.c_str(), "[2 * I, H]", gate_up, dev));
    EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, down_name.c_str(), "[H, I]", down, dev));
    if (e == 0) {
      if (gate_up.dim(0) % 2 != 0) {
        return Invalid(op, gate_up_name, " ", gate_up.ToString(),
                       " must be [2 * I, H] (gate rows, then up rows): odd row count");
      }
      inter = gate_up.dim(0) / 2;
    }
    if (gate_up.dim(0) != 2 * inter || gate_up.dim(1) != hidden) {
      return Invalid(op, gate_up_name, " ", gate_up.ToString(), " must be [2 * I, H] = [",
                     2 * inter, ", ", hidden, "] (H from x ", x.ToString(),
                     ", I from experts[0], the same for every expert)");
    }
    if (down.dim(0) != hidden || down.dim(1) != inter) {
      return Invalid(op, down_name, " ", down.ToString(), " must be [H, I] = [", hidden, ", ",
                     inter, "]");
    }
    EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, gate_up_name.c_str(), gate_up, "out", out, false));
    EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, down_name.c_str(), down, "out", out, false));
  }
  return absl::OkStatus();
}

absl::Status Backend::CheckQuantizedMoeExperts(const TensorView& x, const TensorView& ids,
                                               const TensorView& weights,
                                               std::span<const QuantizedExpertWeights> experts,
                                               const TensorView& out) const {
  const Device dev = device();
  const char* op = "QuantizedMoeExperts";
  EAGLE3_RETURN_IF_ERROR(CheckMoeTokens(op, x, ids, weights, out, dev));
  const int64_t hidden = x.dim(1);
  int64_t inter = 0;  // from experts[0].gate
  for (size_t e = 0; e < experts.size(); ++e) {
    const QuantizedExpertWeights& expert = experts[e];
    for (const auto& [field, w] : {std::pair<const char*, const QuantizedWeightView*>{"gate", &expert.gate},
                                   {"up", &expert.up},
                                   {"down", &expert.down}}) {
      const std::string name = absl::StrCat("experts[", e, "].", field);
      const std::string where = absl::StrCat(op, ": ", name);
      EAGLE3_RETURN_IF_ERROR(w->Check(where));
      if (w->codes.device() != dev) {
        return Invalid(op, name, ".codes is ", w->codes.ToString(), " but this backend runs on ",
                       dev.ToString());
      }
      const QuantizedWeightView& first = experts[0].gate;
      if (w->format != first.format || w->block_rows != first.block_rows ||
          w->block_cols != first.block_cols || w->scales.dtype() != first.scales.dtype()) {
        return Invalid(op, name, " is ", std::string(WeightFormatName(w->format)), " with ", w->block_rows, " x ",
                       w->block_cols, " blocks and ", std::string(DTypeName(w->scales.dtype())),
                       " scales, but experts[0].gate is ", std::string(WeightFormatName(first.format)), " with ",
                       first.block_rows, " x ", first.block_cols, " blocks and ",
                       std::string(DTypeName(first.scales.dtype())),
                       " scales: every expert's views must share one format, block size and scale "
                       "dtype");
      }
      if (e == 0 && w == &expert.gate) inter = w->rows();
      const bool is_down = w == &expert.down;
      const int64_t want_rows = is_down ? hidden : inter;
      const int64_t want_k = is_down ? inter : hidden;
      if (w->rows() != want_rows || w->k != want_k) {
        return Invalid(op, name, " has ", w->rows(), " rows (codes ", w->codes.ToString(), ") and k = ",
                       w->k, "; expected ", is_down ? "[H, I]" : "[I, H]", " = [", want_rows, ", ",
                       want_k, "] (H from x ", x.ToString(),
                       ", I from experts[0].gate, the same for every expert)");
      }
      EAGLE3_RETURN_IF_ERROR(
          CheckNoOverlap(op, absl::StrCat(name, ".codes").c_str(), w->codes, "out", out, false));
      EAGLE3_RETURN_IF_ERROR(
          CheckNoOverlap(op, absl::StrCat(name, ".scales").c_str(), w->scales, "out", out, false));
    }
  }
  return absl::OkStatus();
}

absl::Status Backend::CheckTreeVerify(const TensorView& tokens, const TensorView& parents,
                                      const TensorView& logits, const SamplingParams& sampling,
                                      const TensorView& seed_offset,
                                      const TreeVerifyOutputs& out) const {
  const Device dev = device();
  const char* op = "TreeVerify";
  EAGLE3_RETURN_IF_ERROR(CheckDense(op, "tokens", "[B, N]", tokens, 2, DType::kI64, dev));
  EAGLE3_RETURN_IF_ERROR(CheckDense(op, "parents", "[B, N]", parents, 2, DType::kI32, dev));
  EAGLE3_RETURN_IF_ERROR(CheckRowsLike(op, "parents", parents, "tokens", tokens));
  const int64_t batch = tokens.dim(0);
  const int64_t nodes = tokens.dim(1);
  if (nodes < 1) {
    return Invalid(op, "tokens ", tokens.ToString(), " must hold N >= 1 nodes per tree (the root)");
  }
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "logits", "[B * N, V]", logits, dev));
  if (logits.dim(0) != batch * nodes || logits.dim(1) < 1) {
    return Invalid(op, "logits ", logits.ToString(), " must be [B * N, V] with B * N = ",
                   batch * nodes, " (tokens ", tokens.ToString(), ") and V >= 1");
  }
  if (absl::Status st = sampling.Validate(); !st.ok()) return Invalid(op, st.message());
  EAGLE3_RETURN_IF_ERROR(CheckDense(op, "seed_offset", "[2]", seed_offset, 1, DType::kI64, dev));
  if (seed_offset.dim(0) != 2) {
    return Invalid(op, "seed_offset ", seed_offset.ToString(), " must be [2]: {seed, offset}");
  }
  struct Output {
    const char* name;
    const char* layout;
    const TensorView* view;
    DType dtype;
    Shape shape;
  };
  const Output outputs[] = {
      {"out.num_accepted", "[B]", &out.num_accepted, DType::kI32, Shape{batch}},
      {"out.accepted", "[B, N]", &out.accepted, DType::kI32, Shape{batch, nodes}},
      {"out.out_tokens", "[B, N]", &out.out_tokens, DType::kI64, Shape{batch, nodes}},
      {"out.commit_offsets", "[B, N]", &out.commit_offsets, DType::kI32, Shape{batch, nodes}},
      {"out.commit_counts", "[B]", &out.commit_counts, DType::kI32, Shape{batch}},
      {"out.errors", "[B, 3]", &out.errors, DType::kI64, Shape{batch, kVerifyErrorWidth}},
  };
  const std::pair<const char*, const TensorView*> inputs[] = {
      {"tokens", &tokens}, {"parents", &parents}, {"logits", &logits}, {"seed_offset", &seed_offset}};
  for (size_t i = 0; i < std::size(outputs); ++i) {
    const Output& o = outputs[i];
    EAGLE3_RETURN_IF_ERROR(
        CheckDense(op, o.name, o.layout, *o.view, o.shape.rank(), o.dtype, dev));
    if (!(o.view->shape() == o.shape)) {
      return Invalid(op, o.name, " ", o.view->ToString(), " must be ", o.layout, " = ",
                     o.shape.ToString(), " (tokens ", tokens.ToString(), ")");
    }
    for (const auto& [name, view] : inputs) {
      EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, name, *view, o.name, *o.view, false));
    }
    for (size_t j = 0; j < i; ++j) {
      EAGLE3_RETURN_IF_ERROR(
          CheckNoOverlap(op, outputs[j].name, *outputs[j].view, o.name, *o.view, false));
    }
  }
  return absl::OkStatus();
}

absl::Status Backend::CheckGatherRows(const TensorView& src, const TensorView& index, const TensorView& out,
                                      int64_t groups) const {
  const Device dev = device();
  const char* op = "GatherRows";
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "src", "[R, C]", src, dev));
  EAGLE3_RETURN_IF_ERROR(CheckVector(op, "index", "[n]", index, dev));
  EAGLE3_RETURN_IF_ERROR(CheckI32(op, "index", index));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "out", "[n, C]", out, dev));
  if (out.dtype() != src.dtype()) {
    return Invalid(op, "out ", out.ToString(), " must have the dtype of src ", src.ToString());
  }
  if (out.dim(0) != index.dim(0) || out.dim(1) != src.dim(1)) {
    return Invalid(op, "out ", out.ToString(), " must be [n, C] = [", index.dim(0), ", ",
                   src.dim(1), "] (index ", index.ToString(), ", src ", src.ToString(), ")");
  }
  if (groups < 1 || src.dim(0) % groups != 0 || index.dim(0) % groups != 0) {
    return Invalid(op, "groups = ", groups, " must be >= 1 and divide the rows of src ", src.ToString(),
                   " and of index ", index.ToString());
  }
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "src", src, "out", out, false));
  return CheckNoOverlap(op, "index", index, "out", out, false);
}

absl::Status Backend::CheckExtendMaskRows(const TensorView& src, const TensorView& parent,
                                          const TensorView& column, const TensorView& out) const {
  const Device dev = device();
  const char* op = "ExtendMaskRows";
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "src", "[R, M]", src, dev));
  EAGLE3_RETURN_IF_ERROR(CheckDTypeIs(op, "src", src, DType::kU8));
  EAGLE3_RETURN_IF_ERROR(CheckVector(op, "parent", "[n]", parent, dev));
  EAGLE3_RETURN_IF_ERROR(CheckI32(op, "parent", parent));
  EAGLE3_RETURN_IF_ERROR(CheckVector(op, "column", "[n]", column, dev));
  EAGLE3_RETURN_IF_ERROR(CheckI32(op, "column", column));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "out", "[n, M]", out, dev));
  EAGLE3_RETURN_IF_ERROR(CheckDTypeIs(op, "out", out, DType::kU8));
  if (column.dim(0) != parent.dim(0)) {
    return Invalid(op, "column ", column.ToString(), " must be [n] = [", parent.dim(0),
                   "] like parent ", parent.ToString());
  }
  if (out.dim(0) != parent.dim(0) || out.dim(1) != src.dim(1)) {
    return Invalid(op, "out ", out.ToString(), " must be [n, M] = [", parent.dim(0), ", ",
                   src.dim(1), "] (parent ", parent.ToString(), ", src ", src.ToString(), ")");
  }
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "src", src, "out", out, false));
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "parent", parent, "out", out, false));
  return CheckNoOverlap(op, "column", column, "out", out, false);
}

namespace {

// A dense operand of exactly `shape`; `layout` names its dims ("[B, N]").
absl::Status CheckDenseShape(const char* op, const char* name, const char* layout,
                             const TensorView& t, const Shape& shape, DType dtype, Device device) {
  EAGLE3_RETURN_IF_ERROR(CheckDense(op, name, layout, t, shape.rank(), dtype, device));
  if (t.shape() == shape) return absl::OkStatus();
  return Invalid(op, name, " ", t.ToString(), " must be ", layout, " = ", shape.ToString());
}

struct Operand {
  const char* name;
  const TensorView* view;
  bool written;
};

// No written operand shares memory with another operand (an absent optional one is skipped).
absl::Status CheckWritesApart(const char* op, std::span<const Operand> operands) {
  for (size_t i = 0; i < operands.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (!operands[i].written && !operands[j].written) continue;
      if (operands[i].view->empty() || operands[j].view->empty()) continue;
      const Operand& in = operands[i].written ? operands[j] : operands[i];
      const Operand& out = operands[i].written ? operands[i] : operands[j];
      EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, in.name, *in.view, out.name, *out.view, false));
    }
  }
  return absl::OkStatus();
}

// What both tree-build ops take: the shape, the workspace and the error records.
absl::Status CheckTreeBuildState(const Backend& backend, const char* op,
                                 const TreeBuildShape& shape, const TensorView& workspace,
                                 const TensorView& errors) {
  if (shape.batch < 0) return Invalid(op, "shape.batch = ", shape.batch, " must be >= 0");
  const DraftTreeParams params{shape.topk, shape.num_steps, shape.num_draft_tokens};
  if (absl::Status st = params.Validate(shape.vocab); !st.ok()) {
    return Invalid(op, st.message(), " (TreeBuildShape)");
  }
  const int64_t bytes = backend.TreeBuildWorkspaceBytes(shape);
  if (bytes == 0 && shape.batch > 0) {
    return Invalid(op, "TreeBuildShape {batch ", shape.batch, ", topk ", shape.topk,
                   ", num_steps ", shape.num_steps, ", num_draft_tokens ",
                   shape.num_draft_tokens, ", vocab ", shape.vocab,
                   "} is outside this backend's limits (TreeBuildWorkspaceBytes is 0)");
  }
  const Device dev = backend.device();
  EAGLE3_RETURN_IF_ERROR(CheckDense(op, "workspace", "[bytes]", workspace, 1, DType::kU8, dev));
  if (workspace.numel() < bytes) {
    return Invalid(op, "workspace ", workspace.ToString(), " has ", workspace.numel(),
                   " bytes, TreeBuildWorkspaceBytes(shape) = ", bytes);
  }
  if (reinterpret_cast<uintptr_t>(workspace.data()) % 16 != 0) {
    return Invalid(op, "workspace ", workspace.ToString(), " must be 16-byte aligned");
  }
  return CheckDenseShape(op, "errors", "[B, 4]", errors, Shape{shape.batch, kTreeBuildErrorWidth},
                         DType::kI64, dev);
}

}  // namespace

absl::Status Backend::CheckTreeBuildStep(const TreeBuildShape& shape, int step,
                                         const TensorView& logits, const TensorView& d2t,
                                         const TensorView& workspace, const TensorView& errors,
                                         const TensorView& frontier_tokens,
                                         const TensorView& frontier_parents) const {
  const Device dev = device();
  const char* op = "TreeBuildStep";
  EAGLE3_RETURN_IF_ERROR(CheckTreeBuildState(*this, op, shape, workspace, errors));
  if (step < 0 || step >= shape.num_steps) {
    return Invalid(op, "step = ", step, " is outside [0, num_steps = ", shape.num_steps, ")");
  }
  const int64_t rows = shape.batch * (step == 0 ? 1 : shape.topk);
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "logits", "[B * F, Vd]", logits, dev));
  if (logits.dim(0) != rows || logits.dim(1) != shape.vocab) {
    return Invalid(op, "logits ", logits.ToString(), " must be [B * F, Vd] = [", rows, ", ",
                   shape.vocab, "] at step ", step, " (F = 1 at step 0, else topk = ", shape.topk,
                   ")");
  }
  if (!d2t.empty()) {
    EAGLE3_RETURN_IF_ERROR(
        CheckDenseShape(op, "d2t", "[Vd]", d2t, Shape{shape.vocab}, DType::kI64, dev));
  }
  const Shape frontier{shape.batch * shape.topk};
  EAGLE3_RETURN_IF_ERROR(CheckDenseShape(op, "frontier_tokens", "[B * topk]", frontier_tokens,
                                         frontier, DType::kI64, dev));
  EAGLE3_RETURN_IF_ERROR(CheckDenseShape(op, "frontier_parents", "[B * topk]", frontier_parents,
                                         frontier, DType::kI32, dev));
  const Operand operands[] = {{"logits", &logits, false},
                              {"d2t", &d2t, false},
                              {"workspace", &workspace, true},
                              {"errors", &errors, true},
                              {"frontier_tokens", &frontier_tokens, true},
                              {"frontier_parents", &frontier_parents, true}};
  return CheckWritesApart(op, operands);
}

absl::Status Backend::CheckTreeBuildFinalize(const TreeBuildShape& shape,
                                             const TensorView& workspace, const TensorView& errors,
                                             const TensorView& root_tokens,
                                             const TensorView& root_positions,
                                             const TensorView& tokens, const TensorView& parents,
                                             const TensorView& positions,
                                             const TensorView& mask) const {
  const Device dev = device();
  const char* op = "TreeBuildFinalize";
  EAGLE3_RETURN_IF_ERROR(CheckTreeBuildState(*this, op, shape, workspace, errors));
  const int64_t b = shape.batch, n = shape.num_draft_tokens;
  EAGLE3_RETURN_IF_ERROR(
      CheckDenseShape(op, "root_tokens", "[B]", root_tokens, Shape{b}, DType::kI64, dev));
  EAGLE3_RETURN_IF_ERROR(
      CheckDenseShape(op, "root_positions", "[B]", root_positions, Shape{b}, DType::kI64, dev));
  EAGLE3_RETURN_IF_ERROR(
      CheckDenseShape(op, "tokens", "[B, N]", tokens, Shape{b, n}, DType::kI64, dev));
  EAGLE3_RETURN_IF_ERROR(
      CheckDenseShape(op, "parents", "[B, N]", parents, Shape{b, n}, DType::kI32, dev));
  EAGLE3_RETURN_IF_ERROR(
      CheckDenseShape(op, "positions", "[B, N]", positions, Shape{b, n}, DType::kI64, dev));
  EAGLE3_RETURN_IF_ERROR(
      CheckDenseShape(op, "mask", "[B * N, N]", mask, Shape{b * n, n}, DType::kU8, dev));
  const Operand operands[] = {{"workspace", &workspace, false},
                              {"errors", &errors, false},
                              {"root_tokens", &root_tokens, false},
                              {"root_positions", &root_positions, false},
                              {"tokens", &tokens, true},
                              {"parents", &parents, true},
                              {"positions", &positions, true},
                              {"mask", &mask, true}};
  return CheckWritesApart(op, operands);
}

}  // namespace eagle3
