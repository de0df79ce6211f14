// CudaBackend::BatchedPagedAttention ≡ the CPU reference (1e-5), on both of its kernels (shared
// memory and the split register kernel: CudaBackendOptions::paged_attention_registers; splits
// whose keys are all masked, captured before any eager call), over GQA groups (the draft's
// 4 x 128 and the SpecForge V3 head's 7 x 128 included, 16 heads per kv head, head_dim up to 260),
// page sizes 1 and 16, shuffled pages, random masks or none (causal), 1..8 query rows per sequence
// and contexts long enough for every warp of a block to take several key chunks; bad metadata is
// reported by Synchronize, naming the sequence or row; empty operands (no query heads, no pages)
// behave as on the CPU; the op records into a CUDA graph and a replay reads the device metadata as
// it is then.
#include <cmath>
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

// Parameter: PagedAttentionParams::register_kernel (CudaBackendOptions::paged_attention_registers):
// every test runs on the shared-memory kernel and on the register kernel.
class CudaPagedAttentionTest : public parity::ParityTest, public ::testing::WithParamInterface<bool> {
 protected:
  cuda::CudaBackendOptions Options() const override {
    cuda::CudaBackendOptions o;
    o.paged_attention_registers = GetParam();
    return o;
  }

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
  // causal: an empty mask instead of d.mask.
  absl::Status Run(Device& d, int64_t max_kv_len, bool causal = false) {
    const TensorView mask = causal ? TensorView() : d.mask.view();
    return gpu_->BatchedPagedAttention(d.q, d.cache, d.tables, d.starts, d.lens, max_kv_len, mask, kScale, d.out);
  }
  std::vector<float> Out(const Device& d) {
    Tensor h = Download(d.out);
    return std::vector<float>(h.data_as<float>(), h.data_as<float>() + h.numel());
  }
};

TEST_P(CudaPagedAttentionTest, EqualsCpuReference) {
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
      {7, 1, 128, 16, {1, 2}, {1024, 300}},           // the SpecForge V3 head: 56 q / 8 kv heads (7 per kv head)
      {32, 2, 64, 16, {1, 3}, {200, 77}},             // 16 q heads per kv head: two passes of the register kernel
      {4, 1, 256, 16, {1, 1}, {130, 64}},             // the register kernel's largest head_dim
      {2, 1, 260, 16, {1}, {70}},                     // beyond it: the shared-memory kernel runs
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

// The causal mode (an empty mask: no mask reads, each row's keys end at its own position) against
// the CPU's, over mixed rows per sequence (n_b == kv_len included), contexts long enough for many
// splits, and the CPU's explicit causal mask through the test's reference.
TEST_P(CudaPagedAttentionTest, CausalEqualsCpuReference) {
  std::mt19937 rng(29);
  struct Case {
    int64_t nq, nkv, dim, page_size;
    std::vector<int64_t> n, len;
  };
  const std::vector<Case> cases = {
      {4, 1, 128, 16, {1}, {1}},
      {4, 1, 128, 16, {8, 1, 3}, {8, 700, 257}},  // a sequence of only new tokens; decode; a tree step
      {4, 1, 128, 1, {8, 0, 3}, {400, 0, 20}},    // page_size 1, a skipped sequence
      {8, 2, 64, 16, {2, 7, 4}, {2, 90, 31}},
      {6, 3, 6, 1, {3, 2}, {9, 40}},              // scalar loads
      {7, 1, 128, 16, {5, 2}, {1024, 300}},       // the SpecForge V3 head: rows ending in different splits
      {2, 1, 260, 16, {3}, {70}},                 // the shared-memory kernel only
  };
  for (const Case& c : cases) {
    PagedBatch x = MakePagedBatch(rng, c.nq, c.nkv, c.dim, c.page_size, c.n, c.len);
    ASSERT_TRUE(cpu_.BatchedPagedAttention(x.Q(), x.Cache(), x.Tables(), x.Starts(), x.Lens(), x.max_kv_len,
                                           TensorView(), kScale, x.Out())
                    .ok());
    x.SetCausalMask();
    ExpectAllNear(x.out, x.Reference(kScale));
    Device d = Up(x);
    ASSERT_TRUE(Run(d, x.max_kv_len, /*causal=*/true).ok());
    ASSERT_TRUE(gpu_->Synchronize().ok());
    ExpectAllNear(Out(d), x.out);
  }
}

TEST_P(CudaPagedAttentionTest, CausalRowsBeyondKvLenAreReportedBySynchronize) {
  std::mt19937 rng(3);
  PagedBatch x = MakePagedBatch(rng, 4, 2, 8, 4, {2, 3, 2}, {6, 10, 20});
  x.lens[1] = 2;  // 3 rows over 2 keys
  Device d = Up(x);
  ASSERT_TRUE(Run(d, x.max_kv_len, /*causal=*/true).ok()) << "the op itself returns OK; the error is deferred";
  const absl::Status st = gpu_->Synchronize();
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("sequence 1"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("causal"));
  EXPECT_TRUE(gpu_->Synchronize().ok()) << "the flag is cleared once reported";
  // The rows of the good sequences are written, those of the bad one are not.
  x.SetCausalMask();  // over x.len, still the good lengths
  const std::vector<float> want = x.Reference(kScale), got = Out(d);
  const int64_t row = x.nq * x.dim;
  for (int64_t i = 0; i < x.total * row; ++i) {
    const bool bad = i >= x.starts[1] * row && i < x.starts[2] * row;
    if (bad) {
      ASSERT_TRUE(std::isnan(got[i])) << "element " << i;
    } else {
      ASSERT_NEAR(got[i], want[i], 1e-5) << "element " << i;
    }
  }
}

TEST_P(CudaPagedAttentionTest, BadMetadataIsReportedBySynchronize) {
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

// Empty operands as the CPU reference takes them: q and out with no heads ([T, 0, D]; given the
// strides of [T, 1, D], as contiguous ones would map every row to one address) are accepted and
// still have their mask rows checked; a cache of no pages makes every page entry bad.
TEST_P(CudaPagedAttentionTest, NoQueryHeadsOrNoPagesAgreeWithTheCpuReference) {
  std::mt19937 rng(13);
  PagedBatch x = MakePagedBatch(rng, 2, 2, 8, 4, {2, 1}, {5, 9});
  Device d = Up(x);
  auto headless = [&](const TensorView& t) {
    return TensorView(t.data(), DType::kF32, Shape{x.total, 0, x.dim}, Shape{x.dim, x.dim, 1}, t.device());
  };
  auto cpu_run = [&](const TensorView& q, const TensorView& cache, const TensorView& out) {
    return cpu_.BatchedPagedAttention(q, cache, x.Tables(), x.Starts(), x.Lens(), x.max_kv_len, x.Mask(), kScale,
                                      out);
  };
  auto gpu_run = [&](const TensorView& q, const TensorView& cache, const TensorView& out) {
    return gpu_->BatchedPagedAttention(q, cache, d.tables, d.starts, d.lens, x.max_kv_len, d.mask, kScale, out);
  };
  ASSERT_TRUE(cpu_run(headless(x.Q()), x.Cache(), headless(x.Out())).ok());
  ASSERT_TRUE(gpu_run(headless(d.q), d.cache, headless(d.out)).ok());
  EXPECT_TRUE(gpu_->Synchronize().ok());

  const TensorView no_pages(nullptr, DType::kF32, Shape{0, x.page_size, x.row()}, d.cache.device());
  const TensorView host_no_pages(nullptr, DType::kF32, Shape{0, x.page_size, x.row()}, ::eagle3::Device::Cpu());
  EXPECT_EQ(cpu_run(x.Q(), host_no_pages, x.Out()).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(gpu_run(d.q, no_pages, d.out).ok()) << "the op itself returns OK; the error is deferred";
  absl::Status st = gpu_->Synchronize();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("sequence 0"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("page entry"));

  for (int64_t j = 0; j < x.len[0]; ++j) x.mask[1 * x.max_kv_len + j] = 0;  // row 1 allows no key
  ASSERT_TRUE(gpu_->Copy(x.Mask(), d.mask).ok());
  EXPECT_EQ(cpu_run(headless(x.Q()), x.Cache(), headless(x.Out())).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(gpu_run(headless(d.q), d.cache, headless(d.out)).ok());
  st = gpu_->Synchronize();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("row 1"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("allows no key"));

  // Sequences without rows and page tables without columns (no data): nothing to do, on both.
  std::vector<int32_t> starts = {0, 0, 0}, lens = {0, 3};
  const TensorView host_starts(starts.data(), DType::kI32, Shape{3}), host_lens(lens.data(), DType::kI32, Shape{2});
  Tensor d_starts = *Tensor::Empty(DType::kI32, Shape{3}, gpu_->allocator());
  Tensor d_lens = *Tensor::Empty(DType::kI32, Shape{2}, gpu_->allocator());
  ASSERT_TRUE(gpu_->Copy(host_starts, d_starts).ok());
  ASSERT_TRUE(gpu_->Copy(host_lens, d_lens).ok());
  auto none = [](DType dtype, const Shape& shape, ::eagle3::Device where) {
    return TensorView(nullptr, dtype, shape, where);
  };
  for (const ::eagle3::Device where : {::eagle3::Device::Cpu(), d.q.device()}) {
    Backend& backend = where.is_cpu() ? static_cast<Backend&>(cpu_) : *gpu_;
    const bool on_cpu = where.is_cpu();
    st = backend.BatchedPagedAttention(
        none(DType::kF32, Shape{0, 2, 8}, where), on_cpu ? x.Cache() : d.cache, none(DType::kI32, Shape{2, 0}, where),
        on_cpu ? host_starts : d_starts.view(), on_cpu ? host_lens : d_lens.view(), 4,
        none(DType::kU8, Shape{0, 4}, where), kScale, none(DType::kF32, Shape{0, 2, 8}, where));
    EXPECT_TRUE(st.ok()) << where.ToString() << ": " << st;
    EXPECT_TRUE(backend.Synchronize().ok()) << where.ToString();
  }
}

TEST_P(CudaPagedAttentionTest, TooManyQueryHeadsPerKvHeadIsRefused) {
  std::mt19937 rng(1);
  PagedBatch x = MakePagedBatch(rng, 16, 1, 128, 16, {1}, {4});  // 16 x 128 floats per warp: beyond 48 KiB
  Device d = Up(x);
  const absl::Status st = Run(d, x.max_kv_len);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("shared memory"));
}

TEST_P(CudaPagedAttentionTest, GraphReplayReadsTheMetadataOfTheReplay) {
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

// A causal launch in a graph: the replay reads the lengths (and so each row's causal end) as they
// are then.
TEST_P(CudaPagedAttentionTest, CausalGraphReplayReadsTheLengthsOfTheReplay) {
  std::mt19937 rng(31);
  PagedBatch x = MakePagedBatch(rng, 4, 1, 128, 16, {1, 3}, {40, 900});
  Device d = Up(x);
  ASSERT_TRUE(Run(d, x.max_kv_len, /*causal=*/true).ok());  // eager first: the split kernel's partials
  ASSERT_TRUE(gpu_->Synchronize().ok());
  auto graph = cuda::CudaGraph::Capture(gpu_->stream(), [&] { return Run(d, x.max_kv_len, /*causal=*/true); });
  ASSERT_TRUE(graph.ok()) << graph.status();
  x.len = {17, 3};
  x.lens = {17, 3};
  ASSERT_TRUE(gpu_->Copy(x.Lens(), d.lens).ok());
  ASSERT_TRUE((*graph)->Launch(gpu_->stream()).ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  x.SetCausalMask();
  ExpectAllNear(Out(d), x.Reference(kScale));
}

// The register kernel spreads a row's keys over several blocks (splits of whole 32-key chunks) and
// merges their partial results: splits whose keys are all masked (a partial of max -inf) must drop
// out of the merge, a row allowing no key in any split must be reported, and sequences of very
// different lengths share one split count (each spreads its own keys).
TEST_P(CudaPagedAttentionTest, SparseMasksOverManySplitsAgreeWithTheReference) {
  std::mt19937 rng(21);
  // The SpecForge V3 head's TP 8 rank (7 q heads on 1 kv head) at one token and a 3-row tree step.
  PagedBatch x = MakePagedBatch(rng, 7, 1, 128, 16, {1, 3, 1}, {1024, 1000, 5});
  std::fill(x.mask.begin(), x.mask.end(), 0);
  auto allow = [&](int64_t t, int64_t j) { x.mask[t * x.max_kv_len + j] = 1; };
  allow(0, 5);  // two keys, 995 apart: every split between them holds none
  allow(0, 1000);
  allow(1, 999);  // one key, in the last split
  for (int64_t j = 0; j < 1000; j += 97) allow(2, j);
  allow(3, 0);  // one key, in the first split
  allow(4, 4);
  Device d = Up(x);
  ASSERT_TRUE(Run(d, x.max_kv_len).ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  ExpectAllNear(Out(d), x.Reference(kScale));

  for (int64_t j = 0; j < 1000; ++j) x.mask[2 * x.max_kv_len + j] = 0;  // row 2 allows no key
  ASSERT_TRUE(gpu_->Copy(x.Mask(), d.mask).ok());
  ASSERT_TRUE(Run(d, x.max_kv_len).ok());
  const absl::Status st = gpu_->Synchronize();
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("row 2"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("allows no key"));
}

// A call captured into a graph before any eager call (the register kernel's partials are not yet
// allocated, and are not allocated during a capture) runs unsplit; both graphs and the eager call
// agree with the reference.
TEST_P(CudaPagedAttentionTest, CapturedBeforeAnyEagerCallAgreesWithTheReference) {
  std::mt19937 rng(8);
  PagedBatch x = MakePagedBatch(rng, 7, 1, 128, 16, {1, 2}, {900, 300});
  Device d = Up(x);
  const std::vector<float> want = x.Reference(kScale);
  auto first = cuda::CudaGraph::Capture(gpu_->stream(), [&] { return Run(d, x.max_kv_len); });
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*first)->Launch(gpu_->stream()).ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  ExpectAllNear(Out(d), want);
  ASSERT_TRUE(gpu_->Copy(x.Out(), d.out).ok());  // cleared between runs
  ASSERT_TRUE(Run(d, x.max_kv_len).ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  ExpectAllNear(Out(d), want);
  auto second = cuda::CudaGraph::Capture(gpu_->stream(), [&] { return Run(d, x.max_kv_len); });
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(gpu_->Copy(x.Out(), d.out).ok());
  ASSERT_TRUE((*second)->Launch(gpu_->stream()).ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  ExpectAllNear(Out(d), want);
}

INSTANTIATE_TEST_SUITE_P(Kernels, CudaPagedAttentionTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Registers" : "Shared");
                         });

}  // namespace
}  // namespace eagle3
