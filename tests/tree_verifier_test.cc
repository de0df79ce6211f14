#include "eagle3/tree_verifier.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "eagle3/philox.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

void ExpectInvalid(const absl::Status& status, const std::string& text) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(text));
}

DraftTree Tree(std::vector<int64_t> tokens, std::vector<int32_t> parents) {
  auto tree = DraftTree::FromParents(tokens, parents);
  EXPECT_TRUE(tree.ok()) << tree.status();
  return *tree;
}

// Row-major [N, V] logits that own their storage.
struct Logits {
  int64_t n, v;
  std::vector<float> data;
  Logits(int64_t rows, int64_t vocab, float fill = 0.0f) : n(rows), v(vocab), data(rows * vocab, fill) {}
  float* row(int64_t i) { return data.data() + i * v; }
  TensorView view() { return TensorView(data.data(), DType::kF32, Shape{n, v}); }
};

const SamplingParams kGreedy{};

// ---- Greedy ------------------------------------------------------------------------------------

TEST(TreeVerifierGreedyTest, AcceptsADeepPathAndAddsTheBonus) {
  // 0 -> {1: tok 3, 2: tok 5}; 1 -> {3: tok 2, 4: tok 4}; 4 -> {5: tok 1}.
  const DraftTree tree = Tree({9, 3, 5, 2, 4, 1}, {-1, 0, 0, 1, 1, 4});
  Logits logits(6, 8);
  logits.row(0)[3] = 1.0f;  // argmax 3 -> node 1
  logits.row(1)[4] = 2.0f;  // argmax 4 -> node 4 (its second child)
  logits.row(4)[1] = 0.5f;  // argmax 1 -> node 5
  logits.row(5)[6] = 3.0f;  // bonus 6 at the leaf
  const TensorView view = logits.view();
  auto results = TreeVerifier::Verify(std::span(&tree, 1), std::span(&view, 1), kGreedy, 0, 0);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_THAT((*results)[0].accepted_nodes, ElementsAre(1, 4, 5));
  EXPECT_THAT((*results)[0].tokens, ElementsAre(3, 4, 1, 6));
  EXPECT_EQ((*results)[0].num_accepted(), 3);
}

TEST(TreeVerifierGreedyTest, RejectsAtTheRoot) {
  const DraftTree tree = Tree({9, 3, 5}, {-1, 0, 0});
  Logits logits(3, 8);
  logits.row(0)[7] = 1.0f;
  const TensorView view = logits.view();
  auto results = TreeVerifier::Verify(std::span(&tree, 1), std::span(&view, 1), kGreedy, 0, 0);
  ASSERT_TRUE(results.ok());
  EXPECT_TRUE((*results)[0].accepted_nodes.empty());
  EXPECT_THAT((*results)[0].tokens, ElementsAre(7));
}

TEST(TreeVerifierGreedyTest, FirstMatchingSiblingWins) {
  // Two siblings carry token 2; the first in sibling order is accepted, and its row decides next.
  DraftTree tree = Tree({9, 2, 2, 5, 6}, {-1, 0, 0, 1, 2});
  Logits logits(5, 8);
  logits.row(0)[2] = 1.0f;
  logits.row(1)[5] = 1.0f;  // node 1's child 3 has token 5
  logits.row(2)[6] = 1.0f;  // node 2's child 4 has token 6
  logits.row(3)[0] = 1.0f;
  logits.row(4)[0] = 1.0f;
  const TensorView view = logits.view();
  auto results = TreeVerifier::Verify(std::span(&tree, 1), std::span(&view, 1), kGreedy, 0, 0);
  ASSERT_TRUE(results.ok());
  EXPECT_THAT((*results)[0].accepted_nodes, ElementsAre(1, 3));
  EXPECT_THAT((*results)[0].tokens, ElementsAre(2, 5, 0));

  // Reversed sibling order: node 2 comes first.
  tree.first_child[0] = 2;
  tree.next_sibling[2] = 1;
  tree.next_sibling[1] = -1;
  results = TreeVerifier::Verify(std::span(&tree, 1), std::span(&view, 1), kGreedy, 0, 0);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_THAT((*results)[0].accepted_nodes, ElementsAre(2, 4));
  EXPECT_THAT((*results)[0].tokens, ElementsAre(2, 6, 0));
}

TEST(TreeVerifierGreedyTest, BonusIsTheArgmaxAtTheLastAcceptedNode) {
  const DraftTree tree = Tree({9, 3, 1, 2}, {-1, 0, 1, 1});
  Logits logits(4, 8);
  logits.row(0)[3] = 1.0f;
  // Node 1's children carry 1 and 2; its argmax is a tie of 4 and 6, which goes to the lower id.
  logits.row(1)[4] = 2.0f;
  logits.row(1)[6] = 2.0f;
  const TensorView view = logits.view();
  // Top-k / top-p do not change greedy verification.
  const SamplingParams greedy_with_filters{0.0f, 1, 0.1f};
  auto results = TreeVerifier::Verify(std::span(&tree, 1), std::span(&view, 1), greedy_with_filters, 5, 7);
  ASSERT_TRUE(results.ok());
  EXPECT_THAT((*results)[0].accepted_nodes, ElementsAre(1));
  EXPECT_THAT((*results)[0].tokens, ElementsAre(3, 4));
}

TEST(TreeVerifierGreedyTest, BatchOfDifferentTrees) {
  const std::vector<DraftTree> trees = {Tree({0, 1}, {-1, 0}), Tree({0, 1, 2, 3}, {-1, 0, 1, 2}), Tree({0}, {-1})};
  Logits a(2, 4), b(4, 4), c(1, 4);
  a.row(0)[1] = 1;  // accept, then bonus argmax of row 1 = 0
  b.row(0)[1] = 1;
  b.row(1)[2] = 1;
  b.row(2)[0] = 1;  // reject node 3 (token 3): bonus 0
  c.row(0)[3] = 1;  // root-only tree: just the next token
  const std::vector<TensorView> views = {a.view(), b.view(), c.view()};
  auto results = TreeVerifier::Verify(trees, views, kGreedy, 0, 0);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 3u);
  EXPECT_THAT((*results)[0].tokens, ElementsAre(1, 0));
  EXPECT_THAT((*results)[1].accepted_nodes, ElementsAre(1, 2));
  EXPECT_THAT((*results)[1].tokens, ElementsAre(1, 2, 0));
  EXPECT_THAT((*results)[2].tokens, ElementsAre(3));
}

// ---- Processed distribution ----------------------------------------------------------------------

std::vector<float> Processed(const std::vector<float>& logits, SamplingParams s) {
  std::vector<float> probs(logits.size());
  absl::Status st = TreeVerifier::ProcessedDistribution(logits, s, probs);
  EXPECT_TRUE(st.ok()) << st;
  return probs;
}

TEST(ProcessedDistributionTest, TemperatureTopKTopP) {
  using ::testing::FloatNear;
  using ::testing::Pointwise;
  const std::vector<float> logits = {std::log(1.0f), std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  auto near = [](std::vector<float> v) { return Pointwise(FloatNear(1e-6f), v); };
  EXPECT_THAT(Processed(logits, {1.0f, 0, 1.0f}), near({0.1f, 0.2f, 0.3f, 0.4f}));
  EXPECT_THAT(Processed(logits, {0.5f, 0, 1.0f}), near({1 / 30.f, 4 / 30.f, 9 / 30.f, 16 / 30.f}));
  EXPECT_THAT(Processed(logits, {1.0f, 2, 1.0f}), near({0, 0, 3 / 7.f, 4 / 7.f}));
  EXPECT_THAT(Processed(logits, {1.0f, 4, 1.0f}), near({0.1f, 0.2f, 0.3f, 0.4f}));  // k = V: off
  EXPECT_THAT(Processed(logits, {1.0f, 9, 1.0f}), near({0.1f, 0.2f, 0.3f, 0.4f}));
  // top-p 0.5: 0.4 < 0.5, 0.4 + 0.3 >= 0.5 -> {3, 2}; top-p 0.75: three tokens.
  EXPECT_THAT(Processed(logits, {1.0f, 0, 0.5f}), near({0, 0, 3 / 7.f, 4 / 7.f}));
  EXPECT_THAT(Processed(logits, {1.0f, 0, 0.75f}), near({0, 2 / 9.f, 3 / 9.f, 4 / 9.f}));
  // top-k then top-p on the renormalized top-k: {1, 2, 3} -> 2/9, 3/9, 4/9; top-p 0.5 keeps {3, 2}.
  EXPECT_THAT(Processed(logits, {1.0f, 3, 0.5f}), near({0, 0, 3 / 7.f, 4 / 7.f}));
  // A tiny top-p keeps the single most probable token.
  EXPECT_THAT(Processed(logits, {1.0f, 0, 0.01f}), near({0, 0, 0, 1}));
  // -inf is a masked token.
  const float ninf = -std::numeric_limits<float>::infinity();
  EXPECT_THAT(Processed({0.0f, ninf, 0.0f}, {2.0f, 0, 1.0f}), near({0.5f, 0, 0.5f}));
}

TEST(ProcessedDistributionTest, TiesKeepTheLowerIds) {
  const std::vector<float> flat = {1.0f, 1.0f, 1.0f, 0.0f};
  EXPECT_THAT(Processed(flat, {1.0f, 2, 1.0f}), ElementsAre(0.5f, 0.5f, 0.0f, 0.0f));
  const std::vector<float> uniform = {0.0f, 0.0f, 0.0f, 0.0f};
  // 0.25 + 0.25 >= 0.5 exactly: ids 0 and 1 stay.
  EXPECT_THAT(Processed(uniform, {1.0f, 0, 0.5f}), ElementsAre(0.5f, 0.5f, 0.0f, 0.0f));
  EXPECT_THAT(Processed(uniform, {1.0f, 3, 0.6f}), ElementsAre(0.5f, 0.5f, 0.0f, 0.0f));
}

TEST(ProcessedDistributionTest, BadInputIsInvalid) {
  std::vector<float> probs(3);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  ExpectInvalid(TreeVerifier::ProcessedDistribution(std::vector<float>{0, 1, nan}, {1.0f, 0, 1.0f}, probs),
                "has NaN at token id 2");
  ExpectInvalid(TreeVerifier::ProcessedDistribution(std::vector<float>{inf, 1, 0}, {1.0f, 0, 1.0f}, probs),
                "has +inf at token id 0");
  ExpectInvalid(TreeVerifier::ProcessedDistribution(std::vector<float>{-inf, -inf, -inf}, {1.0f, 0, 1.0f}, probs),
                "no finite logit");
  const std::vector<float> ok = {0, 1, 2};
  ExpectInvalid(TreeVerifier::ProcessedDistribution(ok, {0.0f, 0, 1.0f}, probs), "temperature = 0 means greedy");
  ExpectInvalid(TreeVerifier::ProcessedDistribution(ok, {-1.0f, 0, 1.0f}, probs), "temperature = -1");
  ExpectInvalid(TreeVerifier::ProcessedDistribution(ok, {nan, 0, 1.0f}, probs), "must be finite");
  ExpectInvalid(TreeVerifier::ProcessedDistribution(ok, {1.0f, -2, 1.0f}, probs), "top_k = -2 must be >= 0");
  ExpectInvalid(TreeVerifier::ProcessedDistribution(ok, {1.0f, 0, 0.0f}, probs),
                "top_p = 0.000000 is out of range (0, 1]");
  ExpectInvalid(TreeVerifier::ProcessedDistribution(ok, {1.0f, 0, 1.5f}, probs), "top_p = 1.500000");
  std::vector<float> short_probs(2);
  ExpectInvalid(TreeVerifier::ProcessedDistribution(ok, {1.0f, 0, 1.0f}, short_probs), "probs 2");
}

// ---- Verify's validation -----------------------------------------------------------------------

TEST(TreeVerifierTest, ValidatesEverythingFirst) {
  const std::vector<DraftTree> trees = {Tree({0, 1, 2}, {-1, 0, 0}), Tree({0, 1, 2, 3}, {-1, 0, 1, 1})};
  Logits a(3, 6), b(4, 6);
  std::vector<TensorView> views = {a.view(), b.view()};
  const SamplingParams sampling{1.0f, 0, 1.0f};
  ASSERT_TRUE(TreeVerifier::Verify(trees, views, sampling, 1, 2).ok());

  ExpectInvalid(TreeVerifier::Verify(trees, std::span(views).first(1), sampling, 1, 2).status(),
                "2 trees but 1 target logits tensors");
  ExpectInvalid(TreeVerifier::Verify(trees, views, {1.0f, 0, 2.0f}, 1, 2).status(), "top_p = 2.000000");

  Logits wide(4, 7);
  views[1] = wide.view();
  ExpectInvalid(TreeVerifier::Verify(trees, views, sampling, 1, 2).status(),
                "sequence 1: target logits are f32[4, 7] cpu, expected f32[4, 6] cpu");
  Logits tall(5, 6);
  views[1] = tall.view();
  ExpectInvalid(TreeVerifier::Verify(trees, views, sampling, 1, 2).status(), "(4 tree nodes)");
  views[1] = TensorView(b.data.data(), DType::kBF16, Shape{4, 6});
  ExpectInvalid(TreeVerifier::Verify(trees, views, sampling, 1, 2).status(), "target logits are bf16[4, 6] cpu");
  views[1] = TensorView(b.data.data(), DType::kF32, Shape{4, 6}, ContiguousStrides(Shape{4, 6}), Device::Cuda(0));
  ExpectInvalid(TreeVerifier::Verify(trees, views, sampling, 1, 2).status(), "f32[4, 6] cuda:0");
  views[1] = TensorView(b.data.data(), DType::kF32, Shape{4, 6}, Shape{1, 4}, Device::Cpu());
  ExpectInvalid(TreeVerifier::Verify(trees, views, sampling, 1, 2).status(), "unit stride along the vocabulary");
  // Strided rows (a narrowed view of a wider buffer) are fine.
  Logits buffer(4, 10);
  views[1] = buffer.view().Narrow(1, 2, 6);
  EXPECT_TRUE(TreeVerifier::Verify(trees, views, sampling, 1, 2).ok());

  views[1] = b.view();
  b.row(2)[3] = std::numeric_limits<float>::quiet_NaN();
  ExpectInvalid(TreeVerifier::Verify(trees, views, sampling, 1, 2).status(),
                "sequence 1: target logits row 2 has NaN at token id 3");
  // Greedy validates the same way.
  ExpectInvalid(TreeVerifier::Verify(trees, views, kGreedy, 1, 2).status(), "row 2 has NaN");
  b.row(2)[3] = std::numeric_limits<float>::infinity();
  ExpectInvalid(TreeVerifier::Verify(trees, views, sampling, 1, 2).status(), "row 2 has +inf at token id 3");
  std::fill_n(b.row(3), 6, -std::numeric_limits<float>::infinity());
  b.row(2)[3] = 0.0f;
  ExpectInvalid(TreeVerifier::Verify(trees, views, sampling, 1, 2).status(), "row 3 has no finite logit");
  std::fill_n(b.row(3), 6, 0.0f);

  std::vector<DraftTree> bad = trees;
  bad[0].tokens[2] = 6;
  ExpectInvalid(TreeVerifier::Verify(bad, views, sampling, 1, 2).status(),
                "sequence 0: node 2 token 6 is out of range [0, 6)");
  bad = trees;
  bad[1].depths[3] = 1;
  ExpectInvalid(TreeVerifier::Verify(bad, views, sampling, 1, 2).status(),
                "sequence 1: draft tree: node 3 has depth 1, expected 2");

  auto empty = TreeVerifier::Verify({}, {}, sampling, 1, 2);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

// ---- Coins and determinism -----------------------------------------------------------------------

TEST(TreeVerifierStochasticTest, CoinsFollowTheDocumentedFormula) {
  // Root with children 1, 2, 3 (tokens 0, 1, 2) over 4 equally likely tokens: node 1 is accepted iff
  // u_1 < 1/4, node 2 iff u_2 < 0.25 / 0.75, node 3 iff u_3 < 0.25 / 0.5; otherwise token 3 remains.
  // Accepted leaves draw the bonus from a uniform row over 2 tokens with u_0: token 0 iff u_0 < 0.5.
  const DraftTree tree = Tree({7, 0, 1, 2}, {-1, 0, 0, 0});
  Logits logits(4, 4);
  for (int i = 1; i < 4; ++i) std::fill_n(logits.row(i) + 2, 2, -std::numeric_limits<float>::infinity());
  const int kBatch = 2000;
  const std::vector<DraftTree> trees(kBatch, tree);
  const std::vector<TensorView> views(kBatch, logits.view());
  const uint64_t seed = 0x5eed5eed12345678ull, offset = 0x100000003ull;
  auto results = TreeVerifier::Verify(trees, views, {1.0f, 0, 1.0f}, seed, offset);
  ASSERT_TRUE(results.ok()) << results.status();
  int accepted_at[4] = {};
  for (uint32_t b = 0; b < kBatch; ++b) {
    const double u1 = PhiloxCoin(seed, offset, b, 1), u2 = PhiloxCoin(seed, offset, b, 2),
                 u3 = PhiloxCoin(seed, offset, b, 3), u0 = PhiloxCoin(seed, offset, b, 0);
    std::vector<int32_t> nodes;
    std::vector<int64_t> tokens;
    if (u1 < 0.25 / 1.0) {
      nodes = {1};
    } else if (u2 < 0.25 / 0.75) {
      nodes = {2};
    } else if (u3 < 0.25 / 0.5) {
      nodes = {3};
    }
    if (nodes.empty()) {
      tokens = {3};
    } else {
      tokens = {nodes[0] - 1, u0 < 0.5 ? 0 : 1};
    }
    ++accepted_at[nodes.empty() ? 0 : nodes[0]];
    EXPECT_EQ((*results)[b].accepted_nodes, nodes) << "sequence " << b;
    EXPECT_EQ((*results)[b].tokens, tokens) << "sequence " << b;
  }
  // Each outcome is a quarter of the draws.
  for (int k = 0; k < 4; ++k) EXPECT_NEAR(accepted_at[k], kBatch / 4, 120) << k;
}

TEST(TreeVerifierStochasticTest, SameSeedAndOffsetReplay) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  const DraftTree tree = Tree({0, 1, 2, 3, 4, 5, 6}, {-1, 0, 0, 1, 1, 3, 2});
  Logits logits(7, 8);
  for (float& x : logits.data) x = uniform(rng);
  const std::vector<DraftTree> trees(500, tree);
  const std::vector<TensorView> views(500, logits.view());
  const SamplingParams sampling{0.8f, 5, 0.9f};
  auto run = [&](uint64_t seed, uint64_t offset) {
    auto results = TreeVerifier::Verify(trees, views, sampling, seed, offset);
    EXPECT_TRUE(results.ok()) << results.status();
    std::vector<std::vector<int64_t>> tokens;
    for (const VerifyResult& r : *results) tokens.push_back(r.tokens);
    return tokens;
  };
  const auto first = run(11, 22);
  EXPECT_EQ(run(11, 22), first);
  EXPECT_NE(run(11, 23), first);
  EXPECT_NE(run(12, 22), first);
  // Within one call the sequences draw independent coins: not all 500 agree.
  int differing = 0;
  for (const auto& t : first) differing += t != first[0];
  EXPECT_GT(differing, 0);
}

// ---- Lossless: the emitted tokens are distributed as sampling from the target -------------------

// Q(a, x), the regularized upper incomplete gamma function: a series below a + 1, a continued
// fraction (modified Lentz) above.
double GammaQ(double a, double x) {
  if (x <= 0.0) return 1.0;
  const double log_front = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1.0) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000 && term > sum * 1e-16; ++n) {
      term *= x / (a + n);
      sum += term;
    }
    return std::max(0.0, 1.0 - sum * std::exp(log_front));
  }
  const double tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < 1e-16) break;
  }
  return std::exp(log_front) * h;
}

double ChiSquarePValue(double statistic, int df) { return GammaQ(0.5 * df, 0.5 * statistic); }

TEST(ChiSquareTest, KnownQuantiles) {
  EXPECT_NEAR(ChiSquarePValue(3.841458820694124, 1), 0.05, 1e-9);
  EXPECT_NEAR(ChiSquarePValue(18.307038053275146, 10), 0.05, 1e-9);
  EXPECT_NEAR(ChiSquarePValue(2.0, 2), std::exp(-1.0), 1e-12);
  // Table values: chi2_{0.999}(30) = 59.703, chi2_{0.99}(35) = 57.342.
  EXPECT_NEAR(ChiSquarePValue(59.703, 30), 0.001, 2e-6);
  EXPECT_NEAR(ChiSquarePValue(57.342, 35), 0.01, 2e-6);
  EXPECT_EQ(ChiSquarePValue(0.0, 4), 1.0);
}

struct ChiSquare {
  double statistic = 0.0;
  int df = 0;
  double p_value = 1.0;
};

// Pearson's test of `observed` against probabilities `expected` (summing to ~1). Categories of zero
// probability must be empty (checked by the caller); those expecting fewer than 5 draws are pooled.
ChiSquare PearsonTest(const std::vector<int64_t>& observed, const std::vector<double>& expected, int64_t draws) {
  ChiSquare out;
  int bins = 0;
  double pooled_o = 0.0, pooled_e = 0.0;
  for (size_t i = 0; i < observed.size(); ++i) {
    if (expected[i] <= 0.0) continue;
    const double e = expected[i] * draws;
    if (e < 5.0) {
      pooled_o += observed[i];
      pooled_e += e;
      continue;
    }
    out.statistic += (observed[i] - e) * (observed[i] - e) / e;
    ++bins;
  }
  if (pooled_e > 0.0) {
    out.statistic += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++bins;
  }
  out.df = bins - 1;
  out.p_value = ChiSquarePValue(out.statistic, out.df);
  return out;
}

constexpr int64_t kVocab = 6;
constexpr int64_t kDraws = 200000;
constexpr int kBatch = 2000;
constexpr double kThreshold = 1e-3;  // p-value; fixed seeds make every run identical

struct Scenario {
  DraftTree tree;
  Logits logits;
};

// Tree A: three root children (high, low and medium target probability) so the root's correction
// sample is exercised; node 1 has two children and a depth-3 descendant.
Scenario TreeA() {
  Scenario s{Tree({0, 2, 4, 0, 1, 5, 3}, {-1, 0, 0, 0, 1, 1, 4}), Logits(7, kVocab)};
  const float root[kVocab] = {0.3f, 0.5f, 1.0f, -0.2f, -1.0f, 0.1f};
  std::copy_n(root, kVocab, s.logits.row(0));
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (int64_t i = kVocab; i < s.logits.n * kVocab; ++i) s.logits.data[i] = uniform(rng);
  return s;
}

// Tree B: every vocabulary token is a child of the root (mixed order of high and low probability), so
// the first emitted token is always a drafted node whose target row exists; node 1 (token 3) has
// three children and a grandchild below its first, node 3 (token 5) two children including a repeat
// of its own token.
Scenario TreeB() {
  Scenario s{Tree({0, 3, 0, 5, 1, 4, 2, 1, 4, 0, 2, 5, 2}, {-1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 7, 3, 3}),
             Logits(13, kVocab)};
  const float root[kVocab] = {1.0f, -0.8f, 0.2f, 0.9f, -0.5f, 0.0f};
  std::copy_n(root, kVocab, s.logits.row(0));
  std::mt19937_64 rng(29);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (int64_t i = kVocab; i < s.logits.n * kVocab; ++i) s.logits.data[i] = uniform(rng);
  return s;
}

std::vector<double> Expected(Scenario& s, int64_t row, const SamplingParams& sampling) {
  std::vector<float> p(kVocab);
  absl::Status st =
      TreeVerifier::ProcessedDistribution(std::span<const float>(s.logits.row(row), kVocab), sampling, p);
  EXPECT_TRUE(st.ok()) << st;
  return std::vector<double>(p.begin(), p.end());
}

struct Counts {
  std::vector<int64_t> first = std::vector<int64_t>(kVocab, 0);
  std::vector<int64_t> joint = std::vector<int64_t>(kVocab * kVocab, 0);
};

Counts Draw(Scenario& s, const SamplingParams& sampling, uint64_t seed) {
  const std::vector<DraftTree> trees(kBatch, s.tree);
  const std::vector<TensorView> views(kBatch, s.logits.view());
  Counts counts;
  for (int64_t call = 0; call < kDraws / kBatch; ++call) {
    auto results = TreeVerifier::Verify(trees, views, sampling, seed, static_cast<uint64_t>(call));
    EXPECT_TRUE(results.ok()) << results.status();
    for (const VerifyResult& r : *results) {
      ++counts.first[r.tokens[0]];
      if (r.tokens.size() >= 2) ++counts.joint[r.tokens[0] * kVocab + r.tokens[1]];
    }
  }
  return counts;
}

void Report(const std::string& what, const ChiSquare& chi) {
  std::printf("[ chi2     ] %-44s statistic %8.3f  df %2d  p %.4f\n", what.c_str(), chi.statistic, chi.df,
              chi.p_value);
}

void ExpectNoImpossibleTokens(const std::vector<int64_t>& observed, const std::vector<double>& expected) {
  for (size_t i = 0; i < observed.size(); ++i) {
    if (expected[i] <= 0.0) {
      EXPECT_EQ(observed[i], 0) << "category " << i << " has probability 0";
    }
  }
}

struct LosslessCase {
  const char* name;
  SamplingParams sampling;
};

const LosslessCase kCases[] = {
    {"T=1.0", {1.0f, 0, 1.0f}},
    {"T=0.7", {0.7f, 0, 1.0f}},
    {"T=1.0 top-p 0.8", {1.0f, 0, 0.8f}},
    {"T=1.0 top-k 3", {1.0f, 3, 1.0f}},
    {"T=0.7 top-k 3 top-p 0.8", {0.7f, 3, 0.8f}},
};

TEST(TreeVerifierLosslessTest, FirstTokenWithCorrectionAtTheRoot) {
  Scenario s = TreeA();
  uint64_t seed = 1000;
  for (const LosslessCase& c : kCases) {
    const Counts counts = Draw(s, c.sampling, ++seed);
    const std::vector<double> p = Expected(s, 0, c.sampling);
    ExpectNoImpossibleTokens(counts.first, p);
    const ChiSquare chi = PearsonTest(counts.first, p, kDraws);
    Report(std::string("tree A first token, ") + c.name, chi);
    EXPECT_GT(chi.p_value, kThreshold) << c.name << ": statistic " << chi.statistic << ", df " << chi.df;
  }
}

TEST(TreeVerifierLosslessTest, FirstTwoTokensMatchTheTargetsTwoStepDistribution) {
  Scenario s = TreeB();
  // Node of each root child's token: the row the target uses after emitting that token.
  std::vector<int64_t> node_of(kVocab, -1);
  for (int32_t c = s.tree.first_child[0]; c != -1; c = s.tree.next_sibling[c]) node_of[s.tree.tokens[c]] = c;
  for (int64_t t = 0; t < kVocab; ++t) ASSERT_GE(node_of[t], 0) << "token " << t << " is a root child";

  uint64_t seed = 2000;
  for (const LosslessCase& c : kCases) {
    const Counts counts = Draw(s, c.sampling, ++seed);
    const std::vector<double> p1 = Expected(s, 0, c.sampling);
    std::vector<double> joint(kVocab * kVocab, 0.0);
    for (int64_t x1 = 0; x1 < kVocab; ++x1) {
      const std::vector<double> p2 = Expected(s, node_of[x1], c.sampling);
      for (int64_t x2 = 0; x2 < kVocab; ++x2) joint[x1 * kVocab + x2] = p1[x1] * p2[x2];
    }
    ExpectNoImpossibleTokens(counts.first, p1);
    ExpectNoImpossibleTokens(counts.joint, joint);
    int64_t pairs = 0;
    for (const int64_t n : counts.joint) pairs += n;
    EXPECT_EQ(pairs, kDraws) << "every draw emits at least two tokens";

    const ChiSquare first = PearsonTest(counts.first, p1, kDraws);
    const ChiSquare two = PearsonTest(counts.joint, joint, kDraws);
    Report(std::string("tree B first token, ") + c.name, first);
    Report(std::string("tree B first two tokens, ") + c.name, two);
    EXPECT_GT(first.p_value, kThreshold) << c.name;
    EXPECT_GT(two.p_value, kThreshold) << c.name << ": statistic " << two.statistic << ", df " << two.df;
  }
}

TEST(TreeVerifierLosslessTest, TheTestDetectsAWrongDistribution) {
  // Control: draws at T = 0.7 against the T = 1.0 distribution must fail the same test.
  Scenario s = TreeA();
  const Counts counts = Draw(s, {0.7f, 0, 1.0f}, 77);
  const ChiSquare chi = PearsonTest(counts.first, Expected(s, 0, {1.0f, 0, 1.0f}), kDraws);
  Report("control: T=0.7 draws vs T=1.0", chi);
  EXPECT_LT(chi.p_value, kThreshold);
}

}  // namespace
}  // namespace eagle3
