// cudaError_t -> absl::Status for the host layer of the CUDA backend (never included by .cu files).
#pragma once

#include <string>
#include <string_view>

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace eagle3::cuda {

inline absl::Status CudaStatus(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  // A failed runtime call also leaves its error in the last-error slot, where a later launcher's
  // cudaGetLastError() would report it as its own. It is reported here, so clear it.
  cudaGetLastError();
  std::string message = std::string(what) + ": " + cudaGetErrorName(error) + " (" +
                        cudaGetErrorString(error) + ")";
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
      return absl::InvalidArgumentError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace eagle3::cuda
