// PinnedUploadBacking: what an UploadRing (eagle3/upload_ring.h) stands on for CudaBackend
// (CudaBackend::CreateUploadRing): pinned host memory allocated once per ring, so that Copy's
// transfers from it are DMA it only enqueues, and CUDA events recorded on the backend's stream as
// the ring's fences. Host code only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/allocator.h"
#include "eagle3/upload_ring.h"

namespace eagle3::cuda {

class PinnedUploadBacking final : public UploadRing::Backing {
 public:
  // `bytes` (> 0) of memory from `pinned` (a PinnedHostAllocator), fences on `stream` of CUDA
  // device `device`. `pinned` and the stream must outlive the backing.
  static absl::StatusOr<std::unique_ptr<PinnedUploadBacking>> Create(Allocator& pinned, size_t bytes, int device,
                                                                     cudaStream_t stream);
  // Synchronizes the stream (the ring has waited for its transfers already; this guards a ring
  // whose last fence failed), then frees the events and the memory.
  ~PinnedUploadBacking() override;
  PinnedUploadBacking(const PinnedUploadBacking&) = delete;
  PinnedUploadBacking& operator=(const PinnedUploadBacking&) = delete;

  std::span<std::byte> memory() override { return {static_cast<std::byte*>(memory_), bytes_}; }
  absl::StatusOr<uint64_t> Record() override;
  absl::Status Wait(uint64_t fence) override;

 private:
  PinnedUploadBacking(Allocator& pinned, size_t bytes, int device, cudaStream_t stream)
      : pinned_(&pinned), bytes_(bytes), device_(device), stream_(stream) {}

  Allocator* pinned_;
  void* memory_ = nullptr;
  size_t bytes_;
  int device_;
  cudaStream_t stream_;
  uint64_t next_fence_ = 0;
  // Recorded and not yet waited for, oldest first: (fence, its event).
  std::deque<std::pair<uint64_t, cudaEvent_t>> pending_;
  // Events whose fences have completed, for the next Record.
  std::vector<cudaEvent_t> idle_;
};

}  // namespace eagle3::cuda
