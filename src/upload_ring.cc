#include "eagle3/upload_ring.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "eagle3/status.h"

namespace eagle3 {
namespace {

// The first offset at or after `offset` whose address in `base` is a multiple of `alignment`.
size_t AlignedOffset(const std::byte* base, size_t offset, size_t alignment) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(base) + offset;
  return offset + ((alignment - address % alignment) % alignment);
}

}  // namespace

UploadRing::UploadRing(std::unique_ptr<Backing> backing, Allocator& fallback)
    : backing_(std::move(backing)), memory_(backing_->memory()), fallback_(&fallback) {}

UploadRing::~UploadRing() {
  // Transfers may still read regions freed since the last wait: one fence after them all. Should it
  // fail, the backing's own teardown is the last guard (the CUDA one synchronizes its stream).
  bool pending = false;
  for (const Region& r : regions_) {
    pending = pending || r.state == State::kFreed ||
              (r.state == State::kFenced && (!completed_.has_value() || r.fence > *completed_));
  }
  if (!pending) return;
  if (absl::StatusOr<uint64_t> fence = backing_->Record(); fence.ok()) backing_->Wait(*fence).IgnoreError();
}

bool UploadRing::Owns(const void* ptr) const {
  const auto* p = static_cast<const std::byte*>(ptr);
  return !memory_.empty() && p >= memory_.data() && p < memory_.data() + memory_.size();
}

absl::Status UploadRing::FenceFreed() {
  if (unfenced_ == 0) return absl::OkStatus();
  EAGLE3_ASSIGN_OR_RETURN(const uint64_t fence, backing_->Record());
  for (Region& r : regions_) {
    if (r.state != State::kFreed) continue;
    r.state = State::kFenced;
    r.fence = fence;
  }
  unfenced_ = 0;
  return absl::OkStatus();
}

std::optional<size_t> UploadRing::Place(size_t bytes, size_t alignment) const {
  const size_t size = memory_.size();
  const auto fits = [&](size_t from, size_t limit) -> std::optional<size_t> {
    const size_t offset = AlignedOffset(memory_.data(), from, alignment);
    if (offset <= limit && bytes <= limit - offset) return offset;
    return std::nullopt;
  };
  if (regions_.empty()) return fits(0, size);
  const size_t head = regions_.back().end;
  const size_t tail = regions_.front().offset;
  // Regions in allocation order rise through the memory, with at most one wrap back to its start.
  if (regions_.back().offset < tail) return fits(head, tail);
  if (std::optional<size_t> offset = fits(head, size)) return offset;
  return fits(0, tail);
}

absl::StatusOr<bool> UploadRing::ReclaimOldest() {
  const Region& oldest = regions_.front();
  if (oldest.state == State::kHeld) return false;
  // FenceFreed ran first: a region not held is fenced.
  if (!completed_.has_value() || oldest.fence > *completed_) {
    const auto start = std::chrono::steady_clock::now();
    const absl::Status waited = backing_->Wait(oldest.fence);
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EAGLE3_RETURN_IF_ERROR(waited);
    completed_ = oldest.fence;
  }
  regions_.pop_front();
  return true;
}

absl::StatusOr<void*> UploadRing::FromFallback(size_t bytes, size_t alignment) {
  ++fallbacks_;
  return fallback_->Allocate(bytes, alignment);
}

absl::StatusOr<void*> UploadRing::Allocate(size_t bytes, size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError("UploadRing: alignment must be a power of two, got " +
                                      std::to_string(alignment));
  }
  // Zero bytes still take one, so that every allocation has its own pointer.
  const size_t size = std::max<size_t>(bytes, 1);
  if (size > memory_.size()) return FromFallback(bytes, alignment);
  EAGLE3_RETURN_IF_ERROR(FenceFreed());
  while (true) {
    if (const std::optional<size_t> offset = Place(size, alignment)) {
      regions_.push_back(Region{.offset = *offset, .end = *offset + size});
      return memory_.data() + *offset;
    }
    if (regions_.empty()) break;  // the alignment padding alone leaves too little
    EAGLE3_ASSIGN_OR_RETURN(const bool reclaimed, ReclaimOldest());
    if (!reclaimed) break;  // the oldest region is still held by its tensor
  }
  return FromFallback(bytes, alignment);
}

void UploadRing::Deallocate(void* ptr, size_t bytes) {
  if (!Owns(ptr)) {
    fallback_->Deallocate(ptr, bytes);
    return;
  }
  const size_t offset = static_cast<size_t>(static_cast<std::byte*>(ptr) - memory_.data());
  // Tensors are usually freed newest first: search from the back.
  for (auto it = regions_.rbegin(); it != regions_.rend(); ++it) {
    if (it->offset != offset || it->state != State::kHeld) continue;
    it->state = State::kFreed;
    ++unfenced_;
    return;
  }
}

}  // namespace eagle3
