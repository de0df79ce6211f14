#include "eagle3/allocator.h"

#include <cstdlib>
#include <string>

#include "absl/status/status.h"

namespace eagle3 {

absl::StatusOr<void*> HostAllocator::Allocate(size_t bytes, size_t alignment) {
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError("host allocation alignment must be a power of two >= " +
                                      std::to_string(sizeof(void*)) + ", got " +
                                      std::to_string(alignment));
  }
  // aligned_alloc needs a size that is a multiple of the alignment, and at least one byte.
  size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  if (rounded < bytes) {
    return absl::ResourceExhaustedError("host allocation of " + std::to_string(bytes) +
                                        " bytes overflows size_t");
  }
  if (rounded == 0) rounded = alignment;
  void* ptr = std::aligned_alloc(alignment, rounded);
  if (ptr == nullptr) {
    return absl::ResourceExhaustedError("host allocation of " + std::to_string(bytes) +
                                        " bytes failed");
  }
  return ptr;
}

void HostAllocator::Deallocate(void* ptr, size_t /*bytes*/) { std::free(ptr); }

Allocator& DefaultHostAllocator() {
  static HostAllocator* allocator = new HostAllocator();
  return *allocator;
}

}  // namespace eagle3
