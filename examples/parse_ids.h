// Shared by the example programs: "a,b,c" command-line lists of integers, and --weights.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "eagle3/backend.h"
#include "eagle3/dtype.h"

namespace eagle3::examples {

// "a,b,c" as integers; `flag` names the flag in the message of an item that is not one.
inline absl::StatusOr<std::vector<int64_t>> ParseIds(std::string_view flag, const std::string& text) {
  std::vector<int64_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0') {
      return absl::InvalidArgumentError(std::string(flag) + ": '" + item + "' is not an integer (in '" + text + "')");
    }
    ids.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

// A storage dtype flag (--weights, --kv-cache): bf16 or f32.
inline absl::StatusOr<DType> ParseStorageDType(std::string_view flag, const std::string& value) {
  if (value == "bf16") return DType::kBF16;
  if (value == "f32") return DType::kF32;
  return absl::InvalidArgumentError(std::string(flag) + " must be bf16 or f32, got '" + value + "'");
}

// The weight dtype a run uses, for its summary: the --weights value or the backend's preference.
inline std::string WeightsName(const std::optional<DType>& weights, const Backend& backend) {
  return std::string(DTypeName(weights.value_or(backend.preferred_weight_dtype())));
}

}  // namespace eagle3::examples
