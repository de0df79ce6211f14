// Element types of tensors, with their safetensors and display names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "eagle3/export.h"

namespace eagle3 {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kI32,
  kI64,
  kBool,
  kU8,
  kF8E4M3,  // OCP float8 e4m3fn; storage only for now.
};

// Bytes per element.
constexpr size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kI64:
      return 8;
    case DType::kBool:
    case DType::kU8:
    case DType::kF8E4M3:
      return 1;
  }
  return 0;
}

// Lower-case display name: "f32", "bf16", ...
EAGLE3_API std::string_view DTypeName(DType dtype);

// The safetensors header spelling: "F32", "BF16", "F8_E4M3", ...
EAGLE3_API std::string_view SafetensorsDTypeName(DType dtype);

// Parses a safetensors dtype string; std::nullopt when it is not one eagle3 knows.
EAGLE3_API std::optional<DType> ParseSafetensorsDType(std::string_view name);

constexpr bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 ||
         dtype == DType::kF8E4M3;
}

}  // namespace eagle3
