// CpuBackend::CompactAccepted ≡ the host commit it replaces (per sequence: PagedRead of the rows at
// cache_len + accepted[i], then PagedWrite of them to cache_len + i), bit for bit over the whole
// cache: several sequences, page sizes 1/4/16, shuffled pages, accepted sets empty, all, chains whose
// sources overlap their destinations, random; skipped sequences (num_accepted < 0). Each bad entry is
// named by sequence and entry, its sequence is left unwritten and the others are compacted; shape
// errors name the tensor.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "eagle3/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3::cpu {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kWidth = 6;

// A batch of sequences over one shuffled page pool; cache_len and the accepted offsets are the
// test's to set.
struct Batch {
  int64_t page_size = 4, max_nodes = 8, pages = 0, num_pages = 0;
  int64_t table_stride = 0, accepted_stride = 0;
  std::vector<float> cache;        // [num_pages, page_size, kWidth], every element distinct
  std::vector<int32_t> tables;     // [B, pages], row stride table_stride
  std::vector<int64_t> cache_len;  // [B]
  std::vector<int32_t> accepted;   // [B, max_nodes], row stride accepted_stride
  std::vector<int32_t> num;        // [B]

  int64_t b() const { return static_cast<int64_t>(num.size()); }
  TensorView Cache() { return TensorView(cache.data(), DType::kF32, Shape{num_pages, page_size, kWidth}); }
  TensorView Tables() {
    return TensorView(tables.data(), DType::kI32, Shape{b(), pages}, Shape{table_stride, 1}, Device::Cpu());
  }
  TensorView Table(int64_t s) { return TensorView(tables.data() + s * table_stride, DType::kI32, Shape{pages}); }
  TensorView Accepted() {
    return TensorView(accepted.data(), DType::kI32, Shape{b(), max_nodes}, Shape{accepted_stride, 1},
                      Device::Cpu());
  }
  TensorView Num() { return TensorView(num.data(), DType::kI32, Shape{b()}); }
  void Set(int64_t s, int64_t len, const std::vector<int32_t>& offsets, int32_t n) {
    cache_len[s] = len;
    std::copy(offsets.begin(), offsets.end(), accepted.begin() + s * accepted_stride);
    num[s] = n;
  }
  void Set(int64_t s, int64_t len, const std::vector<int32_t>& offsets) {
    Set(s, len, offsets, static_cast<int32_t>(offsets.size()));
  }
};

// `sequences` sequences of `pages` pages each, drawn without repetition from a shuffled pool with
// spare pages; strides padded by `pad`.
Batch MakeBatch(std::mt19937& rng, int64_t sequences, int64_t page_size, int64_t max_nodes, int64_t pages,
                int64_t pad = 0) {
  Batch x;
  x.page_size = page_size;
  x.max_nodes = max_nodes;
  x.pages = pages;
  x.num_pages = sequences * pages + 3;
  x.table_stride = pages + pad;
  x.accepted_stride = max_nodes + pad;
  x.cache.resize(static_cast<size_t>(x.num_pages * page_size * kWidth));
  for (size_t i = 0; i < x.cache.size(); ++i) x.cache[i] = static_cast<float>(i) + 0.25f;
  std::vector<int32_t> pool(static_cast<size_t>(x.num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  x.tables.assign(static_cast<size_t>(sequences * x.table_stride), -7);
  for (int64_t s = 0; s < sequences; ++s) {
    std::copy_n(pool.begin() + s * pages, pages, x.tables.begin() + s * x.table_stride);
  }
  x.cache_len.assign(static_cast<size_t>(sequences), 0);
  x.accepted.assign(static_cast<size_t>(sequences * x.accepted_stride), -9);
  x.num.assign(static_cast<size_t>(sequences), 0);
  return x;
}

// The host commit CompactAccepted replaces, on a copy of the cache: for each sequence not in
// `skip` with num >= 0, PagedRead of its accepted rows, then PagedWrite of them to cache_len + i.
std::vector<float> Reference(Batch x, const std::vector<int64_t>& skip = {}) {
  CpuBackend backend;
  for (int64_t s = 0; s < x.b(); ++s) {
    const int64_t n = x.num[s];
    if (n <= 0 || std::count(skip.begin(), skip.end(), s) > 0) continue;
    std::vector<int64_t> src(static_cast<size_t>(n)), dst(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      src[i] = x.cache_len[s] + x.accepted[s * x.accepted_stride + i];
      dst[i] = x.cache_len[s] + i;
    }
    std::vector<float> rows(static_cast<size_t>(n * kWidth));
    const TensorView rows_t(rows.data(), DType::kF32, Shape{n, kWidth});
    EXPECT_TRUE(backend.PagedRead(x.Cache(), x.Table(s), TensorView(src.data(), DType::kI64, Shape{n}), rows_t).ok());
    EXPECT_TRUE(backend.PagedWrite(rows_t, TensorView(dst.data(), DType::kI64, Shape{n}), x.Table(s), x.Cache()).ok());
  }
  return x.cache;
}

absl::Status Compact(Batch& x, bool i64_len = true) {
  CpuBackend backend;
  std::vector<int32_t> len32(x.cache_len.begin(), x.cache_len.end());
  const TensorView len = i64_len ? TensorView(x.cache_len.data(), DType::kI64, Shape{x.b()})
                                 : TensorView(len32.data(), DType::kI32, Shape{x.b()});
  return backend.CompactAccepted(x.Cache(), x.Tables(), len, x.Accepted(), x.Num());
}

TEST(CompactAcceptedTest, DesignedSetsMatchTheHostCommit) {
  std::mt19937 rng(3);
  for (int64_t page_size : {1, 4, 16}) {
    SCOPED_TRACE("page_size " + std::to_string(page_size));
    const int64_t max_nodes = 8;
    const int64_t pages = (20 + max_nodes + page_size - 1) / page_size + 1;
    Batch x = MakeBatch(rng, 7, page_size, max_nodes, pages, /*pad=*/2);
    x.Set(0, 5, {});                                       // empty
    x.Set(1, page_size - 1, {0, 1, 2, 3, 4, 5, 6, 7});      // all: nothing moves
    x.Set(2, 3, {0, 2, 3, 5, 6, 7});                       // a chain: sources are destinations
    x.Set(3, 9, {7, 6}, -1);                               // skipped (bad entries never read)
    x.Set(4, 17, {1});                                     // one row down onto offset 0
    x.Set(5, 0, {1, 2, 3, 4, 5, 6, 7});                    // every row one slot down
    x.Set(6, 2 * page_size - 2, {0, 4});                   // across a page boundary
    const std::vector<float> want = Reference(x);
    ASSERT_NE(want, x.cache);
    for (bool i64_len : {true, false}) {
      Batch y = x;
      const absl::Status st = Compact(y, i64_len);
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_EQ(y.cache, want) << (i64_len ? "i64" : "i32") << " cache_len";
    }
  }
}

TEST(CompactAcceptedTest, RandomSetsMatchTheHostCommit) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t page_size = std::vector<int64_t>{1, 4, 16}[trial % 3];
    const int64_t max_nodes = 1 + static_cast<int64_t>(rng() % 40);
    const int64_t sequences = 1 + static_cast<int64_t>(rng() % 6);
    const int64_t pages = (50 + max_nodes + page_size - 1) / page_size;
    Batch x = MakeBatch(rng, sequences, page_size, max_nodes, pages, static_cast<int64_t>(rng() % 3));
    for (int64_t s = 0; s < sequences; ++s) {
      std::vector<int32_t> offsets;
      for (int32_t i = 0; i < max_nodes; ++i) {
        if (rng() % 3 != 0) offsets.push_back(i);
      }
      x.Set(s, static_cast<int64_t>(rng() % 50), offsets, rng() % 7 == 0 ? -1 : static_cast<int32_t>(offsets.size()));
    }
    const std::vector<float> want = Reference(x);
    const absl::Status st = Compact(x, trial % 2 == 0);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(x.cache, want) << "trial " << trial;
  }
}

// Sequences 0 and 2 are fine; sequence 1 gets the bad entry. Checks the message and that only
// sequence 1 is left unwritten.
void ExpectBadSequence(const std::function<void(Batch&)>& spoil, const std::vector<std::string>& words) {
  std::mt19937 rng(5);
  Batch x = MakeBatch(rng, 3, 4, 8, 5);
  x.Set(0, 6, {0, 2, 5});
  x.Set(1, 1, {0, 1, 3, 4});
  x.Set(2, 9, {1, 2, 7});
  spoil(x);
  const std::vector<float> want = Reference(x, {1});
  const absl::Status st = Compact(x);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("CompactAccepted"));
  for (const std::string& w : words) EXPECT_THAT(std::string(st.message()), HasSubstr(w));
  EXPECT_EQ(x.cache, want);
}

TEST(CompactAcceptedTest, BadEntriesAreNamedAndOnlyTheirSequenceIsSkipped) {
  // num_accepted above max_nodes.
  ExpectBadSequence([](Batch& x) { x.num[1] = 9; }, {"sequence 1, entry 0", "exceeds max_nodes"});
  // Offsets: negative, not increasing, equal, >= max_nodes.
  ExpectBadSequence([](Batch& x) { x.accepted[x.accepted_stride + 0] = -1; },
                    {"sequence 1, entry 0", "[0, max_nodes)"});
  ExpectBadSequence([](Batch& x) { x.accepted[x.accepted_stride + 2] = 0; },
                    {"sequence 1, entry 2", "greater than accepted[b][i - 1]"});
  ExpectBadSequence([](Batch& x) { x.accepted[x.accepted_stride + 3] = 3; }, {"sequence 1, entry 3"});
  ExpectBadSequence([](Batch& x) { x.accepted[x.accepted_stride + 3] = 8; },
                    {"sequence 1, entry 3", "accepted[1][3] = 8"});
  // Positions: beyond the page table, negative cache_len.
  ExpectBadSequence([](Batch& x) { x.cache_len[1] = 17; },
                    {"sequence 1, entry 2", "outside [0, P * page_size)"});  // 17 + 3 >= 5 * 4
  ExpectBadSequence([](Batch& x) { x.cache_len[1] = -1; }, {"sequence 1, entry 0", "cache_len[1] = -1"});
  // Page entries: negative, >= num_pages (only the pages a move touches count).
  ExpectBadSequence([](Batch& x) { x.tables[x.table_stride + 1] = -2; },  // entry 2 reads position 4
                    {"sequence 1, entry 2", "outside [0, num_pages)"});
  ExpectBadSequence([](Batch& x) { x.tables[x.table_stride] = static_cast<int32_t>(x.num_pages); },
                    {"sequence 1, entry 0", "outside [0, num_pages)"});  // even an unmoved row's page
  // The lowest condition wins over a lower entry: entry 1 on a bad page, entry 3 not increasing.
  ExpectBadSequence(
      [](Batch& x) {
        x.tables[x.table_stride + 1] = -2;
        x.accepted[x.accepted_stride + 3] = 2;
      },
      {"sequence 1, entry 3", "greater than"});
}

TEST(CompactAcceptedTest, UnusedPageEntriesAndSkippedSequencesAreNotChecked) {
  std::mt19937 rng(7);
  Batch x = MakeBatch(rng, 2, 4, 8, 5);
  x.Set(0, 0, {0, 2});
  x.tables[4] = -5;  // page 4 of sequence 0: never touched
  x.Set(1, -100, {3, 3, 1}, -1);
  x.tables[x.table_stride] = 1 << 30;
  const std::vector<float> want = Reference(x);
  const absl::Status st = Compact(x);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(x.cache, want);
}

TEST(CompactAcceptedTest, ShapeErrorsNameTheTensor) {
  std::mt19937 rng(9);
  Batch x = MakeBatch(rng, 2, 4, 8, 5);
  x.Set(0, 0, {0, 2});
  x.Set(1, 0, {1});
  CpuBackend backend;
  const TensorView len(x.cache_len.data(), DType::kI64, Shape{2});
  auto expect = [&](const absl::Status& st, const std::vector<std::string>& words) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    for (const std::string& w : words) EXPECT_THAT(std::string(st.message()), HasSubstr(w));
  };
  std::vector<int64_t> wide(16, 0);
  std::vector<float> flen(2, 0.0f);
  expect(backend.CompactAccepted(x.Cache(), x.Tables(), len,
                                 TensorView(wide.data(), DType::kI64, Shape{2, 8}), x.Num()),
         {"accepted", "must be i32"});
  expect(backend.CompactAccepted(x.Cache(), x.Tables(), TensorView(flen.data(), DType::kF32, Shape{2}),
                                 x.Accepted(), x.Num()),
         {"cache_len", "i32 or i64"});
  expect(backend.CompactAccepted(x.Cache(), x.Tables(), len, x.Accepted(),
                                 TensorView(x.num.data(), DType::kI32, Shape{1})),
         {"num_accepted", "B = 2"});
  expect(backend.CompactAccepted(x.Cache(), x.Tables(), TensorView(x.cache_len.data(), DType::kI64, Shape{3}),
                                 x.Accepted(), x.Num()),
         {"cache_len", "B = 2"});
  expect(backend.CompactAccepted(x.Cache(), TensorView(wide.data(), DType::kI64, Shape{2, 5}), len,
                                 x.Accepted(), x.Num()),
         {"page_tables", "must be i32"});
  expect(backend.CompactAccepted(x.Cache().Narrow(2, 0, 3), x.Tables(), len, x.Accepted(), x.Num()),
         {"cache", "contiguous"});
  expect(backend.CompactAccepted(TensorView(x.cache.data(), DType::kF32, Shape{x.num_pages * 4, kWidth}),
                                 x.Tables(), len, x.Accepted(), x.Num()),
         {"cache", "3-D"});
  // num_accepted inside the cache it would write.
  expect(backend.CompactAccepted(x.Cache(), x.Tables(), len, x.Accepted(),
                                 TensorView(x.cache.data(), DType::kI32, Shape{2})),
         {"num_accepted", "overlaps"});
}

}  // namespace
}  // namespace eagle3::cpu
