// ReusedBufferAllocator (src/reused_buffer_allocator.h) over a recording upstream allocator: the
// buffer handed out again after its Deallocate with no upstream call, requests while it is out and
// those of an alignment above kAlignment served (and freed) upstream, a larger request replacing
// the buffer by one at least twice as large, the destructor freeing it, every pointer owning the
// bytes asked for, and upstream failures passed on.
#include "reused_buffer_allocator.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Host memory standing for the upstream's: every request recorded, every free checked against
// what was handed out (pointer and size).
class RecordingUpstream final : public Allocator {
 public:
  explicit RecordingUpstream(Device device = Device::Cpu()) : device_(device) {}
  ~RecordingUpstream() override {
    for (const auto& [p, bytes] : live) DefaultHostAllocator().Deallocate(p, std::max<size_t>(bytes, 1));
  }

  Device device() const override { return device_; }
  absl::StatusOr<void*> Allocate(size_t bytes, size_t alignment) override {
    requests.emplace_back(bytes, alignment);
    if (fail) return absl::ResourceExhaustedError("recording upstream: told to fail");
    if (bytes > size_t{1} << 40) return absl::ResourceExhaustedError("recording upstream: too large");
    absl::StatusOr<void*> p = DefaultHostAllocator().Allocate(std::max<size_t>(bytes, 1), alignment);
    if (p.ok()) live.emplace(*p, bytes);
    return p;
  }
  void Deallocate(void* ptr, size_t bytes) override {
    ++deallocations;
    const auto it = live.find(ptr);
    if (it == live.end() || it->second != bytes) {
      ++bad_frees;
      return;
    }
    freed.emplace_back(ptr, bytes);
    live.erase(it);
    DefaultHostAllocator().Deallocate(ptr, std::max<size_t>(bytes, 1));
  }

  // Whether [ptr, ptr + bytes) lies inside one live allocation.
  bool Owns(const void* ptr, size_t bytes) const {
    const auto* p = static_cast<const char*>(ptr);
    for (const auto& [start, size] : live) {
      const auto* s = static_cast<const char*>(start);
      if (p >= s && p + bytes <= s + size) return true;
    }
    return false;
  }

  int allocations() const { return static_cast<int>(requests.size()); }

  bool fail = false;
  std::vector<std::pair<size_t, size_t>> requests;  // (bytes, alignment) of every Allocate
  std::vector<std::pair<void*, size_t>> freed;      // (ptr, bytes) of every good Deallocate
  std::map<void*, size_t> live;
  int deallocations = 0, bad_frees = 0;

 private:
  Device device_;
};

// Fills [p, p + bytes) and reads it back: the memory is the caller's for every byte it asked for.
void ExpectWritable(void* p, size_t bytes, uint8_t value) {
  std::memset(p, value, bytes);
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < bytes; i += std::max<size_t>(1, bytes / 97)) ASSERT_EQ(b[i], value) << i;
  if (bytes > 0) ASSERT_EQ(b[bytes - 1], value);
}

TEST(ReusedBufferAllocatorTest, HandsTheBufferOutAgainWithoutUpstreamCalls) {
  RecordingUpstream upstream;
  {
    ReusedBufferAllocator reused(upstream);
    EXPECT_EQ(upstream.allocations(), 0) << "nothing allocated before the first request";
    absl::StatusOr<void*> first = reused.Allocate(1000, 64);
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_EQ(upstream.allocations(), 1);
    // One whole MiB at the buffer's own alignment, so that later requests of other alignments fit.
    EXPECT_GE(upstream.requests[0].first, kMiB);
    EXPECT_EQ(upstream.requests[0].second, ReusedBufferAllocator::kAlignment);
    EXPECT_TRUE(upstream.Owns(*first, 1000));
    reused.Deallocate(*first, 1000);
    EXPECT_EQ(upstream.deallocations, 0) << "the buffer stays for the next request";

    // Smaller, equal and up-to-capacity requests, of any alignment up to kAlignment: the same memory.
    for (const auto& [bytes, alignment] : std::vector<std::pair<size_t, size_t>>{
             {500, 16}, {1000, 64}, {kMiB, 256}, {0, 1}, {kMiB - 1, 128}}) {
      SCOPED_TRACE(bytes);
      absl::StatusOr<void*> again = reused.Allocate(bytes, alignment);
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_EQ(*again, *first);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(*again) % alignment, 0u);
      ExpectWritable(*again, bytes, static_cast<uint8_t>(bytes));
      reused.Deallocate(*again, bytes);
    }
    EXPECT_EQ(upstream.allocations(), 1);
    EXPECT_EQ(upstream.deallocations, 0);
  }
  // The destructor gives the one buffer back, with the size it was allocated with.
  EXPECT_EQ(upstream.deallocations, 1);
  EXPECT_EQ(upstream.bad_frees, 0);
  EXPECT_TRUE(upstream.live.empty());
}

TEST(ReusedBufferAllocatorTest, RequestsWhileTheBufferIsOutGoUpstream) {
  RecordingUpstream upstream;
  ReusedBufferAllocator reused(upstream);
  void* buffer = *reused.Allocate(100, 64);
  ASSERT_EQ(upstream.allocations(), 1);

  // The buffer is out: a second tensor must not share it.
  absl::StatusOr<void*> second = reused.Allocate(100, 64);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(*second, buffer);
  ASSERT_EQ(upstream.allocations(), 2);
  EXPECT_EQ(upstream.requests[1], (std::pair<size_t, size_t>{100, 64})) << "passed on as asked";
  ExpectWritable(buffer, 100, 1);
  ExpectWritable(*second, 100, 2);
  EXPECT_EQ(static_cast<const uint8_t*>(buffer)[0], 1) << "the two do not overlap";

  // Its free goes upstream at once, with its size.
  reused.Deallocate(*second, 100);
  EXPECT_EQ(upstream.deallocations, 1);
  ASSERT_EQ(upstream.freed.size(), 1u);
  EXPECT_EQ(upstream.freed[0], (std::pair<void*, size_t>{*second, 100}));

  // Even a request larger than the buffer, while it is out, leaves the buffer alone.
  absl::StatusOr<void*> large = reused.Allocate(3 * kMiB, 64);
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_EQ(upstream.requests.back(), (std::pair<size_t, size_t>{3 * kMiB, 64}));
  ExpectWritable(*large, 3 * kMiB, 3);
  EXPECT_EQ(upstream.deallocations, 1) << "the buffer in use was not replaced";
  EXPECT_TRUE(upstream.Owns(buffer, 100));

  // The buffer comes back before the upstream tensor is freed: the order does not matter.
  reused.Deallocate(buffer, 100);
  EXPECT_EQ(upstream.deallocations, 1);
  reused.Deallocate(*large, 3 * kMiB);
  EXPECT_EQ(upstream.deallocations, 2);
  EXPECT_EQ(upstream.freed.back(), (std::pair<void*, size_t>{*large, 3 * kMiB}));

  absl::StatusOr<void*> again = reused.Allocate(200, 64);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, buffer);
  EXPECT_EQ(upstream.allocations(), 3);
  reused.Deallocate(*again, 200);
  EXPECT_EQ(upstream.bad_frees, 0);
}

TEST(ReusedBufferAllocatorTest, LargerRequestsReplaceTheBufferAtLeastDoubling) {
  RecordingUpstream upstream;
  {
    ReusedBufferAllocator reused(upstream);
    void* small = *reused.Allocate(100, 64);
    const size_t first_capacity = upstream.requests[0].first;
    reused.Deallocate(small, 100);

    // Past the capacity: the old buffer goes back upstream (with its own size), a new one comes.
    absl::StatusOr<void*> large = reused.Allocate(first_capacity + 1, 64);
    ASSERT_TRUE(large.ok()) << large.status();
    ASSERT_EQ(upstream.allocations(), 2);
    ASSERT_EQ(upstream.freed.size(), 1u);
    EXPECT_EQ(upstream.freed[0], (std::pair<void*, size_t>{small, first_capacity}));
    const size_t second_capacity = upstream.requests[1].first;
    EXPECT_GE(second_capacity, first_capacity + 1);
    EXPECT_GE(second_capacity, 2 * first_capacity);
    EXPECT_EQ(upstream.requests[1].second, ReusedBufferAllocator::kAlignment);
    EXPECT_TRUE(upstream.Owns(*large, first_capacity + 1));
    ExpectWritable(*large, first_capacity + 1, 7);
    reused.Deallocate(*large, first_capacity + 1);

    // Slowly growing requests: each replacement at least doubles, so a few cover many steps.
    size_t bytes = first_capacity + 1;
    for (int i = 0; i < 64; ++i) {
      bytes += kMiB / 2;
      absl::StatusOr<void*> p = reused.Allocate(bytes, 256);
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_TRUE(upstream.Owns(*p, bytes)) << bytes;
      reused.Deallocate(*p, bytes);
    }
    // 64 half-MiB steps from just past 1 MiB end just past 33 MiB: 2 -> 4 -> 8 -> 16 -> 32 -> 64 MiB.
    EXPECT_LE(upstream.allocations(), 2 + 5);
    for (size_t i = 1; i < upstream.requests.size(); ++i) {
      EXPECT_GE(upstream.requests[i].first, 2 * upstream.requests[i - 1].first) << "replacement " << i;
    }
    // Every replaced buffer went back with the size it was allocated with.
    EXPECT_EQ(upstream.freed.size(), upstream.requests.size() - 1);
    EXPECT_EQ(upstream.live.size(), 1u);
  }
  EXPECT_EQ(upstream.bad_frees, 0);
  EXPECT_TRUE(upstream.live.empty());
}

TEST(ReusedBufferAllocatorTest, AlignmentsAboveTheBuffersGoUpstream) {
  RecordingUpstream upstream;
  ReusedBufferAllocator reused(upstream);
  // Before any buffer exists: no buffer is made for it.
  absl::StatusOr<void*> aligned = reused.Allocate(100, 512);
  ASSERT_TRUE(aligned.ok()) << aligned.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*aligned) % 512, 0u);
  ASSERT_EQ(upstream.allocations(), 1);
  EXPECT_EQ(upstream.requests[0], (std::pair<size_t, size_t>{100, 512}));
  reused.Deallocate(*aligned, 100);
  EXPECT_EQ(upstream.deallocations, 1);
  EXPECT_TRUE(upstream.live.empty());

  // With a free buffer, still upstream: the buffer only promises kAlignment.
  void* buffer = *reused.Allocate(100, 64);
  reused.Deallocate(buffer, 100);
  const int before = upstream.allocations();
  absl::StatusOr<void*> page = reused.Allocate(100, 4096);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(upstream.allocations(), before + 1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*page) % 4096, 0u);
  // The buffer stayed free for the next ordinary request.
  absl::StatusOr<void*> again = reused.Allocate(100, 256);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, buffer);
  EXPECT_EQ(upstream.allocations(), before + 1);
  reused.Deallocate(*page, 100);
  reused.Deallocate(*again, 100);
  EXPECT_EQ(upstream.bad_frees, 0);
}

TEST(ReusedBufferAllocatorTest, DestructorWithoutABufferFreesNothing) {
  RecordingUpstream upstream;
  { ReusedBufferAllocator reused(upstream); }
  EXPECT_EQ(upstream.allocations(), 0);
  EXPECT_EQ(upstream.deallocations, 0);
}

TEST(ReusedBufferAllocatorTest, DeviceIsTheUpstreams) {
  RecordingUpstream upstream(Device::Cuda(3));
  ReusedBufferAllocator reused(upstream);
  EXPECT_EQ(reused.device(), Device::Cuda(3));
}

TEST(ReusedBufferAllocatorTest, UpstreamFailuresArePassedOn) {
  RecordingUpstream upstream;
  ReusedBufferAllocator reused(upstream);
  upstream.fail = true;
  absl::StatusOr<void*> failed = reused.Allocate(100, 64);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted);
  // A failed first allocation leaves no half-made buffer: the next request tries again.
  upstream.fail = false;
  absl::StatusOr<void*> p = reused.Allocate(100, 64);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(upstream.Owns(*p, 100));
  reused.Deallocate(*p, 100);

  // A failed replacement: the old buffer is gone (freed first, so that the two never coexist),
  // and the allocator is still usable.
  upstream.fail = true;
  EXPECT_FALSE(reused.Allocate(2 * kMiB, 64).ok());
  upstream.fail = false;
  absl::StatusOr<void*> after = reused.Allocate(100, 64);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(upstream.Owns(*after, 100));
  reused.Deallocate(*after, 100);
  EXPECT_EQ(upstream.bad_frees, 0);
}

TEST(ReusedBufferAllocatorTest, RequestsTooLargeToRoundUpFailRatherThanShrink) {
  // Rounding a request near SIZE_MAX up to whole MiB must not wrap around to a small buffer that
  // is then handed out for the huge request.
  RecordingUpstream upstream;
  ReusedBufferAllocator reused(upstream);
  const size_t huge = std::numeric_limits<size_t>::max() - 100;
  absl::StatusOr<void*> p = reused.Allocate(huge, 64);
  EXPECT_FALSE(p.ok()) << "got " << *p << " for " << huge << " bytes; upstream asked for "
                       << (upstream.requests.empty() ? 0 : upstream.requests.back().first);
  for (const auto& [bytes, alignment] : upstream.requests) EXPECT_GE(bytes, huge) << "a request shrunk";
  if (p.ok()) reused.Deallocate(*p, huge);
  // With a buffer already there, likewise.
  void* buffer = *reused.Allocate(100, 64);
  reused.Deallocate(buffer, 100);
  absl::StatusOr<void*> q = reused.Allocate(huge, 64);
  EXPECT_FALSE(q.ok());
  if (q.ok()) reused.Deallocate(*q, huge);
  EXPECT_EQ(upstream.bad_frees, 0);
}

}  // namespace
}  // namespace eagle3
