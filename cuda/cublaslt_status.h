// cublasStatus_t -> absl::Status for the cuBLASLt callers of the CUDA backend (gemm.cc,
// fp8_w8a8_gemm.cc; never included by .cu files).
#pragma once

#include <string>
#include <string_view>

#include <cublasLt.h>

#include "absl/status/status.h"

namespace eagle3::cuda {

// `what` names the call (and the op); OK for CUBLAS_STATUS_SUCCESS.
inline absl::Status CublasLtStatus(cublasStatus_t status, std::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = std::string(what) + ": " + cublasLtGetStatusName(status) + " (" +
                              cublasLtGetStatusString(status) + ")";
  switch (status) {
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(message);
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::UnimplementedError(message);
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace eagle3::cuda
