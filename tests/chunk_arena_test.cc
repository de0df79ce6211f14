// ChunkArena over a fake upstream allocator that records every allocation, refuses past a byte
// budget and checks every free: pieces aligned and disjoint, chunks returned when their last piece
// dies, large requests bypassing the chunks, the upstream running out, bad requests and options,
// several threads at once, and what the destructor leaves.
#include "eagle3/chunk_arena.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "eagle3/tensor.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

// Host memory that stands for the upstream's: counted, budgeted, and checked on free. Not locked:
// the arena promises to call it one call at a time.
class FakeUpstream final : public Allocator {
 public:
  explicit FakeUpstream(Device device = Device::Cpu()) : device_(device) {}
  ~FakeUpstream() override {
    for (const auto& [p, bytes] : live) DefaultHostAllocator().Deallocate(p, bytes);
  }

  Device device() const override { return device_; }
  absl::StatusOr<void*> Allocate(size_t bytes, size_t alignment) override {
    ++allocations;
    requests.emplace_back(bytes, alignment);
    if (in_call) ++overlapping_calls;
    in_call = true;
    absl::StatusOr<void*> out = AllocateInCall(bytes, alignment);
    in_call = false;
    return out;
  }
  void Deallocate(void* ptr, size_t bytes) override {
    ++deallocations;
    const auto it = live.find(ptr);
    if (it == live.end() || it->second != bytes) {
      ++bad_frees;
      return;
    }
    held_bytes -= bytes;
    live.erase(it);
    DefaultHostAllocator().Deallocate(ptr, bytes);
  }

  size_t budget = SIZE_MAX;                     // bytes it may hold at once; more: ResourceExhausted
  std::optional<absl::StatusCode> fail_with;    // every request fails with it
  int64_t allocations = 0, deallocations = 0, bad_frees = 0, overlapping_calls = 0;
  size_t held_bytes = 0;
  std::vector<std::pair<size_t, size_t>> requests;  // (bytes, alignment) of every Allocate
  std::map<void*, size_t> live;

 private:
  absl::StatusOr<void*> AllocateInCall(size_t bytes, size_t alignment) {
    if (fail_with.has_value()) return absl::Status(*fail_with, "fake upstream: injected failure");
    if (bytes > budget - held_bytes) {
      return absl::ResourceExhaustedError("fake upstream: " + std::to_string(bytes) + " bytes asked, " +
                                          std::to_string(budget - held_bytes) + " left");
    }
    absl::StatusOr<void*> p = DefaultHostAllocator().Allocate(std::max<size_t>(bytes, 1), std::max<size_t>(alignment, 64));
    if (!p.ok()) return p;
    live.emplace(*p, bytes);
    held_bytes += bytes;
    return p;
  }

  Device device_;
  bool in_call = false;
};

std::unique_ptr<ChunkArena> MakeArena(FakeUpstream& upstream, ChunkArenaOptions options) {
  absl::StatusOr<std::unique_ptr<ChunkArena>> arena = ChunkArena::Create(upstream, options);
  EXPECT_TRUE(arena.ok()) << arena.status();
  return arena.ok() ? std::move(*arena) : nullptr;
}

struct Piece {
  uintptr_t address;
  size_t bytes;
  uint8_t fill;
};

// Pieces (zero bytes counted as one) overlap none of the others: sorted by address, each ends
// before the next starts.
void ExpectDisjoint(std::vector<Piece> pieces) {
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.address < b.address; });
  for (size_t i = 1; i < pieces.size(); ++i) {
    EXPECT_GE(pieces[i].address, pieces[i - 1].address + std::max<size_t>(pieces[i - 1].bytes, 1))
        << "piece at " << pieces[i].address << " overlaps the one at " << pieces[i - 1].address;
  }
}

// Each piece still holds the byte it was filled with (a piece handed out over another would not).
void ExpectFilled(const std::vector<Piece>& pieces) {
  for (const Piece& p : pieces) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(p.address);
    for (size_t i = 0; i < p.bytes; ++i) {
      if (bytes[i] != p.fill) {
        ADD_FAILURE() << "piece at " << p.address << " byte " << i << " overwritten";
        break;
      }
    }
  }
}

TEST(ChunkArenaTest, PiecesAreAlignedDisjointAndInsideChunks) {
  FakeUpstream upstream;
  auto arena = MakeArena(upstream, {.chunk_bytes = 4096});
  ASSERT_NE(arena, nullptr);
  std::mt19937 rng(5);
  std::uniform_int_distribution<size_t> size(0, 1500);
  std::uniform_int_distribution<int> log_alignment(0, 8);
  std::vector<Piece> pieces;
  for (int i = 0; i < 500; ++i) {
    const size_t bytes = size(rng);
    const size_t alignment = size_t{1} << log_alignment(rng);
    absl::StatusOr<void*> p = arena->Allocate(bytes, alignment);
    ASSERT_TRUE(p.ok()) << p.status();
    const auto address = reinterpret_cast<uintptr_t>(*p);
    EXPECT_EQ(address % alignment, 0u) << bytes << " bytes at alignment " << alignment;
    const auto chunk = std::find_if(upstream.live.begin(), upstream.live.end(), [&](const auto& c) {
      const auto base = reinterpret_cast<uintptr_t>(c.first);
      return address >= base && address + std::max<size_t>(bytes, 1) <= base + c.second;
    });
    EXPECT_NE(chunk, upstream.live.end()) << "piece " << i << " is not inside a chunk";
    const auto fill = static_cast<uint8_t>(i);
    std::memset(*p, fill, bytes);
    pieces.push_back(Piece{address, bytes, fill});
  }
  ExpectDisjoint(pieces);
  ExpectFilled(pieces);
  // Every upstream request was a chunk: 500 pieces of ~750 bytes in 4 KiB chunks.
  EXPECT_EQ(arena->stats().chunk_allocations, upstream.allocations);
  EXPECT_EQ(arena->stats().pieces, 500);
  EXPECT_LT(upstream.allocations, 150);
  for (const auto& [bytes, alignment] : upstream.requests) {
    EXPECT_EQ(bytes, 4096u);
    EXPECT_EQ(alignment, 256u);
  }
  for (const Piece& p : pieces) arena->Deallocate(reinterpret_cast<void*>(p.address), p.bytes);
  EXPECT_EQ(upstream.held_bytes, 0u);
  EXPECT_EQ(upstream.deallocations, upstream.allocations);
  EXPECT_EQ(upstream.bad_frees, 0);
}

TEST(ChunkArenaTest, ZeroBytePiecesHaveUniqueAddresses) {
  FakeUpstream upstream;
  auto arena = MakeArena(upstream, {.chunk_bytes = 4096});
  ASSERT_NE(arena, nullptr);
  std::vector<void*> got;
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<void*> p = arena->Allocate(0, 1);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_NE(*p, nullptr);
    got.push_back(*p);
  }
  std::vector<void*> sorted = got;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "two zero-byte pieces share an address";
  EXPECT_EQ(upstream.allocations, 1);
  for (void* p : got) arena->Deallocate(p, 0);
  EXPECT_EQ(upstream.held_bytes, 0u);
}

// Pieces of 300 bytes at 64-byte alignment: three per 1 KiB chunk (offsets 0, 320, 640).
TEST(ChunkArenaTest, ChunkGoesBackWhenItsLastPieceDies) {
  FakeUpstream upstream;
  auto arena = MakeArena(upstream, {.chunk_bytes = 1024});
  ASSERT_NE(arena, nullptr);
  std::vector<void*> p;
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<void*> got = arena->Allocate(300, 64);
    ASSERT_TRUE(got.ok()) << got.status();
    p.push_back(*got);
  }
  ASSERT_EQ(upstream.allocations, 2);
  EXPECT_EQ(arena->stats().chunks, 2);
  // The first chunk (not being filled): returned with its third piece, not before.
  arena->Deallocate(p[0], 300);
  arena->Deallocate(p[2], 300);
  EXPECT_EQ(upstream.deallocations, 0);
  arena->Deallocate(p[1], 300);
  EXPECT_EQ(upstream.deallocations, 1);
  EXPECT_EQ(arena->stats().chunks, 1);
  // The chunk being filled goes back too once empty; the next piece takes a fresh chunk.
  for (int i = 3; i < 6; ++i) arena->Deallocate(p[i], 300);
  EXPECT_EQ(upstream.deallocations, 2);
  EXPECT_EQ(upstream.held_bytes, 0u);
  EXPECT_EQ(arena->stats().chunks, 0);
  absl::StatusOr<void*> again = arena->Allocate(300, 64);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(upstream.allocations, 3);
  arena->Deallocate(*again, 300);
  EXPECT_EQ(upstream.bad_frees, 0);
}

// The chunk being filled keeps serving after one of its pieces is freed, never at that piece's
// address again (memory work in flight may still read).
TEST(ChunkArenaTest, FreedPieceIsNotHandedOutAgain) {
  FakeUpstream upstream;
  auto arena = MakeArena(upstream, {.chunk_bytes = 4096});
  ASSERT_NE(arena, nullptr);
  void* a = *arena->Allocate(256, 256);
  void* b = *arena->Allocate(256, 256);
  arena->Deallocate(a, 256);
  void* c = *arena->Allocate(256, 256);
  EXPECT_EQ(upstream.allocations, 1);  // the same chunk
  EXPECT_NE(c, a);
  EXPECT_GT(reinterpret_cast<uintptr_t>(c), reinterpret_cast<uintptr_t>(b));
  arena->Deallocate(b, 256);
  arena->Deallocate(c, 256);
  EXPECT_EQ(upstream.held_bytes, 0u);
}

TEST(ChunkArenaTest, LargeRequestsBypassTheChunks) {
  FakeUpstream upstream;
  auto arena = MakeArena(upstream, {.chunk_bytes = 4096});
  ASSERT_NE(arena, nullptr);
  EXPECT_EQ(arena->options().max_piece_bytes, 2048u);  // half a chunk by default
  void* piece = *arena->Allocate(2048, 256);            // at the threshold: a chunk's
  ASSERT_EQ(upstream.requests.size(), 1u);
  EXPECT_EQ(upstream.requests[0], std::make_pair(size_t{4096}, size_t{256}));
  absl::StatusOr<void*> large = arena->Allocate(2049, 128);
  ASSERT_TRUE(large.ok()) << large.status();
  ASSERT_EQ(upstream.requests.size(), 2u);
  EXPECT_EQ(upstream.requests[1], std::make_pair(size_t{2049}, size_t{128}));
  EXPECT_EQ(arena->stats().direct, 1);
  EXPECT_EQ(arena->stats().chunks, 1);
  arena->Deallocate(*large, 2049);
  EXPECT_EQ(upstream.deallocations, 1);
  EXPECT_EQ(upstream.live.count(*large), 0u);
  EXPECT_EQ(arena->stats().direct, 0);
  arena->Deallocate(piece, 2048);
  EXPECT_EQ(upstream.held_bytes, 0u);
  EXPECT_EQ(upstream.bad_frees, 0);

  auto small_pieces = MakeArena(upstream, {.chunk_bytes = 4096, .max_piece_bytes = 100});
  ASSERT_NE(small_pieces, nullptr);
  void* p100 = *small_pieces->Allocate(100, 64);
  void* p101 = *small_pieces->Allocate(101, 64);
  EXPECT_EQ(small_pieces->stats().pieces, 1);
  EXPECT_EQ(small_pieces->stats().direct, 1);
  EXPECT_EQ(upstream.requests.back(), std::make_pair(size_t{101}, size_t{64}));
  small_pieces->Deallocate(p100, 100);
  small_pieces->Deallocate(p101, 101);
  EXPECT_EQ(upstream.held_bytes, 0u);
}

TEST(ChunkArenaTest, UpstreamRunningOutPassesResourceExhaustedThrough) {
  FakeUpstream upstream;
  upstream.budget = 4096 + 3000;  // one chunk, then room for pieces but not a second chunk
  auto arena = MakeArena(upstream, {.chunk_bytes = 4096});
  ASSERT_NE(arena, nullptr);
  void* first = *arena->Allocate(2000, 256);
  void* second = *arena->Allocate(2000, 256);
  // No room left in the chunk and none for another: the request alone still fits the upstream.
  absl::StatusOr<void*> alone = arena->Allocate(2000, 256);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(arena->stats().direct, 1);
  EXPECT_EQ(arena->stats().chunks, 1);
  // Now nothing fits: ResourceExhausted naming the chunk, the request and the upstream's reasons.
  absl::StatusOr<void*> none = arena->Allocate(2000, 256);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted) << none.status();
  const std::string message(none.status().message());
  EXPECT_NE(message.find("ChunkArena: a new chunk of 4096 bytes for a request of 2000 bytes"), std::string::npos)
      << message;
  EXPECT_NE(message.find("fake upstream: 4096 bytes asked"), std::string::npos) << message;
  EXPECT_NE(message.find("the request alone"), std::string::npos) << message;
  EXPECT_NE(message.find("fake upstream: 2000 bytes asked"), std::string::npos) << message;
  // A large request the upstream refuses names the bypass.
  absl::StatusOr<void*> large = arena->Allocate(3000, 256);
  ASSERT_FALSE(large.ok());
  EXPECT_EQ(large.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(large.status().message().find("above max_piece_bytes 2048"), std::string::npos) << large.status();
  // Other failures of a chunk keep their code and do not fall back to the request alone.
  arena->Deallocate(first, 2000);
  arena->Deallocate(second, 2000);
  arena->Deallocate(*alone, 2000);
  EXPECT_EQ(upstream.held_bytes, 0u);
  upstream.fail_with = absl::StatusCode::kInternal;
  const int64_t before = upstream.allocations;
  absl::StatusOr<void*> broken = arena->Allocate(10, 16);
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(broken.status().message().find("injected failure"), std::string::npos) << broken.status();
  EXPECT_EQ(upstream.allocations, before + 1);
  // And the arena works again once the upstream does.
  upstream.fail_with.reset();
  absl::StatusOr<void*> later = arena->Allocate(10, 16);
  ASSERT_TRUE(later.ok()) << later.status();
  arena->Deallocate(*later, 10);
  EXPECT_EQ(upstream.held_bytes, 0u);
  EXPECT_EQ(upstream.bad_frees, 0);
}

TEST(ChunkArenaTest, BadAlignmentNamesWhatWasExpectedAndGiven) {
  FakeUpstream upstream;
  auto arena = MakeArena(upstream, {.chunk_bytes = 4096});
  ASSERT_NE(arena, nullptr);
  for (const size_t alignment : {size_t{0}, size_t{3}, size_t{96}, size_t{512}}) {
    absl::StatusOr<void*> p = arena->Allocate(64, alignment);
    ASSERT_FALSE(p.ok()) << alignment;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find("power of two <= 256"), std::string::npos) << p.status();
    EXPECT_NE(p.status().message().find("got " + std::to_string(alignment)), std::string::npos) << p.status();
  }
  EXPECT_EQ(upstream.allocations, 0);
}

TEST(ChunkArenaTest, BadOptionsAreRefusedNamingTheOption) {
  FakeUpstream upstream;
  const struct {
    ChunkArenaOptions options;
    const char* message;
  } cases[] = {
      {{.chunk_bytes = 4096, .max_alignment = 48}, "max_alignment must be a power of two, got 48"},
      {{.chunk_bytes = 4096, .max_alignment = 0}, "max_alignment must be a power of two, got 0"},
      {{.chunk_bytes = 100}, "chunk_bytes must be at least max_alignment (256), got 100"},
      {{.chunk_bytes = 4096, .max_piece_bytes = 4097}, "max_piece_bytes must be at most chunk_bytes (4096), got 4097"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<std::unique_ptr<ChunkArena>> arena = ChunkArena::Create(upstream, c.options);
    ASSERT_FALSE(arena.ok()) << c.message;
    EXPECT_EQ(arena.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(arena.status().message().find(c.message), std::string::npos) << arena.status();
  }
}

TEST(ChunkArenaTest, ThreadsAllocateAndFreeConcurrently) {
  FakeUpstream upstream;
  auto arena = MakeArena(upstream, {.chunk_bytes = 16 << 10});
  ASSERT_NE(arena, nullptr);
  constexpr int kThreads = 8, kPieces = 1000;
  std::vector<std::vector<Piece>> per_thread(kThreads);
  std::vector<int> failures(kThreads, 0);
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 rng(static_cast<uint32_t>(t));
        std::uniform_int_distribution<size_t> size(0, 10 << 10);  // some above 8 KiB: bypass
        for (int i = 0; i < kPieces; ++i) {
          const size_t bytes = size(rng);
          absl::StatusOr<void*> p = arena->Allocate(bytes, 256);
          if (!p.ok() || reinterpret_cast<uintptr_t>(*p) % 256 != 0) {
            ++failures[t];
            continue;
          }
          const auto fill = static_cast<uint8_t>(t * 31 + i);
          std::memset(*p, fill, bytes);
          per_thread[t].push_back(Piece{reinterpret_cast<uintptr_t>(*p), bytes, fill});
        }
      });
    }
    for (std::thread& th : threads) th.join();
  }
  std::vector<Piece> all;
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(failures[t], 0) << "thread " << t;
    all.insert(all.end(), per_thread[t].begin(), per_thread[t].end());
  }
  ExpectDisjoint(all);
  ExpectFilled(all);
  EXPECT_GT(arena->stats().direct, 0);
  EXPECT_GT(arena->stats().pieces, 0);
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (const Piece& p : per_thread[t]) arena->Deallocate(reinterpret_cast<void*>(p.address), p.bytes);
      });
    }
    for (std::thread& th : threads) th.join();
  }
  EXPECT_EQ(upstream.overlapping_calls, 0);
  EXPECT_EQ(upstream.bad_frees, 0);
  EXPECT_EQ(upstream.held_bytes, 0u);
  EXPECT_EQ(upstream.deallocations, upstream.allocations);
  const ChunkArenaStats s = arena->stats();
  EXPECT_EQ(s.chunks, 0);
  EXPECT_EQ(s.pieces, 0);
  EXPECT_EQ(s.direct, 0);
}

// Tensors take their memory from the arena (Tensor::Empty's 256-byte alignment), report the
// upstream's device, and give every chunk back when freed: the arena then holds nothing when
// destroyed.
TEST(ChunkArenaTest, TensorsFreedBeforeTheArenaLeaveNothingHeld) {
  FakeUpstream upstream;
  {
    auto arena = MakeArena(upstream, {.chunk_bytes = 64 << 10});
    ASSERT_NE(arena, nullptr);
    std::vector<Tensor> tensors;
    for (int64_t n : {0, 1, 100, 5000, 20000, 40000}) {
      absl::StatusOr<Tensor> t = Tensor::Empty(DType::kF32, Shape{n}, *arena);
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_TRUE(t->device().is_cpu());
      tensors.push_back(std::move(*t));
    }
    EXPECT_EQ(arena->stats().pieces + arena->stats().direct, 6);
    EXPECT_EQ(arena->stats().direct, 2);  // 80,000 and 160,000 bytes: above 32 KiB
    tensors.clear();
    EXPECT_EQ(upstream.held_bytes, 0u);
  }
  EXPECT_EQ(upstream.deallocations, upstream.allocations);
  EXPECT_EQ(upstream.bad_frees, 0);
}

TEST(ChunkArenaTest, ReportsTheUpstreamDevice) {
  FakeUpstream upstream(Device::Cuda(3));
  auto arena = MakeArena(upstream, {});
  ASSERT_NE(arena, nullptr);
  EXPECT_EQ(arena->device(), Device::Cuda(3));
}

// Destroyed while a piece is live: its chunk is not freed under it (the memory stays the upstream's
// and writable); the chunks of freed pieces went back already.
TEST(ChunkArenaTest, DestroyedWithALivePieceLeavesItsChunkAllocated) {
  FakeUpstream upstream;
  void* kept = nullptr;
  {
    auto arena = MakeArena(upstream, {.chunk_bytes = 1024, .max_piece_bytes = 1024});
    ASSERT_NE(arena, nullptr);
    void* a = *arena->Allocate(600, 256);  // chunk 1
    kept = *arena->Allocate(600, 256);     // chunk 2
    arena->Deallocate(a, 600);
    EXPECT_EQ(upstream.deallocations, 1);
  }
  EXPECT_EQ(upstream.deallocations, 1);
  ASSERT_EQ(upstream.live.size(), 1u);
  const auto base = reinterpret_cast<uintptr_t>(upstream.live.begin()->first);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(kept), base);
  std::memset(kept, 7, 600);  // still the upstream's memory (ASan would catch a freed chunk)
}

}  // namespace
}  // namespace eagle3
