// Memory allocators behind owning tensors. Host memory here; the CUDA device allocator lives in
// the eagle3::cuda target (eagle3/cuda/device_allocator.h).
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "eagle3/device.h"
#include "eagle3/export.h"

namespace eagle3 {

class EAGLE3_API Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // Returns memory of at least `bytes` bytes aligned to at least `alignment` (a power of two).
  // Zero bytes yields a unique non-null pointer that must still be deallocated.
  virtual absl::StatusOr<void*> Allocate(size_t bytes, size_t alignment) = 0;
  virtual void Deallocate(void* ptr, size_t bytes) = 0;
};

// Aligned host memory (64-byte alignment by default, matching AVX-512 and cache lines).
class EAGLE3_API HostAllocator final : public Allocator {
 public:
  Device device() const override { return Device::Cpu(); }
  absl::StatusOr<void*> Allocate(size_t bytes, size_t alignment) override;
  void Deallocate(void* ptr, size_t bytes) override;
};

// Process-wide host allocator (stateless, thread-safe).
EAGLE3_API Allocator& DefaultHostAllocator();

}  // namespace eagle3
