// CountingAllocator: a host allocator for tests that counts what it hands out and takes back, to
// check who allocates (and frees) through an allocator passed in.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "eagle3/allocator.h"
#include "eagle3/device.h"

namespace eagle3 {

class CountingAllocator final : public Allocator {
 public:
  Device device() const override { return Device::Cpu(); }
  absl::StatusOr<void*> Allocate(size_t bytes, size_t alignment) override {
    ++allocations;
    return DefaultHostAllocator().Allocate(bytes, alignment);
  }
  void Deallocate(void* ptr, size_t bytes) override {
    ++deallocations;
    DefaultHostAllocator().Deallocate(ptr, bytes);
  }
  int allocations = 0;
  int deallocations = 0;
};

}  // namespace eagle3
