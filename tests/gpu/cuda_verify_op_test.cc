// CudaBackend::TreeVerify, GatherRows and ExtendMaskRows ≡ CpuBackend's: TreeVerify's outputs byte for
// byte (from identical sentinel-filled buffers, so also what neither writes) for greedy and
// stochastic verification, f32 and bf16 logits, and sequences with error records; a TreeVerify
// captured in a CUDA graph draws the coins the seed_offset buffer holds at each replay; the gathers
// on several dtypes and strides, their bad indices reported by Synchronize. Skipped where no CUDA
// device is visible.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "eagle3/cuda/cuda_graph.h"
#include "eagle3/half.h"
#include "eagle3/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parity_util.h"
#include "verify_op_util.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;
using testing::RandomVerifyBatch;
using testing::VerifyBatch;
using testing::VerifyOutputs;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Tensor SeedOffset(uint64_t seed, uint64_t offset) {
  Tensor t = *Tensor::Empty(DType::kI64, Shape{2});
  std::memcpy(t.data_as<int64_t>(), &seed, sizeof seed);
  std::memcpy(t.data_as<int64_t>() + 1, &offset, sizeof offset);
  return t;
}

// A host f32 tensor as bf16 (the values must be bf16-representable to compare with f32).
Tensor ToBf16(const Tensor& f32) {
  Tensor t = *Tensor::Empty(DType::kBF16, f32.shape());
  for (int64_t i = 0; i < f32.numel(); ++i) t.data_as<uint16_t>()[i] = FloatToBf16(f32.data_as<float>()[i]);
  return t;
}

void ExpectSameBytes(const Tensor& got, const Tensor& want, const char* name) {
  ASSERT_EQ(got.nbytes(), want.nbytes()) << name;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.nbytes()), 0) << name << " differs";
}

class CudaVerifyOpTest : public parity::ParityTest {
 protected:
  // TreeVerifyOutputs on the device, every byte the sentinel.
  struct DeviceOutputs {
    std::vector<Tensor> tensors;  // VerifyOutputs::All()'s order
    TreeVerifyOutputs views() const {
      return {tensors[0], tensors[1], tensors[2], tensors[3], tensors[4], tensors[5]};
    }
  };
  DeviceOutputs UploadOutputs(VerifyOutputs& host) {
    DeviceOutputs d;
    for (Tensor* t : host.All()) d.tensors.push_back(Upload(*t));
    return d;
  }
  VerifyOutputs DownloadOutputs(const DeviceOutputs& d, int64_t batch, int64_t nodes) {
    VerifyOutputs host(batch, nodes);
    const std::vector<Tensor*> all = host.All();
    for (size_t i = 0; i < all.size(); ++i) {
      Tensor got = Download(d.tensors[i]);
      std::memcpy(all[i]->data(), got.data(), got.nbytes());
    }
    return host;
  }

  // The op on both backends (logits uploaded as `dtype` for the device); expects every output byte
  // to agree.
  void ExpectBothAgree(const VerifyBatch& batch, const SamplingParams& sampling, uint64_t seed, uint64_t offset,
                       DType dtype = DType::kF32) {
    VerifyOutputs want(batch.batch(), batch.nodes());
    const Tensor seed_offset = SeedOffset(seed, offset);
    ASSERT_TRUE(cpu_.TreeVerify(batch.tokens, batch.parents, batch.logits, sampling, seed_offset, want.views()).ok());
    VerifyOutputs sentinel(batch.batch(), batch.nodes());
    const DeviceOutputs d = UploadOutputs(sentinel);
    const Tensor d_tokens = Upload(batch.tokens), d_parents = Upload(batch.parents);
    const Tensor d_logits = dtype == DType::kF32 ? Upload(batch.logits) : Upload(ToBf16(batch.logits));
    const Tensor d_seed_offset = Upload(seed_offset);
    const absl::Status st = gpu_->TreeVerify(d_tokens, d_parents, d_logits, sampling, d_seed_offset, d.views());
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_TRUE(gpu_->Synchronize().ok());
    const VerifyOutputs got = DownloadOutputs(d, batch.batch(), batch.nodes());
    ExpectSameBytes(got.num_accepted, want.num_accepted, "num_accepted");
    ExpectSameBytes(got.accepted, want.accepted, "accepted");
    ExpectSameBytes(got.out_tokens, want.out_tokens, "out_tokens");
    ExpectSameBytes(got.commit_offsets, want.commit_offsets, "commit_offsets");
    ExpectSameBytes(got.commit_counts, want.commit_counts, "commit_counts");
    ExpectSameBytes(got.errors, want.errors, "errors");
  }
};

TEST_F(CudaVerifyOpTest, GreedyMatchesTheCpuBackend) {
  struct Case {
    int64_t batch, nodes, vocab;
  };
  for (const Case& c : {Case{1, 8, 1000}, Case{4, 16, 129280}, Case{32, 8, 32000}, Case{3, 1, 20}, Case{2, 256, 50}}) {
    SCOPED_TRACE(::testing::Message() << "B " << c.batch << " N " << c.nodes << " V " << c.vocab);
    const VerifyBatch batch = RandomVerifyBatch(c.batch * 7 + c.nodes, c.batch, c.nodes, c.vocab, 2.0f);
    for (DType dtype : {DType::kF32, DType::kBF16}) ExpectBothAgree(batch, SamplingParams{}, 0, 0, dtype);
  }
}

// A coin within ~1e-6 of its threshold could decide differently on the device (verify_ops.h); on
// these few hundred decisions that has a probability of about 1e-3.
TEST_F(CudaVerifyOpTest, StochasticMatchesTheCpuBackend) {
  const uint64_t seed = 0x9E3779B97F4A7C15ull, offset = 0xF00DFACE00000007ull;
  for (const SamplingParams& sampling : {SamplingParams{0.7f, 0, 1.0f}, SamplingParams{1.0f, 20, 1.0f},
                                         SamplingParams{1.0f, 0, 0.9f}, SamplingParams{0.7f, 20, 0.9f}}) {
    SCOPED_TRACE(::testing::Message() << "T " << sampling.temperature << " top_k " << sampling.top_k << " top_p "
                                      << sampling.top_p);
    const VerifyBatch batch = RandomVerifyBatch(31, 16, 12, 1000, 3.0f);
    for (DType dtype : {DType::kF32, DType::kBF16}) ExpectBothAgree(batch, sampling, seed, offset, dtype);
  }
}

TEST_F(CudaVerifyOpTest, ErrorRecordsMatchTheCpuBackend) {
  const int64_t vocab = 40;
  VerifyBatch batch = RandomVerifyBatch(23, 10, 6, vocab, 2.0f);
  batch.Parents(1)[3] = 5;   // bad tree at node 3
  batch.Parents(2)[0] = 0;   // bad tree at node 0
  batch.Parents(3)[4] = -1;  // bad tree at node 4
  batch.Tokens(4)[5] = vocab;
  batch.Tokens(5)[2] = -3;
  batch.Row(6, 3)[9] = kNaN;
  batch.Row(6, 3)[12] = kInf;
  batch.Row(7, 1)[30] = kInf;
  std::fill(batch.Row(8, 4), batch.Row(8, 4) + vocab, -kInf);
  batch.Parents(9)[2] = 7;  // bad tree before the bad token and logits
  batch.Tokens(9)[1] = vocab + 1;
  batch.Row(9, 0)[0] = kNaN;
  for (const SamplingParams& sampling : {SamplingParams{}, SamplingParams{0.8f, 0, 1.0f}}) {
    ExpectBothAgree(batch, sampling, 11, 12);
  }
}

TEST_F(CudaVerifyOpTest, RefusesWhatItCannotRun) {
  const VerifyBatch batch = RandomVerifyBatch(3, 2, 4, 16, 1.0f);
  VerifyOutputs sentinel(2, 4);
  const DeviceOutputs d = UploadOutputs(sentinel);
  const Tensor d_tokens = Upload(batch.tokens), d_parents = Upload(batch.parents);
  const Tensor d_seed_offset = Upload(SeedOffset(1, 2));
  const Tensor f16 = *Tensor::Empty(DType::kF16, Shape{8, 16}, gpu_->allocator());
  absl::Status st = gpu_->TreeVerify(d_tokens, d_parents, f16, SamplingParams{}, d_seed_offset, d.views());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("f32 or bf16"));
  // Host inputs on the device backend.
  st = gpu_->TreeVerify(batch.tokens, d_parents, Upload(batch.logits), SamplingParams{}, d_seed_offset, d.views());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  // More nodes than the kernels hold.
  const VerifyBatch big = RandomVerifyBatch(4, 1, 257, 8, 1.0f);
  VerifyOutputs big_sentinel(1, 257);
  const DeviceOutputs big_d = UploadOutputs(big_sentinel);
  st = gpu_->TreeVerify(Upload(big.tokens), Upload(big.parents), Upload(big.logits), SamplingParams{}, d_seed_offset,
                        big_d.views());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("N <= 256"));
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

// Captured once after an eager call (which sizes the scratch), replayed with new seed_offset contents:
// each replay equals the CPU op with those coins, and the replays differ (so none reused the coins
// of the capture).
TEST_F(CudaVerifyOpTest, CapturedTreeVerifyDrawsTheCoinsOfTheSeedOffsetBuffer) {
  const SamplingParams sampling{1.0f, 0, 1.0f};
  const VerifyBatch batch = RandomVerifyBatch(77, 32, 8, 1000, 1.0f);
  VerifyOutputs sentinel(32, 8);
  const DeviceOutputs d = UploadOutputs(sentinel);
  const Tensor d_tokens = Upload(batch.tokens), d_parents = Upload(batch.parents), d_logits = Upload(batch.logits);
  const Tensor d_seed_offset = Upload(SeedOffset(1, 1));
  const auto enqueue = [&] {
    return gpu_->TreeVerify(d_tokens, d_parents, d_logits, sampling, d_seed_offset, d.views());
  };
  ASSERT_TRUE(enqueue().ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  auto graph = cuda::CudaGraph::Capture(gpu_->stream(), enqueue);
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::vector<std::vector<int64_t>> replayed;
  for (const auto& [seed, offset] : {std::pair<uint64_t, uint64_t>{1, 2}, {1, 3}, {9, 2}}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " offset " << offset);
    const Tensor seed_offset = SeedOffset(seed, offset);
    ASSERT_TRUE(gpu_->Copy(seed_offset, d_seed_offset).ok());
    ASSERT_TRUE((*graph)->Launch(gpu_->stream()).ok());
    ASSERT_TRUE(gpu_->Synchronize().ok());
    const VerifyOutputs got = DownloadOutputs(d, 32, 8);
    VerifyOutputs want(32, 8);
    ASSERT_TRUE(cpu_.TreeVerify(batch.tokens, batch.parents, batch.logits, sampling, seed_offset, want.views()).ok());
    ExpectSameBytes(got.num_accepted, want.num_accepted, "num_accepted");
    ExpectSameBytes(got.commit_counts, want.commit_counts, "commit_counts");
    ExpectSameBytes(got.errors, want.errors, "errors");
    // Entries past a count hold what an earlier replay wrote: compare up to the counts.
    for (int64_t b = 0; b < 32; ++b) {
      const int32_t n = want.num_accepted.data_as<int32_t>()[b];
      for (int32_t i = 0; i <= n; ++i) {
        EXPECT_EQ(got.out_tokens.data_as<int64_t>()[b * 8 + i], want.out_tokens.data_as<int64_t>()[b * 8 + i]);
        EXPECT_EQ(got.commit_offsets.data_as<int32_t>()[b * 8 + i],
                  want.commit_offsets.data_as<int32_t>()[b * 8 + i]);
      }
    }
    replayed.emplace_back(got.out_tokens.data_as<int64_t>(), got.out_tokens.data_as<int64_t>() + 32 * 8);
  }
  EXPECT_NE(replayed[0], replayed[1]);
  EXPECT_NE(replayed[0], replayed[2]);
}

// ---- GatherRows / ExtendMaskRows -----------------------------------------------------------------

TEST_F(CudaVerifyOpTest, GatherRowsMatchesTheCpuBackend) {
  std::mt19937 rng(9);
  struct Case {
    DType dtype;
    int64_t rows, cols, src_ld, out_ld, n;
    int64_t groups = 1;
  };
  // 16-byte rows and strides (the widest unit), an odd byte width, 2-byte elements with an odd
  // stride, i64, a single row, and indices local to 4 groups.
  for (const Case& c : {Case{DType::kF32, 40, 7168, 7168, 7172, 33}, Case{DType::kU8, 9, 13, 17, 13, 20},
                        Case{DType::kBF16, 12, 64, 65, 64, 5}, Case{DType::kI64, 6, 3, 3, 4, 6},
                        Case{DType::kF32, 1, 5, 5, 5, 3}, Case{DType::kF32, 12, 33, 33, 36, 8, 4}}) {
    SCOPED_TRACE(::testing::Message() << DTypeName(c.dtype) << " C " << c.cols << " groups " << c.groups);
    const Tensor src = RandomInts(DType::kU8, Shape{static_cast<int64_t>(c.rows * c.src_ld * DTypeSize(c.dtype))},
                                  rng(), 0, 256);
    const Tensor index = RandomInts(DType::kI32, Shape{c.n}, rng(), 0, c.rows / c.groups);
    const int64_t out_bytes = static_cast<int64_t>(c.n * c.out_ld * DTypeSize(c.dtype));
    Tensor want = RandomInts(DType::kU8, Shape{out_bytes}, 5, 0, 256);
    const Tensor d_src = Upload(src), d_index = Upload(index), d_out = Upload(want);
    const auto view = [&](const Tensor& t, int64_t rows, int64_t ld) {
      return TensorView(t.data(), c.dtype, Shape{rows, c.cols}, Shape{ld, 1}, t.device());
    };
    ASSERT_TRUE(cpu_.GatherRows(view(src, c.rows, c.src_ld), index, view(want, c.n, c.out_ld), c.groups).ok());
    ASSERT_TRUE(
        gpu_->GatherRows(view(d_src, c.rows, c.src_ld), d_index, view(d_out, c.n, c.out_ld), c.groups).ok());
    ASSERT_TRUE(gpu_->Synchronize().ok());
    ExpectSameBytes(Download(d_out), want, "out");
  }
}

TEST_F(CudaVerifyOpTest, GatherRowsReportsTheLowestBadIndexAtSynchronize) {
  std::vector<float> host_src = {1, 2, 3, 4, 5, 6};
  Tensor src = *Tensor::Empty(DType::kF32, Shape{3, 2});
  std::memcpy(src.data(), host_src.data(), sizeof(float) * 6);
  Tensor index = *Tensor::Empty(DType::kI32, Shape{4});
  const int32_t ids[] = {2, 5, 0, -1};
  std::memcpy(index.data(), ids, sizeof ids);
  const Tensor d_src = Upload(src), d_index = Upload(index);
  const Tensor d_out = Upload(*Tensor::Zeros(DType::kF32, Shape{4, 2}));
  ASSERT_TRUE(gpu_->GatherRows(d_src, d_index, d_out).ok());  // found on the device
  const absl::Status st = gpu_->Synchronize();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("GatherRows: index[1] is outside [0, R)"));
  const Tensor out = Download(d_out);  // the good rows are written, the bad ones left
  EXPECT_EQ(std::vector<float>(out.data_as<float>(), out.data_as<float>() + 8),
            (std::vector<float>{5, 6, 0, 0, 1, 2, 0, 0}));
  EXPECT_TRUE(gpu_->Synchronize().ok());  // the flag was cleared
}

TEST_F(CudaVerifyOpTest, ExtendMaskRowsMatchesTheCpuBackend) {
  std::mt19937 rng(11);
  struct Case {
    int64_t rows, width, src_ld, out_ld, n;
  };
  for (const Case& c : {Case{8, 64, 64, 64, 16}, Case{5, 300, 301, 303, 40}}) {
    const Tensor src = RandomInts(DType::kU8, Shape{c.rows * c.src_ld}, rng(), 0, 2);
    const Tensor parent = RandomInts(DType::kI32, Shape{c.n}, rng(), 0, c.rows);
    const Tensor column = RandomInts(DType::kI32, Shape{c.n}, rng(), 0, c.width);
    Tensor want = RandomInts(DType::kU8, Shape{c.n * c.out_ld}, rng(), 0, 256);
    const Tensor d_src = Upload(src), d_parent = Upload(parent), d_column = Upload(column), d_out = Upload(want);
    const auto view = [&](const Tensor& t, int64_t rows, int64_t ld) {
      return TensorView(t.data(), DType::kU8, Shape{rows, c.width}, Shape{ld, 1}, t.device());
    };
    ASSERT_TRUE(cpu_.ExtendMaskRows(view(src, c.rows, c.src_ld), parent, column, view(want, c.n, c.out_ld)).ok());
    ASSERT_TRUE(
        gpu_->ExtendMaskRows(view(d_src, c.rows, c.src_ld), d_parent, d_column, view(d_out, c.n, c.out_ld)).ok());
    ASSERT_TRUE(gpu_->Synchronize().ok());
    ExpectSameBytes(Download(d_out), want, "out");
  }
}

TEST_F(CudaVerifyOpTest, ExtendMaskRowsReportsTheLowestBadIndexAtSynchronize) {
  const Tensor d_src = Upload(RandomInts(DType::kU8, Shape{3, 4}, 1, 0, 2));
  const Tensor d_out = Upload(*Tensor::Zeros(DType::kU8, Shape{3, 4}));
  struct Case {
    int32_t parent[3], column[3];
    const char* words;
  };
  for (const Case& c : {Case{{0, 3, 1}, {0, 1, 9}, "parent[1] is outside [0, R)"},
                        Case{{0, 1, 2}, {0, -1, 2}, "column[1] is outside [0, M)"},
                        Case{{0, 1, -2}, {0, 1, 4}, "parent[2] is outside [0, R)"}}) {
    Tensor parent = *Tensor::Empty(DType::kI32, Shape{3}), column = *Tensor::Empty(DType::kI32, Shape{3});
    std::memcpy(parent.data(), c.parent, sizeof c.parent);
    std::memcpy(column.data(), c.column, sizeof c.column);
    ASSERT_TRUE(gpu_->ExtendMaskRows(d_src, Upload(parent), Upload(column), d_out).ok());
    const absl::Status st = gpu_->Synchronize();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(std::string("ExtendMaskRows: ") + c.words)) << st;
  }
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

}  // namespace
}  // namespace eagle3
