#include "eagle3/dtype.h"

#include <array>
#include <utility>

namespace eagle3 {
namespace {

struct DTypeNames {
  DType dtype;
  std::string_view display;
  std::string_view safetensors;
};

constexpr std::array<DTypeNames, 8> kNames = {{
    {DType::kF32, "f32", "F32"},
    {DType::kF16, "f16", "F16"},
    {DType::kBF16, "bf16", "BF16"},
    {DType::kI32, "i32", "I32"},
    {DType::kI64, "i64", "I64"},
    {DType::kBool, "bool", "BOOL"},
    {DType::kU8, "u8", "U8"},
    {DType::kF8E4M3, "f8_e4m3", "F8_E4M3"},
}};

const DTypeNames& Lookup(DType dtype) { return kNames[static_cast<size_t>(dtype)]; }

}  // namespace

std::string_view DTypeName(DType dtype) { return Lookup(dtype).display; }

std::string_view SafetensorsDTypeName(DType dtype) { return Lookup(dtype).safetensors; }

std::optional<DType> ParseSafetensorsDType(std::string_view name) {
  for (const DTypeNames& entry : kNames) {
    if (entry.safetensors == name) return entry.dtype;
  }
  return std::nullopt;
}

}  // namespace eagle3
