// Test helper shared by the CPU and CUDA tests of Backend::TreeVerify (cpu_verify_op_test.cc,
// gpu/cuda_verify_op_test.cc): random batches in the op's layout, output buffers whose every byte
// starts as a sentinel (so a test sees what an op left unwritten), and checks against the
// reference TreeVerifier::Verify.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "eagle3/backend.h"
#include "eagle3/draft_tree.h"
#include "eagle3/half.h"
#include "eagle3/tensor.h"
#include "eagle3/tree_verifier.h"
#include "gtest/gtest.h"

namespace eagle3::testing {

inline constexpr uint8_t kSentinelByte = 0xA5;

// B trees of N nodes in Backend::TreeVerify's layout, host.
struct VerifyBatch {
  Tensor tokens;   // [B, N] i64
  Tensor parents;  // [B, N] i32
  Tensor logits;   // [B * N, V] f32

  int64_t batch() const { return tokens.dim(0); }
  int64_t nodes() const { return tokens.dim(1); }
  int64_t vocab() const { return logits.dim(1); }
  int64_t* Tokens(int64_t b) const { return tokens.data_as<int64_t>() + b * nodes(); }
  int32_t* Parents(int64_t b) const { return parents.data_as<int32_t>() + b * nodes(); }
  float* Row(int64_t b, int64_t i) const { return logits.data_as<float>() + (b * nodes() + i) * vocab(); }

  // The trees as DraftTree::FromParents builds them (every tree must be valid).
  std::vector<DraftTree> Trees() const {
    std::vector<DraftTree> trees;
    for (int64_t b = 0; b < batch(); ++b) {
      auto tree = DraftTree::FromParents(std::span<const int64_t>(Tokens(b), nodes()),
                                         std::span<const int32_t>(Parents(b), nodes()));
      EXPECT_TRUE(tree.ok()) << tree.status();
      trees.push_back(*tree);
    }
    return trees;
  }
  std::vector<TensorView> LogitViews() const {
    std::vector<TensorView> views;
    for (int64_t b = 0; b < batch(); ++b) views.push_back(logits.view().Narrow(0, b * nodes(), nodes()));
    return views;
  }
  // TreeVerifier::Verify over the whole batch: sequence b draws Philox stream b.
  std::vector<VerifyResult> Reference(const SamplingParams& sampling, uint64_t seed, uint64_t offset) const {
    auto results = TreeVerifier::Verify(Trees(), LogitViews(), sampling, seed, offset);
    EXPECT_TRUE(results.ok()) << results.status();
    return results.ok() ? *results : std::vector<VerifyResult>();
  }
};

// Random trees: each node's parent is one of the earlier nodes; its token is the parent row's
// argmax with probability 1/2, one of that row's 4 best with 3/10, else random (so paths get
// accepted, and siblings repeat tokens). Logits N(0, stddev) rounded to bf16, so that a bf16 copy
// holds the same values.
inline VerifyBatch RandomVerifyBatch(uint64_t seed, int64_t batch, int64_t nodes, int64_t vocab, float stddev) {
  std::mt19937_64 rng(seed);
  VerifyBatch out{*Tensor::Empty(DType::kI64, Shape{batch, nodes}), *Tensor::Empty(DType::kI32, Shape{batch, nodes}),
                  *Tensor::Empty(DType::kF32, Shape{batch * nodes, vocab})};
  std::normal_distribution<float> normal(0.0f, stddev);
  float* logits = out.logits.data_as<float>();
  for (int64_t i = 0; i < out.logits.numel(); ++i) logits[i] = Bf16ToFloat(FloatToBf16(normal(rng)));
  std::vector<int64_t> ids(static_cast<size_t>(vocab));
  for (int64_t b = 0; b < batch; ++b) {
    out.Parents(b)[0] = -1;
    out.Tokens(b)[0] = static_cast<int64_t>(rng() % vocab);
    for (int64_t i = 1; i < nodes; ++i) {
      const int32_t parent = static_cast<int32_t>(rng() % i);
      out.Parents(b)[i] = parent;
      const float* row = out.Row(b, parent);
      const double pick = std::uniform_real_distribution<double>(0, 1)(rng);
      if (pick < 0.8) {
        std::iota(ids.begin(), ids.end(), 0);
        const int64_t k = std::min<int64_t>(4, vocab);
        std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [row](int64_t x, int64_t y) {
          return row[x] > row[y] || (row[x] == row[y] && x < y);
        });
        out.Tokens(b)[i] = pick < 0.5 ? ids[0] : ids[rng() % k];
      } else {
        out.Tokens(b)[i] = static_cast<int64_t>(rng() % vocab);
      }
    }
  }
  return out;
}

// TreeVerify's outputs for B trees of N nodes, host, every byte kSentinelByte.
struct VerifyOutputs {
  Tensor num_accepted, accepted, out_tokens, commit_offsets, commit_counts, errors;

  VerifyOutputs(int64_t batch, int64_t nodes)
      : num_accepted(*Tensor::Empty(DType::kI32, Shape{batch})),
        accepted(*Tensor::Empty(DType::kI32, Shape{batch, nodes})),
        out_tokens(*Tensor::Empty(DType::kI64, Shape{batch, nodes})),
        commit_offsets(*Tensor::Empty(DType::kI32, Shape{batch, nodes})),
        commit_counts(*Tensor::Empty(DType::kI32, Shape{batch})),
        errors(*Tensor::Empty(DType::kI64, Shape{batch, kVerifyErrorWidth})) {
    for (Tensor* t : All()) std::memset(t->data(), kSentinelByte, t->nbytes());
  }
  std::vector<Tensor*> All() {
    return {&num_accepted, &accepted, &out_tokens, &commit_offsets, &commit_counts, &errors};
  }
  TreeVerifyOutputs views() const {
    return {num_accepted, accepted, out_tokens, commit_offsets, commit_counts, errors};
  }
  int64_t nodes() const { return accepted.dim(1); }
  const int64_t* Record(int64_t b) const { return errors.data_as<int64_t>() + b * kVerifyErrorWidth; }
};

inline bool AllSentinel(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  return std::all_of(p, p + bytes, [](uint8_t x) { return x == kSentinelByte; });
}

// Sequence b of `out` holds `want`: accepted nodes, tokens then the bonus, commit offsets {0,
// accepted...}, counts, and an empty error record.
inline void ExpectVerified(const VerifyOutputs& out, int64_t b, const VerifyResult& want) {
  SCOPED_TRACE(::testing::Message() << "sequence " << b);
  const int64_t nodes = out.nodes();
  const int32_t n = want.num_accepted();
  EXPECT_EQ(out.num_accepted.data_as<int32_t>()[b], n);
  EXPECT_EQ(out.commit_counts.data_as<int32_t>()[b], n + 1);
  EXPECT_EQ(std::vector<int64_t>(out.Record(b), out.Record(b) + kVerifyErrorWidth), std::vector<int64_t>(3, 0));
  const int32_t* accepted = out.accepted.data_as<int32_t>() + b * nodes;
  const int64_t* tokens = out.out_tokens.data_as<int64_t>() + b * nodes;
  const int32_t* commit = out.commit_offsets.data_as<int32_t>() + b * nodes;
  EXPECT_EQ(std::vector<int32_t>(accepted, accepted + n), want.accepted_nodes);
  EXPECT_EQ(std::vector<int64_t>(tokens, tokens + n + 1), want.tokens);
  std::vector<int32_t> offsets = {0};
  offsets.insert(offsets.end(), want.accepted_nodes.begin(), want.accepted_nodes.end());
  EXPECT_EQ(std::vector<int32_t>(commit, commit + n + 1), offsets);
}

// Sequence b of `out` holds the error record {kind, row, token}, -1 counts, and nothing else.
inline void ExpectRecord(const VerifyOutputs& out, int64_t b, int64_t kind, int64_t row, int64_t token) {
  SCOPED_TRACE(::testing::Message() << "sequence " << b);
  const int64_t nodes = out.nodes();
  EXPECT_EQ(std::vector<int64_t>(out.Record(b), out.Record(b) + kVerifyErrorWidth),
            (std::vector<int64_t>{kind, row, token}));
  EXPECT_EQ(out.num_accepted.data_as<int32_t>()[b], -1);
  EXPECT_EQ(out.commit_counts.data_as<int32_t>()[b], -1);
  EXPECT_TRUE(AllSentinel(out.accepted.data_as<int32_t>() + b * nodes, nodes * sizeof(int32_t)));
  EXPECT_TRUE(AllSentinel(out.out_tokens.data_as<int64_t>() + b * nodes, nodes * sizeof(int64_t)));
  EXPECT_TRUE(AllSentinel(out.commit_offsets.data_as<int32_t>() + b * nodes, nodes * sizeof(int32_t)));
}

}  // namespace eagle3::testing
