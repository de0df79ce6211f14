// Helpers shared by the CpuBackend op files (private to src/cpu).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "eagle3/tensor_view.h"

namespace eagle3::cpu {

template <typename... Args>
absl::Status Invalid(const char* op, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", args...));
}

inline absl::Status CheckF32(const char* op, const char* name, const TensorView& t) {
  if (t.dtype() == DType::kF32) return absl::OkStatus();
  return Invalid(op, name, " is ", t.ToString(), " but CpuBackend takes f32 only (got ",
                 std::string(DTypeName(t.dtype())), "; convert with ConvertTensor)");
}

// Row r of a row-strided f32 matrix (validated by the Backend checks).
inline float* Row(const TensorView& t, int64_t r) { return t.data_as<float>() + r * t.stride(0); }

// Element i of a contiguous i32 or i64 vector.
inline int64_t LoadIndex(const TensorView& ids, int64_t i) {
  return ids.dtype() == DType::kI32 ? ids.data_as<const int32_t>()[i]
                                    : ids.data_as<const int64_t>()[i];
}

// MoeExperts' id rule: every ids[t, j] (a row-strided [T, k] i32 matrix) in [0, num_experts), else
// InvalidArgument naming [t, j] (checked before an expert op writes anything).
inline absl::Status CheckExpertIds(const char* op, const TensorView& ids, int64_t num_experts) {
  for (int64_t t = 0; t < ids.dim(0); ++t) {
    const int32_t* id = ids.data_as<const int32_t>() + t * ids.stride(0);
    for (int64_t j = 0; j < ids.dim(1); ++j) {
      if (id[j] < 0 || id[j] >= num_experts) {
        return Invalid(op, "ids[", t, ", ", j, "] = ", id[j], " is outside the [0, ", num_experts,
                       ") experts given");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace eagle3::cpu
