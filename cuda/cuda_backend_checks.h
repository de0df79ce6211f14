// Private: argument checks shared by the CudaBackend op files (host code only; no .cu includes it).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "eagle3/tensor_view.h"

namespace eagle3::cuda {

template <typename... Args>
absl::Status Invalid(const char* op, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", args...));
}

// The float storage these ops take (the CPU reference's policy; bf16 operands are Gemm's alone).
inline absl::Status CheckF32(const char* op, std::string_view name, const TensorView& t) {
  if (t.dtype() == DType::kF32) return absl::OkStatus();
  return Invalid(op, absl::string_view(name.data(), name.size()), " is ", t.ToString(), " but CudaBackend::", op,
                 " takes f32 only (got ", std::string(DTypeName(t.dtype())), "; convert with LaunchBf16ToF32)");
}

// CompactAccepted's device error (cuda_backend_compact.cc): the Status for the index part of a flag
// code of its DeviceCheck (format: CompactErrorIndex in src/compact_accepted_check.h); `found`
// is the suffix Synchronize appends to every device error.
absl::Status CompactAcceptedDeviceError(int64_t index, const char* found);

// BatchedPagedAttention's device error (cuda_backend_paged_attention.cc): the Status for the index
// part of a flag code of its DeviceCheck (8 * sequence or row + condition, paged_attention_ops.h);
// `found` is the suffix Synchronize appends to every device error.
absl::Status BatchedPagedAttentionDeviceError(int64_t index, const char* found);

}  // namespace eagle3::cuda
