// CpuBackend::BatchedPagedAttention: equal to a plain per-sequence reference (GQA groups, page sizes
// 1 and 16, shuffled pages, arbitrary masks, 1..8 query rows per sequence), an empty mask equal to
// the explicit causal one, and every bad input refused by name before anything is written.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "batched_paged_attention_util.h"
#include "eagle3/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3::cpu {
namespace {

using ::eagle3::testing::ExpectAllNear;
using ::eagle3::testing::MakePagedBatch;
using ::eagle3::testing::PagedBatch;
using ::testing::HasSubstr;

constexpr float kScale = 0.35f;

absl::Status RunOp(CpuBackend& backend, PagedBatch& x) {
  return backend.BatchedPagedAttention(x.Q(), x.Cache(), x.Tables(), x.Starts(), x.Lens(), x.max_kv_len, x.Mask(),
                                       kScale, x.Out());
}

TEST(CpuBatchedPagedAttentionTest, EqualsPerSequenceReference) {
  std::mt19937 rng(7);
  struct Case {
    int64_t nq, nkv, dim, page_size;
    std::vector<int64_t> n, len;
  };
  const std::vector<Case> cases = {
      {4, 2, 8, 16, {1}, {1}},
      {4, 4, 8, 1, {3, 1}, {5, 40}},
      {8, 2, 16, 16, {8, 2, 1, 5}, {8, 33, 17, 70}},
      {6, 1, 4, 1, {2, 7, 4}, {2, 9, 31}},
      {2, 2, 12, 16, {1, 1, 1, 1, 1}, {16, 1, 32, 15, 3}},
      {4, 2, 8, 16, {3, 0, 2}, {20, 0, 5}},  // a sequence with no query rows is skipped
  };
  for (const Case& c : cases) {
    for (const double density : {1.0, 0.5, 0.1}) {
      PagedBatch x = MakePagedBatch(rng, c.nq, c.nkv, c.dim, c.page_size, c.n, c.len, density);
      CpuBackend backend;
      ASSERT_TRUE(RunOp(backend, x).ok());
      ExpectAllNear(x.out, x.Reference(kScale));
    }
  }
}

// An empty mask is causal: the same results, bit for bit, as the explicit causal mask, over mixed
// query rows per sequence (n_b == kv_len included) and a skipped sequence.
TEST(CpuBatchedPagedAttentionTest, EmptyMaskEqualsTheExplicitCausalMask) {
  std::mt19937 rng(17);
  struct Case {
    int64_t nq, nkv, dim, page_size;
    std::vector<int64_t> n, len;
  };
  const std::vector<Case> cases = {
      {4, 2, 8, 16, {1}, {1}},
      {4, 4, 8, 1, {3, 1}, {3, 40}},
      {8, 2, 16, 16, {8, 2, 1, 5}, {8, 33, 17, 70}},
      {6, 1, 4, 1, {2, 7, 0, 4}, {2, 9, 0, 31}},
  };
  for (const Case& c : cases) {
    PagedBatch x = MakePagedBatch(rng, c.nq, c.nkv, c.dim, c.page_size, c.n, c.len);
    x.SetCausalMask();
    CpuBackend backend;
    ASSERT_TRUE(RunOp(backend, x).ok());
    ExpectAllNear(x.out, x.Reference(kScale));
    const std::vector<float> masked = x.out;
    const TensorView no_elements(x.mask.data(), DType::kU8, Shape{x.total, 0}, Device::Cpu());
    for (const TensorView& causal : {TensorView(), no_elements}) {
      std::fill(x.out.begin(), x.out.end(), NAN);
      ASSERT_TRUE(backend
                      .BatchedPagedAttention(x.Q(), x.Cache(), x.Tables(), x.Starts(), x.Lens(), x.max_kv_len,
                                             causal, kScale, x.Out())
                      .ok());
      EXPECT_EQ(x.out, masked);
    }
  }
}

// Causal rows end at their own key kv_len[b] - n_b + i: more rows than keys is refused by name.
TEST(CpuBatchedPagedAttentionTest, CausalRowsBeyondKvLenAreRefusedWithoutWriting) {
  std::mt19937 rng(19);
  PagedBatch x = MakePagedBatch(rng, 4, 2, 8, 4, {2, 3, 2}, {6, 10, 20});
  x.lens[1] = 2;  // 3 rows over 2 keys
  CpuBackend backend;
  const absl::Status st = backend.BatchedPagedAttention(x.Q(), x.Cache(), x.Tables(), x.Starts(), x.Lens(),
                                                        x.max_kv_len, TensorView(), kScale, x.Out());
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("sequence 1"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("kv_len[1] = 2"));
  for (float v : x.out) ASSERT_TRUE(std::isnan(v)) << "written despite " << st;
}

TEST(CpuBatchedPagedAttentionTest, StridedQueriesAndOutputs) {
  std::mt19937 rng(11);
  PagedBatch x = MakePagedBatch(rng, 4, 2, 8, 16, {2, 3}, {9, 21});
  // q and out as head-major views into wider buffers: [T, Nq, D] with strides {D, T * D + 8, 1}.
  const int64_t t = x.total, hs = t * x.dim + 8;
  std::vector<float> q_wide(static_cast<size_t>(x.nq * hs), 0.0f), out_wide(q_wide.size(), -7.0f);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t h = 0; h < x.nq; ++h) {
      for (int64_t d = 0; d < x.dim; ++d) q_wide[h * hs + i * x.dim + d] = x.q[(i * x.nq + h) * x.dim + d];
    }
  }
  const Shape shape{t, x.nq, x.dim}, strides{x.dim, hs, 1};
  const TensorView q(q_wide.data(), DType::kF32, shape, strides, Device::Cpu());
  const TensorView out(out_wide.data(), DType::kF32, shape, strides, Device::Cpu());
  CpuBackend backend;
  ASSERT_TRUE(backend
                  .BatchedPagedAttention(q, x.Cache(), x.Tables(), x.Starts(), x.Lens(), x.max_kv_len, x.Mask(),
                                         kScale, out)
                  .ok());
  const std::vector<float> ref = x.Reference(kScale);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t h = 0; h < x.nq; ++h) {
      for (int64_t d = 0; d < x.dim; ++d) {
        ASSERT_NEAR(out_wide[h * hs + i * x.dim + d], ref[(i * x.nq + h) * x.dim + d], 1e-5);
      }
    }
  }
  EXPECT_EQ(out_wide[t * x.dim], -7.0f);  // the gap between heads is untouched
}

TEST(CpuBatchedPagedAttentionTest, RejectsBadMetadataWithoutWriting) {
  struct Case {
    std::function<void(PagedBatch&)> edit;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {[](PagedBatch& x) { x.starts[0] = 1; }, {"q_start[0] must be 0"}},
      {[](PagedBatch& x) { x.starts[2] = x.starts[1] - 1; }, {"sequence 1", "q_start[2]"}},
      {[](PagedBatch& x) { x.starts[3] = x.total - 1; }, {"q_start[B = 3]", "must be T"}},
      {[](PagedBatch& x) { x.lens[1] = static_cast<int32_t>(x.max_kv_len + 1); }, {"sequence 1", "kv_len[1]"}},
      {[](PagedBatch& x) { x.lens[0] = -1; }, {"sequence 0", "kv_len[0] = -1"}},
      {[](PagedBatch& x) { x.tables[2 * x.max_pages + 1] = static_cast<int32_t>(x.num_pages); },
       {"sequence 2", "page_tables[2][1]"}},
      {[](PagedBatch& x) { x.tables[0] = -1; }, {"sequence 0", "page_tables[0][0] = -1"}},
      {[](PagedBatch& x) {
         for (int64_t j = 0; j < x.len[1]; ++j) x.mask[(x.starts[1] + 1) * x.max_kv_len + j] = 0;
       },
       {"sequence 1", "row 3", "allows no key"}},
  };
  for (const Case& c : cases) {
    std::mt19937 rng(3);
    PagedBatch x = MakePagedBatch(rng, 4, 2, 8, 4, {2, 3, 2}, {6, 10, 20});
    c.edit(x);
    CpuBackend backend;
    const absl::Status st = RunOp(backend, x);
    ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.needles[0];
    for (const std::string& needle : c.needles) EXPECT_THAT(std::string(st.message()), HasSubstr(needle));
    for (float v : x.out) ASSERT_TRUE(std::isnan(v)) << "written despite " << st;
  }
}

TEST(CpuBatchedPagedAttentionTest, KvLenBeyondThePageTableIsRefused) {
  std::mt19937 rng(5);
  PagedBatch x = MakePagedBatch(rng, 2, 1, 4, 4, {1}, {7});
  x.max_kv_len = 64;
  x.mask.assign(static_cast<size_t>(x.total * x.max_kv_len), 1);
  x.lens[0] = static_cast<int32_t>(x.max_pages * x.page_size + 1);
  CpuBackend backend;
  const absl::Status st = RunOp(backend, x);
  EXPECT_THAT(std::string(st.message()), HasSubstr("P * page_size"));
}

TEST(CpuBatchedPagedAttentionTest, RejectsBadShapes) {
  std::mt19937 rng(9);
  PagedBatch x = MakePagedBatch(rng, 4, 2, 8, 4, {2, 1}, {5, 3});
  CpuBackend backend;
  auto call = [&](const TensorView& q, const TensorView& cache, const TensorView& tables, const TensorView& starts,
                  const TensorView& lens, int64_t max_kv_len, const TensorView& mask, float scale,
                  const TensorView& out) {
    return std::string(
        backend.BatchedPagedAttention(q, cache, tables, starts, lens, max_kv_len, mask, scale, out).message());
  };
  const TensorView q = x.Q(), cache = x.Cache(), tables = x.Tables(), starts = x.Starts(), lens = x.Lens();
  const TensorView mask = x.Mask(), out = x.Out();
  const int64_t m = x.max_kv_len;
  // Cache rows not 2 * Nkv * D wide.
  const TensorView narrow(x.cache.data(), DType::kF32, Shape{x.num_pages, x.page_size, 2 * 2 * 8 - 4}, Device::Cpu());
  EXPECT_THAT(call(q, narrow, tables, starts, lens, m, mask, kScale, out), HasSubstr("2 * Nkv * D"));
  // Nq = 4 not a multiple of Nkv = 3 (cache rows 48 wide).
  std::vector<float> wide(static_cast<size_t>(x.num_pages * x.page_size * 48));
  const TensorView cache3(wide.data(), DType::kF32, Shape{x.num_pages, x.page_size, 48}, Device::Cpu());
  EXPECT_THAT(call(q, cache3, tables, starts, lens, m, mask, kScale, out), HasSubstr("not a multiple of the Nkv = 3"));
  EXPECT_THAT(call(q, cache, tables, starts.Narrow(0, 0, 2), lens, m, mask, kScale, out),
              HasSubstr("q_start"));
  EXPECT_THAT(call(q, cache, tables, starts, lens.Narrow(0, 0, 1), m, mask, kScale, out), HasSubstr("kv_len"));
  EXPECT_THAT(call(q, cache, tables, starts, lens, 0, mask, kScale, out), HasSubstr("max_kv_len must be >= 1"));
  EXPECT_THAT(call(q, cache, tables, starts, lens, m + 1, mask, kScale, out), HasSubstr("mask"));
  EXPECT_THAT(call(q, cache, tables, starts, lens, m, mask, kScale, out.Narrow(2, 0, 4)), HasSubstr("out"));
  EXPECT_THAT(call(q, cache, tables, starts, lens, m, mask, NAN, out), HasSubstr("scale must be finite"));
  EXPECT_THAT(call(q, cache, tables, starts, lens, m, mask, kScale, q), HasSubstr("overlaps q"));
  std::vector<int64_t> wide_starts(3, 0);
  const TensorView i64_starts(wide_starts.data(), DType::kI64, Shape{3}, Device::Cpu());
  EXPECT_THAT(call(q, cache, tables, i64_starts, lens, m, mask, kScale, out), HasSubstr("q_start"));
  std::vector<float> float_mask(x.mask.size());
  const TensorView f32_mask(float_mask.data(), DType::kF32, Shape{x.total, m}, Device::Cpu());
  EXPECT_THAT(call(q, cache, tables, starts, lens, m, f32_mask, kScale, out), HasSubstr("u8 or bool"));
}

}  // namespace
}  // namespace eagle3::cpu
