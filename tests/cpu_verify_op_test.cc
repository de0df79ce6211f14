// CpuBackend::TreeVerify ≡ TreeVerifier::Verify over the whole batch (greedy and stochastic, sequence
// b on Philox stream b, seed and offset read from the seed_offset tensor), its per-sequence error
// records (the others still verified), commit offsets and counts; GatherRows and ExtendMaskRows
// on examples, bad indices and bad shapes.
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "eagle3/backend.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/half.h"
#include "eagle3/tensor.h"
#include "eagle3/tree_verifier.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "verify_op_util.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;
using testing::ExpectRecord;
using testing::ExpectVerified;
using testing::RandomVerifyBatch;
using testing::VerifyBatch;
using testing::VerifyOutputs;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

void ExpectInvalid(const absl::Status& status, const std::string& text) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(text));
}

// {seed, offset} as the op reads them: i64 bit patterns.
Tensor SeedOffset(uint64_t seed, uint64_t offset) {
  Tensor t = *Tensor::Empty(DType::kI64, Shape{2});
  std::memcpy(t.data_as<int64_t>(), &seed, sizeof seed);
  std::memcpy(t.data_as<int64_t>() + 1, &offset, sizeof offset);
  return t;
}

class CpuVerifyOpTest : public ::testing::Test {
 protected:
  // Runs the op on `batch` into fresh sentinel-filled outputs.
  VerifyOutputs Run(const VerifyBatch& batch, const SamplingParams& sampling, uint64_t seed, uint64_t offset) {
    VerifyOutputs out(batch.batch(), batch.nodes());
    const absl::Status st = cpu_.TreeVerify(batch.tokens, batch.parents, batch.logits, sampling,
                                            SeedOffset(seed, offset), out.views());
    EXPECT_TRUE(st.ok()) << st;
    return out;
  }

  cpu::CpuBackend cpu_;
};

TEST_F(CpuVerifyOpTest, GreedyEqualsTreeVerifier) {
  struct Case {
    int64_t batch, nodes, vocab;
  };
  int accepted = 0;
  for (const Case& c : {Case{1, 8, 50}, Case{4, 16, 1000}, Case{8, 40, 300}, Case{3, 1, 20}}) {
    SCOPED_TRACE(::testing::Message() << "B " << c.batch << " N " << c.nodes << " V " << c.vocab);
    const VerifyBatch batch = RandomVerifyBatch(c.batch * 1000 + c.nodes, c.batch, c.nodes, c.vocab, 2.0f);
    const std::vector<VerifyResult> want = batch.Reference(SamplingParams{}, 0, 0);
    const VerifyOutputs got = Run(batch, SamplingParams{}, 0, 0);
    for (int64_t b = 0; b < c.batch; ++b) {
      ExpectVerified(got, b, want[b]);
      accepted += want[b].num_accepted();
    }
  }
  EXPECT_GT(accepted, 10);  // the trees follow the argmax often enough to test accepted paths
}

TEST_F(CpuVerifyOpTest, StochasticEqualsTreeVerifierOnEveryStream) {
  // High-bit seeds: the tensor holds bit patterns, not values.
  const uint64_t seed = 0x9E3779B97F4A7C15ull, offset = 0xF00DFACE00000007ull;
  for (const SamplingParams& sampling : {SamplingParams{0.7f, 0, 1.0f}, SamplingParams{1.0f, 5, 1.0f},
                                         SamplingParams{1.3f, 0, 0.8f}, SamplingParams{0.9f, 20, 0.9f}}) {
    SCOPED_TRACE(::testing::Message() << "T " << sampling.temperature << " top_k " << sampling.top_k << " top_p "
                                      << sampling.top_p);
    const VerifyBatch batch = RandomVerifyBatch(17, 12, 10, 64, 1.5f);
    const std::vector<VerifyResult> want = batch.Reference(sampling, seed, offset);
    const VerifyOutputs got = Run(batch, sampling, seed, offset);
    for (int64_t b = 0; b < batch.batch(); ++b) ExpectVerified(got, b, want[b]);
  }
}

// The same tree and logits in every sequence: the sequences differ only by their Philox stream, and
// the op draws stream b for sequence b (the outcomes differ, and equal the batched reference's).
TEST_F(CpuVerifyOpTest, SequenceBDrawsStreamB) {
  const SamplingParams sampling{1.5f, 0, 1.0f};
  const int64_t batch = 16, nodes = 8, vocab = 32;
  const VerifyBatch one = RandomVerifyBatch(5, 1, nodes, vocab, 1.0f);
  VerifyBatch same{*Tensor::Empty(DType::kI64, Shape{batch, nodes}), *Tensor::Empty(DType::kI32, Shape{batch, nodes}),
                   *Tensor::Empty(DType::kF32, Shape{batch * nodes, vocab})};
  for (int64_t b = 0; b < batch; ++b) {
    std::memcpy(same.Tokens(b), one.Tokens(0), nodes * sizeof(int64_t));
    std::memcpy(same.Parents(b), one.Parents(0), nodes * sizeof(int32_t));
    std::memcpy(same.Row(b, 0), one.Row(0, 0), nodes * vocab * sizeof(float));
  }
  const std::vector<VerifyResult> want = same.Reference(sampling, 3, 4);
  const VerifyOutputs got = Run(same, sampling, 3, 4);
  bool differ = false;
  for (int64_t b = 0; b < batch; ++b) {
    ExpectVerified(got, b, want[b]);
    differ = differ || want[b].tokens != want[0].tokens;
  }
  EXPECT_TRUE(differ);
}

TEST_F(CpuVerifyOpTest, CommitOffsetsFollowTheAcceptedPath) {
  // 0 -> {1: tok 3, 2: tok 5}; 1 -> {3: tok 2, 4: tok 4}; 4 -> {5: tok 1}.
  VerifyBatch batch{*Tensor::Empty(DType::kI64, Shape{1, 6}), *Tensor::Empty(DType::kI32, Shape{1, 6}),
                    *Tensor::Zeros(DType::kF32, Shape{6, 8})};
  const int64_t tokens[] = {9, 3, 5, 2, 4, 1};
  const int32_t parents[] = {-1, 0, 0, 1, 1, 4};
  std::memcpy(batch.Tokens(0), tokens, sizeof tokens);
  std::memcpy(batch.Parents(0), parents, sizeof parents);
  batch.Row(0, 0)[3] = 1.0f;  // argmax 3 -> node 1
  batch.Row(0, 1)[4] = 2.0f;  // argmax 4 -> node 4
  batch.Row(0, 4)[1] = 0.5f;  // argmax 1 -> node 5
  batch.Row(0, 5)[6] = 3.0f;  // bonus 6
  const VerifyOutputs out = Run(batch, SamplingParams{}, 0, 0);
  EXPECT_EQ(out.num_accepted.data_as<int32_t>()[0], 3);
  EXPECT_EQ(out.commit_counts.data_as<int32_t>()[0], 4);
  EXPECT_EQ(std::vector<int32_t>(out.accepted.data_as<int32_t>(), out.accepted.data_as<int32_t>() + 3),
            (std::vector<int32_t>{1, 4, 5}));
  EXPECT_EQ(std::vector<int64_t>(out.out_tokens.data_as<int64_t>(), out.out_tokens.data_as<int64_t>() + 4),
            (std::vector<int64_t>{3, 4, 1, 6}));
  EXPECT_EQ(std::vector<int32_t>(out.commit_offsets.data_as<int32_t>(), out.commit_offsets.data_as<int32_t>() + 4),
            (std::vector<int32_t>{0, 1, 4, 5}));
  // Past the counts the buffers are left as they were.
  EXPECT_TRUE(testing::AllSentinel(out.accepted.data_as<int32_t>() + 3, 3 * sizeof(int32_t)));
  EXPECT_TRUE(testing::AllSentinel(out.out_tokens.data_as<int64_t>() + 4, 2 * sizeof(int64_t)));
  EXPECT_TRUE(testing::AllSentinel(out.commit_offsets.data_as<int32_t>() + 4, 2 * sizeof(int32_t)));
}

// One bad sequence per kind; the good ones are verified as in the clean batch (their streams do not
// move), and a bad one writes its record and -1 counts only.
TEST_F(CpuVerifyOpTest, BadSequencesGetRecordsWhileTheOthersVerify) {
  const int64_t nodes = 6, vocab = 40;
  const SamplingParams sampling{0.8f, 0, 1.0f};
  const VerifyBatch clean = RandomVerifyBatch(23, 10, nodes, vocab, 2.0f);
  const std::vector<VerifyResult> want = clean.Reference(sampling, 11, 12);
  VerifyBatch bad = RandomVerifyBatch(23, 10, nodes, vocab, 2.0f);
  bad.Parents(1)[3] = 5;                        // a parent after its child: bad tree at node 3
  bad.Parents(2)[0] = 0;                        // the root has a parent: bad tree at node 0
  bad.Parents(3)[4] = -1;                       // a second root: node 4
  bad.Tokens(4)[5] = vocab;                     // token out of range at node 5
  bad.Tokens(5)[2] = -3;                        // negative token at node 2
  bad.Row(6, 3)[9] = kNaN;                      // NaN at row 3, id 9 (and +inf after it)
  bad.Row(6, 3)[12] = kInf;
  bad.Row(7, 1)[30] = kInf;                     // +inf at row 1, id 30
  std::fill(bad.Row(8, 4), bad.Row(8, 4) + vocab, -kInf);  // row 4 all -inf
  bad.Parents(9)[2] = 7;                        // bad tree outranks a bad token and bad logits
  bad.Tokens(9)[1] = vocab + 1;
  bad.Row(9, 0)[0] = kNaN;
  bad.Tokens(0)[0] = -5;                        // the root's token is unused
  const VerifyOutputs out = Run(bad, sampling, 11, 12);
  ExpectVerified(out, 0, want[0]);
  ExpectRecord(out, 1, 1, 3, 0);
  ExpectRecord(out, 2, 1, 0, 0);
  ExpectRecord(out, 3, 1, 4, 0);
  ExpectRecord(out, 4, 2, 5, vocab);
  ExpectRecord(out, 5, 2, 2, -3);
  ExpectRecord(out, 6, 3, 3, 9);
  ExpectRecord(out, 7, 4, 1, 30);
  ExpectRecord(out, 8, 5, 4, 0);
  ExpectRecord(out, 9, 1, 2, 0);
}

TEST_F(CpuVerifyOpTest, BadArgumentsAreInvalidArgument) {
  const VerifyBatch batch = RandomVerifyBatch(1, 2, 4, 16, 1.0f);
  const Tensor seed_offset = SeedOffset(1, 2);
  VerifyOutputs out(2, 4);
  const auto verify = [&](const TensorView& tokens, const TensorView& parents, const TensorView& logits,
                          const SamplingParams& sampling, const TensorView& so, const TreeVerifyOutputs& o) {
    return cpu_.TreeVerify(tokens, parents, logits, sampling, so, o);
  };
  ExpectInvalid(verify(batch.tokens, batch.parents, batch.logits, SamplingParams{-1.0f, 0, 1.0f}, seed_offset,
                       out.views()),
                "temperature");
  ExpectInvalid(verify(batch.tokens, batch.parents, batch.logits, SamplingParams{1.0f, 0, 0.0f}, seed_offset,
                       out.views()),
                "top_p");
  const Tensor bf16 = *Tensor::Zeros(DType::kBF16, Shape{8, 16});
  ExpectInvalid(verify(batch.tokens, batch.parents, bf16, SamplingParams{}, seed_offset, out.views()), "f32 only");
  ExpectInvalid(verify(batch.tokens, batch.parents, batch.logits.view().Narrow(0, 0, 7), SamplingParams{},
                       seed_offset, out.views()),
                "B * N = 8");
  ExpectInvalid(verify(batch.parents, batch.parents, batch.logits, SamplingParams{}, seed_offset, out.views()),
                "tokens");
  const Tensor parents_i64 = *Tensor::Zeros(DType::kI64, Shape{2, 4});
  ExpectInvalid(verify(batch.tokens, parents_i64, batch.logits, SamplingParams{}, seed_offset, out.views()),
                "parents");
  const Tensor empty_tokens = *Tensor::Zeros(DType::kI64, Shape{2, 0});
  const Tensor empty_parents = *Tensor::Zeros(DType::kI32, Shape{2, 0});
  ExpectInvalid(verify(empty_tokens, empty_parents, batch.logits, SamplingParams{}, seed_offset, out.views()),
                "N >= 1");
  const Tensor three = *Tensor::Zeros(DType::kI64, Shape{3});
  ExpectInvalid(verify(batch.tokens, batch.parents, batch.logits, SamplingParams{}, three, out.views()),
                "seed_offset");
  TreeVerifyOutputs wrong = out.views();
  wrong.errors = out.errors.view().Narrow(1, 0, 2);
  ExpectInvalid(verify(batch.tokens, batch.parents, batch.logits, SamplingParams{}, seed_offset, wrong),
                "out.errors");
  wrong = out.views();
  wrong.commit_counts = out.num_accepted;  // two outputs in one buffer
  ExpectInvalid(verify(batch.tokens, batch.parents, batch.logits, SamplingParams{}, seed_offset, wrong), "overlaps");
  wrong = out.views();
  wrong.out_tokens = batch.tokens;  // an output over an input
  ExpectInvalid(verify(batch.tokens, batch.parents, batch.logits, SamplingParams{}, seed_offset, wrong), "overlaps");
  // Nothing was written by the refused calls.
  for (Tensor* t : out.All()) EXPECT_TRUE(testing::AllSentinel(t->data(), t->nbytes()));
}

// ---- GatherRows ----------------------------------------------------------------------------------

TEST_F(CpuVerifyOpTest, GatherRowsCopiesRowsBitForBit) {
  // Row-strided f32 source and output, with NaN payloads that a float copy could change.
  std::vector<uint32_t> src(4 * 5);
  for (size_t i = 0; i < src.size(); ++i) src[i] = 0x7FA00000u + static_cast<uint32_t>(i);
  const TensorView src_view(src.data(), DType::kF32, Shape{4, 3}, Shape{5, 1}, Device::Cpu());
  std::vector<int32_t> index = {3, 0, 3, 2};
  std::vector<uint32_t> out(4 * 4, 0);
  const TensorView out_view(out.data(), DType::kF32, Shape{4, 3}, Shape{4, 1}, Device::Cpu());
  ASSERT_TRUE(cpu_.GatherRows(src_view, TensorView(index.data(), DType::kI32, Shape{4}), out_view).ok());
  for (int i = 0; i < 4; ++i) {
    for (int c = 0; c < 4; ++c) {
      const uint32_t want = c < 3 ? src[index[i] * 5 + c] : 0u;  // the padding column is untouched
      EXPECT_EQ(out[i * 4 + c], want) << "row " << i << " column " << c;
    }
  }
  // Other dtypes: bytes (u8) and 8-byte elements (i64).
  std::vector<uint8_t> bytes = {1, 2, 3, 4, 5, 6};
  std::vector<uint8_t> bytes_out(4, 0);
  std::vector<int32_t> pick = {2, 0};
  ASSERT_TRUE(cpu_.GatherRows(TensorView(bytes.data(), DType::kU8, Shape{3, 2}),
                              TensorView(pick.data(), DType::kI32, Shape{2}),
                              TensorView(bytes_out.data(), DType::kU8, Shape{2, 2}))
                  .ok());
  EXPECT_EQ(bytes_out, (std::vector<uint8_t>{5, 6, 1, 2}));
  std::vector<int64_t> wide = {-1, std::numeric_limits<int64_t>::min()};
  std::vector<int64_t> wide_out(2, 0);
  std::vector<int32_t> swap = {1, 0};
  ASSERT_TRUE(cpu_.GatherRows(TensorView(wide.data(), DType::kI64, Shape{2, 1}),
                              TensorView(swap.data(), DType::kI32, Shape{2}),
                              TensorView(wide_out.data(), DType::kI64, Shape{2, 1}))
                  .ok());
  EXPECT_EQ(wide_out, (std::vector<int64_t>{std::numeric_limits<int64_t>::min(), -1}));
}

TEST_F(CpuVerifyOpTest, GatherRowsRefusesBadIndicesBeforeWriting) {
  std::vector<float> src(6, 1.0f);
  std::vector<float> out(6, 0.0f);
  const TensorView src_view(src.data(), DType::kF32, Shape{3, 2});
  const TensorView out_view(out.data(), DType::kF32, Shape{3, 2});
  for (const int32_t bad : {-1, 3}) {
    std::vector<int32_t> index = {0, 1, bad};
    ExpectInvalid(cpu_.GatherRows(src_view, TensorView(index.data(), DType::kI32, Shape{3}), out_view),
                  "index[2] = " + std::to_string(bad) + " is outside [0, 3)");
    EXPECT_EQ(out, std::vector<float>(6, 0.0f));
  }
}

// Indices local to equal groups: out[g q + j] = src[g m + index[g q + j]].
TEST_F(CpuVerifyOpTest, GatherRowsWithGroupsIndexWithinEachGroup) {
  std::vector<float> src(12);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);  // row r = {2r, 2r + 1}
  const TensorView src_view(src.data(), DType::kF32, Shape{6, 2});        // 2 groups of 3 rows
  std::vector<int32_t> index = {2, 0, 1, 1};                               // 2 rows per group
  std::vector<float> out(8, -1.0f);
  ASSERT_TRUE(cpu_.GatherRows(src_view, TensorView(index.data(), DType::kI32, Shape{4}),
                              TensorView(out.data(), DType::kF32, Shape{4, 2}), 2)
                  .ok());
  EXPECT_EQ(out, (std::vector<float>{4, 5, 0, 1, 8, 9, 8, 9}));
  // Within a group, an index must stay below its group's row count.
  index = {0, 0, 3, 0};
  std::fill(out.begin(), out.end(), -1.0f);
  ExpectInvalid(cpu_.GatherRows(src_view, TensorView(index.data(), DType::kI32, Shape{4}),
                                TensorView(out.data(), DType::kF32, Shape{4, 2}), 2),
                "index[2] = 3 is outside [0, 3)");
  EXPECT_EQ(out, std::vector<float>(8, -1.0f));
  ExpectInvalid(cpu_.GatherRows(src_view, TensorView(index.data(), DType::kI32, Shape{4}),
                                TensorView(out.data(), DType::kF32, Shape{4, 2}), 4),
                "groups = 4");
}

TEST_F(CpuVerifyOpTest, GatherRowsRefusesBadShapes) {
  std::vector<float> src(6, 1.0f), out(8, 0.0f);
  std::vector<int32_t> index = {0, 1};
  std::vector<int64_t> index64 = {0, 1};
  const TensorView src_view(src.data(), DType::kF32, Shape{3, 2});
  const TensorView idx(index.data(), DType::kI32, Shape{2});
  ExpectInvalid(cpu_.GatherRows(src_view, TensorView(index64.data(), DType::kI64, Shape{2}),
                                TensorView(out.data(), DType::kF32, Shape{2, 2})),
                "index");
  ExpectInvalid(cpu_.GatherRows(src_view, idx, TensorView(out.data(), DType::kI32, Shape{2, 2})), "dtype of src");
  ExpectInvalid(cpu_.GatherRows(src_view, idx, TensorView(out.data(), DType::kF32, Shape{2, 3})), "[n, C] = [2, 2]");
  ExpectInvalid(cpu_.GatherRows(src_view, idx, TensorView(out.data(), DType::kF32, Shape{4, 2})), "[n, C] = [2, 2]");
  ExpectInvalid(cpu_.GatherRows(src_view, idx, TensorView(src.data() + 2, DType::kF32, Shape{2, 2})), "overlaps");
}

// ---- ExtendMaskRows ------------------------------------------------------------------------------

TEST_F(CpuVerifyOpTest, ExtendMaskRowsCopiesTheParentRowAndSetsTheColumn) {
  // A root and its two children (columns 0..2) of a 6-column mask, row-strided by 8.
  std::vector<uint8_t> src = {1, 0, 0, 0, 0, 0, 9, 9,  //
                              1, 1, 0, 0, 0, 0, 9, 9,  //
                              1, 0, 1, 0, 0, 0, 9, 9};
  const TensorView src_view(src.data(), DType::kU8, Shape{3, 6}, Shape{8, 1}, Device::Cpu());
  std::vector<int32_t> parent = {1, 1, 2};
  std::vector<int32_t> column = {3, 4, 5};
  std::vector<uint8_t> out(3 * 6, 7);
  ASSERT_TRUE(cpu_.ExtendMaskRows(src_view, TensorView(parent.data(), DType::kI32, Shape{3}),
                                  TensorView(column.data(), DType::kI32, Shape{3}),
                                  TensorView(out.data(), DType::kU8, Shape{3, 6}))
                  .ok());
  EXPECT_EQ(out, (std::vector<uint8_t>{1, 1, 0, 1, 0, 0,  //
                                       1, 1, 0, 0, 1, 0,  //
                                       1, 0, 1, 0, 0, 1}));
}

TEST_F(CpuVerifyOpTest, ExtendMaskRowsRefusesBadIndicesAndShapes) {
  std::vector<uint8_t> src(2 * 4, 1), out(3 * 4, 0);
  const TensorView src_view(src.data(), DType::kU8, Shape{2, 4});
  const TensorView out_view(out.data(), DType::kU8, Shape{3, 4});
  std::vector<int32_t> parent = {0, 1, 2}, column = {1, 2, 3};
  const TensorView parent_view(parent.data(), DType::kI32, Shape{3});
  const TensorView column_view(column.data(), DType::kI32, Shape{3});
  const auto extend = [&](const TensorView& c, const TensorView& o) {
    return cpu_.ExtendMaskRows(src_view, parent_view, c, o);
  };
  ExpectInvalid(extend(column_view, out_view), "parent[2] = 2 is outside [0, R = 2)");
  parent[2] = 1;
  column[1] = 4;
  ExpectInvalid(extend(column_view, out_view), "column[1] = 4 is outside [0, M = 4)");
  column[1] = -1;
  ExpectInvalid(extend(column_view, out_view), "column[1] = -1");
  EXPECT_EQ(out, std::vector<uint8_t>(12, 0));  // refused before writing
  column[1] = 2;
  ExpectInvalid(extend(TensorView(column.data(), DType::kI32, Shape{2}), out_view), "like parent");
  ExpectInvalid(extend(column_view, TensorView(out.data(), DType::kU8, Shape{3, 3})), "[n, M] = [3, 4]");
  std::vector<float> floats(8, 0.0f);
  ExpectInvalid(cpu_.ExtendMaskRows(TensorView(floats.data(), DType::kF32, Shape{2, 4}), parent_view, column_view,
                                    out_view),
                "must be u8");
  ASSERT_TRUE(extend(column_view, out_view).ok());
}

}  // namespace
}  // namespace eagle3
