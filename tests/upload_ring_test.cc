// UploadRing's host-side bookkeeping against a simulated device: copies "enqueued" from ring memory
// run only when a fence after them is waited for (or the ring is destroyed), and check then that
// the bytes are still the ones the copy was enqueued with. A region reused too early would have
// been overwritten by then.
#include "eagle3/upload_ring.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "counting_allocator.h"
#include "eagle3/tensor.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

// The simulated device behind a ring: its memory, a queue of copies, the fences and what happened.
struct FakeDevice {
  struct Copy {
    const std::byte* src;
    std::vector<std::byte> expected;  // src's bytes when the copy was enqueued
  };

  explicit FakeDevice(size_t bytes) : storage(bytes + 256), size(bytes) {}
  // 256-byte aligned, as pinned memory is (more), so that offsets of aligned allocations are known.
  std::byte* base() {
    const auto address = reinterpret_cast<uintptr_t>(storage.data());
    return storage.data() + (256 - address % 256) % 256;
  }

  // What a backend's Copy from ring memory does: the transfer runs later, in order.
  void Enqueue(const void* src, size_t bytes) {
    const auto* p = static_cast<const std::byte*>(src);
    copies.push_back(Copy{p, std::vector<std::byte>(p, p + bytes)});
  }
  // Runs the queued copies before `end`: each reads its source now.
  void RunUntil(size_t end) {
    for (; ran < end; ++ran) {
      const Copy& c = copies[ran];
      if (std::memcmp(c.src, c.expected.data(), c.expected.size()) != 0) ++corrupted;
    }
  }

  std::vector<std::byte> storage;
  size_t size;
  std::vector<Copy> copies;
  size_t ran = 0;
  int64_t corrupted = 0;              // copies whose source changed before they ran
  std::vector<size_t> fence_ends;     // fence i covers copies [0, fence_ends[i])
  std::vector<std::string> log;       // "record <fence>", "wait <fence>"
  std::optional<absl::Status> record_error, wait_error;  // the next Record / Wait fails so
  bool destroyed = false;
};

class FakeBacking final : public UploadRing::Backing {
 public:
  explicit FakeBacking(FakeDevice& device) : device_(&device) {}
  ~FakeBacking() override { device_->destroyed = true; }
  std::span<std::byte> memory() override { return {device_->base(), device_->size}; }
  absl::StatusOr<uint64_t> Record() override {
    if (device_->record_error.has_value()) {
      absl::Status error = *std::exchange(device_->record_error, std::nullopt);
      return error;
    }
    device_->fence_ends.push_back(device_->copies.size());
    const uint64_t fence = device_->fence_ends.size() - 1;
    device_->log.push_back("record " + std::to_string(fence));
    return fence;
  }
  absl::Status Wait(uint64_t fence) override {
    if (device_->wait_error.has_value()) return *std::exchange(device_->wait_error, std::nullopt);
    EXPECT_LT(fence, device_->fence_ends.size());
    device_->log.push_back("wait " + std::to_string(fence));
    device_->RunUntil(device_->fence_ends[fence]);
    return absl::OkStatus();
  }

 private:
  FakeDevice* device_;
};

class UploadRingTest : public ::testing::Test {
 protected:
  void Make(size_t bytes) {
    device_ = std::make_unique<FakeDevice>(bytes);
    ring_ = std::make_unique<UploadRing>(std::make_unique<FakeBacking>(*device_), fallback_);
  }
  std::byte* Alloc(size_t bytes, size_t alignment = 64) {
    absl::StatusOr<void*> p = ring_->Allocate(bytes, alignment);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? static_cast<std::byte*>(*p) : nullptr;
  }
  size_t Offset(const std::byte* p) const { return static_cast<size_t>(p - device_->base()); }

  CountingAllocator fallback_;
  std::unique_ptr<FakeDevice> device_;
  std::unique_ptr<UploadRing> ring_;
};

// Allocations follow one another; when the end is reached and the oldest region is still held,
// the fallback serves; once the oldest is freed, the ring waits for its fence and wraps onto it.
TEST_F(UploadRingTest, WrapsOntoTheOldestRegionOnceFreedAndFenced) {
  Make(1024);
  std::byte* a = Alloc(300);
  std::byte* b = Alloc(300);
  std::byte* c = Alloc(300);
  EXPECT_EQ(Offset(a), 0u);
  EXPECT_EQ(Offset(b), 320u);  // 64-byte aligned
  EXPECT_EQ(Offset(c), 640u);
  std::byte* d = Alloc(300);  // no room at the end, the oldest held
  EXPECT_FALSE(ring_->Owns(d));
  EXPECT_EQ(ring_->fallbacks(), 1);
  EXPECT_TRUE(device_->log.empty());  // nothing freed: no fence
  ring_->Deallocate(d, 300);
  EXPECT_EQ(fallback_.deallocations, 1);

  device_->Enqueue(a, 300);
  ring_->Deallocate(a, 300);
  std::byte* e = Alloc(300);
  EXPECT_EQ(e, a);
  EXPECT_EQ(device_->log, (std::vector<std::string>{"record 0", "wait 0"}));
  EXPECT_EQ(device_->ran, 1u);  // the copy from `a` ran before `e` was handed out
  ring_->Deallocate(b, 300);
  ring_->Deallocate(c, 300);
  ring_->Deallocate(e, 300);
  ring_.reset();
  EXPECT_EQ(device_->corrupted, 0);
}

// Freed memory behind free space is not waited for: the fence is recorded, never waited, until
// the ring needs that memory.
TEST_F(UploadRingTest, WaitsOnlyWhenFull) {
  Make(4096);
  std::byte* a = Alloc(1000);
  device_->Enqueue(a, 1000);
  ring_->Deallocate(a, 1000);
  std::byte* b = Alloc(1000);
  EXPECT_EQ(Offset(b), 1024u);
  EXPECT_EQ(device_->log, (std::vector<std::string>{"record 0"}));
  EXPECT_EQ(ring_->wait_seconds(), 0.0);
  ring_->Deallocate(b, 1000);
  // Nothing freed since the last fence was recorded: no new one.
  std::byte* c = Alloc(1000);
  EXPECT_EQ(device_->log.size(), 2u);  // "record 1" for b
  ring_->Deallocate(c, 1000);
  ring_.reset();
  // Destroying the ring waits for every transfer still pending.
  EXPECT_EQ(device_->log.back(), "wait 2");
  EXPECT_EQ(device_->ran, 1u);
  EXPECT_TRUE(device_->destroyed);
}

// Regions are reclaimed oldest first, each after its own fence; destruction fences and waits for
// what is still in flight, and a ring with nothing in flight is destroyed without a fence.
TEST_F(UploadRingTest, ReclaimsInOrderAndDestructionWaitsForTheRest) {
  Make(1024);
  std::byte* a = Alloc(100);
  ring_->Deallocate(a, 100);
  std::byte* b = Alloc(900);  // fences a and waits for it: no room after it
  EXPECT_EQ(Offset(b), 0u);
  EXPECT_EQ(device_->log, (std::vector<std::string>{"record 0", "wait 0"}));
  ring_->Deallocate(b, 900);
  std::byte* c = Alloc(1000);
  EXPECT_EQ(Offset(c), 0u);
  EXPECT_EQ(device_->log, (std::vector<std::string>{"record 0", "wait 0", "record 1", "wait 1"}));
  ring_->Deallocate(c, 1000);
  std::byte* d = Alloc(1000);
  EXPECT_EQ(device_->log.back(), "wait 2");
  ring_->Deallocate(d, 1000);
  const size_t before = device_->log.size();
  ring_.reset();
  EXPECT_EQ(device_->log.size(), before + 2);  // d's copies: record and wait once

  Make(1024);
  std::byte* e = Alloc(2000);  // the fallback's
  ring_->Deallocate(e, 2000);
  ring_.reset();
  EXPECT_TRUE(device_->log.empty());
  EXPECT_TRUE(device_->destroyed);
}

// Larger than the ring, or zero bytes, or an odd alignment.
TEST_F(UploadRingTest, OversizeFallsBackAndSizesAreChecked) {
  Make(1024);
  std::byte* big = Alloc(1025);
  ASSERT_NE(big, nullptr);
  EXPECT_FALSE(ring_->Owns(big));
  EXPECT_EQ(fallback_.allocations, 1);
  std::memset(big, 1, 1025);
  ring_->Deallocate(big, 1025);
  EXPECT_EQ(fallback_.deallocations, 1);

  std::byte* whole = Alloc(1024);
  EXPECT_TRUE(ring_->Owns(whole));
  ring_->Deallocate(whole, 1024);
  std::byte* empty1 = Alloc(0);
  std::byte* empty2 = Alloc(0);
  EXPECT_NE(empty1, empty2);
  EXPECT_TRUE(ring_->Owns(empty1) && ring_->Owns(empty2));
  std::byte* aligned = Alloc(10, 256);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(aligned) % 256, 0u);
  for (const size_t bad : {size_t{0}, size_t{3}, size_t{96}}) {
    EXPECT_EQ(ring_->Allocate(8, bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  for (std::byte* p : {empty1, empty2, aligned}) ring_->Deallocate(p, 0);
  EXPECT_EQ(ring_->fallbacks(), 1);
  EXPECT_EQ(ring_->capacity(), 1024u);
}

// A failing fence is the Allocate's error, and nothing that may still be read is handed out; the
// ring works again once the backing does.
TEST_F(UploadRingTest, FenceErrorsAreReportedAndNothingIsReusedEarly) {
  Make(1024);
  std::byte* a = Alloc(600);
  std::memset(a, 7, 600);
  device_->Enqueue(a, 600);
  ring_->Deallocate(a, 600);
  device_->record_error = absl::InternalError("record failed");
  absl::StatusOr<void*> failed = ring_->Allocate(600, 64);
  EXPECT_EQ(failed.status(), absl::InternalError("record failed"));

  device_->wait_error = absl::InternalError("wait failed");
  failed = ring_->Allocate(600, 64);  // records a fence, then needs a's memory: the wait fails
  EXPECT_EQ(failed.status(), absl::InternalError("wait failed"));
  EXPECT_EQ(device_->ran, 0u);

  std::byte* b = Alloc(600);
  EXPECT_EQ(b, a);
  EXPECT_EQ(device_->ran, 1u);
  ring_->Deallocate(b, 600);
  ring_.reset();
  EXPECT_EQ(device_->corrupted, 0);
}

// Tensors through the ring as a load uses it: many of mixed sizes, each filled, "uploaded" and freed
// at once, a few held across later ones, some larger than the ring; the ring wraps many times and
// no transfer sees its bytes changed.
TEST_F(UploadRingTest, ManyTensorsWrapTheRingWithoutCorruptingTransfers) {
  Make(64 << 10);
  std::mt19937 rng(20);
  std::uniform_int_distribution<int64_t> small(1, 6000);
  std::vector<Tensor> held;
  size_t last_offset = 0;
  int wraps = 0;
  for (int i = 0; i < 3000; ++i) {
    const int64_t n = i % 500 == 499 ? (int64_t{70} << 10) : small(rng);
    absl::StatusOr<Tensor> t = Tensor::Empty(DType::kU8, Shape{n}, *ring_);
    ASSERT_TRUE(t.ok()) << t.status();
    std::memset(t->data(), i & 0xff, static_cast<size_t>(n));
    const auto* p = static_cast<const std::byte*>(t->data());
    if (ring_->Owns(p)) {
      if (Offset(p) < last_offset) ++wraps;
      last_offset = Offset(p);
    }
    // Copy reads fallback (pageable) memory before it returns: only ring memory is read later.
    if (ring_->Owns(p)) device_->Enqueue(p, static_cast<size_t>(n));
    if (i % 7 == 0) {
      held.push_back(std::move(*t));
      if (held.size() > 3) held.erase(held.begin());
    }
  }
  held.clear();
  ring_.reset();
  EXPECT_EQ(device_->ran, device_->copies.size());
  EXPECT_EQ(device_->corrupted, 0);
  EXPECT_GT(wraps, 20);
  EXPECT_EQ(fallback_.allocations, fallback_.deallocations);
  EXPECT_GE(fallback_.allocations, 6);  // the 70 KiB tensors
}

}  // namespace
}  // namespace eagle3
