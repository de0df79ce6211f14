// Device memory for owning tensors on a CUDA GPU (eagle3::cuda target).
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "eagle3/allocator.h"
#include "eagle3/export.h"

namespace eagle3::cuda {

// cudaMalloc / cudaFree on one device. Allocation happens at init time only (docs/architecture.md: no
// allocation in the hot path), so a plain synchronous allocator is the right tool.
class EAGLE3_API DeviceAllocator final : public Allocator {
 public:
  explicit DeviceAllocator(int device_index) : device_index_(device_index) {}
  Device device() const override { return Device::Cuda(device_index_); }
  // Fails with InvalidArgument for a bad ordinal or alignment > 256 (cudaMalloc's guarantee), and
  // ResourceExhausted when the device is out of memory.
  absl::StatusOr<void*> Allocate(size_t bytes, size_t alignment) override;
  void Deallocate(void* ptr, size_t bytes) override;

 private:
  int device_index_;
};

// Number of visible CUDA devices; 0 when there is no driver or no device (never an error).
EAGLE3_API int CudaDeviceCount();

}  // namespace eagle3::cuda
