#include "pinned_upload_backing.h"

#include <string>

#include "cuda_status.h"
#include "eagle3/status.h"

namespace eagle3::cuda {

absl::StatusOr<std::unique_ptr<PinnedUploadBacking>> PinnedUploadBacking::Create(Allocator& pinned, size_t bytes,
                                                                                  int device, cudaStream_t stream) {
  if (bytes == 0) return absl::InvalidArgumentError("PinnedUploadBacking: an upload ring needs memory, got 0 bytes");
  std::unique_ptr<PinnedUploadBacking> backing(new PinnedUploadBacking(pinned, bytes, device, stream));
  EAGLE3_ASSIGN_OR_RETURN(backing->memory_, pinned.Allocate(bytes, 256));
  return backing;
}

PinnedUploadBacking::~PinnedUploadBacking() {
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);
  for (const auto& [fence, event] : pending_) cudaEventDestroy(event);
  for (cudaEvent_t event : idle_) cudaEventDestroy(event);
  if (memory_ != nullptr) pinned_->Deallocate(memory_, bytes_);
  cudaGetLastError();  // a teardown failure must not be reported by a later, unrelated launch
}

absl::StatusOr<uint64_t> PinnedUploadBacking::Record() {
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "upload ring: cudaSetDevice"));
  cudaEvent_t event = nullptr;
  if (idle_.empty()) {
    EAGLE3_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "upload ring: cudaEventCreate"));
  } else {
    event = idle_.back();
    idle_.pop_back();
  }
  if (const cudaError_t error = cudaEventRecord(event, stream_); error != cudaSuccess) {
    idle_.push_back(event);
    return CudaStatus(error, "upload ring: cudaEventRecord");
  }
  pending_.emplace_back(next_fence_, event);
  return next_fence_++;
}

absl::Status PinnedUploadBacking::Wait(uint64_t fence) {
  if (pending_.empty() || fence < pending_.front().first) return absl::OkStatus();  // waited for before
  if (fence >= next_fence_) {
    return absl::InternalError("upload ring: fence " + std::to_string(fence) + " was never recorded");
  }
  const cudaEvent_t event = pending_[fence - pending_.front().first].second;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(event), "upload ring: waiting for a transfer"));
  // Fences complete in order: this one and every earlier one are done.
  while (!pending_.empty() && pending_.front().first <= fence) {
    idle_.push_back(pending_.front().second);
    pending_.pop_front();
  }
  return absl::OkStatus();
}

}  // namespace eagle3::cuda
