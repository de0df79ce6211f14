// CpuBackend MoeRoute and MoeExperts against hand-computed cases and naive references written here.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "config_test_util.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/half.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3::cpu {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

void ExpectInvalid(const absl::Status& s, const std::vector<std::string>& needles) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (const std::string& n : needles) EXPECT_THAT(Msg(s), HasSubstr(n));
}

double Sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

MoeRoutingParams Params(ScoringFunc scoring, TopkMethod method, int top_k, int n_group = 1,
                        int topk_group = 1, bool norm = false, float scale = 1.0f) {
  MoeRoutingParams p;
  p.scoring_func = scoring;
  p.topk_method = method;
  p.top_k = top_k;
  p.n_group = n_group;
  p.topk_group = topk_group;
  p.norm_topk_prob = norm;
  p.routed_scaling_factor = scale;
  return p;
}

MoeRoutingParams V2(TopkMethod method, int top_k, int n_group = 1, int topk_group = 1,
                    bool norm = false, float scale = 1.0f) {
  return Params(ScoringFunc::kSoftmax, method, top_k, n_group, topk_group, norm, scale);
}

MoeRoutingParams V3(int top_k, int n_group, int topk_group, bool norm = true, float scale = 1.0f) {
  return Params(ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, top_k, n_group, topk_group, norm,
                scale);
}

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// Routes one token (one row of logits).
Routed Route(CpuBackend& backend, std::vector<float> logits, const MoeRoutingParams& p,
             std::vector<float>* bias = nullptr) {
  const int64_t e = static_cast<int64_t>(logits.size());
  Routed r{std::vector<int32_t>(p.top_k, -1), std::vector<float>(p.top_k, kNaN)};
  TensorView bias_view;
  if (bias != nullptr) bias_view = TensorView(bias->data(), DType::kF32, Shape{e});
  const absl::Status s = backend.MoeRoute(
      TensorView(logits.data(), DType::kF32, Shape{1, e}), bias ? &bias_view : nullptr, p,
      TensorView(r.ids.data(), DType::kI32, Shape{1, p.top_k}),
      TensorView(r.weights.data(), DType::kF32, Shape{1, p.top_k}));
  EXPECT_TRUE(s.ok()) << s;
  return r;
}

std::vector<double> Softmax(const std::vector<float>& x) {
  double max = *std::max_element(x.begin(), x.end()), sum = 0;
  std::vector<double> p(x.size());
  for (size_t i = 0; i < x.size(); ++i) sum += p[i] = std::exp(x[i] - max);
  for (double& v : p) v /= sum;
  return p;
}

// ---- MoeRoute: hand-computed cases --------------------------------------------------------------

TEST(CpuBackendMoeRouteTest, V2GreedyPicksTopScoresInOrder) {
  CpuBackend backend;
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 3.0f, 1.0f};
  const std::vector<double> p = Softmax(logits);
  Routed r = Route(backend, logits, V2(TopkMethod::kGreedy, 3));
  EXPECT_THAT(r.ids, ElementsAre(3, 1, 4));
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(r.weights[j], p[r.ids[j]], 1e-7);
}

TEST(CpuBackendMoeRouteTest, TiesGoToTheLowerExpert) {
  CpuBackend backend;
  Routed r = Route(backend, {1, 2, 2, 1, 2}, V2(TopkMethod::kGreedy, 4));
  EXPECT_THAT(r.ids, ElementsAre(1, 2, 4, 0));
  std::vector<float> bias(4, 0.0f);
  Routed v3 = Route(backend, {0, 0, 0, 0}, V3(2, 1, 1), &bias);
  EXPECT_THAT(v3.ids, ElementsAre(0, 1));
}

// V2: normalize (when top_k > 1 and norm_topk_prob) XOR multiply by routed_scaling_factor.
TEST(CpuBackendMoeRouteTest, V2NormalizesXorScales) {
  CpuBackend backend;
  const std::vector<float> logits = {0.1f, 1.2f, -0.3f, 0.9f, 0.0f, 2.0f};
  const std::vector<double> p = Softmax(logits);
  Routed scaled = Route(backend, logits, V2(TopkMethod::kGreedy, 2, 1, 1, false, 16.0f));
  EXPECT_THAT(scaled.ids, ElementsAre(5, 1));
  EXPECT_NEAR(scaled.weights[0], 16 * p[5], 1e-5);
  EXPECT_NEAR(scaled.weights[1], 16 * p[1], 1e-5);

  Routed normalized = Route(backend, logits, V2(TopkMethod::kGreedy, 2, 1, 1, true, 16.0f));
  EXPECT_NEAR(normalized.weights[0], p[5] / (p[5] + p[1]), 1e-6);
  EXPECT_NEAR(normalized.weights[1], p[1] / (p[5] + p[1]), 1e-6);
  EXPECT_NEAR(normalized.weights[0] + normalized.weights[1], 1.0, 1e-6);  // not scaled by 16

  // top_k == 1: no normalization even with norm_topk_prob, so the factor applies.
  Routed single = Route(backend, logits, V2(TopkMethod::kGreedy, 1, 1, 1, true, 16.0f));
  EXPECT_NEAR(single.weights[0], 16 * p[5], 1e-5);
}

// group_limited_greedy: group score = its best expert; experts of dropped groups are out even when
// they outscore every expert left.
TEST(CpuBackendMoeRouteTest, V2GroupLimitedDropsHighScoringExpertOfDroppedGroup) {
  CpuBackend backend;
  // Groups of 2: G0 = {9, 8.9}, G1 = {9.5, 0}, G2 = {1, 2}.
  const std::vector<float> logits = {9.0f, 8.9f, 9.5f, 0.0f, 1.0f, 2.0f};
  const std::vector<double> p = Softmax(logits);
  Routed greedy = Route(backend, logits, V2(TopkMethod::kGreedy, 2));
  EXPECT_THAT(greedy.ids, ElementsAre(2, 0));
  Routed one_group = Route(backend, logits, V2(TopkMethod::kGroupLimitedGreedy, 2, 3, 1));
  EXPECT_THAT(one_group.ids, ElementsAre(2, 3));  // expert 0 (9.0) beats 3 (0.0) but G0 is dropped
  EXPECT_NEAR(one_group.weights[1], p[3], 1e-9);
  Routed two_groups = Route(backend, logits, V2(TopkMethod::kGroupLimitedGreedy, 3, 3, 2));
  EXPECT_THAT(two_groups.ids, ElementsAre(2, 0, 1));  // G1 and G0 kept: 8.9 beats G1's 0.0
  // Tied group scores keep the lower group: G0 = {5, 0}, G1 = {5, 1}.
  Routed tie = Route(backend, {5, 0, 5, 1}, V2(TopkMethod::kGroupLimitedGreedy, 2, 2, 1));
  EXPECT_THAT(tie.ids, ElementsAre(0, 1));
}

// noaux_tc scores a group by the sum of its two best biased scores, not its best one.
TEST(CpuBackendMoeRouteTest, V3GroupScoreIsSumOfTopTwo) {
  CpuBackend backend;
  // G0 = {5, 5}: 2 * sigmoid(5) = 1.987; G1 = {6, -10}: 0.9975 + 0.00005. Max-based would keep G1.
  std::vector<float> bias(4, 0.0f);
  Routed r = Route(backend, {5, 5, 6, -10}, V3(2, 2, 1), &bias);
  EXPECT_THAT(r.ids, ElementsAre(0, 1));  // expert 2 (the best single score) is dropped with G1
  EXPECT_NEAR(r.weights[0], 0.5, 1e-6);
  EXPECT_NEAR(r.weights[1], 0.5, 1e-6);
}

// The correction bias steers selection; the weights are the unbiased sigmoid scores, normalized,
// then scaled.
TEST(CpuBackendMoeRouteTest, V3BiasSelectsButDoesNotWeigh) {
  CpuBackend backend;
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f};
  std::vector<float> bias = {0.0f, 2.0f, 0.0f, 1.5f};
  // Biased: 0.881, 2.731, 0.622, 1.769 -> experts 1, 3.
  Routed r = Route(backend, logits, V3(2, 1, 1, true, 2.5f), &bias);
  EXPECT_THAT(r.ids, ElementsAre(1, 3));
  const double s1 = Sigmoid(1.0), s3 = Sigmoid(-1.0);
  EXPECT_NEAR(r.weights[0], 2.5 * s1 / (s1 + s3), 1e-6);
  EXPECT_NEAR(r.weights[1], 2.5 * s3 / (s1 + s3), 1e-6);
  EXPECT_NEAR(r.weights[0] + r.weights[1], 2.5, 1e-6);  // normalize, then always scale

  std::vector<float> no_bias(4, 0.0f);
  Routed unbiased = Route(backend, logits, V3(2, 1, 1, true, 2.5f), &no_bias);
  EXPECT_THAT(unbiased.ids, ElementsAre(0, 1));

  // Without norm_topk_prob: raw sigmoid scores times the factor.
  Routed raw = Route(backend, logits, V3(2, 1, 1, false, 2.5f), &bias);
  EXPECT_NEAR(raw.weights[0], 2.5 * s1, 1e-6);
  EXPECT_NEAR(raw.weights[1], 2.5 * s3, 1e-6);
  // top_k == 1 with norm_topk_prob: normalized to 1, then scaled.
  Routed single = Route(backend, logits, V3(1, 1, 1, true, 2.5f), &bias);
  EXPECT_THAT(single.ids, ElementsAre(1));
  EXPECT_NEAR(single.weights[0], 2.5, 1e-6);
}

// Dropped groups are excluded outright, even when the kept experts' biased scores are negative
// (the reference code's fill with 0 would pick from the dropped group here).
TEST(CpuBackendMoeRouteTest, V3DroppedGroupsStayOutWithNegativeBiasedScores) {
  CpuBackend backend;
  std::vector<float> bias = {-0.8f, -0.9f, -2.0f, -2.0f};  // biased: -0.3, -0.4 | -1.5, -1.5
  Routed r = Route(backend, {0, 0, 0, 0}, V3(2, 2, 1, false), &bias);
  EXPECT_THAT(r.ids, ElementsAre(0, 1));
}

// ---- MoeRoute: random rows against a sort-based reference ---------------------------------------

// Sort-based reference for one row, in double: stable sorts give the lower index on ties.
Routed NaiveRoute(const float* logits, int64_t experts, const float* bias,
                  const MoeRoutingParams& p) {
  std::vector<double> scores(experts), choice(experts);
  if (p.scoring_func == ScoringFunc::kSoftmax) {
    scores = Softmax(std::vector<float>(logits, logits + experts));
  } else {
    for (int64_t e = 0; e < experts; ++e) scores[e] = Sigmoid(logits[e]);
  }
  for (int64_t e = 0; e < experts; ++e) choice[e] = scores[e] + (bias ? bias[e] : 0.0);
  std::vector<bool> eligible(experts, true);
  if (p.topk_method != TopkMethod::kGreedy) {
    const int64_t per = experts / p.n_group;
    std::vector<double> group(p.n_group);
    for (int g = 0; g < p.n_group; ++g) {
      std::vector<double> members(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(members.rbegin(), members.rend());
      group[g] = p.topk_method == TopkMethod::kNoauxTc ? members[0] + members[1] : members[0];
    }
    std::vector<int> order(p.n_group);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return group[a] > group[b]; });
    for (int j = p.topk_group; j < p.n_group; ++j) {
      for (int64_t i = 0; i < per; ++i) eligible[order[j] * per + i] = false;
    }
  }
  std::vector<int32_t> order;
  for (int64_t e = 0; e < experts; ++e) {
    if (eligible[e]) order.push_back(static_cast<int32_t>(e));
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return choice[a] > choice[b]; });
  Routed r;
  double sum = 0;
  for (int j = 0; j < p.top_k; ++j) {
    r.ids.push_back(order[j]);
    sum += scores[order[j]];
  }
  const bool v3 = p.topk_method == TopkMethod::kNoauxTc;
  for (int j = 0; j < p.top_k; ++j) {
    double w = scores[order[j]];
    if (v3) {
      if (p.norm_topk_prob) w /= sum + 1e-20;
      w *= p.routed_scaling_factor;
    } else if (p.top_k > 1 && p.norm_topk_prob) {
      w /= sum + 1e-20;
    } else {
      w *= p.routed_scaling_factor;
    }
    r.weights.push_back(static_cast<float>(w));
  }
  return r;
}

struct RouteCase {
  const char* name;
  MoeRoutingParams params;
  int64_t experts;
};

void PrintTo(const RouteCase& c, std::ostream* os) { *os << c.name; }

class CpuBackendMoeRouteRandomTest : public ::testing::TestWithParam<RouteCase> {};

TEST_P(CpuBackendMoeRouteRandomTest, MatchesSortBasedReference) {
  const RouteCase c = GetParam();
  CpuBackend backend;
  std::mt19937 rng(static_cast<uint32_t>(c.experts * 31 + c.params.top_k));
  const int64_t tokens = 24, k = c.params.top_k;
  // Strided views: logits row stride E + 3, ids and weights row stride k + 2.
  std::vector<float> logits(tokens * (c.experts + 3), kNaN);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t e = 0; e < c.experts; ++e) logits[t * (c.experts + 3) + e] = normal(rng);
  }
  std::vector<float> bias(c.experts);
  for (float& b : bias) b = 0.3f * normal(rng);
  TensorView bias_view(bias.data(), DType::kF32, Shape{c.experts});
  const bool noaux = c.params.topk_method == TopkMethod::kNoauxTc;
  std::vector<int32_t> ids(tokens * (k + 2), -7);
  std::vector<float> weights(tokens * (k + 2), kNaN);
  ASSERT_TRUE(backend
                  .MoeRoute(TensorView(logits.data(), DType::kF32, Shape{tokens, c.experts},
                                       Shape{c.experts + 3, 1}, Device::Cpu()),
                            noaux ? &bias_view : nullptr, c.params,
                            TensorView(ids.data(), DType::kI32, Shape{tokens, k}, Shape{k + 2, 1},
                                       Device::Cpu()),
                            TensorView(weights.data(), DType::kF32, Shape{tokens, k},
                                       Shape{k + 2, 1}, Device::Cpu()))
                  .ok());
  for (int64_t t = 0; t < tokens; ++t) {
    const Routed expected = NaiveRoute(&logits[t * (c.experts + 3)], c.experts,
                                       noaux ? bias.data() : nullptr, c.params);
    for (int64_t j = 0; j < k; ++j) {
      ASSERT_EQ(ids[t * (k + 2) + j], expected.ids[j]) << "token " << t << " rank " << j;
      ASSERT_NEAR(weights[t * (k + 2) + j], expected.weights[j], 1e-5 * (1 + expected.weights[j]));
    }
    EXPECT_EQ(ids[t * (k + 2) + k], -7);  // row padding untouched
    EXPECT_TRUE(std::isnan(weights[t * (k + 2) + k + 1]));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Methods, CpuBackendMoeRouteRandomTest,
    ::testing::Values(RouteCase{"V2LiteGreedy", V2(TopkMethod::kGreedy, 6, 1, 1, false, 1.0f), 64},
                      RouteCase{"V2GroupLimited",
                                V2(TopkMethod::kGroupLimitedGreedy, 6, 8, 3, false, 16.0f), 160},
                      RouteCase{"V2GroupLimitedNorm",
                                V2(TopkMethod::kGroupLimitedGreedy, 4, 4, 2, true, 16.0f), 32},
                      RouteCase{"V3NoauxTc", V3(8, 8, 4, true, 2.5f), 256},
                      RouteCase{"K2NoauxTcOneGroup", V3(8, 1, 1, true, 2.827f), 384},
                      RouteCase{"NoauxTcPairs", V3(3, 6, 2, false, 1.5f), 12}),
    [](const ::testing::TestParamInfo<RouteCase>& info) { return info.param.name; });

// The params as the real configs give them are accepted at the configs' expert counts.
TEST(CpuBackendMoeRouteTest, AcceptsTheRealConfigs) {
  CpuBackend backend;
  for (const char* name :
       {"deepseek-ai_DeepSeek-V2.json", "deepseek-ai_DeepSeek-V3.json",
        "moonshotai_Kimi-K2-Instruct.json", "deepseek-ai_DeepSeek-V2-Lite-Chat.json"}) {
    SCOPED_TRACE(name);
    auto config = DeepseekV2Config::FromJson(testing::WithoutQuantization(name), name);
    ASSERT_TRUE(config.ok()) << config.status();
    const MoeRoutingParams p = MoeRoutingParams::FromConfig(*config);
    const int64_t experts = *config->n_routed_experts;
    std::vector<float> logits(2 * experts);
    std::mt19937 rng(1);
    for (float& f : logits) f = std::normal_distribution<float>()(rng);
    std::vector<float> bias(experts, 0.01f);
    TensorView bias_view(bias.data(), DType::kF32, Shape{experts});
    std::vector<int32_t> ids(2 * p.top_k);
    std::vector<float> weights(2 * p.top_k);
    ASSERT_TRUE(backend
                    .MoeRoute(TensorView(logits.data(), DType::kF32, Shape{2, experts}),
                              p.topk_method == TopkMethod::kNoauxTc ? &bias_view : nullptr, p,
                              TensorView(ids.data(), DType::kI32, Shape{2, p.top_k}),
                              TensorView(weights.data(), DType::kF32, Shape{2, p.top_k}))
                    .ok());
    const Routed expected = NaiveRoute(
        logits.data(), experts, p.topk_method == TopkMethod::kNoauxTc ? bias.data() : nullptr, p);
    EXPECT_THAT(std::vector<int32_t>(ids.begin(), ids.begin() + p.top_k),
                ElementsAreArray(expected.ids));
  }
}

TEST(CpuBackendMoeRouteTest, RejectsBadParamsAndData) {
  CpuBackend backend;
  std::vector<float> logits(2 * 8, 0.5f);
  std::vector<float> bias(8, 0.0f);
  TensorView bias_view(bias.data(), DType::kF32, Shape{8});
  std::vector<int32_t> ids(2 * 8, -1);
  std::vector<float> weights(2 * 8, kNaN);
  const auto route = [&](const MoeRoutingParams& p, const TensorView* b) {
    return backend.MoeRoute(TensorView(logits.data(), DType::kF32, Shape{2, 8}), b, p,
                            TensorView(ids.data(), DType::kI32, Shape{2, p.top_k}),
                            TensorView(weights.data(), DType::kF32, Shape{2, p.top_k}));
  };
  ExpectInvalid(route(V2(TopkMethod::kGreedy, 0), nullptr),
                {"MoeRoute", "top_k = 0 must be in [1, E] for logits f32[2, 8] cpu"});
  ExpectInvalid(route(V2(TopkMethod::kGreedy, 9), nullptr), {"top_k = 9"});
  ExpectInvalid(route(V2(TopkMethod::kGroupLimitedGreedy, 2, 3, 1), nullptr),
                {"n_group = 3 must divide the E = 8 experts", "group_limited_greedy"});
  ExpectInvalid(route(V2(TopkMethod::kGroupLimitedGreedy, 2, 4, 5), nullptr),
                {"topk_group = 5 must be in [1, n_group = 4]"});
  ExpectInvalid(route(V2(TopkMethod::kGroupLimitedGreedy, 5, 4, 2), nullptr),
                {"top_k = 5 exceeds the 4 experts in the topk_group = 2 kept groups of 2"});
  ExpectInvalid(route(V3(2, 8, 2), &bias_view),
                {"noaux_tc scores a group by its two best experts but the groups have 1"});
  ExpectInvalid(route(Params(ScoringFunc::kSoftmax, TopkMethod::kNoauxTc, 2, 2, 1), &bias_view),
                {"scoring_func softmax does not go with topk_method noaux_tc"});
  ExpectInvalid(route(Params(ScoringFunc::kSigmoid, TopkMethod::kGreedy, 2), nullptr),
                {"scoring_func sigmoid does not go with topk_method greedy"});
  ExpectInvalid(route(V3(2, 2, 1), nullptr), {"noaux_tc needs correction_bias [E]"});
  ExpectInvalid(route(V2(TopkMethod::kGreedy, 2), &bias_view),
                {"correction_bias is only for noaux_tc", "greedy"});
  TensorView short_bias(bias.data(), DType::kF32, Shape{7});
  ExpectInvalid(route(V3(2, 2, 1), &short_bias), {"correction_bias f32[7] cpu must be [E] = [8]"});
  ExpectInvalid(route(V2(TopkMethod::kGreedy, 2, 1, 1, false, kNaN), nullptr),
                {"routed_scaling_factor must be finite"});
  ExpectInvalid(
      backend.MoeRoute(TensorView(logits.data(), DType::kF32, Shape{2, 8}), nullptr,
                       V2(TopkMethod::kGreedy, 2), TensorView(ids.data(), DType::kI64, Shape{2, 2}),
                       TensorView(weights.data(), DType::kF32, Shape{2, 2})),
      {"ids i64[2, 2] cpu must be i32, got i64"});
  ExpectInvalid(
      backend.MoeRoute(TensorView(logits.data(), DType::kF32, Shape{2, 8}), nullptr,
                       V2(TopkMethod::kGreedy, 2), TensorView(ids.data(), DType::kI32, Shape{2, 2}),
                       TensorView(weights.data(), DType::kF32, Shape{2, 3})),
      {"weights f32[2, 3] cpu must be [T, top_k] = [2, 2]"});
  ExpectInvalid(
      backend.MoeRoute(TensorView(logits.data(), DType::kF32, Shape{2, 8}), nullptr,
                       V2(TopkMethod::kGreedy, 2), TensorView(ids.data(), DType::kI32, Shape{2, 2}),
                       TensorView(logits.data() + 4, DType::kF32, Shape{2, 2})),
      {"weights f32[2, 2] cpu overlaps logits"});

  logits[8 + 5] = kNaN;
  ExpectInvalid(route(V2(TopkMethod::kGreedy, 2), nullptr),
                {"row 1 of logits f32[2, 8] cpu has nan at expert 5"});
  logits[8 + 5] = -kInf;
  ExpectInvalid(route(V2(TopkMethod::kGreedy, 2), nullptr), {"row 1", "-inf at expert 5"});
  logits[8 + 5] = 0.5f;
  bias[3] = kInf;
  ExpectInvalid(route(V3(2, 2, 1), &bias_view), {"correction_bias f32[8] cpu has inf at expert 3"});
  // Nothing was written by any rejected call.
  EXPECT_TRUE(std::all_of(ids.begin(), ids.end(), [](int32_t i) { return i == -1; }));
  EXPECT_TRUE(std::all_of(weights.begin(), weights.end(), [](float w) { return std::isnan(w); }));
}

// ---- MoeExperts ---------------------------------------------------------------------------------

// One expert's weights in a buffer wider than the views (row stride = cols + 2).
struct Expert {
  std::vector<float> gate_up, down;
  int64_t hidden, inter;
  Expert(int64_t h, int64_t i, std::mt19937& rng)
      : gate_up(2 * i * (h + 2), kNaN), down(h * (i + 2), kNaN), hidden(h), inter(i) {
    std::normal_distribution<float> normal(0.0f, 0.3f);
    for (int64_t r = 0; r < 2 * i; ++r) {
      for (int64_t c = 0; c < h; ++c) gate_up[r * (h + 2) + c] = normal(rng);
    }
    for (int64_t r = 0; r < h; ++r) {
      for (int64_t c = 0; c < i; ++c) down[r * (i + 2) + c] = normal(rng);
    }
  }
  ExpertWeights views() {
    return {TensorView(gate_up.data(), DType::kF32, Shape{2 * inter, hidden}, Shape{hidden + 2, 1},
                       Device::Cpu()),
            TensorView(down.data(), DType::kF32, Shape{hidden, inter}, Shape{inter + 2, 1},
                       Device::Cpu())};
  }
  // down(silu(gate x) * up x), in double; with `bf16`, x and the activation rounded to bf16 first.
  std::vector<double> Apply(const float* x, bool bf16 = false) const {
    const auto round = [&](double v) {
      return bf16 ? static_cast<double>(Bf16ToFloat(FloatToBf16(static_cast<float>(v)))) : v;
    };
    std::vector<double> act(inter), y(hidden, 0.0);
    for (int64_t i = 0; i < inter; ++i) {
      double g = 0, u = 0;
      for (int64_t c = 0; c < hidden; ++c) {
        g += static_cast<double>(gate_up[i * (hidden + 2) + c]) * round(x[c]);
        u += static_cast<double>(gate_up[(inter + i) * (hidden + 2) + c]) * round(x[c]);
      }
      act[i] = round(g / (1 + std::exp(-g)) * u);
    }
    for (int64_t r = 0; r < hidden; ++r) {
      for (int64_t i = 0; i < inter; ++i) y[r] += down[r * (inter + 2) + i] * act[i];
    }
    return y;
  }
};

TEST(CpuBackendMoeExpertsTest, MatchesDenseLoop) {
  CpuBackend backend;
  std::mt19937 rng(51);
  // Two rounds with different intermediate sizes: the scratch buffer is reused and regrown.
  for (auto [hidden, inter] : {std::pair<int64_t, int64_t>{12, 7}, {20, 33}, {8, 3}}) {
    SCOPED_TRACE(inter);
    const int64_t num_experts = 5, tokens = 6, k = 3;
    std::vector<Expert> experts;
    for (int64_t e = 0; e < num_experts; ++e) experts.emplace_back(hidden, inter, rng);
    std::vector<ExpertWeights> views;
    for (Expert& e : experts) views.push_back(e.views());
    std::vector<float> x(tokens * (hidden + 1), kNaN);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t c = 0; c < hidden; ++c)
        x[t * (hidden + 1) + c] = std::normal_distribution<float>()(rng);
    }
    std::vector<int32_t> ids = {0, 4, 2, 1, 1, 3, 4, 3, 0, 2, 0, 1, 3, 4, 2, 0, 1, 2};
    std::vector<float> weights(tokens * k);
    for (float& w : weights) w = std::uniform_real_distribution<float>(-1.0f, 2.0f)(rng);
    const TensorView x_view(x.data(), DType::kF32, Shape{tokens, hidden}, Shape{hidden + 1, 1},
                            Device::Cpu());
    for (bool accumulate : {false, true}) {
      std::vector<float> out(tokens * (hidden + 3), kNaN);
      std::vector<float> initial(tokens * hidden, 0.0f);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t c = 0; c < hidden; ++c) {
          if (accumulate) {
            initial[t * hidden + c] = out[t * (hidden + 3) + c] = 0.1f * static_cast<float>(c - t);
          }
        }
      }
      ASSERT_TRUE(backend
                      .MoeExperts(x_view, TensorView(ids.data(), DType::kI32, Shape{tokens, k}),
                                  TensorView(weights.data(), DType::kF32, Shape{tokens, k}), views,
                                  TensorView(out.data(), DType::kF32, Shape{tokens, hidden},
                                             Shape{hidden + 3, 1}, Device::Cpu()),
                                  accumulate)
                      .ok());
      for (int64_t t = 0; t < tokens; ++t) {
        std::vector<double> expected(hidden);
        for (int64_t c = 0; c < hidden; ++c) expected[c] = initial[t * hidden + c];
        for (int64_t j = 0; j < k; ++j) {
          const std::vector<double> y = experts[ids[t * k + j]].Apply(&x[t * (hidden + 1)]);
          for (int64_t c = 0; c < hidden; ++c) expected[c] += weights[t * k + j] * y[c];
        }
        for (int64_t c = 0; c < hidden; ++c) {
          ASSERT_NEAR(out[t * (hidden + 3) + c], expected[c], 1e-5 * (1 + std::abs(expected[c])))
              << "accumulate " << accumulate << " out[" << t << ", " << c << "]";
        }
        for (int64_t c = hidden; c < hidden + 3; ++c)
          ASSERT_TRUE(std::isnan(out[t * (hidden + 3) + c]));
      }
    }
  }
}

// ExpertWeights::bf16_activations: that expert's products see x and its activation rounded to bf16;
// the others' do not. The rounding is visible (the unrounded sums differ by far more than the
// tolerance).
TEST(CpuBackendMoeExpertsTest, Bf16ActivationsRoundXAndTheActivationOfThatExpertOnly) {
  CpuBackend backend;
  std::mt19937 rng(53);
  const int64_t hidden = 24, inter = 10, tokens = 3, k = 2;
  std::vector<Expert> experts;
  for (int e = 0; e < 3; ++e) experts.emplace_back(hidden, inter, rng);
  std::vector<ExpertWeights> views;
  for (Expert& e : experts) views.push_back(e.views());
  views[1].bf16_activations = true;
  std::vector<float> x(tokens * hidden);
  for (float& v : x) v = std::normal_distribution<float>()(rng);
  std::vector<int32_t> ids = {1, 0, 2, 1, 0, 2};
  std::vector<float> weights = {0.7f, 0.3f, 0.5f, 0.5f, 1.0f, -0.25f};
  std::vector<float> out(tokens * hidden, kNaN);
  ASSERT_TRUE(backend
                  .MoeExperts(TensorView(x.data(), DType::kF32, Shape{tokens, hidden}),
                              TensorView(ids.data(), DType::kI32, Shape{tokens, k}),
                              TensorView(weights.data(), DType::kF32, Shape{tokens, k}), views,
                              TensorView(out.data(), DType::kF32, Shape{tokens, hidden}), false)
                  .ok());
  double rounding_seen = 0.0;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<double> expected(hidden, 0.0), unrounded(hidden, 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      const std::vector<double> y = experts[e].Apply(&x[t * hidden], e == 1);
      const std::vector<double> plain = experts[e].Apply(&x[t * hidden]);
      for (int64_t c = 0; c < hidden; ++c) {
        expected[c] += weights[t * k + j] * y[c];
        unrounded[c] += weights[t * k + j] * plain[c];
      }
    }
    for (int64_t c = 0; c < hidden; ++c) {
      ASSERT_NEAR(out[t * hidden + c], expected[c], 1e-5 * (1 + std::abs(expected[c])))
          << "out[" << t << ", " << c << "]";
      rounding_seen = std::max(rounding_seen, std::abs(unrounded[c] - expected[c]) / (1 + std::abs(expected[c])));
    }
  }
  EXPECT_GT(rounding_seen, 1e-4) << "the rounding changed nothing measurable: the test could not tell";
}

TEST(CpuBackendMoeExpertsTest, RejectsBadOperandsWithoutWriting) {
  CpuBackend backend;
  std::mt19937 rng(52);
  const int64_t hidden = 4, inter = 3;
  std::vector<Expert> experts;
  for (int e = 0; e < 3; ++e) experts.emplace_back(hidden, inter, rng);
  std::vector<ExpertWeights> views;
  for (Expert& e : experts) views.push_back(e.views());
  std::vector<float> x(2 * hidden, 1.0f), weights(4, 0.5f), out(2 * hidden, kNaN);
  std::vector<int32_t> ids = {0, 2, 1, 3};
  const TensorView x_view(x.data(), DType::kF32, Shape{2, hidden});
  const TensorView w_view(weights.data(), DType::kF32, Shape{2, 2});
  const TensorView out_view(out.data(), DType::kF32, Shape{2, hidden});
  const auto run = [&](const TensorView& id_view, std::span<const ExpertWeights> e,
                       const TensorView& o) {
    return backend.MoeExperts(x_view, id_view, w_view, e, o, false);
  };
  const TensorView id_view(ids.data(), DType::kI32, Shape{2, 2});
  ExpectInvalid(run(id_view, views, out_view),
                {"MoeExperts", "ids[1, 1] = 3 is outside the [0, 3) experts given"});
  ids[3] = -1;
  ExpectInvalid(run(id_view, views, out_view), {"ids[1, 1] = -1"});
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float f) { return std::isnan(f); }));
  ids[3] = 1;
  ExpectInvalid(run(TensorView(ids.data(), DType::kI64, Shape{2, 1}), views, out_view),
                {"ids i64[2, 1] cpu must be i32"});
  ExpectInvalid(
      backend.MoeExperts(x_view, id_view, TensorView(weights.data(), DType::kF32, Shape{2, 1}),
                         views, out_view, false),
      {"weights f32[2, 1] cpu must have the shape of ids i32[2, 2] cpu"});
  ExpectInvalid(run(id_view, views, TensorView(out.data(), DType::kF32, Shape{2, 3})),
                {"out f32[2, 3] cpu must have the shape of x f32[2, 4] cpu"});
  ExpectInvalid(run(id_view, views, TensorView(x.data(), DType::kF32, Shape{2, hidden})),
                {"out f32[2, 4] cpu overlaps x"});
  ExpectInvalid(
      run(id_view, views, TensorView(experts[1].down.data(), DType::kF32, Shape{2, hidden})),
      {"out f32[2, 4] cpu overlaps experts[1].down"});

  Expert wider(hidden, inter + 1, rng);
  std::vector<ExpertWeights> mixed = views;
  mixed[2] = wider.views();
  ExpectInvalid(run(id_view, mixed, out_view),
                {"experts[2].gate_up f32[8, 4] cpu must be [2 * I, H] = [6, 4]",
                 "the same for every expert"});
  mixed[2] = {views[2].gate_up, views[1].gate_up.Narrow(1, 0, 3)};
  ExpectInvalid(run(id_view, mixed, out_view),
                {"experts[2].down f32[6, 3] cpu must be [H, I] = [4, 3]"});
  mixed[0] = {views[0].gate_up.Narrow(0, 0, 5), views[0].down};
  ExpectInvalid(run(id_view, mixed, out_view),
                {"experts[0].gate_up f32[5, 4] cpu", "odd row count"});
  std::vector<uint16_t> half(6 * 4);
  mixed = views;
  mixed[1].gate_up = TensorView(half.data(), DType::kBF16, Shape{6, 4});
  ExpectInvalid(run(id_view, mixed, out_view),
                {"experts[1].gate_up is bf16[6, 4] cpu", "f32 only"});
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float f) { return std::isnan(f); }));
}

}  // namespace
}  // namespace eagle3::cpu
