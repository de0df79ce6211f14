// DeviceTreeVerifier / LaunchTreeVerify ≡ TreeVerifier::Verify (the CPU reference): greedy results
// identical on random trees and logits (batch 1/4/32, V 1000/129280/163840); stochastic results
// identical on thousands of random cases except where the data shows a coin (or the top-p cut)
// within 1e-6 of its threshold (counted, expected ~0); designed ties; bf16 ≡ f32 on
// bf16-representable logits; lossless first-token distribution (chi-square); bad input named by
// sequence, row and token. Skipped where no CUDA device is visible.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "device_buffer.h"
#include "eagle3/cuda/cuda_graph.h"
#include "eagle3/cuda/device_allocator.h"
#include "eagle3/cuda/device_tree_verifier.h"
#include "eagle3/half.h"
#include "eagle3/philox.h"
#include "eagle3/tree_verifier.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "verify_ops.h"

namespace eagle3::cuda {
namespace {

using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// A batch: trees and their logits, flattened [Σ N_b, V] row-major on the host (f32).
struct Batch {
  std::vector<DraftTree> trees;
  int64_t vocab = 0;
  std::vector<float> logits;
  int64_t rows() const { return static_cast<int64_t>(logits.size()) / vocab; }
  int64_t offset(size_t b) const {
    int64_t o = 0;
    for (size_t c = 0; c < b; ++c) o += trees[c].size();
    return o;
  }
  std::vector<TensorView> HostViews() {
    std::vector<TensorView> views;
    for (size_t b = 0; b < trees.size(); ++b) {
      views.emplace_back(logits.data() + offset(b) * vocab, DType::kF32, Shape{trees[b].size(), vocab});
    }
    return views;
  }
};

int64_t ArgmaxRow(const float* row, int64_t v) {
  return std::max_element(row, row + v) - row;  // first of the largest: the lowest id among ties
}

// Random parents and (re-ordered) sibling lists; each node's token is its parent's argmax with
// probability 1/2, one of the parent's top tokens with probability 3/10, otherwise random (repeats
// among siblings happen).
DraftTree RandomTree(std::mt19937_64& rng, int n, int64_t vocab, const float* rows) {
  std::vector<int32_t> parents(n, -1);
  std::vector<int64_t> tokens(n, 0);
  tokens[0] = static_cast<int64_t>(rng() % vocab);
  for (int i = 1; i < n; ++i) {
    parents[i] = static_cast<int32_t>(rng() % i);
    const float* prow = rows + parents[i] * vocab;
    const double pick = std::uniform_real_distribution<double>(0, 1)(rng);
    if (pick < 0.5) {
      tokens[i] = ArgmaxRow(prow, vocab);
    } else if (pick < 0.8) {
      // One of the top 4 of the parent's row.
      std::vector<int64_t> ids(static_cast<size_t>(vocab));
      std::iota(ids.begin(), ids.end(), 0);
      const int64_t k = std::min<int64_t>(4, vocab);
      std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                        [prow](int64_t a, int64_t b) { return prow[a] > prow[b] || (prow[a] == prow[b] && a < b); });
      tokens[i] = ids[rng() % k];
    } else {
      tokens[i] = static_cast<int64_t>(rng() % vocab);
    }
  }
  auto tree = DraftTree::FromParents(tokens, parents);
  EXPECT_TRUE(tree.ok()) << tree.status();
  // Shuffle every sibling list (verification follows the lists, in any order).
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> children;
    for (int32_t c = tree->first_child[i]; c != -1; c = tree->next_sibling[c]) children.push_back(c);
    std::shuffle(children.begin(), children.end(), rng);
    tree->first_child[i] = children.empty() ? -1 : children[0];
    for (size_t j = 0; j < children.size(); ++j) {
      tree->next_sibling[children[j]] = j + 1 < children.size() ? children[j + 1] : -1;
    }
  }
  EXPECT_TRUE(tree->Validate().ok());
  return *tree;
}

// Random batch: N_b in [1, max_nodes], logits N(0, stddev) rounded to bf16 (so the bf16 path sees
// the same values).
Batch RandomBatch(uint64_t seed, int batch, int max_nodes, int64_t vocab, float stddev) {
  std::mt19937_64 rng(seed);
  std::vector<int> sizes(batch);
  int64_t rows = 0;
  for (int& n : sizes) rows += n = 1 + static_cast<int>(rng() % max_nodes);
  Batch out;
  out.vocab = vocab;
  out.logits.resize(static_cast<size_t>(rows * vocab));
  std::normal_distribution<float> normal(0.0f, stddev);
  for (float& x : out.logits) x = Bf16ToFloat(FloatToBf16(normal(rng)));
  int64_t row = 0;
  for (int n : sizes) {
    out.trees.push_back(RandomTree(rng, n, vocab, out.logits.data() + row * vocab));
    row += n;
  }
  return out;
}

class CudaVerifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    auto v = DeviceTreeVerifier::Create(DeviceTreeVerifierOptions{});
    ASSERT_TRUE(v.ok()) << v.status();
    verifier_ = std::move(*v);
  }

  // Uploads the batch's logits as f32 or bf16 and verifies on the device.
  absl::StatusOr<std::vector<VerifyResult>> DeviceVerify(const Batch& batch, const SamplingParams& sampling,
                                                         uint64_t seed, uint64_t offset, DType dtype = DType::kF32) {
    const int64_t rows = batch.rows();
    const size_t n = batch.logits.size();
    DeviceBuffer d(n * DTypeSize(dtype));
    if (dtype == DType::kF32) {
      EXPECT_EQ(cudaMemcpy(d.ptr, batch.logits.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    } else {
      std::vector<uint16_t> bits(n);
      for (size_t i = 0; i < n; ++i) bits[i] = FloatToBf16(batch.logits[i]);
      EXPECT_EQ(cudaMemcpy(d.ptr, bits.data(), n * sizeof(uint16_t), cudaMemcpyHostToDevice), cudaSuccess);
    }
    const TensorView view(d.ptr, dtype, Shape{rows, batch.vocab}, Device::Cuda(0));
    return verifier_->Verify(batch.trees, view, sampling, seed, offset);
  }

  std::unique_ptr<DeviceTreeVerifier> verifier_;
};

void ExpectSame(const std::vector<VerifyResult>& got, const std::vector<VerifyResult>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t b = 0; b < got.size(); ++b) {
    EXPECT_EQ(got[b].accepted_nodes, want[b].accepted_nodes) << "sequence " << b;
    EXPECT_EQ(got[b].tokens, want[b].tokens) << "sequence " << b;
  }
}

// ---- Greedy ------------------------------------------------------------------------------------

TEST_F(CudaVerifyTest, GreedyMatchesTheReference) {
  for (int64_t vocab : {int64_t{1000}, int64_t{129280}, int64_t{163840}}) {
    for (int batch : {1, 4, 32}) {
      const int max_nodes = vocab == 1000 ? 64 : 12;
      Batch data = RandomBatch(static_cast<uint64_t>(vocab * 100 + batch), batch, max_nodes, vocab, 2.0f);
      auto want = TreeVerifier::Verify(data.trees, data.HostViews(), SamplingParams{}, 0, 0);
      ASSERT_TRUE(want.ok()) << want.status();
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        auto got = DeviceVerify(data, SamplingParams{}, 0, 0, dtype);
        ASSERT_TRUE(got.ok()) << got.status();
        SCOPED_TRACE("V " + std::to_string(vocab) + " batch " + std::to_string(batch) + " " +
                     std::string(DTypeName(dtype)));
        ExpectSame(*got, *want);
      }
      int accepted = 0;
      for (const VerifyResult& r : *want) accepted += r.num_accepted();
      if (batch == 32) EXPECT_GT(accepted, 0);  // the trees follow the argmax often enough
    }
  }
}

// Equal maxima: the lowest id wins, inside one load group (row 0: 7 and 3), across splits (row 2:
// 150000 and 100) and across neighbouring threads' groups (row 4: 9000 and 8999).
TEST_F(CudaVerifyTest, GreedyTiesGoToTheLowestId) {
  const int64_t vocab = 163840;
  Batch data;
  data.vocab = vocab;
  data.logits.assign(6 * vocab, -1.0f);
  for (auto [row, id] : {std::pair{0, 7}, {0, 3}, {2, 150000}, {2, 100}, {4, 9000}, {4, 8999}, {5, 42}}) {
    data.logits[row * vocab + id] = 5.0f;
  }
  data.trees.push_back(*DraftTree::FromParents(std::vector<int64_t>{0, 7, 3, 150000, 100, 8999},
                                               std::vector<int32_t>{-1, 0, 0, 2, 2, 4}));
  auto want = TreeVerifier::Verify(data.trees, data.HostViews(), SamplingParams{}, 0, 0);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ((*want)[0].accepted_nodes, (std::vector<int32_t>{2, 4, 5}));
  EXPECT_EQ((*want)[0].tokens, (std::vector<int64_t>{3, 100, 8999, 42}));
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    auto got = DeviceVerify(data, SamplingParams{}, 0, 0, dtype);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSame(*got, *want);
  }
}

// ---- Stochastic ----------------------------------------------------------------------------------

// Whether the reference's decisions for sequence b lie within 1e-6 of a threshold: a coin against
// r(x) / m, the final coin against a cumulative boundary, or the top-p cut mass against top_p.
bool NearThreshold(const DraftTree& tree, const float* rows, int64_t vocab, const SamplingParams& s,
                   uint64_t seed, uint64_t offset, uint32_t b, const VerifyResult& ref) {
  constexpr double kWindow = 1e-6;
  std::vector<int32_t> path = {0};
  path.insert(path.end(), ref.accepted_nodes.begin(), ref.accepted_nodes.end());
  std::vector<float> probs(static_cast<size_t>(vocab));
  for (size_t step = 0; step < path.size(); ++step) {
    const float* z = rows + path[step] * vocab;
    if (s.top_p < 1.0f) {
      SamplingParams no_p = s;
      no_p.top_p = 1.0f;
      EXPECT_TRUE(TreeVerifier::ProcessedDistribution({z, static_cast<size_t>(vocab)}, no_p, probs).ok());
      std::vector<double> sorted(probs.begin(), probs.end());
      std::sort(sorted.rbegin(), sorted.rend());
      double cumulative = 0.0;
      for (double q : sorted) {
        cumulative += q;
        if (std::fabs(cumulative - s.top_p) < kWindow) return true;
        if (cumulative >= s.top_p) break;
      }
    }
    EXPECT_TRUE(TreeVerifier::ProcessedDistribution({z, static_cast<size_t>(vocab)}, s, probs).ok());
    std::vector<double> r(probs.begin(), probs.end());
    double mass = std::accumulate(r.begin(), r.end(), 0.0);
    bool accepted = false;
    for (int32_t c = tree.first_child[path[step]]; c != -1; c = tree.next_sibling[c]) {
      const double u = PhiloxCoin(seed, offset, b, static_cast<uint32_t>(c));
      const double threshold = r[tree.tokens[c]] / mass;
      if (threshold > 0.0 && std::fabs(u - threshold) < kWindow) return true;
      if (u < threshold) {
        accepted = true;
        break;
      }
      r[tree.tokens[c]] = 0.0;
      mass = std::accumulate(r.begin(), r.end(), 0.0);
    }
    if (!accepted) {
      const double target = PhiloxCoin(seed, offset, b, 0) * mass;
      double cumulative = 0.0;
      for (double q : r) {
        if (q <= 0.0) continue;
        cumulative += q;
        if (std::fabs(cumulative - target) < kWindow * mass) return true;
        if (target < cumulative) break;
      }
      return false;
    }
  }
  return false;
}

struct StochasticCase {
  float temperature;
  int top_k;
  float top_p;
};

class CudaVerifyStochasticTest : public CudaVerifyTest, public ::testing::WithParamInterface<StochasticCase> {};

TEST_P(CudaVerifyStochasticTest, MatchesTheReferenceOnThousandsOfCases) {
  const StochasticCase c = GetParam();
  const SamplingParams sampling{c.temperature, c.top_k, c.top_p};
  int sequences = 0, near = 0, accepted = 0;
  // Many small-vocabulary batches, then a few at the real vocabularies.
  struct Shape {
    int64_t vocab;
    int batch, max_nodes, calls;
  };
  for (const Shape& shape : {Shape{1000, 32, 16, 100}, Shape{129280, 4, 8, 2}, Shape{163840, 32, 6, 1}}) {
    for (int call = 0; call < shape.calls; ++call) {
      const uint64_t seed = 1000 + call, offset = 7 * call + static_cast<uint64_t>(shape.vocab);
      Batch data = RandomBatch(seed ^ static_cast<uint64_t>(shape.vocab), shape.batch, shape.max_nodes, shape.vocab, 3.0f);
      auto want = TreeVerifier::Verify(data.trees, data.HostViews(), sampling, seed, offset);
      ASSERT_TRUE(want.ok()) << want.status();
      auto got = DeviceVerify(data, sampling, seed, offset);
      ASSERT_TRUE(got.ok()) << got.status();
      for (size_t b = 0; b < want->size(); ++b) {
        ++sequences;
        accepted += (*want)[b].num_accepted();
        if ((*got)[b].tokens == (*want)[b].tokens && (*got)[b].accepted_nodes == (*want)[b].accepted_nodes) continue;
        const bool explained = NearThreshold(data.trees[b], data.logits.data() + data.offset(b) * shape.vocab,
                                             shape.vocab, sampling, seed, offset, static_cast<uint32_t>(b), (*want)[b]);
        EXPECT_TRUE(explained) << "V " << shape.vocab << " call " << call << " sequence " << b
                               << ": device and reference differ with no coin near a threshold";
        near += explained;
      }
    }
  }
  RecordProperty("sequences", sequences);
  RecordProperty("near_threshold_differences", near);
  EXPECT_GE(sequences, 3000);
  EXPECT_LE(near, sequences / 1000);  // expected ~0
  EXPECT_GT(accepted, sequences / 10);  // the cases exercise acceptance, not only corrections
}

INSTANTIATE_TEST_SUITE_P(Sampling, CudaVerifyStochasticTest,
                         ::testing::Values(StochasticCase{0.7f, 0, 1.0f}, StochasticCase{1.0f, 0, 1.0f},
                                           StochasticCase{0.7f, 20, 1.0f}, StochasticCase{1.0f, 20, 1.0f},
                                           StochasticCase{0.7f, 0, 0.9f}, StochasticCase{1.0f, 0, 0.9f},
                                           StochasticCase{0.7f, 20, 0.9f}, StochasticCase{1.0f, 20, 0.9f}));

// Seed and offset travel with the staged trees: a Launch captured once and replayed after Stages
// with other seeds or offsets draws each Stage's coins (the same results as an eager Verify with
// them), and those coins differ between the Stages (so the test fails if a replay reused the
// captured ones).
TEST_F(CudaVerifyTest, CapturedLaunchDrawsTheCoinsOfEachStage) {
  const SamplingParams sampling{1.0f, 0, 1.0f};
  const Batch data = RandomBatch(77, 32, 8, 1000, 1.0f);
  const size_t n = data.logits.size();
  DeviceBuffer d(n * sizeof(float));
  ASSERT_EQ(cudaMemcpy(d.ptr, data.logits.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  const TensorView view(d.ptr, DType::kF32, Shape{data.rows(), data.vocab}, Device::Cuda(0));
  ASSERT_TRUE(verifier_->Stage(data.trees, view, sampling, 1, 1).ok());
  auto graph = CudaGraph::Capture(verifier_->stream(), [&] { return verifier_->Launch(); });
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::vector<std::vector<VerifyResult>> replayed;
  for (const auto& [seed, offset] : {std::pair<uint64_t, uint64_t>{1, 2}, {1, 3}, {9, 2}}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " offset " << offset);
    ASSERT_TRUE(verifier_->Stage(data.trees, view, sampling, seed, offset).ok());
    ASSERT_TRUE((*graph)->Launch(verifier_->stream()).ok());
    auto got = verifier_->Finish();
    ASSERT_TRUE(got.ok()) << got.status();
    auto eager = verifier_->Verify(data.trees, view, sampling, seed, offset);
    ASSERT_TRUE(eager.ok()) << eager.status();
    ExpectSame(*got, *eager);
    replayed.push_back(std::move(*got));
  }
  const auto differ = [](const std::vector<VerifyResult>& a, const std::vector<VerifyResult>& b) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].tokens != b[i].tokens) return true;
    }
    return false;
  };
  EXPECT_TRUE(differ(replayed[0], replayed[1])) << "offsets 2 and 3 gave every sequence the same tokens";
  EXPECT_TRUE(differ(replayed[0], replayed[2])) << "seeds 1 and 9 gave every sequence the same tokens";
}

TEST_F(CudaVerifyTest, Bf16MatchesF32OnRepresentableLogits) {
  for (const SamplingParams& sampling : {SamplingParams{}, SamplingParams{1.0f, 0, 1.0f}, SamplingParams{0.7f, 20, 0.9f}}) {
    Batch data = RandomBatch(99, 32, 12, 129280, 3.0f);
    auto f32 = DeviceVerify(data, sampling, 5, 6, DType::kF32);
    auto bf16 = DeviceVerify(data, sampling, 5, 6, DType::kBF16);
    ASSERT_TRUE(f32.ok()) << f32.status();
    ASSERT_TRUE(bf16.ok()) << bf16.status();
    ExpectSame(*bf16, *f32);
  }
}

// Tied logits under top-k: the lower ids are kept (k = 2 over four equal maxima keeps ids 1 and 4).
TEST_F(CudaVerifyTest, TopKTiesKeepTheLowerIds) {
  Batch data;
  data.vocab = 4096;
  data.logits.assign(2 * data.vocab, -3.0f);
  for (int64_t id : {4, 1, 4000, 2000}) data.logits[id] = 2.0f;
  data.trees.push_back(*DraftTree::FromParents(std::vector<int64_t>{0, 2000}, std::vector<int32_t>{-1, 0}));
  const SamplingParams sampling{1.0f, 2, 1.0f};
  for (uint64_t seed = 0; seed < 64; ++seed) {
    auto want = TreeVerifier::Verify(data.trees, data.HostViews(), sampling, seed, 0);
    auto got = DeviceVerify(data, sampling, seed, 0);
    ASSERT_TRUE(want.ok() && got.ok());
    ExpectSame(*got, *want);
    // Token 2000 is outside the top-2: always rejected, and the correction is 1 or 4.
    EXPECT_EQ((*got)[0].num_accepted(), 0);
    EXPECT_THAT((std::vector<int64_t>{1, 4}), ::testing::Contains((*got)[0].tokens[0]));
  }
}

// The last remaining token of a residual is accepted with probability exactly 1: two finite logits,
// both drafted as children; rejecting the first leaves the second certain.
TEST_F(CudaVerifyTest, LastRemainingTokenIsAlwaysAccepted) {
  Batch data;
  data.vocab = 50000;
  data.logits.assign(3 * data.vocab, -kInf);
  data.logits[123] = 0.5f;
  data.logits[45678] = 0.3f;
  data.logits[data.vocab + 1] = 0.0f;
  data.logits[2 * data.vocab + 2] = 0.0f;
  data.trees.push_back(*DraftTree::FromParents(std::vector<int64_t>{0, 45678, 123}, std::vector<int32_t>{-1, 0, 0}));
  for (uint64_t seed = 0; seed < 200; ++seed) {
    auto got = DeviceVerify(data, SamplingParams{1.0f, 0, 1.0f}, seed, 3);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ((*got)[0].num_accepted(), 1);
    EXPECT_TRUE((*got)[0].tokens[0] == 45678 || (*got)[0].tokens[0] == 123);
  }
}

// ---- Lossless: the first emitted token is distributed as the target -------------------------------

TEST_F(CudaVerifyTest, FirstTokenFollowsTheTargetDistribution) {
  constexpr int64_t kVocab = 6;
  // Root children in mixed order with a repeated token, a grandchild under the first.
  const DraftTree tree = *DraftTree::FromParents(std::vector<int64_t>{0, 2, 0, 2, 5, 1},
                                                 std::vector<int32_t>{-1, 0, 0, 0, 0, 1});
  const float root[kVocab] = {0.3f, 0.5f, 1.0f, -0.2f, -1.0f, 0.1f};
  for (const SamplingParams& sampling : {SamplingParams{1.0f, 0, 1.0f}, SamplingParams{0.8f, 5, 0.9f}}) {
    Batch data;
    data.vocab = kVocab;
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    const int batch = 32;
    for (int b = 0; b < batch; ++b) {
      data.trees.push_back(tree);
      data.logits.insert(data.logits.end(), root, root + kVocab);
      for (int64_t i = kVocab; i < tree.size() * kVocab; ++i) data.logits.push_back(uniform(rng));
    }
    std::vector<float> p(kVocab);
    ASSERT_TRUE(TreeVerifier::ProcessedDistribution(root, sampling, p).ok());
    std::vector<int64_t> counts(kVocab, 0);
    const int calls = 1500;
    for (int call = 0; call < calls; ++call) {
      auto got = DeviceVerify(data, sampling, 77, static_cast<uint64_t>(call));
      ASSERT_TRUE(got.ok()) << got.status();
      for (const VerifyResult& r : *got) ++counts[r.tokens[0]];
    }
    const double draws = static_cast<double>(batch) * calls;
    double chi2 = 0.0;
    int bins = 0;
    for (int64_t i = 0; i < kVocab; ++i) {
      if (p[i] == 0.0f) {
        EXPECT_EQ(counts[i], 0) << "token " << i << " has zero target probability";
        continue;
      }
      const double e = p[i] * draws;
      chi2 += (counts[i] - e) * (counts[i] - e) / e;
      ++bins;
    }
    // Upper 1e-4 quantiles of chi-square with bins - 1 degrees of freedom (1..5).
    const double kCritical[] = {0.0, 15.137, 18.421, 21.108, 23.513, 25.745};
    EXPECT_LT(chi2, kCritical[bins - 1]) << "bins " << bins << " temperature " << sampling.temperature;
  }
}

// ---- The row pass's scalar head, vector body and scalar tail (raw launcher) -----------------------

// The raw launcher's outputs for a batch.
struct RawOutputs {
  std::vector<int32_t> num_accepted;  // -1 for a failing sequence
  std::vector<VerifyResult> results;  // empty entries for failing sequences
  std::vector<VerifyError> errors;
};

template <typename V>
void Upload(const DeviceBuffer& d, const std::vector<V>& host) {
  EXPECT_EQ(cudaMemcpy(d.ptr, host.data(), host.size() * sizeof(V), cudaMemcpyHostToDevice), cudaSuccess);
}

// Flattened trees (verify_ops.h's layout) on the device with the launcher's workspace and outputs:
// Params() sets everything of TreeVerifyLaunchParams but the logits (pointer, type, ld) and the
// sampling; Read() copies the outputs back.
class RawLaunch {
 public:
  RawLaunch(const std::vector<int32_t>& offsets, const std::vector<int64_t>& tokens,
            const std::vector<int32_t>& first_child, const std::vector<int32_t>& next_sibling, int max_nodes,
            int64_t vocab)
      : batch_(static_cast<int>(offsets.size()) - 1),
        rows_(static_cast<int64_t>(tokens.size())),
        max_nodes_(max_nodes),
        vocab_(vocab),
        offsets_(offsets.size() * 4),
        tokens_(tokens.size() * 8),
        first_child_(first_child.size() * 4),
        next_sibling_(next_sibling.size() * 4),
        workspace_(TreeVerifyWorkspaceBytes(rows_, vocab)),
        num_(batch_ * 4),
        nodes_(static_cast<size_t>(batch_) * max_nodes * 4),
        out_(static_cast<size_t>(batch_) * max_nodes * 8),
        errors_(batch_ * sizeof(VerifyError)) {
    Upload(offsets_, offsets);
    Upload(tokens_, tokens);
    Upload(first_child_, first_child);
    Upload(next_sibling_, next_sibling);
  }

  TreeVerifyLaunchParams Params() const {
    TreeVerifyLaunchParams p;
    p.batch = batch_;
    p.row_offsets = static_cast<int32_t*>(offsets_.ptr);
    p.total_rows = rows_;
    p.max_nodes = max_nodes_;
    p.tokens = static_cast<int64_t*>(tokens_.ptr);
    p.first_child = static_cast<int32_t*>(first_child_.ptr);
    p.next_sibling = static_cast<int32_t*>(next_sibling_.ptr);
    p.vocab = vocab_;
    p.workspace = workspace_.ptr;
    p.workspace_bytes = TreeVerifyWorkspaceBytes(rows_, vocab_);
    p.num_accepted = static_cast<int32_t*>(num_.ptr);
    p.accepted_nodes = static_cast<int32_t*>(nodes_.ptr);
    p.out_tokens = static_cast<int64_t*>(out_.ptr);
    p.errors = static_cast<VerifyError*>(errors_.ptr);
    return p;
  }

  RawOutputs Read() const {
    const size_t slots = static_cast<size_t>(batch_) * max_nodes_;
    std::vector<int32_t> nodes(slots);
    std::vector<int64_t> out(slots);
    RawOutputs r;
    r.num_accepted.resize(batch_);
    r.errors.resize(batch_);
    EXPECT_EQ(cudaMemcpy(r.num_accepted.data(), num_.ptr, batch_ * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(nodes.data(), nodes_.ptr, slots * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), out_.ptr, slots * 8, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(r.errors.data(), errors_.ptr, batch_ * sizeof(VerifyError), cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (int b = 0; b < batch_; ++b) {
      VerifyResult v;
      const int n = r.num_accepted[b];
      if (n >= 0) {
        v.accepted_nodes.assign(nodes.begin() + b * max_nodes_, nodes.begin() + b * max_nodes_ + n);
        v.tokens.assign(out.begin() + b * max_nodes_, out.begin() + b * max_nodes_ + n + 1);
      }
      r.results.push_back(std::move(v));
    }
    return r;
  }

 private:
  int batch_;
  int64_t rows_;
  int max_nodes_;
  int64_t vocab_;
  DeviceBuffer offsets_, tokens_, first_child_, next_sibling_, workspace_, num_, nodes_, out_, errors_;
};

// Verifies `data` through LaunchTreeVerify with its logits stored `shift` elements into the buffer
// with row stride `ld` (>= V): rows start off the 16-byte boundary when shift or ld is not a
// multiple of the vector width. The padding (columns [V, ld) and the shift) holds NaN, which the
// kernels must never read.
RawOutputs RawVerify(const Batch& data, const SamplingParams& sampling, uint64_t seed, uint64_t offset, DType dtype,
                     int64_t ld, int64_t shift) {
  const int64_t rows = data.rows(), vocab = data.vocab;
  std::vector<int32_t> offsets = {0};
  std::vector<int64_t> tokens;
  std::vector<int32_t> first_child, next_sibling;
  int max_nodes = 1;
  for (const DraftTree& t : data.trees) {
    offsets.push_back(offsets.back() + t.size());
    tokens.insert(tokens.end(), t.tokens.begin(), t.tokens.end());
    first_child.insert(first_child.end(), t.first_child.begin(), t.first_child.end());
    next_sibling.insert(next_sibling.end(), t.next_sibling.begin(), t.next_sibling.end());
    max_nodes = std::max(max_nodes, t.size());
  }
  const RawLaunch launch(offsets, tokens, first_child, next_sibling, max_nodes, vocab);
  const size_t elems = static_cast<size_t>(shift + rows * ld);
  std::vector<float> padded(elems, kNaN);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(data.logits.begin() + r * vocab, vocab, padded.begin() + shift + r * ld);
  }
  DeviceBuffer d_logits(elems * DTypeSize(dtype));
  if (dtype == DType::kF32) {
    Upload(d_logits, padded);
  } else {
    std::vector<uint16_t> bits(elems);
    for (size_t i = 0; i < elems; ++i) bits[i] = FloatToBf16(padded[i]);
    Upload(d_logits, bits);
  }
  TreeVerifyLaunchParams p = launch.Params();
  p.logits = static_cast<char*>(d_logits.ptr) + shift * DTypeSize(dtype);
  p.logits_type = dtype == DType::kF32 ? VerifyLogitsType::kF32 : VerifyLogitsType::kBf16;
  p.ld = ld;
  p.temperature = sampling.temperature;
  p.top_k = sampling.top_k;
  p.top_p = sampling.top_p;
  p.seed = seed;
  p.offset = offset;
  EXPECT_EQ(LaunchTreeVerify(p, /*programmatic=*/true, nullptr), cudaSuccess);
  return launch.Read();
}

// Row layouts: (ld, shift) for rows on and off the 16-byte boundary, the vocabulary a multiple of 8
// or not.
std::vector<std::pair<int64_t, int64_t>> Layouts(int64_t vocab) {
  return {{vocab, 0}, {vocab + 1, 0}, {vocab, 1}, {vocab + 3, 5}, {vocab + 8, 7}};
}

TEST_F(CudaVerifyTest, UnalignedRowsAndOddVocabulariesMatchTheReference) {
  for (int64_t vocab : {int64_t{1003}, int64_t{40003}, int64_t{163840}}) {
    // At V 163840 ~100 rows: 5 splits of 32768 ids, several chunks per thread.
    const int batch = vocab == 163840 ? 24 : 4, max_nodes = vocab == 163840 ? 8 : 6;
    Batch data = RandomBatch(static_cast<uint64_t>(vocab), batch, max_nodes, vocab, 3.0f);
    for (const SamplingParams& sampling : {SamplingParams{}, SamplingParams{1.0f, 0, 1.0f}, SamplingParams{0.7f, 0, 1.0f}}) {
      for (uint64_t seed = 0; seed < 3; ++seed) {
        auto want = TreeVerifier::Verify(data.trees, data.HostViews(), sampling, seed, 9);
        ASSERT_TRUE(want.ok()) << want.status();
        for (auto [ld, shift] : Layouts(vocab)) {
          for (DType dtype : {DType::kF32, DType::kBF16}) {
            SCOPED_TRACE("V " + std::to_string(vocab) + " ld " + std::to_string(ld) + " shift " + std::to_string(shift) +
                         " T " + std::to_string(sampling.temperature) + " seed " + std::to_string(seed) + " " +
                         std::string(DTypeName(dtype)));
            const RawOutputs got = RawVerify(data, sampling, seed, 9, dtype, ld, shift);
            for (size_t b = 0; b < want->size(); ++b) {
              EXPECT_EQ(got.errors[b].kind, static_cast<int64_t>(VerifyErrorKind::kNone)) << "sequence " << b;
              if (got.results[b].tokens == (*want)[b].tokens &&
                  got.results[b].accepted_nodes == (*want)[b].accepted_nodes) {
                continue;
              }
              EXPECT_TRUE(sampling.temperature > 0.0f &&
                          NearThreshold(data.trees[b], data.logits.data() + data.offset(b) * vocab, vocab, sampling,
                                        seed, 9, static_cast<uint32_t>(b), (*want)[b]))
                  << "sequence " << b << " differs from the reference";
            }
          }
        }
      }
    }
  }
}

// V = 40003 (not a multiple of 8) over 128 rows: 4 splits of 10008 ids per row, so a thread of the
// row pass meets several chunks (256 threads x 4 vectors of 8 bf16 / 4 f32 per chunk).
constexpr int64_t kOddVocab = 40003;
constexpr int64_t kManyRows = 128;

// One-node trees: the emitted token is the row's argmax (greedy). Ties placed inside one vector,
// across the vectors of one chunk, across chunks and splits, between the head and the body, the
// body and the tail; a row whose only finite logits sit in the head or the tail; -0 against +0.
TEST_F(CudaVerifyTest, ArgmaxTiesAcrossHeadBodyAndTailGoToTheLowestId) {
  const int64_t vocab = kOddVocab;
  const std::vector<std::vector<int64_t>> ties = {
      {3, 5},          {5, 3},           {9, 9 + 2048},   {9 + 2048, 9},   {17, 17 + 8192},
      {17 + 8192, 17}, {30000, 100},     {0, 20000},      {1, 2},          {vocab - 1, 4},
      {vocab - 2, vocab - 1}, {10007, 10008, 10009}, {12, 12 + 1024, 12 + 4096, 12 + 16384},
      {9000, 8999, 8192 + 3},
  };
  Batch data;
  data.vocab = vocab;
  for (const std::vector<int64_t>& ids : ties) {
    const size_t at = data.logits.size();
    data.logits.resize(at + vocab, -1.0f);
    for (int64_t id : ids) data.logits[at + id] = 4.0f;
  }
  for (int64_t id : {int64_t{0}, int64_t{2}, vocab - 1}) {  // only one finite logit, the rest -inf
    const size_t at = data.logits.size();
    data.logits.resize(at + vocab, -kInf);
    data.logits[at + id] = -7.0f;
  }
  {
    const size_t at = data.logits.size();  // signed zeros tie: the lower id wins
    data.logits.resize(at + vocab, -1.0f);
    data.logits[at + 20] = 0.0f;
    data.logits[at + 10] = -0.0f;
  }
  std::mt19937_64 rng(4);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  while (data.rows() < kManyRows) {  // random rows up to many rows (long splits)
    for (int64_t i = 0; i < vocab; ++i) data.logits.push_back(Bf16ToFloat(FloatToBf16(normal(rng))));
  }
  for (int64_t r = 0; r < data.rows(); ++r) {
    data.trees.push_back(*DraftTree::FromParents(std::vector<int64_t>{0}, std::vector<int32_t>{-1}));
  }
  auto want = TreeVerifier::Verify(data.trees, data.HostViews(), SamplingParams{}, 0, 0);
  ASSERT_TRUE(want.ok()) << want.status();
  for (size_t r = 0; r < ties.size(); ++r) {
    EXPECT_EQ((*want)[r].tokens[0], *std::min_element(ties[r].begin(), ties[r].end()));
  }
  for (auto [ld, shift] : Layouts(vocab)) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE("ld " + std::to_string(ld) + " shift " + std::to_string(shift) + " " + std::string(DTypeName(dtype)));
      const RawOutputs got = RawVerify(data, SamplingParams{}, 0, 0, dtype, ld, shift);
      for (size_t b = 0; b < want->size(); ++b) {
        EXPECT_EQ(got.results[b].tokens, (*want)[b].tokens) << "row " << b;
      }
      // Sampling over a row with one finite logit must emit it.
      const RawOutputs sampled = RawVerify(data, SamplingParams{1.0f, 0, 1.0f}, 4, 5, dtype, ld, shift);
      for (size_t b = ties.size(); b < ties.size() + 3; ++b) {
        EXPECT_EQ(sampled.results[b].tokens, (*want)[b].tokens) << "row " << b;
      }
    }
  }
}

// NaN / +inf anywhere in a row (the head, the vector body, the tail, split and chunk boundaries) is
// reported at the lowest bad id, with its kind; an all -inf row has no finite logit.
TEST_F(CudaVerifyTest, BadLogitsAreFoundInHeadBodyAndTail) {
  const int64_t vocab = kOddVocab;
  Batch data = RandomBatch(21, 3, 3, vocab, 1.0f);
  while (data.rows() < kManyRows) {  // one-node sequences up to many rows (long splits)
    data.trees.push_back(*DraftTree::FromParents(std::vector<int64_t>{0}, std::vector<int32_t>{-1}));
    data.logits.resize(data.logits.size() + vocab, 0.5f);
  }
  const int64_t row = data.offset(1);  // sequence 1, local row 0
  struct Case {
    std::vector<std::pair<int64_t, float>> bad;  // (id, NaN or +inf)
    int64_t want_id;
    VerifyErrorKind want_kind;
  };
  std::vector<Case> cases;
  for (int64_t id : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{2050},
                     int64_t{8191}, int64_t{8192}, int64_t{8193}, int64_t{10007}, int64_t{10008}, int64_t{10009},
                     int64_t{30015}, vocab - 2, vocab - 1}) {
    cases.push_back({{{id, kNaN}}, id, VerifyErrorKind::kNaN});
    cases.push_back({{{id, kInf}}, id, VerifyErrorKind::kPosInf});
  }
  cases.push_back({{{40, kNaN}, {37, kInf}}, 37, VerifyErrorKind::kPosInf});          // one vector
  cases.push_back({{{37, kNaN}, {40, kInf}}, 37, VerifyErrorKind::kNaN});
  cases.push_back({{{37 + 2048, kNaN}, {37, kInf}}, 37, VerifyErrorKind::kPosInf});   // one chunk
  cases.push_back({{{vocab - 1, kNaN}, {30000, kInf}}, 30000, VerifyErrorKind::kPosInf});  // body and tail
  cases.push_back({{{5000, kNaN}, {1, kInf}}, 1, VerifyErrorKind::kPosInf});          // head and body
  for (auto [ld, shift] : {std::pair{vocab, int64_t{0}}, std::pair{vocab + 1, int64_t{0}}, std::pair{vocab + 3, int64_t{5}}}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (const SamplingParams& sampling : {SamplingParams{}, SamplingParams{1.0f, 0, 1.0f}}) {
        for (const Case& c : cases) {
          Batch bad = data;
          for (auto [id, value] : c.bad) bad.logits[row * vocab + id] = value;
          SCOPED_TRACE("ld " + std::to_string(ld) + " shift " + std::to_string(shift) + " " +
                       std::string(DTypeName(dtype)) + " T " + std::to_string(sampling.temperature) + " id " +
                       std::to_string(c.want_id));
          const RawOutputs got = RawVerify(bad, sampling, 1, 2, dtype, ld, shift);
          EXPECT_EQ(got.errors[1].kind, static_cast<int64_t>(c.want_kind));
          EXPECT_EQ(got.errors[1].row, 0);
          EXPECT_EQ(got.errors[1].token, c.want_id);
          for (size_t b = 0; b < got.errors.size(); ++b) {
            if (b != 1) EXPECT_EQ(got.errors[b].kind, static_cast<int64_t>(VerifyErrorKind::kNone)) << b;
          }
        }
        Batch dead = data;
        std::fill_n(dead.logits.begin() + row * vocab, vocab, -kInf);
        const RawOutputs got = RawVerify(dead, sampling, 1, 2, dtype, ld, shift);
        EXPECT_EQ(got.errors[1].kind, static_cast<int64_t>(VerifyErrorKind::kNoFiniteLogit));
        EXPECT_EQ(got.errors[1].row, 0);
      }
    }
  }
}

// ---- Bad input -----------------------------------------------------------------------------------

void ExpectInvalid(const absl::Status& status, const std::string& text) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(text));
}

TEST_F(CudaVerifyTest, BadLogitsNameSequenceRowAndToken) {
  for (const SamplingParams& sampling : {SamplingParams{}, SamplingParams{1.0f, 0, 1.0f}}) {
    Batch data = RandomBatch(5, 4, 6, 129280, 1.0f);
    const int64_t row = data.offset(2) + std::min(1, data.trees[2].size() - 1);
    const int64_t local = row - data.offset(2);
    // Two NaNs in one row, in different splits: the lower id is reported.
    data.logits[row * data.vocab + 100000] = kNaN;
    data.logits[row * data.vocab + 77] = kNaN;
    auto got = DeviceVerify(data, sampling, 1, 2);
    ExpectInvalid(got.status(), "sequence 2: target logits row " + std::to_string(local) + " has NaN at token id 77");
    data.logits[row * data.vocab + 77] = kInf;
    data.logits[row * data.vocab + 100000] = 0.0f;
    got = DeviceVerify(data, sampling, 1, 2);
    ExpectInvalid(got.status(), "sequence 2: target logits row " + std::to_string(local) + " has +inf at token id 77");
    std::fill_n(data.logits.begin() + row * data.vocab, data.vocab, -kInf);
    got = DeviceVerify(data, sampling, 1, 2);
    ExpectInvalid(got.status(), "sequence 2: target logits row " + std::to_string(local) + " has no finite logit");
  }
}

TEST_F(CudaVerifyTest, BadTreesTokensAndShapesAreInvalid) {
  Batch data = RandomBatch(8, 3, 5, 1000, 1.0f);
  data.trees[1] = *DraftTree::FromParents(std::vector<int64_t>{0, 1, 2}, std::vector<int32_t>{-1, 0, 1});
  data.logits.resize(static_cast<size_t>(data.offset(3) * data.vocab), 0.0f);
  Batch bad_token = data;
  bad_token.trees[1].tokens[2] = 1000;
  ExpectInvalid(DeviceVerify(bad_token, SamplingParams{}, 0, 0).status(),
                "sequence 1: node 2 token 1000 is out of range [0, 1000)");
  Batch bad_tree = data;
  bad_tree.trees[1].first_child[1] = -1;  // node 2 is no longer listed as node 1's child
  ExpectInvalid(DeviceVerify(bad_tree, SamplingParams{}, 0, 0).status(), "sequence 1: ");
  // Logits with the wrong number of rows.
  DeviceBuffer d(static_cast<size_t>(data.rows() + 1) * 1000 * sizeof(float));
  const TensorView view(d.ptr, DType::kF32, Shape{data.rows() + 1, 1000}, Device::Cuda(0));
  ExpectInvalid(verifier_->Verify(data.trees, view, SamplingParams{}, 0, 0).status(), "tree nodes over 3 sequences");
  // Host logits.
  ExpectInvalid(verifier_->Verify(data.trees, TensorView(data.logits.data(), DType::kF32, Shape{data.rows(), 1000}),
                                  SamplingParams{}, 0, 0)
                    .status(),
                "on cuda:0");
  ExpectInvalid(DeviceVerify(data, SamplingParams{-1.0f, 0, 1.0f}, 0, 0).status(), "temperature");
}

// The raw launcher: device-side checks of what DeviceTreeVerifier checks on the host, and
// cudaErrorInvalidValue for bad parameters.
TEST_F(CudaVerifyTest, LauncherReportsErrorsPerSequence) {
  const int64_t vocab = 100;
  // Sequence 0: fine (2 nodes); sequence 1: token out of range at node 1; sequence 2: a first_child
  // pointing backwards at node 1.
  const std::vector<int32_t> offsets = {0, 2, 4, 6};
  const std::vector<int64_t> tokens = {0, 3, 0, 100, 0, 5};
  const std::vector<int32_t> first_child = {1, -1, 1, -1, 1, 0};
  const std::vector<int32_t> next_sibling = {-1, -1, -1, -1, -1, -1};
  std::vector<float> logits(6 * vocab, 0.0f);
  logits[3] = 1.0f;  // root argmax 3 -> node 1 accepted
  const RawLaunch launch(offsets, tokens, first_child, next_sibling, 2, vocab);
  DeviceBuffer d_logits(logits.size() * 4);
  Upload(d_logits, logits);
  TreeVerifyLaunchParams p = launch.Params();
  p.logits = d_logits.ptr;
  p.ld = vocab;
  ASSERT_EQ(LaunchTreeVerify(p, /*programmatic=*/true, nullptr), cudaSuccess);
  const RawOutputs got = launch.Read();
  const std::vector<int32_t>& num = got.num_accepted;
  const std::vector<VerifyError>& err = got.errors;
  EXPECT_EQ(num[0], 1);
  // Node 1's token, then the bonus: the argmax of row 1 (all zeros) is token 0.
  EXPECT_EQ(got.results[0].tokens, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(err[0].kind, static_cast<int64_t>(VerifyErrorKind::kNone));
  EXPECT_EQ(num[1], -1);
  EXPECT_EQ(err[1].kind, static_cast<int64_t>(VerifyErrorKind::kTokenOutOfRange));
  EXPECT_EQ(err[1].row, 1);
  EXPECT_EQ(err[1].token, 100);
  EXPECT_EQ(num[2], -1);
  EXPECT_EQ(err[2].kind, static_cast<int64_t>(VerifyErrorKind::kBadTree));
  EXPECT_EQ(err[2].row, 1);

  const size_t ws = p.workspace_bytes;
  TreeVerifyLaunchParams small = p;
  small.workspace_bytes = ws - 1;
  EXPECT_EQ(LaunchTreeVerify(small, true, nullptr), cudaErrorInvalidValue);
  TreeVerifyLaunchParams no_tokens = p;
  no_tokens.tokens = nullptr;
  EXPECT_EQ(LaunchTreeVerify(no_tokens, true, nullptr), cudaErrorInvalidValue);
  TreeVerifyLaunchParams bad_ld = p;
  bad_ld.ld = vocab - 1;
  EXPECT_EQ(LaunchTreeVerify(bad_ld, true, nullptr), cudaErrorInvalidValue);
  TreeVerifyLaunchParams bad_p = p;
  bad_p.top_p = 0.0f;
  EXPECT_EQ(LaunchTreeVerify(bad_p, true, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace eagle3::cuda
