#include "eagle3/backend.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
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

absl::Status CheckRowsLike(const char* op, const char* name, const TensorView& t,
                           const char* ref_name, const TensorView& ref) {
  if (!(t.shape() == ref.shape())) {
    return Invalid(op, name, " ", t.ToString(), " must have the shape of ", ref_name, " ",
                   ref.ToString());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Backend::CheckCopy(const TensorView& src, const TensorView& dst) const {
  EAGLE3_RETURN_IF_ERROR(CheckLayout("Copy", "src", src));
  EAGLE3_RETURN_IF_ERROR(CheckLayout("Copy", "dst", dst));
  if (!(src.shape() == dst.shape()) || src.dtype() != dst.dtype()) {
    return Invalid("Copy", "src ", src.ToString(), " and dst ", dst.ToString(),
                   " must have the same shape and dtype");
  }
  if (src.device() != dst.device()) return absl::OkStatus();  // distinct address spaces
  return CheckNoOverlap("Copy", "src", src, "dst", dst, true);
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
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap("Gemm", "a", a, "c", c, false));
  return CheckNoOverlap("Gemm", "b", b, "c", c, false);
}

absl::Status Backend::CheckRmsNorm(const char* op, const TensorView& x, const TensorView* residual,
                                   const TensorView& weight, float eps,
                                   const TensorView& out) const {
  const Device dev = device();
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "x", "[T, H]", x, dev));
  EAGLE3_RETURN_IF_ERROR(CheckVector(op, "weight", "[H]", weight, dev));
  EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "out", "[T, H]", out, dev));
  if (weight.dim(0) != x.dim(1)) {
    return Invalid(op, "weight ", weight.ToString(), " must be [H] = [", x.dim(1), "] for x ",
                   x.ToString());
  }
  EAGLE3_RETURN_IF_ERROR(CheckRowsLike(op, "out", out, "x", x));
  if (!(eps >= 0.0f) || !std::isfinite(eps)) {
    return Invalid(op, "eps must be finite and >= 0, got ", eps);
  }
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "x", x, "out", out, true));
  EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "weight", weight, "out", out, false));
  if (residual != nullptr) {
    EAGLE3_RETURN_IF_ERROR(CheckMatrix(op, "residual", "[T, H]", *residual, dev));
    EAGLE3_RETURN_IF_ERROR(CheckRowsLike(op, "residual", *residual, "x", x));
    EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "x", x, "residual", *residual, false));
    EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "weight", weight, "residual", *residual, false));
    EAGLE3_RETURN_IF_ERROR(CheckNoOverlap(op, "residual", *residual, "out", out, false));
  }
  return absl::OkStatus();
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

}  // namespace eagle3
