// StagedUpload: large host-to-device copies from pageable host memory through two pinned buffers
// of the backend (Copy's path for them, cuda_backend.cc). The driver moves a pageable source
// through its own small staging in synchronous steps, well below the link's rate; here the host
// copies chunk i + 1 into one pinned buffer while the DMA engine moves chunk i from the other, so
// the transfer runs at the host's memcpy rate, and Copy returns before its last chunk has arrived:
// the host goes on (reading the next weight) while the DMA engine finishes. Used for weights at load
// time. Host code only.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "eagle3/allocator.h"

namespace eagle3::cuda {

class StagedUpload {
 public:
  // Every contiguous pageable upload takes this path, the smallest too: the driver's path waits for
  // the whole stream before it starts a pageable copy, so one small copy (a weight's scales) between
  // two large ones would stop the next weight's read from overlapping the last one's transfer.
  static constexpr size_t kMinBytes = 1;
  static constexpr size_t kChunkBytes = size_t{8} << 20;

  // `pinned` allocates the two buffers on first use and must outlive this object.
  explicit StagedUpload(Allocator& pinned) : pinned_(&pinned) {}
  ~StagedUpload();
  StagedUpload(const StagedUpload&) = delete;
  StagedUpload& operator=(const StagedUpload&) = delete;

  // dst (device) = src (pageable host), `bytes` bytes, enqueued on `stream` in chunks. Returns when
  // every byte of src has been read (src may be freed then), as a pageable cudaMemcpyAsync does; the
  // last chunks' transfers may still be running. Not for a stream being captured.
  absl::Status Copy(void* dst, const void* src, size_t bytes, cudaStream_t stream);

 private:
  Allocator* pinned_;
  void* buffers_[2] = {nullptr, nullptr};
  // Recorded after each buffer's latest transfer: the host waits for it before refilling the buffer.
  cudaEvent_t done_[2] = {nullptr, nullptr};
};

}  // namespace eagle3::cuda
