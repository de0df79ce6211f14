// Shared by the example programs: "a,b,c" command-line lists of ids, and --weights.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/backend.h"
#include "eagle3/dtype.h"
#include "flag_parse.h"

namespace eagle3::examples {

// Most ids --tokens takes: more than any argument the OS passes (an id takes at least two bytes).
constexpr size_t kMaxTokenIds = size_t{1} << 20;

// --tokens: "a,b,c" as token ids in [0, 2^63 - 1] (the model refuses ids beyond its vocab_size,
// naming the id); an item that is not one is echoed as typed.
inline absl::StatusOr<std::vector<int64_t>> ParseTokenIds(std::string_view flag, std::string_view text) {
  return ParseIntList(flag, text, 0, std::numeric_limits<int64_t>::max(), kMaxTokenIds);
}

// --aux-layers: "a,b,c" as layer ids in [0, 2^31 - 1] (HiddenStateTap checks them against the
// target's layers), never narrowed from a wider integer.
inline absl::StatusOr<std::vector<int>> ParseLayerIds(std::string_view flag, std::string_view text) {
  absl::StatusOr<std::vector<int64_t>> ids = ParseIntList(flag, text, 0, std::numeric_limits<int>::max(), 4096);
  if (!ids.ok()) return ids.status();
  return std::vector<int>(ids->begin(), ids->end());
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

// --weights bf16 on --device cpu: the CPU reference backend stores weights in f32 only
// (CpuBackend keeps Backend::preferred_weight_dtype() f32 and refuses bf16 weights), so the run is
// refused in the flags' terms before anything loads.
inline absl::Status CheckWeightsOnDevice(const std::optional<DType>& weights, std::string_view device) {
  if (weights.has_value() && *weights == DType::kBF16 && device == "cpu") {
    return absl::InvalidArgumentError(
        "--weights bf16 needs --device cuda: the CPU backend stores weights in f32");
  }
  return absl::OkStatus();
}

}  // namespace eagle3::examples
