// A raw device allocation for the launcher-level gpu tests, freed at scope exit (a failed allocation
// is a test failure, and ptr stays null).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "gtest/gtest.h"

namespace eagle3::cuda {

struct DeviceBuffer {
  void* ptr = nullptr;
  // bytes == 0 still allocates (one byte), so ptr is a valid distinct address.
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&ptr, bytes == 0 ? 1 : bytes), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

}  // namespace eagle3::cuda
