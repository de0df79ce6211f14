// CudaBackend MoeRoute and MoeExperts against the CPU reference (CpuBackend) on the same inputs;
// skipped where no CUDA device is visible.
//
// Tolerances: routing ids exactly equal; routing weights within 1e-6 relative, element by element
// (the backends' expf differ by an ulp or two), except 2e-6 for softmax weights that are not
// normalized: they also carry the CPU's sequential fp32 sum over E (the GPU sums in fp64), whose
// rounding reaches 7e-7 relative on these inputs (measured with a host emulation of the kernel);
// expert outputs within 1e-5 relative (RelError: max |diff| / max |cpu|), fp32 dot products of up
// to 7168 terms summed in different orders.
#include <algorithm>
#include <cstdio>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/cuda_graph.h"
#include "eagle3/moe_routing.h"
#include "gmock/gmock.h"
#include "gpu/parity_util.h"
#include "gtest/gtest.h"
#include "moe_ops.h"

namespace eagle3::parity {
namespace {

using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kExpertTolerance = 1e-5;

double WeightTolerance(const MoeRoutingParams& p) {
  const bool normalized =
      p.norm_topk_prob && (p.topk_method == TopkMethod::kNoauxTc || p.top_k > 1);
  return p.scoring_func == ScoringFunc::kSoftmax && !normalized ? 2e-6 : 1e-6;
}

MoeRoutingParams Params(ScoringFunc scoring, TopkMethod method, int top_k, int n_group,
                        int topk_group, bool norm, float scale) {
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

// ---- Test data for routing ----------------------------------------------------------------------
//
// Exact id parity needs inputs where fp32 rounding cannot decide anything: the backends' expf
// differ by an ulp or two, so two candidates whose selection scores are within that of each other
// could swap. Logits (and biases) are drawn on coarse grids, so that equal inputs tie exactly on
// both backends (ties get tested at real sizes), and a row is redrawn while two candidates that
// decide its routing are distinct inputs closer than 1e-5 (relative) in exact arithmetic.

bool Near(double a, double b, double floor) {
  return std::fabs(a - b) <= 1e-5 * std::max({std::fabs(a), std::fabs(b), floor});
}

bool HasNearTie(const float* x, const float* bias, int64_t experts, const MoeRoutingParams& p) {
  const bool sigmoid = p.scoring_func == ScoringFunc::kSigmoid;
  const double floor = sigmoid ? 1.0 : 0.0;  // sigmoid scores and biases are O(1)
  std::vector<double> choice(experts);
  double max = *std::max_element(x, x + experts), sum = 0;
  for (int64_t e = 0; e < experts; ++e) sum += std::exp(static_cast<double>(x[e]) - max);
  for (int64_t e = 0; e < experts; ++e) {
    choice[e] = sigmoid ? 1 / (1 + std::exp(-static_cast<double>(x[e])))
                        : std::exp(static_cast<double>(x[e]) - max) / sum;
    if (bias != nullptr) choice[e] += bias[e];
  }
  auto same = [&](int64_t a, int64_t b) {
    return x[a] == x[b] && (bias == nullptr || bias[a] == bias[b]);
  };
  auto by_choice = [&](int64_t a, int64_t b) { return choice[a] > choice[b]; };

  std::vector<int64_t> candidates;
  const bool grouped = p.topk_method != TopkMethod::kGreedy && p.topk_group < p.n_group;
  if (grouped) {
    const int64_t per = experts / p.n_group;
    const int members = p.topk_method == TopkMethod::kNoauxTc ? 2 : 1;
    std::vector<double> score(p.n_group, 0.0);
    std::vector<std::vector<int64_t>> best(p.n_group);  // the experts that make up the score
    for (int g = 0; g < p.n_group; ++g) {
      std::vector<int64_t> order(per);
      std::iota(order.begin(), order.end(), g * per);
      std::stable_sort(order.begin(), order.end(), by_choice);
      for (int i = 0; i < members; ++i) score[g] += choice[order[i]];
      best[g].assign(order.begin(), order.begin() + members);
      // (A near tie at the cut inside a group changes the score by less than the tie itself.)
    }
    auto same_group = [&](int a, int b) {
      for (int i = 0; i < members; ++i) {
        if (!same(best[a][i], best[b][i])) return false;
      }
      return true;
    };
    // Only which groups are kept matters, not their order.
    std::vector<int> groups(p.n_group);
    std::iota(groups.begin(), groups.end(), 0);
    std::stable_sort(groups.begin(), groups.end(),
                     [&](int a, int b) { return score[a] > score[b]; });
    for (int i = 0; i < p.topk_group; ++i) {
      for (int j = p.topk_group; j < p.n_group; ++j) {
        const int a = groups[i], b = groups[j];
        if (!same_group(a, b) && Near(score[a], score[b], floor)) return true;
      }
    }
    for (int i = 0; i < p.topk_group; ++i) {
      for (int64_t e = 0; e < per; ++e) candidates.push_back(groups[i] * per + e);
    }
  } else {
    candidates.resize(experts);
    std::iota(candidates.begin(), candidates.end(), 0);
  }
  std::stable_sort(candidates.begin(), candidates.end(), [&](int64_t a, int64_t b) {
    return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
  });
  const size_t decisive = std::min(candidates.size(), static_cast<size_t>(p.top_k) + 1);
  for (size_t i = 0; i + 1 < decisive; ++i) {
    const int64_t a = candidates[i], b = candidates[i + 1];
    if (!same(a, b) && Near(choice[a], choice[b], floor)) return true;
  }
  return false;
}

struct RouteInputs {
  Tensor logits;  // host [T, E + 3]; the op gets the [T, E] narrow (row-strided)
  Tensor bias;    // host [E], empty unless noaux_tc
};

struct Draw {
  float step = 1.0f / 64;  // logits: N(offset, 1.5) rounded to this grid
  float offset = 0.0f;
  float bias_step = 1.0f / 256;  // noaux_tc biases: N(bias_offset, bias_spread) on this grid
  float bias_spread = 0.2f;
  float bias_offset = 0.0f;
  bool mirror_groups = false;  // odd groups repeat their even neighbour reversed: exact group ties
};

RouteInputs MakeRouteInputs(int64_t tokens, int64_t experts, const MoeRoutingParams& p,
                            uint32_t seed, const Draw& d = {}) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto grid = [&](float mean, float spread, float step) {
    return std::round((mean + spread * normal(rng)) / step) * step;
  };
  RouteInputs in;
  const bool noaux = p.topk_method == TopkMethod::kNoauxTc;
  if (noaux) {
    in.bias = *Tensor::Empty(DType::kF32, Shape{experts});
    for (int64_t e = 0; e < experts; ++e) {
      in.bias.data_as<float>()[e] = grid(d.bias_offset, d.bias_spread, d.bias_step);
    }
  }
  in.logits = *Tensor::Empty(DType::kF32, Shape{tokens, experts + 3});
  const int64_t per = experts / p.n_group;
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = in.logits.data_as<float>() + t * (experts + 3);
    int draws = 0;
    do {
      for (int64_t e = 0; e < experts + 3; ++e) row[e] = grid(d.offset, 1.5f, d.step);
      for (int g = 1; d.mirror_groups && g < p.n_group; g += 2) {
        std::reverse_copy(row + (g - 1) * per, row + g * per, row + g * per);
      }
      ++draws;
    } while (HasNearTie(row, noaux ? in.bias.data_as<float>() : nullptr, experts, p) &&
             draws < 1000);
    EXPECT_LT(draws, 1000) << "could not draw a row without near ties";
  }
  return in;
}

struct Routed {
  Tensor ids;      // host [T, k]
  Tensor weights;  // host [T, k]
};

class CudaBackendMoeTest : public ParityTest {
 protected:
  // Routes on the CPU reference (which must succeed).
  Routed RouteCpu(const TensorView& logits, const Tensor& bias, const MoeRoutingParams& p) {
    const int64_t tokens = logits.dim(0);
    Routed r{*Tensor::Empty(DType::kI32, Shape{tokens, p.top_k}),
             *Tensor::Empty(DType::kF32, Shape{tokens, p.top_k})};
    const absl::Status s =
        cpu_.MoeRoute(logits, bias.empty() ? nullptr : &bias.view(), p, r.ids, r.weights);
    EXPECT_TRUE(s.ok()) << s;
    return r;
  }

  // Routes on the GPU with row-strided inputs and outputs (ids prefilled with -1, weights with
  // NaN); returns the op's status and the outputs downloaded (without synchronizing the flag).
  absl::Status RouteGpu(const Tensor& host_logits_wide, int64_t experts, const Tensor& bias,
                        const MoeRoutingParams& p, Routed* out) {
    const int64_t tokens = host_logits_wide.dim(0);
    Tensor logits = Upload(host_logits_wide);
    Tensor device_bias;
    if (!bias.empty()) device_bias = Upload(bias);
    Tensor ids_init = *Tensor::Empty(DType::kI32, Shape{tokens, p.top_k + 1});
    Tensor weights_init = *Tensor::Empty(DType::kF32, Shape{tokens, p.top_k + 2});
    std::fill_n(ids_init.data_as<int32_t>(), ids_init.numel(), -1);
    std::fill_n(weights_init.data_as<float>(), weights_init.numel(), kNaN);
    Tensor ids = Upload(ids_init);
    Tensor weights = Upload(weights_init);
    const TensorView ids_view = ids.view().Narrow(1, 0, p.top_k);
    const TensorView weights_view = weights.view().Narrow(1, 0, p.top_k);
    const absl::Status s =
        gpu_->MoeRoute(logits.view().Narrow(1, 0, experts),
                       bias.empty() ? nullptr : &device_bias.view(), p, ids_view, weights_view);
    out->ids = *Tensor::Empty(DType::kI32, Shape{tokens, p.top_k});
    out->weights = *Tensor::Empty(DType::kF32, Shape{tokens, p.top_k});
    EXPECT_TRUE(gpu_->Copy(ids_view, out->ids).ok());
    EXPECT_TRUE(gpu_->Copy(weights_view, out->weights).ok());
    EXPECT_EQ(cudaStreamSynchronize(gpu_->stream()), cudaSuccess);
    return s;
  }

  // GPU vs CPU on the same inputs: ids equal, weights within WeightTolerance relative, for every
  // row (or every row but `skip_row`, whose GPU outputs must stay untouched).
  void ExpectRouteParity(const RouteInputs& in, int64_t experts, const MoeRoutingParams& p,
                         int64_t skip_row = -1) {
    const int64_t tokens = in.logits.dim(0);
    Routed gpu;
    const absl::Status s = RouteGpu(in.logits, experts, in.bias, p, &gpu);
    ASSERT_TRUE(s.ok()) << s;
    const absl::Status sync = gpu_->Synchronize();
    if (skip_row >= 0) {
      EXPECT_EQ(sync.code(), absl::StatusCode::kInvalidArgument) << sync;
      EXPECT_THAT(std::string(sync.message()), HasSubstr("MoeRoute")) << sync;
      EXPECT_TRUE(gpu_->Synchronize().ok()) << "the flag must be cleared once reported";
    } else {
      ASSERT_TRUE(sync.ok()) << sync;
    }
    // The CPU refuses a call with a bad row at all: route the good rows one by one.
    for (int64_t t = 0; t < tokens; ++t) {
      const int32_t* gpu_ids = gpu.ids.data_as<int32_t>() + t * p.top_k;
      const float* gpu_w = gpu.weights.data_as<float>() + t * p.top_k;
      if (t == skip_row) {
        for (int j = 0; j < p.top_k; ++j) {
          EXPECT_EQ(gpu_ids[j], -1) << "bad row " << t << " was written";
          EXPECT_TRUE(std::isnan(gpu_w[j])) << "bad row " << t << " was written";
        }
        continue;
      }
      const Routed cpu =
          RouteCpu(in.logits.view().Narrow(0, t, 1).Narrow(1, 0, experts), in.bias, p);
      for (int j = 0; j < p.top_k; ++j) {
        const float want = cpu.weights.data_as<float>()[j];
        ASSERT_EQ(gpu_ids[j], cpu.ids.data_as<int32_t>()[j]) << "row " << t << " slot " << j;
        EXPECT_LE(std::fabs(gpu_w[j] - want), WeightTolerance(p) * std::fabs(want))
            << "row " << t << " slot " << j << ": gpu " << gpu_w[j] << " cpu " << want;
      }
    }
  }
};

// ---- MoeRoute: every variant at real sizes ------------------------------------------------------

struct RouteCase {
  const char* name;
  int64_t experts;
  MoeRoutingParams params;
};

void PrintTo(const RouteCase& c, std::ostream* os) { *os << c.name; }

class CudaBackendMoeRouteTest : public CudaBackendMoeTest,
                                public ::testing::WithParamInterface<RouteCase> {};

TEST_P(CudaBackendMoeRouteTest, MatchesCpu) {
  const RouteCase& c = GetParam();
  for (const int64_t tokens : {1, 7, 300}) {
    SCOPED_TRACE(tokens);
    ExpectRouteParity(MakeRouteInputs(tokens, c.experts, c.params, 100 + tokens), c.experts,
                      c.params);
  }
}

// Coarse logits (and biases): many exact ties among experts and groups, decided by the lower
// index.
TEST_P(CudaBackendMoeRouteTest, TiesGoToTheLowerIndex) {
  const RouteCase& c = GetParam();
  Draw coarse;
  coarse.step = 0.5f;
  coarse.bias_step = 0.25f;
  ExpectRouteParity(MakeRouteInputs(64, c.experts, c.params, 7, coarse), c.experts, c.params);
  // Every logit (and bias) equal: the lowest experts of the lowest groups, in index order.
  RouteInputs equal = MakeRouteInputs(3, c.experts, c.params, 8);
  std::fill_n(equal.logits.data_as<float>(), equal.logits.numel(), 0.25f);
  if (!equal.bias.empty()) std::fill_n(equal.bias.data_as<float>(), c.experts, -0.125f);
  ExpectRouteParity(equal, c.experts, c.params);
  Routed gpu;
  ASSERT_TRUE(RouteGpu(equal.logits, c.experts, equal.bias, c.params, &gpu).ok());
  for (int j = 0; j < c.params.top_k; ++j) EXPECT_EQ(gpu.ids.data_as<int32_t>()[j], j);
  // Groups that are copies of each other tie exactly on their group score (one bias for all).
  Draw mirrored;
  mirrored.mirror_groups = true;
  mirrored.bias_spread = 0.0f;
  ExpectRouteParity(MakeRouteInputs(16, c.experts, c.params, 9, mirrored), c.experts, c.params);
}

// Every selection score negative: very negative logits (softmax scores stay positive), and for
// noaux_tc biases that push every biased score below zero (dropped groups must stay out).
TEST_P(CudaBackendMoeRouteTest, AllNegativeScores) {
  const RouteCase& c = GetParam();
  Draw negative;
  negative.offset = c.params.scoring_func == ScoringFunc::kSoftmax ? -40.0f : -4.0f;
  negative.bias_offset = -3.0f;
  ExpectRouteParity(MakeRouteInputs(32, c.experts, c.params, 11, negative), c.experts, c.params);
}

// LaunchMoeRoute's two kernels on the same device inputs: the same ids and the same weight bits
// (for experts <= kMoeRouteMaxBlockExperts, where the block kernel is the one LaunchMoeRoute takes;
// above, only the warp kernel exists).
TEST_P(CudaBackendMoeRouteTest, BlockKernelMatchesWarpKernelBitwise) {
  const RouteCase& c = GetParam();
  if (c.experts > cuda::kMoeRouteMaxBlockExperts) GTEST_SKIP() << "one kernel only";
  Draw coarse;
  coarse.step = 0.5f;
  coarse.bias_step = 0.25f;
  for (const RouteInputs& in : {MakeRouteInputs(1, c.experts, c.params, 21),
                                MakeRouteInputs(300, c.experts, c.params, 22),
                                MakeRouteInputs(64, c.experts, c.params, 23, coarse)}) {
    const int64_t tokens = in.logits.dim(0);
    const int64_t top_k = c.params.top_k;
    const bool grouped = c.params.topk_method != TopkMethod::kGreedy;
    const bool noaux = c.params.topk_method == TopkMethod::kNoauxTc;
    cuda::MoeRouteLaunchParams lp;
    lp.top_k = c.params.top_k;
    lp.n_group = grouped ? c.params.n_group : 1;
    lp.topk_group = grouped ? c.params.topk_group : 1;
    lp.sigmoid = c.params.scoring_func == ScoringFunc::kSigmoid;
    lp.group_top2 = noaux;
    lp.normalize = c.params.norm_topk_prob && (noaux || top_k > 1);
    lp.scale = noaux || !lp.normalize ? c.params.routed_scaling_factor : 1.0f;
    Tensor logits = Upload(in.logits);
    Tensor bias;
    if (!in.bias.empty()) bias = Upload(in.bias);
    Tensor flag = Upload(*Tensor::Zeros(DType::kI32, Shape{1}));
    Routed out[2];
    for (const bool warp_per_row : {false, true}) {
      lp.warp_per_row = warp_per_row;
      Tensor ids = *Tensor::Empty(DType::kI32, Shape{tokens, top_k}, gpu_->allocator());
      Tensor weights = *Tensor::Empty(DType::kF32, Shape{tokens, top_k}, gpu_->allocator());
      ASSERT_EQ(cuda::LaunchMoeRoute(logits.data_as<const float>(), logits.view().stride(0),
                                     bias.empty() ? nullptr : bias.data_as<const float>(), tokens,
                                     c.experts, lp, ids.data_as<int32_t>(), top_k,
                                     weights.data_as<float>(), top_k, flag.data_as<int>(),
                                     /*error_code=*/1 << 24, /*bias_error_code=*/2 << 24,
                                     /*programmatic=*/true, gpu_->stream()),
                cudaSuccess);
      out[warp_per_row] = Routed{Download(ids), Download(weights)};
    }
    EXPECT_EQ(Download(flag).data_as<int32_t>()[0], 0);
    for (int64_t i = 0; i < tokens * top_k; ++i) {
      ASSERT_EQ(out[0].ids.data_as<int32_t>()[i], out[1].ids.data_as<int32_t>()[i])
          << "row " << i / top_k << " slot " << i % top_k;
      EXPECT_EQ(std::bit_cast<uint32_t>(out[0].weights.data_as<float>()[i]),
                std::bit_cast<uint32_t>(out[1].weights.data_as<float>()[i]))
          << "row " << i / top_k << " slot " << i % top_k << ": block "
          << out[0].weights.data_as<float>()[i] << " warp " << out[1].weights.data_as<float>()[i];
    }
  }
}

// A non-finite logit: the op itself succeeds (the check runs on the device), Synchronize reports
// it, the bad row is left unwritten and the others are routed as usual.
TEST_P(CudaBackendMoeRouteTest, NonFiniteLogitIsReportedAtSynchronize) {
  const RouteCase& c = GetParam();
  for (const float bad : {kNaN, kInf, -kInf}) {
    RouteInputs in = MakeRouteInputs(6, c.experts, c.params, 12);
    in.logits.data_as<float>()[3 * (c.experts + 3) + c.experts / 2] = bad;
    ExpectRouteParity(in, c.experts, c.params, /*skip_row=*/3);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, CudaBackendMoeRouteTest,
    ::testing::Values(
        RouteCase{"V2Lite_greedy_k6", 64,
                  Params(ScoringFunc::kSoftmax, TopkMethod::kGreedy, 6, 1, 1, false, 1.0f)},
        RouteCase{"V2Lite_greedy_k6_normalized", 64,
                  Params(ScoringFunc::kSoftmax, TopkMethod::kGreedy, 6, 1, 1, true, 1.0f)},
        // kGreedy ignores the group params.
        RouteCase{"V2_greedy_ignores_groups", 160,
                  Params(ScoringFunc::kSoftmax, TopkMethod::kGreedy, 6, 8, 3, false, 16.0f)},
        RouteCase{
            "V2_group_limited_8g_top3_k6_scaled", 160,
            Params(ScoringFunc::kSoftmax, TopkMethod::kGroupLimitedGreedy, 6, 8, 3, false, 16.0f)},
        RouteCase{
            "V2_group_limited_8g_top3_k6_normalized", 160,
            Params(ScoringFunc::kSoftmax, TopkMethod::kGroupLimitedGreedy, 6, 8, 3, true, 16.0f)},
        // top_k == 1: no normalization even with norm_topk_prob, so the factor applies.
        RouteCase{
            "V2_group_limited_k1", 160,
            Params(ScoringFunc::kSoftmax, TopkMethod::kGroupLimitedGreedy, 1, 8, 3, true, 16.0f)},
        RouteCase{"V3_noaux_8g_top4_k8", 256,
                  Params(ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, 8, 8, 4, true, 2.5f)},
        RouteCase{"V3_noaux_8g_top4_k8_unnormalized", 256,
                  Params(ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, 8, 8, 4, false, 2.5f)},
        RouteCase{"K2_noaux_1g_k8", 384,
                  Params(ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, 8, 1, 1, true, 2.827f)},
        // More groups than a warp has lanes, one kept.
        RouteCase{"noaux_64g_top1_k2", 256,
                  Params(ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, 2, 64, 1, true, 1.0f)},
        // Groups of 48 (more than a warp, not a multiple of it).
        RouteCase{"noaux_384_8g_top4_k8", 384,
                  Params(ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, 8, 8, 4, true, 2.5f)},
        // Expert counts that are not whole warps (the block kernel's idle threads).
        RouteCase{
            "group_limited_100_4g_top2_k6", 100,
            Params(ScoringFunc::kSoftmax, TopkMethod::kGroupLimitedGreedy, 6, 4, 2, true, 1.0f)},
        RouteCase{"greedy_3_k2", 3,
                  Params(ScoringFunc::kSoftmax, TopkMethod::kGreedy, 2, 1, 1, true, 1.0f)},
        // The largest block (1024 threads), 32 groups of 32.
        RouteCase{"noaux_1024_32g_top4_k8", 1024,
                  Params(ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, 8, 32, 4, true, 2.5f)},
        // Past kMoeRouteMaxBlockExperts: the one-warp-per-row kernel.
        RouteCase{"warp_kernel_noaux_1536_8g_top4_k8", 1536,
                  Params(ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, 8, 8, 4, true, 2.5f)},
        // Normalized: unnormalized softmax weights at this E carry the CPU's fp32 sum's rounding,
        // beyond WeightTolerance (that path of the warp kernel is held to the block kernel's bits
        // by BlockKernelMatchesWarpKernelBitwise).
        RouteCase{
            "warp_kernel_group_limited_1536_8g_top3_k6_normalized", 1536,
            Params(ScoringFunc::kSoftmax, TopkMethod::kGroupLimitedGreedy, 6, 8, 3, true, 1.0f)}),
    [](const ::testing::TestParamInfo<RouteCase>& info) { return std::string(info.param.name); });

// Both kernels (256 experts: one block per row; 1536: one warp per row). Two bad biases: the lower
// expert is the one reported.
TEST_F(CudaBackendMoeTest, RouteNonFiniteBiasIsReportedAtSynchronize) {
  const MoeRoutingParams p =
      Params(ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, 8, 8, 4, true, 2.5f);
  for (const int64_t experts : {256, 1536}) {
    SCOPED_TRACE(experts);
    RouteInputs in = MakeRouteInputs(4, experts, p, 13);
    in.bias.data_as<float>()[experts - 3] = kInf;
    in.bias.data_as<float>()[17] = kNaN;
    Routed gpu;
    ASSERT_TRUE(RouteGpu(in.logits, experts, in.bias, p, &gpu).ok());
    const absl::Status s = gpu_->Synchronize();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("MoeRoute")) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("17")) << s;
    for (int64_t i = 0; i < gpu.ids.numel(); ++i) EXPECT_EQ(gpu.ids.data_as<int32_t>()[i], -1);
    EXPECT_TRUE(gpu_->Synchronize().ok());
  }
}

// Shape / dtype / params errors come back from the call itself, as InvalidArgument.
TEST_F(CudaBackendMoeTest, RouteRejectsBadArgumentsUpFront) {
  const MoeRoutingParams p =
      Params(ScoringFunc::kSoftmax, TopkMethod::kGreedy, 2, 1, 1, false, 1.0f);
  Tensor logits = Upload(Random(Shape{3, 8}, 1));
  Tensor ids = *Tensor::Empty(DType::kI32, Shape{3, 2}, gpu_->allocator());
  Tensor weights = *Tensor::Empty(DType::kF32, Shape{3, 2}, gpu_->allocator());
  Tensor ids64 = *Tensor::Empty(DType::kI64, Shape{3, 2}, gpu_->allocator());
  Tensor bf16 = *Tensor::Empty(DType::kBF16, Shape{3, 8}, gpu_->allocator());
  Tensor wide =
      *Tensor::Empty(DType::kF32, Shape{1, cuda::kMoeRouteMaxExperts + 1}, gpu_->allocator());
  Tensor ids1 = *Tensor::Empty(DType::kI32, Shape{1, 2}, gpu_->allocator());
  Tensor weights1 = *Tensor::Empty(DType::kF32, Shape{1, 2}, gpu_->allocator());
  Tensor host_logits = Random(Shape{3, 8}, 1);
  MoeRoutingParams sigmoid_greedy = p;
  sigmoid_greedy.scoring_func = ScoringFunc::kSigmoid;
  const std::vector<absl::Status> bad = {
      gpu_->MoeRoute(logits, nullptr, p, ids64, weights),
      gpu_->MoeRoute(bf16, nullptr, p, ids, weights),
      gpu_->MoeRoute(logits, nullptr, sigmoid_greedy, ids, weights),
      gpu_->MoeRoute(host_logits, nullptr, p, ids, weights),
      gpu_->MoeRoute(logits, &logits.view(), p, ids, weights),
      gpu_->MoeRoute(wide, nullptr, p, ids1, weights1),
  };
  for (const absl::Status& s : bad) EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(bad[1].message()), HasSubstr("f32"));
  EXPECT_THAT(std::string(bad[5].message()), HasSubstr("at most"));
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

// ---- MoeExperts ---------------------------------------------------------------------------------

// E experts with weights N(0, 1/sqrt(fan_in)), in two buffers with `pad` spare columns per row (so
// pad > 0 makes every expert row-strided), on the host and on the device.
struct Experts {
  Tensor host_gate_up, host_down, device_gate_up, device_down;
  std::vector<ExpertWeights> host, device;
};

class CudaBackendMoeExpertsTest : public CudaBackendMoeTest {
 protected:
  Experts MakeExperts(int64_t num, int64_t hidden, int64_t inter, int64_t pad, uint32_t seed) {
    Experts x;
    x.host_gate_up = Random(Shape{num * 2 * inter, hidden + pad}, seed, 1.0f / std::sqrt(hidden));
    x.host_down = Random(Shape{num * hidden, inter + pad}, seed + 1, 1.0f / std::sqrt(inter));
    x.device_gate_up = Upload(x.host_gate_up);
    x.device_down = Upload(x.host_down);
    for (int64_t e = 0; e < num; ++e) {
      for (auto [views, gate_up, down] :
           {std::tuple{&x.host, &x.host_gate_up, &x.host_down},
            std::tuple{&x.device, &x.device_gate_up, &x.device_down}}) {
        views->push_back({gate_up->view().Narrow(0, e * 2 * inter, 2 * inter).Narrow(1, 0, hidden),
                          down->view().Narrow(0, e * hidden, hidden).Narrow(1, 0, inter)});
      }
    }
    return x;
  }

  // Random routing of `tokens` tokens to `k` distinct experts each, positive weights.
  static void MakeRouting(int64_t tokens, int64_t k, int64_t num, uint32_t seed, Tensor* ids,
                          Tensor* weights) {
    *ids = *Tensor::Empty(DType::kI32, Shape{tokens, k});
    *weights = *Tensor::Empty(DType::kF32, Shape{tokens, k});
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> w(0.05f, 1.0f);
    std::vector<int32_t> all(num);
    std::iota(all.begin(), all.end(), 0);
    for (int64_t t = 0; t < tokens; ++t) {
      std::shuffle(all.begin(), all.end(), rng);
      for (int64_t j = 0; j < k; ++j) {
        ids->data_as<int32_t>()[t * k + j] = all[j % num];
        weights->data_as<float>()[t * k + j] = w(rng);
      }
    }
  }

  // One MoeExperts call on both backends; returns RelError(gpu out, cpu out). x and out are
  // row-strided views ([T, H] of [T, H + 4] buffers); out starts random with accumulate, else NaN
  // (write-only). The GPU result goes to *gpu_result when given.
  double RunBoth(const Experts& experts, int64_t tokens, int64_t hidden, const Tensor& ids,
                 const Tensor& weights, bool accumulate, uint32_t seed,
                 Tensor* gpu_result = nullptr) {
    Tensor x = Random(Shape{tokens, hidden + 4}, seed);
    Tensor out = Random(Shape{tokens, hidden + 4}, seed + 1);
    if (!accumulate) std::fill_n(out.data_as<float>(), out.numel(), kNaN);
    Tensor device_x = Upload(x);
    Tensor device_out = Upload(out);
    Tensor device_ids = Upload(ids);
    Tensor device_weights = Upload(weights);
    const TensorView out_view = device_out.view().Narrow(1, 0, hidden);
    const absl::Status s = gpu_->MoeExperts(device_x.view().Narrow(1, 0, hidden), device_ids,
                                            device_weights, experts.device, out_view, accumulate);
    EXPECT_TRUE(s.ok()) << s;
    const absl::Status sync = gpu_->Synchronize();
    EXPECT_TRUE(sync.ok()) << sync;
    Tensor got = Download(out_view);
    const absl::Status c =
        cpu_.MoeExperts(x.view().Narrow(1, 0, hidden), ids, weights, experts.host,
                        out.view().Narrow(1, 0, hidden), accumulate);
    EXPECT_TRUE(c.ok()) << c;
    Tensor want = *Tensor::Empty(DType::kF32, Shape{tokens, hidden});
    EXPECT_TRUE(cpu_.Copy(out.view().Narrow(1, 0, hidden), want).ok());
    const float* g = got.data_as<float>();
    EXPECT_TRUE(std::all_of(g, g + got.numel(), [](float v) { return std::isfinite(v); }))
        << "non-finite GPU output";
    const double error = RelError(got, want);
    if (gpu_result != nullptr) *gpu_result = std::move(got);
    return error;
  }
};

struct ExpertsCase {
  const char* name;
  int64_t hidden, inter, num_experts, top_k, pad;
};

void PrintTo(const ExpertsCase& c, std::ostream* os) { *os << c.name; }

class CudaBackendMoeExpertsShapeTest : public CudaBackendMoeExpertsTest,
                                       public ::testing::WithParamInterface<ExpertsCase> {
 protected:
  void CheckMatchesCpu() {
    const ExpertsCase& c = GetParam();
    const Experts experts = MakeExperts(c.num_experts, c.hidden, c.inter, c.pad, 21);
    for (const int64_t tokens : {1, 5, 64}) {
      for (const bool accumulate : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "T = " << tokens << ", accumulate = " << accumulate);
        Tensor ids, weights;
        MakeRouting(tokens, c.top_k, c.num_experts, 30 + tokens, &ids, &weights);
        EXPECT_LE(RunBoth(experts, tokens, c.hidden, ids, weights, accumulate, 40 + tokens),
                  kExpertTolerance);
      }
    }
  }
};

// With the default options, 64 tokens take the grouped path (MoeExpertsUseGrouped), 1 and 5 the
// per-pair path.
TEST_P(CudaBackendMoeExpertsShapeTest, MatchesCpu) { CheckMatchesCpu(); }

// The grouped path off (CudaBackendOptions::moe_grouped_experts = false): the per-pair path for
// every token count, which is what a backend created so runs.
class CudaBackendMoePerPairShapeTest : public CudaBackendMoeExpertsShapeTest {
 protected:
  cuda::CudaBackendOptions Options() const override {
    cuda::CudaBackendOptions options;
    options.moe_grouped_experts = false;
    return options;
  }
};

TEST_P(CudaBackendMoePerPairShapeTest, MatchesCpu) { CheckMatchesCpu(); }

const ExpertsCase kExpertsCases[] = {
    // DeepSeek-V3 / Kimi-K2 at TP8: H 7168, I 2048 / 8 (16 of the 256 experts: the kernels'
    // shapes do not depend on E).
    ExpertsCase{"V3_TP8_H7168_I256_k8", 7168, 256, 16, 8, 0},
    // Small and odd: the scalar (unaligned) load path, row-strided experts.
    ExpertsCase{"small_H37_I11_k3_strided", 37, 11, 10, 3, 3},
    // Aligned, row-strided (float4 path through strides), I not a multiple of the row block.
    ExpertsCase{"small_H64_I20_k6_strided", 64, 20, 12, 6, 4},
    // More slots than the down kernel's warps (each takes several), hidden not a multiple of its
    // row block: the dense join's top_k + shared slots at V3 / K2 are 9.
    ExpertsCase{"slots_H200_I24_k17", 200, 24, 20, 17, 0},
    ExpertsCase{"slots_H132_I32_k9_strided", 132, 32, 12, 9, 8},
};

std::string ExpertsCaseName(const ::testing::TestParamInfo<ExpertsCase>& info) {
  return std::string(info.param.name);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaBackendMoeExpertsShapeTest, ::testing::ValuesIn(kExpertsCases),
                         ExpertsCaseName);
INSTANTIATE_TEST_SUITE_P(Shapes, CudaBackendMoePerPairShapeTest, ::testing::ValuesIn(kExpertsCases),
                         ExpertsCaseName);

// Experts with bf16_activations (a dense layer's shared experts joined to its routed ones) round x
// and their activation on both backends, the others do not; 64 tokens, which would take the grouped
// path, take the per-pair one. Against the CPU with the flags cleared the difference is the
// rounding's, far above the tolerance: the test sees whether the GPU rounds.
TEST_F(CudaBackendMoeExpertsTest, Bf16ActivationsRoundOnBothBackends) {
  Experts experts = MakeExperts(6, 96, 24, 4, 70);
  for (const size_t e : {size_t{1}, size_t{4}}) {
    experts.host[e].bf16_activations = true;
    experts.device[e].bf16_activations = true;
  }
  for (const int64_t tokens : {1, 5, 64}) {
    SCOPED_TRACE(::testing::Message() << "T = " << tokens);
    Tensor ids, weights;
    MakeRouting(tokens, 4, 6, 71 + tokens, &ids, &weights);
    const double error = RunBoth(experts, tokens, 96, ids, weights, false, 72);
    EXPECT_LE(error, 1e-4);
    Experts unflagged = MakeExperts(6, 96, 24, 4, 70);  // the same weights, no flags on the CPU
    unflagged.device = experts.device;
    const double rounding = RunBoth(unflagged, tokens, 96, ids, weights, false, 72);
    std::printf("  T = %lld: GPU vs CPU %.2e, flagged vs not %.2e\n", static_cast<long long>(tokens), error, rounding);
    EXPECT_GT(rounding, 10 * error);
  }
}

// A call naming the leading entries of a cached expert set (a layer's routed experts without its
// joined shared slices, as FeedForwardBlock passes past the join) uses that set's device table: it
// uploads nothing, so it records under a graph capture once the whole set has run (a new set would
// be refused there), and the replay computes the routed experts' sum.
TEST_F(CudaBackendMoeExpertsTest, LeadingEntriesOfACachedSetRunUnderCapture) {
  const int64_t hidden = 64, inter = 16, routed = 6, tokens = 5, k = 3;
  Experts all = MakeExperts(routed + 2, hidden, inter, 0, 80);
  for (const size_t e : {size_t{6}, size_t{7}}) {  // the shared slices
    all.host[e].bf16_activations = true;
    all.device[e].bf16_activations = true;
  }
  Tensor ids, weights;
  MakeRouting(tokens, k, routed, 81, &ids, &weights);
  EXPECT_LE(RunBoth(all, tokens, hidden, ids, weights, false, 82), kExpertTolerance);  // uploads the set

  Experts prefix;
  prefix.host.assign(all.host.begin(), all.host.begin() + routed);
  prefix.device.assign(all.device.begin(), all.device.begin() + routed);
  const Tensor x = Random(Shape{tokens, hidden}, 83);
  const Tensor device_x = Upload(x), device_ids = Upload(ids), device_weights = Upload(weights);
  Tensor device_out = *Tensor::Empty(DType::kF32, Shape{tokens, hidden}, gpu_->allocator());
  auto graph = cuda::CudaGraph::Capture(gpu_->stream(), [&] {
    return gpu_->MoeExperts(device_x, device_ids, device_weights, prefix.device, device_out, false);
  });
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE((*graph)->Launch(gpu_->stream()).ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  Tensor want = *Tensor::Empty(DType::kF32, Shape{tokens, hidden});
  ASSERT_TRUE(cpu_.MoeExperts(x, ids, weights, prefix.host, want, false).ok());
  EXPECT_LE(RelError(Download(device_out), want), kExpertTolerance);

  // A set that only shares a prefix with the cached one is new: refused under capture.
  Experts other = MakeExperts(routed, hidden, inter, 0, 84);
  other.device.front() = all.device.front();
  auto refused = cuda::CudaGraph::Capture(gpu_->stream(), [&] {
    return gpu_->MoeExperts(device_x, device_ids, device_weights, other.device, device_out, false);
  });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
}

// CudaBackendOptions::moe_grouped_min_tokens reaches the dispatch: a 16-token call (pairs >= 2 E)
// runs per pair at the default bound and grouped with the bound at 8. The two paths sum in different
// orders, so their bits differ while both match the CPU; with the grouped path off, the lowered
// bound gives the default's bits.
TEST_F(CudaBackendMoeExpertsTest, GroupedTokenBoundIsTheBackendsOption) {
  const int64_t hidden = 128, inter = 32, num = 8, tokens = 16, k = 4;
  const Experts experts = MakeExperts(num, hidden, inter, 0, 90);
  Tensor ids, weights;
  MakeRouting(tokens, k, num, 91, &ids, &weights);
  ASSERT_LT(tokens, cuda::CudaBackendOptions().moe_grouped_min_tokens);
  const Tensor x = Random(Shape{tokens, hidden}, 92);
  const Tensor device_x = Upload(x), device_ids = Upload(ids), device_weights = Upload(weights);
  ASSERT_TRUE(gpu_->Synchronize().ok());
  Tensor want = *Tensor::Empty(DType::kF32, Shape{tokens, hidden});
  ASSERT_TRUE(cpu_.MoeExperts(x, ids, weights, experts.host, want, false).ok());
  const auto run = [&](int64_t min_tokens, bool grouped) {
    cuda::CudaBackendOptions options;
    options.moe_grouped_min_tokens = min_tokens;
    options.moe_grouped_experts = grouped;
    auto backend = cuda::CudaBackend::Create(options);
    EXPECT_TRUE(backend.ok()) << backend.status();
    if (!backend.ok()) return Tensor();
    Tensor out = *Tensor::Empty(DType::kF32, Shape{tokens, hidden}, (*backend)->allocator());
    EXPECT_TRUE((*backend)->MoeExperts(device_x, device_ids, device_weights, experts.device, out, false).ok());
    EXPECT_TRUE((*backend)->Synchronize().ok());
    Tensor host = *Tensor::Empty(DType::kF32, Shape{tokens, hidden});
    EXPECT_TRUE((*backend)->Copy(out, host).ok());
    EXPECT_TRUE((*backend)->Synchronize().ok());
    EXPECT_LE(RelError(host, want), kExpertTolerance) << "bound " << min_tokens << ", grouped " << grouped;
    return host;
  };
  const Tensor per_pair = run(cuda::CudaBackendOptions().moe_grouped_min_tokens, true);
  const Tensor grouped = run(8, true);
  const Tensor off = run(8, false);
  ASSERT_EQ(per_pair.nbytes(), grouped.nbytes());
  ASSERT_EQ(per_pair.nbytes(), off.nbytes());
  EXPECT_NE(std::memcmp(per_pair.data(), grouped.data(), per_pair.nbytes()), 0) << "the bound did not reach the path";
  EXPECT_EQ(std::memcmp(per_pair.data(), off.data(), per_pair.nbytes()), 0);
}

// No atomics: the same call gives bitwise the same output.
TEST_F(CudaBackendMoeExpertsTest, Reproducible) {
  const Experts experts = MakeExperts(8, 256, 64, 0, 50);
  Tensor ids, weights;
  MakeRouting(33, 4, 8, 51, &ids, &weights);
  Tensor first, second;
  RunBoth(experts, 33, 256, ids, weights, false, 52, &first);
  RunBoth(experts, 33, 256, ids, weights, false, 52, &second);
  for (int64_t i = 0; i < first.numel(); ++i) {
    ASSERT_EQ(first.data_as<float>()[i], second.data_as<float>()[i]) << i;
  }
}

// The device pointer tables are cached by content: switching between expert sets (layers),
// changing a set in place, and evicting tables (more sets than the cache holds) all stay correct.
TEST_F(CudaBackendMoeExpertsTest, ExpertSetsSwitchChangeAndEvict) {
  const int64_t hidden = 48, inter = 16, num = 6;
  Experts a = MakeExperts(num, hidden, inter, 0, 60);
  const Experts b = MakeExperts(num, hidden, inter, 0, 61);
  Tensor ids, weights;
  MakeRouting(5, 3, num, 62, &ids, &weights);
  for (const Experts* set : std::initializer_list<const Experts*>{&a, &b, &a, &b}) {
    EXPECT_LE(RunBoth(*set, 5, hidden, ids, weights, false, 63), kExpertTolerance);
  }
  std::swap(a.host[0], a.host[4]);  // same span, new contents
  std::swap(a.device[0], a.device[4]);
  EXPECT_LE(RunBoth(a, 5, hidden, ids, weights, false, 64), kExpertTolerance);

  // 300 distinct sets of 6 drawn from the 12 experts of a and b: more than the cache's 256 tables.
  std::vector<int> pool(2 * num);
  std::iota(pool.begin(), pool.end(), 0);
  std::mt19937 rng(65);
  std::vector<std::vector<int>> picks;
  while (picks.size() < 300) {
    std::shuffle(pool.begin(), pool.end(), rng);
    std::vector<int> pick(pool.begin(), pool.begin() + num);
    if (std::find(picks.begin(), picks.end(), pick) == picks.end()) picks.push_back(pick);
  }
  std::vector<Experts> sets(picks.size());
  for (size_t i = 0; i < picks.size(); ++i) {
    for (const int e : picks[i]) {
      const Experts& from = e < num ? a : b;
      sets[i].host.push_back(from.host[e % num]);
      sets[i].device.push_back(from.device[e % num]);
    }
  }
  Tensor out = *Tensor::Empty(DType::kF32, Shape{5, hidden}, gpu_->allocator());
  Tensor x = Upload(Random(Shape{5, hidden}, 66));
  Tensor device_ids = Upload(ids), device_weights = Upload(weights);
  for (const Experts& set : sets) {
    ASSERT_TRUE(gpu_->MoeExperts(x, device_ids, device_weights, set.device, out, false).ok());
  }
  EXPECT_TRUE(gpu_->Synchronize().ok());
  // sets[0] was evicted (least recently used), sets[299] is cached; b comes back too.
  for (const Experts* set :
       std::initializer_list<const Experts*>{&sets[0], &sets[299], &sets[1], &b}) {
    EXPECT_LE(RunBoth(*set, 5, hidden, ids, weights, true, 67), kExpertTolerance);
  }
}

// An id outside [0, E): the call succeeds, Synchronize reports it, that token's out row is left
// alone, and the other tokens are computed.
TEST_F(CudaBackendMoeExpertsTest, BadIdIsReportedAtSynchronize) {
  const int64_t hidden = 32, inter = 8, num = 4, tokens = 4;
  const Experts experts = MakeExperts(num, hidden, inter, 0, 70);
  for (const int32_t bad : {-1, static_cast<int32_t>(num)}) {
    Tensor ids, weights;
    MakeRouting(tokens, 2, num, 71, &ids, &weights);
    Tensor good_ids = *Tensor::Empty(DType::kI32, Shape{tokens, 2});
    std::copy_n(ids.data_as<int32_t>(), ids.numel(), good_ids.data_as<int32_t>());
    ids.data_as<int32_t>()[2 * 2 + 1] = bad;  // token 2, slot 1
    Tensor x = Random(Shape{tokens, hidden}, 72);
    Tensor init = *Tensor::Empty(DType::kF32, Shape{tokens, hidden});
    std::fill_n(init.data_as<float>(), init.numel(), 7.0f);
    Tensor device_out = Upload(init);
    // Named: the kernels run after the call returns.
    Tensor device_x = Upload(x), device_ids = Upload(ids), device_weights = Upload(weights);
    ASSERT_TRUE(
        gpu_->MoeExperts(device_x, device_ids, device_weights, experts.device, device_out, false)
            .ok());
    const absl::Status s = gpu_->Synchronize();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("MoeExperts")) << s;
    EXPECT_TRUE(gpu_->Synchronize().ok()) << "the flag must be cleared once reported";
    Tensor got = Download(device_out);
    Tensor want = *Tensor::Empty(DType::kF32, Shape{tokens, hidden});
    ASSERT_TRUE(cpu_.MoeExperts(x, good_ids, weights, experts.host, want, false).ok());
    for (int64_t t = 0; t < tokens; ++t) {
      const TensorView got_row = got.view().Narrow(0, t, 1);
      if (t == 2) {
        for (int64_t h = 0; h < hidden; ++h) EXPECT_EQ(got.data_as<float>()[t * hidden + h], 7.0f);
      } else {
        EXPECT_LE(RelError(got_row, want.view().Narrow(0, t, 1)), kExpertTolerance)
            << "token " << t;
      }
    }
  }
}

// k = 0: nothing routed, so out is zeroed (or left as it was with accumulate).
TEST_F(CudaBackendMoeExpertsTest, NoSlots) {
  const Experts experts = MakeExperts(2, 16, 4, 0, 80);
  Tensor ids = *Tensor::Empty(DType::kI32, Shape{3, 0});
  Tensor weights = *Tensor::Empty(DType::kF32, Shape{3, 0});
  Tensor got;
  EXPECT_EQ(RunBoth(experts, 3, 16, ids, weights, false, 81, &got), 0.0);
  for (int64_t i = 0; i < got.numel(); ++i) EXPECT_EQ(got.data_as<float>()[i], 0.0f);
  EXPECT_EQ(RunBoth(experts, 3, 16, ids, weights, true, 82), 0.0);
}

// Bounds fixed at creation: more tokens than max_rows, more experts than max_experts.
TEST_F(CudaBackendMoeExpertsTest, CallsBeyondTheCreationBoundsAreRefused) {
  cuda::CudaBackendOptions options;
  options.max_rows = 4;
  options.max_experts = 3;
  auto small = cuda::CudaBackend::Create(options);
  ASSERT_TRUE(small.ok()) << small.status();
  cuda::CudaBackend& backend = **small;
  const Experts experts = MakeExperts(4, 16, 4, 0, 90);  // on gpu_'s device (device 0, as small's)
  auto run = [&](int64_t tokens, std::span<const ExpertWeights> set) {
    Tensor x = *Tensor::Empty(DType::kF32, Shape{tokens, 16}, backend.allocator());
    Tensor out = *Tensor::Empty(DType::kF32, Shape{tokens, 16}, backend.allocator());
    Tensor ids = *Tensor::Zeros(DType::kI32, Shape{tokens, 2});
    Tensor weights = *Tensor::Zeros(DType::kF32, Shape{tokens, 2});
    Tensor device_ids = *Tensor::Empty(DType::kI32, Shape{tokens, 2}, backend.allocator());
    Tensor device_weights = *Tensor::Empty(DType::kF32, Shape{tokens, 2}, backend.allocator());
    EXPECT_TRUE(backend.Copy(ids, device_ids).ok());
    EXPECT_TRUE(backend.Copy(weights, device_weights).ok());
    EXPECT_TRUE(backend.Copy(Random(Shape{tokens, 16}, 91), x).ok());
    const absl::Status s = backend.MoeExperts(x, device_ids, device_weights, set, out, false);
    EXPECT_TRUE(backend.Synchronize().ok());
    return s;
  };
  const std::span<const ExpertWeights> three(experts.device.data(), 3);
  EXPECT_TRUE(run(4, three).ok());
  const absl::Status rows = run(5, three);
  EXPECT_EQ(rows.code(), absl::StatusCode::kResourceExhausted) << rows;
  EXPECT_THAT(std::string(rows.message()), HasSubstr("max_rows"));
  const absl::Status many = run(2, experts.device);
  EXPECT_EQ(many.code(), absl::StatusCode::kResourceExhausted) << many;
  EXPECT_THAT(std::string(many.message()), HasSubstr("max_experts"));
}

TEST_F(CudaBackendMoeExpertsTest, RejectsBadArgumentsUpFront) {
  const Experts experts = MakeExperts(2, 16, 4, 0, 95);
  Tensor x = Upload(Random(Shape{2, 16}, 96));
  Tensor out = *Tensor::Empty(DType::kF32, Shape{2, 16}, gpu_->allocator());
  Tensor ids = *Tensor::Empty(DType::kI32, Shape{2, 1}, gpu_->allocator());
  Tensor ids64 = *Tensor::Empty(DType::kI64, Shape{2, 1}, gpu_->allocator());
  Tensor weights = *Tensor::Empty(DType::kF32, Shape{2, 1}, gpu_->allocator());
  Tensor x_bf16 = *Tensor::Empty(DType::kBF16, Shape{2, 16}, gpu_->allocator());
  const std::vector<absl::Status> bad = {
      gpu_->MoeExperts(x, ids64, weights, experts.device, out, false),
      gpu_->MoeExperts(x_bf16, ids, weights, experts.device, out, false),
      gpu_->MoeExperts(x, ids, weights, experts.host, out, false),  // host experts
      gpu_->MoeExperts(x, ids, weights, experts.device, x, true),   // out overlaps x
  };
  for (const absl::Status& s : bad) EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(bad[1].message()), HasSubstr("f32"));
  // More slots a token than the kernels hold: refused by name before anything runs.
  Tensor many_ids = *Tensor::Empty(DType::kI32, Shape{2, 1537}, gpu_->allocator());
  Tensor many_weights = *Tensor::Empty(DType::kF32, Shape{2, 1537}, gpu_->allocator());
  const absl::Status slots = gpu_->MoeExperts(x, many_ids, many_weights, experts.device, out, false);
  EXPECT_EQ(slots.code(), absl::StatusCode::kInvalidArgument) << slots;
  EXPECT_THAT(std::string(slots.message()), HasSubstr("1537 slots per token"));
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

}  // namespace
}  // namespace eagle3::parity
