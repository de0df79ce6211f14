// Page-locked host memory (cudaHostAlloc) for staging a step's inputs and outputs: transfers from
// it are true asynchronous DMA, and a copy captured into a CUDA graph reads it at replay time.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "eagle3/allocator.h"
#include "eagle3/export.h"

namespace eagle3::cuda {

class EAGLE3_API PinnedHostAllocator final : public Allocator {
 public:
  Device device() const override { return Device::Cpu(); }
  // ResourceExhausted when the driver cannot pin that much; InvalidArgument for an alignment above
  // 256 (cudaHostAlloc's guarantee is a page) or not a power of two.
  absl::StatusOr<void*> Allocate(size_t bytes, size_t alignment) override;
  void Deallocate(void* ptr, size_t bytes) override;
};

}  // namespace eagle3::cuda
