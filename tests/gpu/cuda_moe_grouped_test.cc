// CudaBackend::MoeExperts on its grouped path (calls with many tokens: MoeExpertsUseGrouped in
// cuda/moe_ops.h) against the CPU reference, at DeepSeek-V2 / V3 TP8 rank shapes and small
// odd ones, f32 and bf16 expert weights; skipped where no CUDA device is visible.
//
// Tolerance: 1e-5 relative (RelError: max |diff| / max |cpu|), as the per-pair path's tests: the
// grouped kernels split every f32 operand exactly into bf16 parts for the tensor cores, so the
// products are fp32 products and only the summation order differs.
//
// The CPU reference runs on a sample of the tokens (all of them up to 64 tokens; the results of a
// token do not depend on the others'); the GPU runs every token, so the grouping sees the full
// routing. Expert e views pool e % kPools shifted right by (e / kPools) * shift columns: every
// expert has distinct weights while the device holds only kPools copies (the V3 rank in f32 would
// be 5.6 GB otherwise).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/half.h"
#include "gmock/gmock.h"
#include "gpu/parity_util.h"
#include "gtest/gtest.h"
#include "moe_ops.h"

namespace eagle3::parity {
namespace {

using ::testing::HasSubstr;

constexpr double kTolerance = 1e-5;
constexpr int64_t kPools = 16;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct MoeShape {
  const char* name;
  int64_t experts, hidden, inter, top_k;
  int64_t shift;  // pool column shift per expert: a multiple of 8 keeps rows 16-byte aligned
};

// DeepSeek-V2 at TP8: 160 experts, I 1536 / 8, H 5120, top-6; V3 at TP8: 256, 2048 / 8, 7168, top-8.
// The grouped path's token bound of a default backend (the one these tests create).
const int64_t kGroupedMinTokens = cuda::CudaBackendOptions().moe_grouped_min_tokens;
const MoeShape kV2Tp8{"V2_TP8", 160, 5120, 192, 6, 8};
const MoeShape kV3Tp8{"V3_TP8", 256, 7168, 256, 8, 8};
const MoeShape kSmall{"small_E7_H72_I40_k3", 7, 72, 40, 3, 8};
const MoeShape kOdd{"odd_E5_H37_I11_k2_unaligned", 5, 37, 11, 2, 1};

struct ExpertSet {
  std::vector<Tensor> storage;                // host f32 pools and their device copies
  std::vector<ExpertWeights> host, device;    // per expert: [2I, H], [H, I] views
};

struct Routing {
  Tensor ids;      // host [T, k], i32
  Tensor weights;  // host [T, k], f32
};

class CudaMoeGroupedTest : public ParityTest {
 protected:
  // The grouped path (CudaBackendOptions::moe_grouped_experts, on by default) is on for this suite.
  cuda::CudaBackendOptions Options() const override {
    cuda::CudaBackendOptions options;
    options.moe_grouped_experts = true;
    return options;
  }

  // Uniform values of standard deviation `stddev`, fast enough for the V3 pools (~100M values).
  static void Fill(Tensor& t, uint32_t seed, float stddev) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-std::sqrt(3.0f) * stddev, std::sqrt(3.0f) * stddev);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng);
  }

  // Device copy of a host f32 pool in `dtype` (bf16: the host values are rounded in place first,
  // so that both backends see the same weights).
  Tensor UploadAs(Tensor& host, DType dtype) {
    if (dtype == DType::kF32) return Upload(host);
    Tensor bits = *Tensor::Empty(DType::kBF16, host.shape());
    for (int64_t i = 0; i < host.numel(); ++i) {
      bits.data_as<uint16_t>()[i] = FloatToBf16(host.data_as<float>()[i]);
      host.data_as<float>()[i] = Bf16ToFloat(bits.data_as<uint16_t>()[i]);
    }
    return Upload(bits);
  }

  ExpertSet MakeExperts(const MoeShape& s, DType dtype, uint32_t seed) {
    ExpertSet set;
    const int64_t pools = std::min(s.experts, kPools);
    const int64_t shifts = (s.experts + pools - 1) / pools;
    const int64_t gate_up_cols = s.hidden + shifts * s.shift, down_cols = s.inter + shifts * s.shift;
    for (int64_t p = 0; p < pools; ++p) {
      Tensor gate_up = *Tensor::Empty(DType::kF32, Shape{2 * s.inter, gate_up_cols});
      Tensor down = *Tensor::Empty(DType::kF32, Shape{s.hidden, down_cols});
      Fill(gate_up, seed + 2 * static_cast<uint32_t>(p), 1.0f / std::sqrt(static_cast<float>(s.hidden)));
      Fill(down, seed + 2 * static_cast<uint32_t>(p) + 1, 1.0f / std::sqrt(static_cast<float>(s.inter)));
      Tensor device_gate_up = UploadAs(gate_up, dtype);
      Tensor device_down = UploadAs(down, dtype);
      for (Tensor* t : {&gate_up, &down, &device_gate_up, &device_down}) set.storage.push_back(std::move(*t));
    }
    for (int64_t e = 0; e < s.experts; ++e) {
      const size_t p = static_cast<size_t>(e % pools) * 4;
      const int64_t shift = (e / pools) * s.shift;
      set.host.push_back({set.storage[p].view().Narrow(1, shift, s.hidden),
                          set.storage[p + 1].view().Narrow(1, shift, s.inter)});
      set.device.push_back({set.storage[p + 2].view().Narrow(1, shift, s.hidden),
                            set.storage[p + 3].view().Narrow(1, shift, s.inter)});
    }
    return set;
  }

  // Each token picks k distinct experts at random (any of them, or with `skewed`: slot 0 is always
  // expert 1 and the other slots come from experts 2 .. k + 2, so most experts stay untouched and
  // expert 1 gets every token).
  static Routing MakeRouting(const MoeShape& s, int64_t tokens, uint32_t seed, bool skewed = false) {
    Routing r{*Tensor::Empty(DType::kI32, Shape{tokens, s.top_k}),
              *Tensor::Empty(DType::kF32, Shape{tokens, s.top_k})};
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> w(0.05f, 1.0f);
    std::vector<int32_t> all(static_cast<size_t>(skewed ? s.top_k + 1 : s.experts));
    std::iota(all.begin(), all.end(), skewed ? 2 : 0);
    for (int64_t t = 0; t < tokens; ++t) {
      std::shuffle(all.begin(), all.end(), rng);
      for (int64_t j = 0; j < s.top_k; ++j) {
        const int32_t id = skewed ? (j == 0 ? 1 : all[static_cast<size_t>(j - 1)]) : all[static_cast<size_t>(j)];
        r.ids.data_as<int32_t>()[t * s.top_k + j] = id;
        r.weights.data_as<float>()[t * s.top_k + j] = w(rng);
      }
    }
    return r;
  }

  // The tokens the CPU checks: all up to 64, else every (T / 24)-th, the last two, and both sides
  // of the V3 rank's chunk boundary (1170 tokens per grouped round).
  static std::vector<int64_t> Sample(int64_t tokens) {
    std::vector<int64_t> rows;
    const int64_t step = tokens <= 64 ? 1 : tokens / 24;
    for (int64_t t = 0; t < tokens; t += step) rows.push_back(t);
    for (const int64_t t : {tokens - 2, tokens - 1, int64_t{1169}, int64_t{1170}}) {
      if (t >= 0 && t < tokens) rows.push_back(t);
    }
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    return rows;
  }

  // One grouped call on the GPU (x and out row-strided: [T, H] of [T, H + 4]; out starts random
  // with accumulate, NaN without) and the CPU reference on the sampled tokens, except `bad_token`
  // (whose GPU row must stay as it was, and whose id makes Synchronize fail); returns RelError over
  // the sampled tokens.
  double RunCase(const MoeShape& s, const ExpertSet& experts, const Routing& r, bool accumulate, uint32_t seed,
                 int64_t bad_token = -1) {
    const int64_t tokens = r.ids.dim(0), hidden = s.hidden, k = s.top_k;
    EXPECT_TRUE(cuda::MoeExpertsUseGrouped(tokens, k, s.experts, hidden, s.inter, kGroupedMinTokens))
        << "the case does not exercise the grouped path";
    Tensor x = Random(Shape{tokens, hidden + 4}, seed);
    Tensor out = Random(Shape{tokens, hidden + 4}, seed + 1);
    if (!accumulate) std::fill_n(out.data_as<float>(), out.numel(), kNaN);
    Tensor device_x = Upload(x), device_out = Upload(out);
    Tensor device_ids = Upload(r.ids), device_weights = Upload(r.weights);
    const TensorView out_view = device_out.view().Narrow(1, 0, hidden);
    const absl::Status status = gpu_->MoeExperts(device_x.view().Narrow(1, 0, hidden), device_ids, device_weights,
                                                 experts.device, out_view, accumulate);
    EXPECT_TRUE(status.ok()) << status;
    const absl::Status sync = gpu_->Synchronize();
    if (bad_token >= 0) {
      EXPECT_EQ(sync.code(), absl::StatusCode::kInvalidArgument) << sync;
      EXPECT_THAT(std::string(sync.message()), HasSubstr("MoeExperts")) << sync;
      EXPECT_THAT(std::string(sync.message()), HasSubstr("token " + std::to_string(bad_token))) << sync;
      EXPECT_TRUE(gpu_->Synchronize().ok()) << "the flag must be cleared once reported";
    } else {
      EXPECT_TRUE(sync.ok()) << sync;
    }
    Tensor got = Download(out_view);

    std::vector<int64_t> rows = Sample(tokens);
    if (bad_token >= 0) {
      for (int64_t h = 0; h < hidden; ++h) {
        const float want = out.data_as<float>()[bad_token * (hidden + 4) + h];
        const float have = got.data_as<float>()[bad_token * hidden + h];
        if (!(have == want || (std::isnan(have) && std::isnan(want)))) {
          ADD_FAILURE() << "token " << bad_token << " (bad id) was written at " << h;
          break;
        }
      }
      rows.erase(std::remove(rows.begin(), rows.end(), bad_token), rows.end());
    }
    const int64_t n = static_cast<int64_t>(rows.size());
    Tensor xs = *Tensor::Empty(DType::kF32, Shape{n, hidden});
    Tensor ids = *Tensor::Empty(DType::kI32, Shape{n, k});
    Tensor weights = *Tensor::Empty(DType::kF32, Shape{n, k});
    Tensor want = *Tensor::Empty(DType::kF32, Shape{n, hidden});
    Tensor have = *Tensor::Empty(DType::kF32, Shape{n, hidden});
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = rows[static_cast<size_t>(i)];
      std::copy_n(x.data_as<float>() + t * (hidden + 4), hidden, xs.data_as<float>() + i * hidden);
      std::copy_n(out.data_as<float>() + t * (hidden + 4), hidden, want.data_as<float>() + i * hidden);
      std::copy_n(got.data_as<float>() + t * hidden, hidden, have.data_as<float>() + i * hidden);
      std::copy_n(r.ids.data_as<int32_t>() + t * k, k, ids.data_as<int32_t>() + i * k);
      std::copy_n(r.weights.data_as<float>() + t * k, k, weights.data_as<float>() + i * k);
    }
    const absl::Status c = cpu_.MoeExperts(xs, ids, weights, experts.host, want, accumulate);
    EXPECT_TRUE(c.ok()) << c;
    const float* g = have.data_as<float>();
    EXPECT_TRUE(std::all_of(g, g + have.numel(), [](float v) { return std::isfinite(v); })) << "non-finite GPU output";
    return RelError(have, want);
  }
};

struct GroupedCase {
  MoeShape shape;
  DType dtype;
};

void PrintTo(const GroupedCase& c, std::ostream* os) { *os << c.shape.name << "_" << DTypeName(c.dtype); }

class CudaMoeGroupedShapeTest : public CudaMoeGroupedTest, public ::testing::WithParamInterface<GroupedCase> {};

TEST_P(CudaMoeGroupedShapeTest, MatchesCpu) {
  const GroupedCase& c = GetParam();
  const ExpertSet experts = MakeExperts(c.shape, c.dtype, 11);
  for (const int64_t tokens : {64, 256, 2048}) {
    // Token counts the backend runs per pair (64 of K2's shape) are cuda_backend_moe_test's.
    const MoeShape& m = c.shape;
    if (!cuda::MoeExpertsUseGrouped(tokens, m.top_k, m.experts, m.hidden, m.inter, kGroupedMinTokens)) continue;
    const Routing r = MakeRouting(c.shape, tokens, static_cast<uint32_t>(20 + tokens));
    for (const bool accumulate : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "T = " << tokens << ", accumulate = " << accumulate);
      EXPECT_LE(RunCase(c.shape, experts, r, accumulate, static_cast<uint32_t>(30 + tokens)), kTolerance);
    }
  }
}

// Every token on expert 1 (2048 pairs: 32 tiles of one expert), the rest on k + 1 others.
TEST_P(CudaMoeGroupedShapeTest, SkewedRoutingMatchesCpu) {
  const GroupedCase& c = GetParam();
  const ExpertSet experts = MakeExperts(c.shape, c.dtype, 12);
  for (const int64_t tokens : {64, 2048}) {
    SCOPED_TRACE(::testing::Message() << "T = " << tokens);
    const Routing r = MakeRouting(c.shape, tokens, static_cast<uint32_t>(40 + tokens), /*skewed=*/true);
    EXPECT_LE(RunCase(c.shape, experts, r, /*accumulate=*/true, 50), kTolerance);
  }
}

std::vector<GroupedCase> Cases() {
  std::vector<GroupedCase> cases;
  for (const MoeShape& s : {kV2Tp8, kV3Tp8, kSmall, kOdd}) {
    for (const DType dtype : {DType::kF32, DType::kBF16}) cases.push_back({s, dtype});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaMoeGroupedShapeTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<GroupedCase>& info) {
                           return std::string(info.param.shape.name) + "_" + std::string(DTypeName(info.param.dtype));
                         });

// An id outside [0, E) (either side) in one token: reported at Synchronize naming the token, that
// token's row untouched, every other token right.
TEST_F(CudaMoeGroupedTest, BadIdIsReportedAndItsRowLeftAlone) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    const ExpertSet experts = MakeExperts(kSmall, dtype, 13);
    for (const int32_t bad : {-1, static_cast<int32_t>(kSmall.experts)}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << ", id " << bad);
      Routing r = MakeRouting(kSmall, 64, 60);
      r.ids.data_as<int32_t>()[13 * kSmall.top_k + 2] = bad;  // token 13, slot 2
      EXPECT_LE(RunCase(kSmall, experts, r, /*accumulate=*/true, 61, /*bad_token=*/13), kTolerance);
    }
  }
}

// No atomics on out: the same call gives bitwise the same output.
TEST_F(CudaMoeGroupedTest, Reproducible) {
  const ExpertSet experts = MakeExperts(kV2Tp8, DType::kBF16, 14);
  const Routing r = MakeRouting(kV2Tp8, 256, 70);
  Tensor x = Upload(Random(Shape{256, kV2Tp8.hidden}, 71));
  Tensor ids = Upload(r.ids), weights = Upload(r.weights);
  std::vector<Tensor> results;
  for (int run = 0; run < 2; ++run) {
    Tensor out = *Tensor::Empty(DType::kF32, Shape{256, kV2Tp8.hidden}, gpu_->allocator());
    ASSERT_TRUE(gpu_->MoeExperts(x, ids, weights, experts.device, out, false).ok());
    results.push_back(Download(out));
  }
  for (int64_t i = 0; i < results[0].numel(); ++i) {
    ASSERT_EQ(results[0].data_as<float>()[i], results[1].data_as<float>()[i]) << i;
  }
}

// Where the backend switches paths (a host-side rule, checked here with the ranks' shapes), at the
// default token bound and at a lowered one (CudaBackendOptions::moe_grouped_min_tokens).
TEST(MoeExpertsUseGroupedTest, SwitchPoint) {
  const auto grouped = [](int64_t tokens, int64_t k, int64_t experts, int64_t hidden, int64_t inter) {
    return cuda::MoeExpertsUseGrouped(tokens, k, experts, hidden, inter, kGroupedMinTokens);
  };
  EXPECT_EQ(kGroupedMinTokens, 40);
  EXPECT_FALSE(grouped(4, 8, 256, 7168, 256));   // decode: per pair
  EXPECT_FALSE(grouped(16, 8, 256, 7168, 256));  // 128 pairs < 2 E
  EXPECT_FALSE(grouped(63, 8, 256, 7168, 256));  // 504 pairs < 2 E
  EXPECT_TRUE(grouped(64, 8, 256, 7168, 256));
  EXPECT_TRUE(grouped(54, 6, 160, 5120, 192));
  EXPECT_FALSE(grouped(53, 6, 160, 5120, 192));
  EXPECT_FALSE(grouped(64, 8, 384, 7168, 256));  // K2: 512 pairs < 2 E
  EXPECT_FALSE(grouped(32, 6, 64, 2048, 1408));  // V2-Lite: 192 pairs, but fewer than 40 tokens
  EXPECT_FALSE(grouped(39, 6, 64, 2048, 1408));
  EXPECT_TRUE(grouped(40, 6, 64, 2048, 1408));
  EXPECT_TRUE(cuda::MoeExpertsUseGrouped(32, 6, 64, 2048, 1408, 8));  // the bound lowered
  EXPECT_FALSE(cuda::MoeExpertsUseGrouped(7, 6, 64, 2048, 1408, 8));
  EXPECT_FALSE(grouped(7, 3, 7, 72, 40));  // tiny token counts stay per pair
  EXPECT_FALSE(grouped(39, 3, 7, 72, 40));
  EXPECT_FALSE(grouped(64, 0, 7, 72, 40));
  EXPECT_FALSE(grouped(64, 3, 7, 72, 0));
  EXPECT_FALSE(grouped(64, 3, cuda::kMoeGroupedMaxExperts + 1, 72, 40));
}

}  // namespace
}  // namespace eagle3::parity
