#include "eagle3/tensor_convert.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "eagle3/half.h"

namespace eagle3 {
namespace {

bool IsConvertibleFloat(DType d) {
  return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16;
}

// dst[i] = store(load(src[i])) for i < n. The dtypes are resolved once per call, not per element,
// so that the loop over a weight's millions of elements inlines and vectorizes.
template <typename From, typename To, typename Load, typename Store>
void ConvertLoop(const void* src, void* dst, int64_t n, Load load, Store store) {
  const From* from = static_cast<const From*>(src);
  To* to = static_cast<To*>(dst);
  for (int64_t i = 0; i < n; ++i) to[i] = store(load(from[i]));
}

template <typename From, typename Load>
void ConvertTo(const void* src, void* dst, DType dst_dtype, int64_t n, Load load) {
  switch (dst_dtype) {
    case DType::kF32:
      ConvertLoop<From, float>(src, dst, n, load, [](float v) { return v; });
      break;
    case DType::kF16:
      ConvertLoop<From, uint16_t>(src, dst, n, load, [](float v) { return FloatToF16(v); });
      break;
    case DType::kBF16:
      ConvertLoop<From, uint16_t>(src, dst, n, load, [](float v) { return FloatToBf16(v); });
      break;
    default:
      break;  // unreachable: callers check the dtype first
  }
}

// Float-to-float conversion of n elements (src: f32, f16, bf16 or f8_e4m3; dst: f32, f16 or bf16).
// Out of line: inlined into ConvertTensor, GCC leaves its loops scalar.
[[gnu::noinline]] void ConvertFloats(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) {
  switch (src_dtype) {
    case DType::kF32:
      ConvertTo<float>(src, dst, dst_dtype, n, [](float v) { return v; });
      break;
    case DType::kF16:
      ConvertTo<uint16_t>(src, dst, dst_dtype, n, [](uint16_t b) { return F16ToFloat(b); });
      break;
    case DType::kBF16:
      ConvertTo<uint16_t>(src, dst, dst_dtype, n, [](uint16_t b) { return Bf16ToFloat(b); });
      break;
    case DType::kF8E4M3:
      ConvertTo<uint8_t>(src, dst, dst_dtype, n, [](uint8_t b) { return F8E4M3ToFloat(b); });
      break;
    default:
      break;  // unreachable: callers check the dtype first
  }
}

std::string Describe(const TensorView& src, const TensorView& dst) {
  return "from " + src.ToString() + " to " + dst.ToString();
}

}  // namespace

absl::Status ConvertTensor(const TensorView& src, const TensorView& dst) {
  if (!src.device().is_cpu() || !dst.device().is_cpu()) {
    return absl::InvalidArgumentError("ConvertTensor runs on host tensors only: " + Describe(src, dst));
  }
  if (!(src.shape() == dst.shape())) {
    return absl::InvalidArgumentError("ConvertTensor shape mismatch " + Describe(src, dst));
  }
  if (!src.is_contiguous() || !dst.is_contiguous()) {
    return absl::InvalidArgumentError("ConvertTensor needs contiguous tensors " + Describe(src, dst));
  }
  const int64_t n = src.numel();
  if (src.dtype() == dst.dtype()) {
    if (n > 0) std::memmove(dst.data(), src.data(), src.nbytes());
    return absl::OkStatus();
  }
  if ((IsConvertibleFloat(src.dtype()) || src.dtype() == DType::kF8E4M3) &&
      IsConvertibleFloat(dst.dtype())) {
    ConvertFloats(src.data(), src.dtype(), dst.data(), dst.dtype(), n);
    return absl::OkStatus();
  }
  if (src.dtype() == DType::kI32 && dst.dtype() == DType::kI64) {
    for (int64_t i = 0; i < n; ++i) dst.data_as<int64_t>()[i] = src.data_as<const int32_t>()[i];
    return absl::OkStatus();
  }
  if (src.dtype() == DType::kI64 && dst.dtype() == DType::kI32) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = src.data_as<const int64_t>()[i];
      if (v != static_cast<int32_t>(v)) {
        return absl::OutOfRangeError("ConvertTensor i64 -> i32: element " + std::to_string(i) +
                                     " = " + std::to_string(v) + " does not fit in i32");
      }
      dst.data_as<int32_t>()[i] = static_cast<int32_t>(v);
    }
    return absl::OkStatus();
  }
  return absl::UnimplementedError("ConvertTensor has no conversion " + Describe(src, dst));
}

}  // namespace eagle3
