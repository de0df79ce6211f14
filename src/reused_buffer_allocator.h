// ReusedBufferAllocator: an Allocator handing out one buffer again and again, for a tensor that a
// loop makes, consumes and drops once per iteration (the row-major codes a weight load uploads and
// then rewrites in warp tiles): one upstream allocation for the whole loop instead of one per
// tensor, and no upstream free (on a device, cudaFree waits for the device) per iteration.
//
// The buffer is handed out again as soon as it is freed, with no wait: every reader and writer of
// it must be ordered one after the other by whoever uses it (the work of one Backend, which runs
// its ops in the order they were enqueued: the next upload into the buffer runs after the kernel
// that read the last one). A request while the buffer is out, or one larger than it (which first
// replaces the buffer by a larger one), goes to the upstream allocator.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "eagle3/allocator.h"
#include "eagle3/device.h"

namespace eagle3 {

class ReusedBufferAllocator final : public Allocator {
 public:
  // `upstream` must outlive this.
  explicit ReusedBufferAllocator(Allocator& upstream) : upstream_(&upstream) {}
  ~ReusedBufferAllocator() override;
  ReusedBufferAllocator(const ReusedBufferAllocator&) = delete;
  ReusedBufferAllocator& operator=(const ReusedBufferAllocator&) = delete;

  Device device() const override { return upstream_->device(); }
  // Alignment up to kAlignment and sizes up to kMaxBufferBytes from the buffer (the upstream's
  // beyond).
  absl::StatusOr<void*> Allocate(size_t bytes, size_t alignment) override;
  void Deallocate(void* ptr, size_t bytes) override;

  static constexpr size_t kAlignment = 256;
  // Far past any real buffer, and low enough that its capacity, rounded up and doubled, stays
  // below SIZE_MAX.
  static constexpr size_t kMaxBufferBytes = SIZE_MAX / 4;

 private:
  Allocator* upstream_;
  void* buffer_ = nullptr;
  size_t capacity_ = 0;
  bool out_ = false;
};

}  // namespace eagle3
