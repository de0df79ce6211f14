#include "eagle3/cuda/device_allocator.h"

#include <string>

#include "cuda_status.h"
#include "eagle3/status.h"

namespace eagle3::cuda {
namespace {

// Makes a device current for the scope and restores the caller's current device at its end: an
// allocation must not move it. When the device is current already (a backend's thread keeps its
// device current, UseBackendDevice), nothing is switched and nothing restored.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ == device) return;
    switched_ = true;
    error_ = cudaSetDevice(device);
  }
  ~ScopedDevice() {
    if (switched_) cudaSetDevice(previous_);
  }
  cudaError_t error() const { return error_; }

 private:
  int previous_ = 0;
  bool switched_ = false;
  cudaError_t error_ = cudaSuccess;
};

// The visible devices, counted once: CUDA reads CUDA_VISIBLE_DEVICES when it initializes, so the
// count cannot change afterwards, and a weight load allocates tens of thousands of times.
int VisibleDevices() {
  static const int count = CudaDeviceCount();
  return count;
}

}  // namespace

absl::StatusOr<void*> DeviceAllocator::Allocate(size_t bytes, size_t alignment) {
  if (alignment > 256 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError("device allocation alignment must be a power of two <= 256, got " +
                                      std::to_string(alignment));
  }
  const int count = VisibleDevices();
  if (device_index_ < 0 || device_index_ >= count) {
    return absl::InvalidArgumentError("CUDA device " + std::to_string(device_index_) +
                                      " does not exist (" + std::to_string(count) + " visible)");
  }
  const ScopedDevice use(device_index_);
  EAGLE3_RETURN_IF_ERROR(CudaStatus(use.error(), "cudaSetDevice"));
  void* ptr = nullptr;
  // cudaMalloc(0) returns nullptr; allocate one byte so every allocation has a unique pointer.
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&ptr, bytes == 0 ? 1 : bytes),
                                    "cudaMalloc of " + std::to_string(bytes) + " bytes on cuda:" +
                                        std::to_string(device_index_)));
  return ptr;
}

void DeviceAllocator::Deallocate(void* ptr, size_t /*bytes*/) {
  const ScopedDevice use(device_index_);
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
