// CudaBackend::BatchedPagedAttention ≡ the CPU reference (1e-5) over GQA groups (the draft's 4 x 128
// included), page sizes 1 and 16, shuffled pages, random masks, 1..8 query rows per sequence and
// contexts long enough for every warp of a block to take several key chunks; bad metadata is
// reported by Synchronize, naming the sequence or row; the op records into a CUDA graph and a replay
// reads the device metadata as it is then.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "batched_paged_attention_util.h"
#include "eagle3/cuda/cuda_graph.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parity_util.h"

namespace eagle3 {
namespace {

using ::eagle3::testing::ExpectAllNear;
using ::eagle3::testing::MakePagedBatch;
using ::eagle3::testing::PagedBatch;
using ::testing::HasSubstr;

constexpr float kScale = 0.125f;

class CudaPagedAttentionTest : public parity::ParityTest {
 protected:
  // Device copies of a batch's inputs and output.
  struct Device {
    Tensor q, cache, tables, starts, lens, mask, out;
  };
  Device Up(PagedBatch& x) {
    auto up = [&](const TensorView& host) {
      Tensor d = *Tensor::Empty(host.dtype(), host.shape(), gpu_->allocator());
      EXPECT_TRUE(gpu_->Copy(host, d).ok());
      return d;
    };
    return {up(x.Q()), up(x.Cache()), up(x.Tables()), up(x.Starts()), up(x.Lens()), up(x.Mask()), up(x.Out())};
  }
  absl::Status Run(Device& d, int64_t max_kv_len) {
    return gpu_->BatchedPagedAttention(d.q, d.cache, d.tables, d.starts, d.lens, max_kv_len, d.mask, kScale, d.out);
  }
  std::vector<float> Out(const Device& d) {
    Tensor h = Download(d.out);
    return std::vector<float>(h.data_as<float>(), h.data_as<float>() + h.numel());
  }
};

TEST_F(CudaPagedAttentionTest, EqualsCpuReference) {
  std::mt19937 rng(7);
  struct Case {
    int64_t nq, nkv, dim, page_size;
    std::vector<int64_t> n, len;
  };
  const std::vector<Case> cases = {
      {4, 1, 128, 16, {1}, {1}},                        // the DeepSeek-V3 draft's TP8 rank: 4 q heads, 1 kv head
      {4, 1, 128, 16, {1, 1, 1, 1}, {700, 33, 256, 257}},  // decode over long contexts
      {4, 1, 128, 1, {8, 3}, {400, 20}},               // tree steps, page_size 1
      {8, 2, 64, 16, {2, 7, 4}, {2, 90, 31}},
      {16, 2, 64, 16, {5, 1}, {60, 600}},              // groups of 8
      {6, 3, 6, 1, {3, 0, 2}, {9, 0, 40}},             // head_dim % 4 != 0 (scalar loads), an empty sequence
      {2, 2, 36, 16, {1, 1, 1, 1, 1}, {16, 1, 32, 15, 300}},
  };
  for (const Case& c : cases) {
    for (const double density : {1.0, 0.3}) {
      PagedBatch x = MakePagedBatch(rng, c.nq, c.nkv, c.dim, c.page_size, c.n, c.len, density);
      ASSERT_TRUE(cpu_.BatchedPagedAttention(x.Q(), x.Cache(), x.Tables(), x.Starts(), x.Lens(), x.max_kv_len,
                                             x.Mask(), kScale, x.Out())
                      .ok());
      ExpectAllNear(x.out, x.Reference(kScale));  // the CPU reference itself, against the test's
      Device d = Up(x);
      ASSERT_TRUE(Run(d, x.max_kv_len).ok());
      ASSERT_TRUE(gpu_->Synchronize().ok());
      ExpectAllNear(Out(d), x.out);
    }
  }
}

TEST_F(CudaPagedAttentionTest, BadMetadataIsReportedBySynchronize) {
  struct Case {
    void (*edit)(PagedBatch&);
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {[](PagedBatch& x) { x.starts[0] = 1; }, {"q_start[0] must be 0"}},
      {[](PagedBatch& x) { x.starts[2] = x.starts[1] - 1; }, {"sequence 1", "q_start[b + 1]"}},
      {[](PagedBatch& x) { x.starts[3] = static_cast<int32_t>(x.total - 1); }, {"q_start[B] must be T"}},
      {[](PagedBatch& x) { x.lens[1] = static_cast<int32_t>(x.max_kv_len + 1); }, {"sequence 1", "kv_len[b]"}},
      {[](PagedBatch& x) { x.tables[2 * x.max_pages + 1] = static_cast<int32_t>(x.num_pages); },
       {"sequence 2", "page entry"}},
      {[](PagedBatch& x) {
         for (int64_t j = 0; j < x.len[1]; ++j) x.mask[(x.starts[1] + 1) * x.max_kv_len + j] = 0;
       },
       {"row 3", "allows no key"}},
  };
  for (const Case& c : cases) {
    std::mt19937 rng(3);
    PagedBatch x = MakePagedBatch(rng, 4, 2, 8, 4, {2, 3, 2}, {6, 10, 20});
    c.edit(x);
    Device d = Up(x);
    ASSERT_TRUE(Run(d, x.max_kv_len).ok()) << "the op itself returns OK; the error is deferred";
    const absl::Status st = gpu_->Synchronize();
    ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.needles[0] << ": " << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("BatchedPagedAttention"));
    for (const std::string& needle : c.needles) EXPECT_THAT(std::string(st.message()), HasSubstr(needle));
    EXPECT_TRUE(gpu_->Synchronize().ok()) << "the flag is cleared once reported";
  }
}

TEST_F(CudaPagedAttentionTest, TooManyQueryHeadsPerKvHeadIsRefused) {
  std::mt19937 rng(1);
  PagedBatch x = MakePagedBatch(rng, 16, 1, 128, 16, {1}, {4});  // 16 x 128 floats per warp: beyond 48 KiB
  Device d = Up(x);
  const absl::Status st = Run(d, x.max_kv_len);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("shared memory"));
}

TEST_F(CudaPagedAttentionTest, GraphReplayReadsTheMetadataOfTheReplay) {
  std::mt19937 rng(5);
  PagedBatch x = MakePagedBatch(rng, 4, 1, 128, 16, {1, 2}, {40, 90});
  Device d = Up(x);
  ASSERT_TRUE(Run(d, x.max_kv_len).ok());  // eager first
  ASSERT_TRUE(gpu_->Synchronize().ok());
  auto graph = cuda::CudaGraph::Capture(gpu_->stream(), [&] { return Run(d, x.max_kv_len); });
  ASSERT_TRUE(graph.ok()) << graph.status();
  // New lengths, masks and queries in the same device buffers, then a replay.
  PagedBatch y = MakePagedBatch(rng, 4, 1, 128, 16, {1, 2}, {40, 90});
  y.lens = {17, 88};
  y.len = {17, 88};
  for (int64_t t = 0; t < y.total; ++t) y.mask[t * y.max_kv_len + (t == 0 ? 16 : 87)] = 1;
  ASSERT_TRUE(gpu_->Copy(y.Q(), d.q).ok());
  ASSERT_TRUE(gpu_->Copy(y.Cache(), d.cache).ok());
  ASSERT_TRUE(gpu_->Copy(y.Tables(), d.tables).ok());
  ASSERT_TRUE(gpu_->Copy(y.Lens(), d.lens).ok());
  ASSERT_TRUE(gpu_->Copy(y.Mask(), d.mask).ok());
  ASSERT_TRUE((*graph)->Launch(gpu_->stream()).ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  ExpectAllNear(Out(d), y.Reference(kScale));
}

}  // namespace
}  // namespace eagle3
