#include "eagle3/cuda/device_allocator.h"

#include <string>

#include "cuda_status.h"
#include "eagle3/status.h"

namespace eagle3::cuda {
namespace {

// Restores the caller's current device on scope exit: allocation must not move it.
class ScopedDevice {
 public:
  ScopedDevice() { cudaGetDevice(&previous_); }
  ~ScopedDevice() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

}  // namespace

absl::StatusOr<void*> DeviceAllocator::Allocate(size_t bytes, size_t alignment) {
  if (alignment > 256 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError("device allocation alignment must be a power of two <= 256, got " +
                                      std::to_string(alignment));
  }
  const int count = CudaDeviceCount();
  if (device_index_ < 0 || device_index_ >= count) {
    return absl::InvalidArgumentError("CUDA device " + std::to_string(device_index_) +
                                      " does not exist (" + std::to_string(count) + " visible)");
  }
  ScopedDevice restore;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_index_), "cudaSetDevice"));
  void* ptr = nullptr;
  // cudaMalloc(0) returns nullptr; allocate one byte so every allocation has a unique pointer.
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&ptr, bytes == 0 ? 1 : bytes),
                                    "cudaMalloc of " + std::to_string(bytes) + " bytes on cuda:" +
                                        std::to_string(device_index_)));
  return ptr;
}

void DeviceAllocator::Deallocate(void* ptr, size_t /*bytes*/) {
  ScopedDevice restore;
  cudaSetDevice(device_index_);
  cudaFree(ptr);
}

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // reset the last-error slot so later calls do not report this one
    return 0;
  }
  return count;
}

}  // namespace eagle3::cuda
