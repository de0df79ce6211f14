// CpuBackend::BatchedLatentAttention: equal, row for row, to one LatentAttention call per sequence
// with the [n_b, kv_len] mask spelled out (prefix of ones, then the causal or tree rows), and every
// bad metadata entry refused by name before anything is written. BatchedLatentAttentionKeyMask (a
// mask over every key, an MLA draft's tree passes): equal to LatentAttention with the same mask rows,
// its bad masks refused by name.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
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

constexpr int64_t kHeads = 3, kWidth = 12, kValue = 8;
constexpr float kScale = 0.3f;

struct Batch {
  int64_t page_size = 4, num_pages = 0, max_pages = 0;
  std::vector<int64_t> n, len;          // per sequence: new tokens, kv_len
  std::vector<float> q, cache, out;     // [T, N, W], [pages, page, W], [T, N, V]
  std::vector<int32_t> tables, starts, lens;  // [B, P], [B + 1], [B]
  std::vector<uint8_t> mask;            // [T, M] (empty: causal)
  int64_t m = 0;
  int64_t total = 0;                    // T, fixed at creation (the tests edit q_start)

  int64_t b() const { return static_cast<int64_t>(n.size()); }
  int64_t t() const { return total; }
  TensorView Q() { return TensorView(q.data(), DType::kF32, Shape{t(), kHeads, kWidth}, Device::Cpu()); }
  TensorView Cache() {
    return TensorView(cache.data(), DType::kF32, Shape{num_pages, page_size, kWidth}, Device::Cpu());
  }
  TensorView Tables() { return TensorView(tables.data(), DType::kI32, Shape{b(), max_pages}, Device::Cpu()); }
  TensorView Starts() { return TensorView(starts.data(), DType::kI32, Shape{b() + 1}, Device::Cpu()); }
  TensorView Lens() { return TensorView(lens.data(), DType::kI32, Shape{b()}, Device::Cpu()); }
  TensorView Mask() {
    return mask.empty() ? TensorView() : TensorView(mask.data(), DType::kU8, Shape{t(), m}, Device::Cpu());
  }
  TensorView Out() { return TensorView(out.data(), DType::kF32, Shape{t(), kHeads, kValue}, Device::Cpu()); }
};

// Random sequences with shuffled, disjoint pages; tree masks (ancestor sets of a random tree,
// self included) when `tree`, else causal.
Batch MakeBatch(std::mt19937& rng, const std::vector<int64_t>& n, const std::vector<int64_t>& len, bool tree) {
  Batch x;
  x.n = n;
  x.len = len;
  int64_t most = 1;
  for (int64_t l : len) most = std::max(most, (l + x.page_size - 1) / x.page_size);
  x.max_pages = most + 1;
  x.num_pages = x.b() * x.max_pages + 2;
  std::vector<int32_t> perm(static_cast<size_t>(x.num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  x.tables.resize(static_cast<size_t>(x.b() * x.max_pages));
  for (size_t i = 0; i < x.tables.size(); ++i) x.tables[i] = perm[i];
  x.starts.push_back(0);
  for (int64_t v : n) x.starts.push_back(x.starts.back() + static_cast<int32_t>(v));
  for (int64_t l : len) x.lens.push_back(static_cast<int32_t>(l));
  x.total = x.starts.back();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  x.q.resize(static_cast<size_t>(x.t() * kHeads * kWidth));
  for (float& v : x.q) v = normal(rng);
  x.cache.resize(static_cast<size_t>(x.num_pages * x.page_size * kWidth));
  for (float& v : x.cache) v = normal(rng);
  x.out.assign(static_cast<size_t>(x.t() * kHeads * kValue), std::numeric_limits<float>::quiet_NaN());
  if (tree) {
    x.m = *std::max_element(n.begin(), n.end()) + 1;  // a wider M than needed: stride != n
    x.mask.assign(static_cast<size_t>(x.t() * x.m), 0);
    for (int64_t s = 0; s < x.b(); ++s) {
      std::vector<int64_t> parent(static_cast<size_t>(n[s]), -1);
      for (int64_t i = 1; i < n[s]; ++i) parent[i] = std::uniform_int_distribution<int64_t>(0, i - 1)(rng);
      for (int64_t i = 0; i < n[s]; ++i) {
        for (int64_t j = i; j >= 0; j = parent[j]) x.mask[(x.starts[s] + i) * x.m + j] = 1;
      }
    }
  }
  return x;
}

// The same result through one LatentAttention call per sequence with the full mask.
std::vector<float> PerSequence(CpuBackend& backend, Batch& x) {
  std::vector<float> out(x.out.size(), 0.0f);
  for (int64_t s = 0; s < x.b(); ++s) {
    const int64_t n = x.n[s], len = x.len[s], begin = x.starts[s];
    if (n == 0) continue;
    std::vector<uint8_t> full(static_cast<size_t>(n * len), 0);
    for (int64_t i = 0; i < n; ++i) {
      std::fill_n(&full[i * len], len - n, uint8_t{1});
      for (int64_t j = 0; j < n; ++j) {
        full[i * len + len - n + j] = x.mask.empty() ? (j <= i) : x.mask[(begin + i) * x.m + j];
      }
    }
    const TensorView q = x.Q().Narrow(0, begin, n);
    const TensorView o(out.data() + begin * kHeads * kValue, DType::kF32, Shape{n, kHeads, kValue}, Device::Cpu());
    const TensorView table(x.tables.data() + s * x.max_pages, DType::kI32, Shape{x.max_pages}, Device::Cpu());
    const absl::Status st = backend.LatentAttention(q, x.Cache(), table, len,
                                                    TensorView(full.data(), DType::kU8, Shape{n, len}, Device::Cpu()),
                                                    kScale, kValue, o);
    EXPECT_TRUE(st.ok()) << st;
  }
  return out;
}

TEST(CpuBatchedLatentAttentionTest, EqualsOneLatentAttentionPerSequence) {
  std::mt19937 rng(7);
  CpuBackend backend;
  for (bool tree : {false, true}) {
    // Decode (1 token), tree verify (several), an idle sequence (0), a prefill without prefix.
    Batch x = MakeBatch(rng, {1, 5, 0, 3, 7}, {9, 17, 4, 3, 30}, tree);
    ASSERT_TRUE(backend.BatchedLatentAttention(x.Q(), x.Cache(), x.Tables(), x.Starts(), x.Lens(), 40, x.Mask(),
                                               kScale, kValue, x.Out())
                    .ok());
    const std::vector<float> want = PerSequence(backend, x);
    ASSERT_EQ(x.out.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(x.out[i], want[i]) << "tree " << tree << " element " << i;
  }
}

TEST(CpuBatchedLatentAttentionTest, TreeMaskDecidesAmongNewTokensOnly) {
  // One sequence, 2 cached rows + 2 new tokens where new token 1 may NOT see new token 0: its output
  // must not depend on cache row 2 (token 0's key), but must depend on the cached prefix.
  std::mt19937 rng(3);
  CpuBackend backend;
  Batch x = MakeBatch(rng, {2}, {4}, true);
  x.mask.assign(x.mask.size(), 0);
  x.mask[0 * x.m + 0] = 1;
  x.mask[1 * x.m + 1] = 1;
  auto run = [&] {
    EXPECT_TRUE(backend.BatchedLatentAttention(x.Q(), x.Cache(), x.Tables(), x.Starts(), x.Lens(), 4, x.Mask(),
                                               kScale, kValue, x.Out())
                    .ok());
    return std::vector<float>(x.out.begin() + kHeads * kValue, x.out.end());  // row 1
  };
  const std::vector<float> before = run();
  auto slot = [&](int64_t pos) { return (x.tables[pos / x.page_size] * x.page_size + pos % x.page_size) * kWidth; };
  for (int64_t d = 0; d < kWidth; ++d) x.cache[slot(2) + d] += 5.0f;
  EXPECT_EQ(run(), before);
  for (int64_t d = 0; d < kWidth; ++d) x.cache[slot(0) + d] += 5.0f;
  EXPECT_NE(run(), before);
}

struct BadCase {
  std::string name;
  std::function<void(Batch&, int64_t*)> mutate;  // may change max_kv_len
  std::vector<std::string> needles;
};

TEST(CpuBatchedLatentAttentionTest, RejectsBadMetadataWithoutWriting) {
  const std::vector<BadCase> cases = {
      {"first start", [](Batch& x, int64_t*) { x.starts[0] = 1; }, {"q_start[0] must be 0"}},
      {"decreasing", [](Batch& x, int64_t*) { x.starts[1] = 3; x.starts[2] = 2; }, {"sequence 1", "q_start[2] = 2"}},
      {"last start", [](Batch& x, int64_t*) { x.starts[3] = x.starts[2]; }, {"q_start[B = 3] = 4", "must be T = 6"}},
      {"short kv", [](Batch& x, int64_t*) { x.lens[1] = 2; }, {"sequence 1", "kv_len[1] = 2"}},
      {"over bound", [](Batch&, int64_t* max) { *max = 10; }, {"sequence 1", "max_kv_len = 10"}},
      {"over pages", [](Batch& x, int64_t* max) { x.lens[2] = static_cast<int32_t>(x.max_pages * x.page_size + 1); *max = 1000; },
       {"sequence 2", "P * page_size"}},
      {"page entry", [](Batch& x, int64_t*) { x.tables[1 * x.max_pages + 2] = static_cast<int32_t>(x.num_pages); },
       {"sequence 1", "page_tables[1][2]"}},
      {"negative page", [](Batch& x, int64_t*) { x.tables[0] = -1; }, {"sequence 0", "page_tables[0][0] = -1"}},
      {"empty row", [](Batch& x, int64_t*) {
         std::fill_n(&x.mask[(x.starts[2] + 1) * x.m], x.m, uint8_t{0});
       }, {"sequence 2", "row 5 of tree_mask", "no cached prefix"}},
  };
  std::mt19937 rng(11);
  CpuBackend backend;
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    Batch x = MakeBatch(rng, {1, 3, 2}, {6, 11, 2}, true);
    int64_t max_kv = 16;
    c.mutate(x, &max_kv);
    const std::vector<float> before = x.out;
    const absl::Status st = backend.BatchedLatentAttention(x.Q(), x.Cache(), x.Tables(), x.Starts(), x.Lens(), max_kv,
                                                           x.Mask(), kScale, kValue, x.Out());
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    for (const std::string& needle : c.needles) EXPECT_THAT(std::string(st.message()), HasSubstr(needle));
    EXPECT_EQ(std::memcmp(before.data(), x.out.data(), before.size() * sizeof(float)), 0);
  }
}

TEST(CpuBatchedLatentAttentionTest, RejectsBadShapes) {
  std::mt19937 rng(5);
  CpuBackend backend;
  Batch x = MakeBatch(rng, {2, 3}, {5, 6}, true);
  const TensorView short_starts(x.starts.data(), DType::kI32, Shape{2}, Device::Cpu());
  absl::Status st = backend.BatchedLatentAttention(x.Q(), x.Cache(), x.Tables(), short_starts, x.Lens(), 8,
                                                   x.Mask(), kScale, kValue, x.Out());
  EXPECT_THAT(std::string(st.message()), HasSubstr("q_start"));
  std::vector<int64_t> wide(x.lens.begin(), x.lens.end());
  st = backend.BatchedLatentAttention(x.Q(), x.Cache(), x.Tables(), x.Starts(),
                                      TensorView(wide.data(), DType::kI64, Shape{2}, Device::Cpu()), 8, x.Mask(),
                                      kScale, kValue, x.Out());
  EXPECT_THAT(std::string(st.message()), HasSubstr("kv_len"));
  const TensorView narrow_mask(x.mask.data(), DType::kU8, Shape{x.t() - 1, x.m}, Device::Cpu());
  st = backend.BatchedLatentAttention(x.Q(), x.Cache(), x.Tables(), x.Starts(), x.Lens(), 8, narrow_mask, kScale,
                                      kValue, x.Out());
  EXPECT_THAT(std::string(st.message()), HasSubstr("tree_mask"));
  st = backend.BatchedLatentAttention(x.Q(), x.Cache(), x.Tables(), x.Starts(), x.Lens(), 0, x.Mask(), kScale,
                                      kValue, x.Out());
  EXPECT_THAT(std::string(st.message()), HasSubstr("max_kv_len must be >= 1"));
  x.mask.resize(x.mask.size());
  Batch y = MakeBatch(rng, {5}, {5}, true);
  y.m = 3;  // M smaller than the 5 new tokens
  st = backend.BatchedLatentAttention(y.Q(), y.Cache(), y.Tables(), y.Starts(), y.Lens(), 8,
                                      TensorView(y.mask.data(), DType::kU8, Shape{5, 3}, Device::Cpu()), kScale,
                                      kValue, y.Out());
  EXPECT_THAT(std::string(st.message()), HasSubstr("do not fit tree_mask"));
}

// Key masks over [T, max_kv_len]: each row its own key and a random subset of the others below its
// kv_len, garbage (ones) at and past kv_len, which must never be read.
std::vector<uint8_t> RandomKeyMask(std::mt19937& rng, const Batch& x, int64_t max_kv) {
  std::vector<uint8_t> mask(static_cast<size_t>(x.t() * max_kv), 1);
  std::bernoulli_distribution coin(0.5);
  for (int64_t s = 0; s < x.b(); ++s) {
    for (int64_t i = 0; i < x.n[s]; ++i) {
      uint8_t* row = &mask[(x.starts[s] + i) * max_kv];
      for (int64_t k = 0; k < x.len[s]; ++k) row[k] = coin(rng) ? 1 : 0;
      row[x.len[s] - x.n[s] + i] = 1;
    }
  }
  return mask;
}

TEST(CpuBatchedLatentAttentionTest, KeyMaskEqualsLatentAttentionWithTheSameRows) {
  std::mt19937 rng(17);
  CpuBackend backend;
  Batch x = MakeBatch(rng, {1, 5, 0, 3}, {9, 17, 4, 3}, false);
  const int64_t max_kv = 20;
  const std::vector<uint8_t> mask = RandomKeyMask(rng, x, max_kv);
  const TensorView key_mask(const_cast<uint8_t*>(mask.data()), DType::kU8, Shape{x.t(), max_kv}, Device::Cpu());
  const absl::Status st = backend.BatchedLatentAttentionKeyMask(x.Q(), x.Cache(), x.Tables(), x.Starts(), x.Lens(),
                                                                max_kv, key_mask, kScale, kValue, x.Out());
  ASSERT_TRUE(st.ok()) << st;
  for (int64_t s = 0; s < x.b(); ++s) {
    const int64_t n = x.n[s], len = x.len[s], begin = x.starts[s];
    if (n == 0) continue;
    std::vector<uint8_t> rows(static_cast<size_t>(n * len));
    for (int64_t i = 0; i < n; ++i) std::copy_n(&mask[(begin + i) * max_kv], len, &rows[i * len]);
    std::vector<float> want(static_cast<size_t>(n * kHeads * kValue));
    const TensorView table(x.tables.data() + s * x.max_pages, DType::kI32, Shape{x.max_pages}, Device::Cpu());
    ASSERT_TRUE(backend
                    .LatentAttention(x.Q().Narrow(0, begin, n), x.Cache(), table, len,
                                     TensorView(rows.data(), DType::kU8, Shape{n, len}, Device::Cpu()), kScale, kValue,
                                     TensorView(want.data(), DType::kF32, Shape{n, kHeads, kValue}, Device::Cpu()))
                    .ok());
    for (size_t e = 0; e < want.size(); ++e) {
      ASSERT_EQ(x.out[begin * kHeads * kValue + e], want[e]) << "sequence " << s << " element " << e;
    }
  }
}

TEST(CpuBatchedLatentAttentionTest, KeyMaskRefusesBadMasksWithoutWriting) {
  std::mt19937 rng(19);
  CpuBackend backend;
  Batch x = MakeBatch(rng, {2, 3}, {5, 6}, false);
  const int64_t max_kv = 8;
  std::vector<uint8_t> mask = RandomKeyMask(rng, x, max_kv);
  const std::vector<float> before = x.out;
  // A row that allows keys only at and past its kv_len: none of its sequence's.
  std::vector<uint8_t> blind = mask;
  std::fill_n(&blind[3 * max_kv], x.len[1], uint8_t{0});
  absl::Status st = backend.BatchedLatentAttentionKeyMask(
      x.Q(), x.Cache(), x.Tables(), x.Starts(), x.Lens(), max_kv,
      TensorView(blind.data(), DType::kU8, Shape{x.t(), max_kv}, Device::Cpu()), kScale, kValue, x.Out());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("sequence 1: row 3 of key_mask"));
  EXPECT_EQ(std::memcmp(before.data(), x.out.data(), before.size() * sizeof(float)), 0);
  // Columns other than max_kv_len.
  st = backend.BatchedLatentAttentionKeyMask(x.Q(), x.Cache(), x.Tables(), x.Starts(), x.Lens(), max_kv - 1,
                                             TensorView(mask.data(), DType::kU8, Shape{x.t(), max_kv}, Device::Cpu()),
                                             kScale, kValue, x.Out());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("key_mask"));
  // An f32 mask.
  std::vector<float> floats(mask.size(), 1.0f);
  st = backend.BatchedLatentAttentionKeyMask(x.Q(), x.Cache(), x.Tables(), x.Starts(), x.Lens(), max_kv,
                                             TensorView(floats.data(), DType::kF32, Shape{x.t(), max_kv}, Device::Cpu()),
                                             kScale, kValue, x.Out());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  // No mask at all: the key form needs one.
  st = backend.BatchedLatentAttentionKeyMask(x.Q(), x.Cache(), x.Tables(), x.Starts(), x.Lens(), max_kv, TensorView(),
                                             kScale, kValue, x.Out());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("key_mask"));
  EXPECT_EQ(std::memcmp(before.data(), x.out.data(), before.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace eagle3::cpu
