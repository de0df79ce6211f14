#include "eagle3/cuda/pinned_host_allocator.h"

#include <string>

#include <cuda_runtime_api.h>

#include "cuda_status.h"
#include "eagle3/status.h"

namespace eagle3::cuda {

absl::StatusOr<void*> PinnedHostAllocator::Allocate(size_t bytes, size_t alignment) {
  if (alignment > 256 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError("pinned host allocation alignment must be a power of two <= 256, got " +
                                      std::to_string(alignment));
  }
  void* ptr = nullptr;
  // Portable: usable from every device's streams (ranks of one process on several GPUs).
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(&ptr, bytes == 0 ? 1 : bytes, cudaHostAllocPortable),
                                    "cudaHostAlloc of " + std::to_string(bytes) + " pinned bytes"));
  return ptr;
}

void PinnedHostAllocator::Deallocate(void* ptr, size_t /*bytes*/) { cudaFreeHost(ptr); }

}  // namespace eagle3::cuda
