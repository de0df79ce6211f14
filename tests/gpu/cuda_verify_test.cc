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

#include "eagle3/cuda/device_allocator.h"
#include "eagle3/cuda/device_tree_verifier.h"
#include "eagle3/cuda/verify_ops.h"
#include "eagle3/half.h"
#include "eagle3/philox.h"
#include "eagle3/tree_verifier.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3::cuda {
namespace {

using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// A device buffer freed at scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

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
  const size_t ws = TreeVerifyWorkspaceBytes(6, vocab);
  DeviceBuffer d_off(16 * 4), d_tok(6 * 8), d_fc(6 * 4), d_ns(6 * 4), d_logits(logits.size() * 4), d_ws(ws),
      d_num(3 * 4), d_nodes(3 * 2 * 4), d_out(3 * 2 * 8), d_err(3 * sizeof(VerifyError));
  cudaMemcpy(d_off.ptr, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_tok.ptr, tokens.data(), tokens.size() * 8, cudaMemcpyHostToDevice);
  cudaMemcpy(d_fc.ptr, first_child.data(), first_child.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_ns.ptr, next_sibling.data(), next_sibling.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_logits.ptr, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice);
  TreeVerifyLaunchParams p;
  p.batch = 3;
  p.row_offsets = static_cast<int32_t*>(d_off.ptr);
  p.total_rows = 6;
  p.max_nodes = 2;
  p.tokens = static_cast<int64_t*>(d_tok.ptr);
  p.first_child = static_cast<int32_t*>(d_fc.ptr);
  p.next_sibling = static_cast<int32_t*>(d_ns.ptr);
  p.logits = d_logits.ptr;
  p.ld = vocab;
  p.vocab = vocab;
  p.workspace = d_ws.ptr;
  p.workspace_bytes = ws;
  p.num_accepted = static_cast<int32_t*>(d_num.ptr);
  p.accepted_nodes = static_cast<int32_t*>(d_nodes.ptr);
  p.out_tokens = static_cast<int64_t*>(d_out.ptr);
  p.errors = static_cast<VerifyError*>(d_err.ptr);
  ASSERT_EQ(LaunchTreeVerify(p, nullptr), cudaSuccess);
  std::vector<int32_t> num(3);
  std::vector<VerifyError> err(3);
  std::vector<int64_t> out(6);
  ASSERT_EQ(cudaMemcpy(num.data(), d_num.ptr, 12, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(err.data(), d_err.ptr, 3 * sizeof(VerifyError), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(out.data(), d_out.ptr, 48, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(num[0], 1);
  EXPECT_EQ(out[0], 3);  // accepted node 1's token
  EXPECT_EQ(out[1], 0);  // bonus: argmax of row 1 (all zeros) = token 0
  EXPECT_EQ(err[0].kind, static_cast<int64_t>(VerifyErrorKind::kNone));
  EXPECT_EQ(num[1], -1);
  EXPECT_EQ(err[1].kind, static_cast<int64_t>(VerifyErrorKind::kTokenOutOfRange));
  EXPECT_EQ(err[1].row, 1);
  EXPECT_EQ(err[1].token, 100);
  EXPECT_EQ(num[2], -1);
  EXPECT_EQ(err[2].kind, static_cast<int64_t>(VerifyErrorKind::kBadTree));
  EXPECT_EQ(err[2].row, 1);

  TreeVerifyLaunchParams small = p;
  small.workspace_bytes = ws - 1;
  EXPECT_EQ(LaunchTreeVerify(small, nullptr), cudaErrorInvalidValue);
  TreeVerifyLaunchParams no_tokens = p;
  no_tokens.tokens = nullptr;
  EXPECT_EQ(LaunchTreeVerify(no_tokens, nullptr), cudaErrorInvalidValue);
  TreeVerifyLaunchParams bad_ld = p;
  bad_ld.ld = vocab - 1;
  EXPECT_EQ(LaunchTreeVerify(bad_ld, nullptr), cudaErrorInvalidValue);
  TreeVerifyLaunchParams bad_p = p;
  bad_p.top_p = 0.0f;
  EXPECT_EQ(LaunchTreeVerify(bad_p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace eagle3::cuda
