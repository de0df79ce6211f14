#include "reused_buffer_allocator.h"

#include <algorithm>

#include "eagle3/status.h"

namespace eagle3 {

ReusedBufferAllocator::~ReusedBufferAllocator() {
  if (buffer_ != nullptr) upstream_->Deallocate(buffer_, capacity_);
}

absl::StatusOr<void*> ReusedBufferAllocator::Allocate(size_t bytes, size_t alignment) {
  // A request past kMaxBufferBytes is never the buffer: rounding it up to whole MiB (or doubling a
  // buffer that large) would wrap around to a size smaller than asked for.
  if (out_ || alignment > kAlignment || bytes > kMaxBufferBytes) return upstream_->Allocate(bytes, alignment);
  if (buffer_ == nullptr || bytes > capacity_) {
    // Grown in whole MiB, at least doubling, so that slowly growing requests replace it rarely.
    const size_t mib = size_t{1} << 20;
    const size_t capacity = std::max((std::max<size_t>(bytes, 1) + mib - 1) / mib * mib, 2 * capacity_);
    if (buffer_ != nullptr) upstream_->Deallocate(buffer_, capacity_);
    buffer_ = nullptr;
    capacity_ = 0;
    EAGLE3_ASSIGN_OR_RETURN(buffer_, upstream_->Allocate(capacity, kAlignment));
    capacity_ = capacity;
  }
  out_ = true;
  return buffer_;
}

void ReusedBufferAllocator::Deallocate(void* ptr, size_t bytes) {
  if (ptr == buffer_ && out_) {
    out_ = false;
    return;
  }
  upstream_->Deallocate(ptr, bytes);
}

}  // namespace eagle3
