#include "eagle3/tensor_convert.h"

#include <cstring>
#include <string>

#include "eagle3/half.h"

namespace eagle3 {
namespace {

bool IsConvertibleFloat(DType d) {
  return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16;
}

float LoadFloat(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kF16:
      return F16ToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kBF16:
      return Bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kF8E4M3:
      return F8E4M3ToFloat(static_cast<const uint8_t*>(base)[i]);
    default:
      return 0.0f;  // unreachable: callers check the dtype first
  }
}

void StoreFloat(void* base, DType dtype, int64_t i, float value) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(base)[i] = value;
      break;
    case DType::kF16:
      static_cast<uint16_t*>(base)[i] = FloatToF16(value);
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(base)[i] = FloatToBf16(value);
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
    for (int64_t i = 0; i < n; ++i) {
      StoreFloat(dst.data(), dst.dtype(), i, LoadFloat(src.data(), src.dtype(), i));
    }
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
