#include "collective_checks.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "eagle3/status.h"

namespace eagle3 {
namespace {

bool IsCollectiveDType(DType d) {
  return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16 || d == DType::kI32 || d == DType::kI64;
}

struct ByteRange {
  uintptr_t begin = 0;
  uintptr_t end = 0;
};

ByteRange RangeOf(const TensorView& t) {
  const auto begin = reinterpret_cast<uintptr_t>(t.data());
  return {begin, begin + t.nbytes()};
}

bool Overlap(ByteRange a, ByteRange b) {
  return a.begin < a.end && b.begin < b.end && a.begin < b.end && b.begin < a.end;
}

}  // namespace

absl::Status CheckCollectiveBuffer(const char* op, const char* name, const TensorView& t, Device expected) {
  for (int i = 0; i < t.rank(); ++i) {
    if (t.dim(i) < 0) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " ", t.ToString(), " has a negative dim"));
    }
  }
  if (t.device() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " ", t.ToString(),
        expected.is_cpu() ? std::string(" must be host memory (device cpu)")
                          : " must be memory of " + expected.ToString() + " (the communicator's device)"));
  }
  if (!IsCollectiveDType(t.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " ", t.ToString(), " has dtype ",
                                                   std::string(DTypeName(t.dtype())),
                                                   "; expected f32, f16, bf16, i32 or i64"));
  }
  if (!t.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " ", t.ToString(), " must be contiguous"));
  }
  if (t.data() == nullptr && t.numel() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " ", t.ToString(), " has no data"));
  }
  return absl::OkStatus();
}

absl::Status CheckCollectivePair(const char* op, const TensorView& small, const TensorView& big, int factor,
                                 const char* small_name, const char* big_name, Device expected) {
  EAGLE3_RETURN_IF_ERROR(CheckCollectiveBuffer(op, small_name, small, expected));
  EAGLE3_RETURN_IF_ERROR(CheckCollectiveBuffer(op, big_name, big, expected));
  if (small.dtype() != big.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": send and recv dtypes differ: ", small_name, " ",
                                                   small.ToString(), ", ", big_name, " ", big.ToString()));
  }
  if (factor == 1) {
    if (!(small.shape() == big.shape())) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": send and recv shapes differ: ", small_name, " ",
                                                     small.ToString(), ", ", big_name, " ", big.ToString()));
    }
    return absl::OkStatus();
  }
  bool ok = small.rank() >= 1 && small.rank() == big.rank() && big.dim(0) == static_cast<int64_t>(factor) * small.dim(0);
  for (int i = 1; ok && i < small.rank(); ++i) ok = small.dim(i) == big.dim(i);
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": expected ", big_name, " = [", factor, " * ", small_name,
                                                   ".dim(0), ", small_name, " dims 1..]; got ", small_name, " ",
                                                   small.ToString(), ", ", big_name, " ", big.ToString()));
  }
  return absl::OkStatus();
}

bool BuffersOverlap(const TensorView& a, const TensorView& b) { return Overlap(RangeOf(a), RangeOf(b)); }

absl::Status CheckCollectiveAliasing(const char* op, const TensorView& outer, const TensorView& inner, int block,
                                     const char* outer_name, const char* inner_name) {
  if (!Overlap(RangeOf(outer), RangeOf(inner))) return absl::OkStatus();
  const ByteRange own = {RangeOf(outer).begin + block * inner.nbytes(),
                         RangeOf(outer).begin + (block + 1) * inner.nbytes()};
  const ByteRange actual = RangeOf(inner);
  if (own.begin == actual.begin && own.end == actual.end) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", inner_name, " ", inner.ToString(), " overlaps ",
                                                 outer_name, " ", outer.ToString(), " but is not its block ", block,
                                                 " (in place means exactly that block)"));
}

}  // namespace eagle3
