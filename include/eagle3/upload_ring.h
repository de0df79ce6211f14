// UploadRing: host memory a weight load reads checkpoint bytes into, so that a device backend uploads
// them with no host copy of its own (Backend::CreateUploadRing): pinned memory on CUDA, whose
// transfers are DMA that Copy only enqueues. The load reads the next tensor into the ring while
// the transfers of the ones before it run.
//
// The ring hands out its memory in allocation order, wrapping around at the end. Memory freed by its
// tensor (Deallocate) is handed out again only once the backend's work enqueued before the free —
// the Copy that read it — has finished: at the next Allocate the ring records one fence after that
// work, and it waits for a fence only when it needs the memory behind it (the ring is full). So a
// caller frees a host tensor as soon as Copy returns, as with pageable memory. What the ring cannot
// serve comes from a plain host allocator: a request larger than the ring, or one arriving while
// the oldest memory of the ring is still held by its tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>

#include "absl/status/statusor.h"
#include "eagle3/allocator.h"
#include "eagle3/device.h"
#include "eagle3/export.h"

namespace eagle3 {

class EAGLE3_API UploadRing final : public Allocator {
 public:
  // What a backend supplies: the memory, and fences over the work it enqueues on the stream its
  // Copy reads the memory from.
  class Backing {
   public:
    // Frees the memory. The ring has waited for its transfers before (see ~UploadRing).
    virtual ~Backing() = default;
    // Host memory, writable, as long as the backing lives; aligned to at least 64 bytes.
    virtual std::span<std::byte> memory() = 0;
    // A fence that completes once all the work enqueued so far has finished. Fences complete in the
    // order they were recorded (one stream), so waiting for one waits for every earlier one too.
    virtual absl::StatusOr<uint64_t> Record() = 0;
    // Blocks until `fence` (returned by Record) has completed; later calls may name it again or an
    // earlier one.
    virtual absl::Status Wait(uint64_t fence) = 0;
  };

  // Takes `backing`; `fallback` (a host allocator) must outlive the ring.
  explicit UploadRing(std::unique_ptr<Backing> backing, Allocator& fallback = DefaultHostAllocator());
  // Waits for the transfers of every region still held (a fence recorded now), then frees the
  // memory. Every tensor allocated from the ring must have been freed before.
  ~UploadRing() override;
  UploadRing(const UploadRing&) = delete;
  UploadRing& operator=(const UploadRing&) = delete;

  Device device() const override { return Device::Cpu(); }
  // Ring memory when `bytes` fits (waiting for fences as needed), else the fallback's. Errors: a
  // backing's Record or Wait failure (the ring stays usable: nothing is handed out that may still be
  // read); InvalidArgument for an alignment that is not a power of two.
  absl::StatusOr<void*> Allocate(size_t bytes, size_t alignment) override;
  // Ring memory becomes reusable after a fence (see above); other memory goes to the fallback.
  void Deallocate(void* ptr, size_t bytes) override;

  size_t capacity() const { return memory_.size(); }
  // Whether `ptr` lies in the ring's memory (else it came from the fallback).
  bool Owns(const void* ptr) const;
  // Seconds Allocate has spent waiting for fences: transfers, not reads.
  double wait_seconds() const { return wait_seconds_; }
  // Allocations the fallback served.
  int64_t fallbacks() const { return fallbacks_; }

 private:
  enum class State { kHeld, kFreed, kFenced };
  // Bytes [offset, end) of the memory, in allocation order.
  struct Region {
    size_t offset = 0;
    size_t end = 0;
    State state = State::kHeld;
    uint64_t fence = 0;  // kFenced: the fence after the transfers that read it
  };

  // Records one fence for every region freed since the last one.
  absl::Status FenceFreed();
  // Where `bytes` at `alignment` fits after the newest region (or, wrapping, before the oldest).
  std::optional<size_t> Place(size_t bytes, size_t alignment) const;
  // Frees the oldest region once its fence has completed (waiting for it when not known to be);
  // false when the oldest is still held.
  absl::StatusOr<bool> ReclaimOldest();
  absl::StatusOr<void*> FromFallback(size_t bytes, size_t alignment);

  std::unique_ptr<Backing> backing_;
  std::span<std::byte> memory_;
  Allocator* fallback_;
  std::deque<Region> regions_;
  int64_t unfenced_ = 0;                // regions in State::kFreed
  std::optional<uint64_t> completed_;   // the latest fence known to have completed
  double wait_seconds_ = 0;
  int64_t fallbacks_ = 0;
};

}  // namespace eagle3
