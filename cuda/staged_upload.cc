#include "staged_upload.h"

#include <algorithm>
#include <cstring>

#include "cuda_status.h"
#include "eagle3/status.h"

namespace eagle3::cuda {

StagedUpload::~StagedUpload() {
  for (int b = 0; b < 2; ++b) {
    // The buffers are read by transfers that may still run: wait for them before freeing.
    if (done_[b] != nullptr) {
      cudaEventSynchronize(done_[b]);
      cudaEventDestroy(done_[b]);
    }
    if (buffers_[b] != nullptr) pinned_->Deallocate(buffers_[b], kChunkBytes);
  }
}

absl::Status StagedUpload::Copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  for (int b = 0; b < 2; ++b) {
    if (buffers_[b] == nullptr) {
      EAGLE3_ASSIGN_OR_RETURN(buffers_[b], pinned_->Allocate(kChunkBytes, 256));
    }
    if (done_[b] == nullptr) {
      EAGLE3_RETURN_IF_ERROR(
          CudaStatus(cudaEventCreateWithFlags(&done_[b], cudaEventDisableTiming), "StagedUpload: cudaEventCreate"));
    }
  }
  auto* to = static_cast<char*>(dst);
  const auto* from = static_cast<const char*>(src);
  for (size_t offset = 0, i = 0; offset < bytes; offset += kChunkBytes, ++i) {
    const int b = static_cast<int>(i % 2);
    const size_t n = std::min(kChunkBytes, bytes - offset);
    // An event never recorded counts as complete.
    EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(done_[b]), "StagedUpload: waiting for a staging buffer"));
    std::memcpy(buffers_[b], from + offset, n);
    EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(to + offset, buffers_[b], n, cudaMemcpyHostToDevice, stream),
                                      "StagedUpload: cudaMemcpyAsync"));
    EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(done_[b], stream), "StagedUpload: cudaEventRecord"));
  }
  return absl::OkStatus();
}

}  // namespace eagle3::cuda
