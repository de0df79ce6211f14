#include "eagle3/rope_table.h"

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "config_test_util.h"
#include "eagle3/deepseek_v2_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;
using Type = RopeScaling::Type;

constexpr double kPi = std::numbers::pi;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

void ExpectInvalid(const absl::Status& s, const std::vector<std::string>& needles) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (const std::string& n : needles) EXPECT_THAT(Msg(s), HasSubstr(n));
}

RopeConfig Yarn(double theta, double factor, int64_t original, double beta_fast, double beta_slow,
                double mscale, double mscale_all_dim) {
  RopeConfig rope;
  rope.theta = theta;
  rope.scaling.type = Type::kYarn;
  rope.scaling.factor = factor;
  rope.scaling.original_max_position_embeddings = original;
  rope.scaling.beta_fast = beta_fast;
  rope.scaling.beta_slow = beta_slow;
  rope.scaling.mscale = mscale;
  rope.scaling.mscale_all_dim = mscale_all_dim;
  return rope;
}

// The real configs' rope_scaling blocks.
RopeConfig V2Rope() { return Yarn(10000, 40, 4096, 32, 1, 0.707, 0.707); }
RopeConfig V3Rope() { return Yarn(10000, 40, 4096, 32, 1, 1.0, 1.0); }
RopeConfig K2Rope() { return Yarn(50000, 32, 4096, 1, 1, 1.0, 1.0); }

double Base(double theta, int64_t i, int64_t dim) {
  return 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(dim));
}

// Checks table entries at a few (position, pair) points against cos/sin of position * freq[i],
// times `factor`, in double. Rounding to f32 is the only expected error.
void ExpectTableMatches(const Tensor& table, const std::vector<double>& freq, double factor) {
  const int64_t half = static_cast<int64_t>(freq.size());
  const float* data = table.data_as<const float>();
  for (int64_t p :
       {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{4095}, int64_t{4096}, table.dim(0) - 1}) {
    if (p >= table.dim(0)) continue;
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * freq[i];
      const double tol = 1.2e-7 * std::max(1.0, std::abs(factor));
      ASSERT_NEAR(data[p * 2 * half + i], std::cos(angle) * factor, tol)
          << "cos p " << p << " i " << i;
      ASSERT_NEAR(data[p * 2 * half + half + i], std::sin(angle) * factor, tol)
          << "sin p " << p << " i " << i;
    }
  }
}

TEST(RopeTableTest, UnscaledMatchesDirectFormula) {
  RopeConfig rope;
  rope.theta = 10000;
  auto freq = RopeInvFreq(rope, 8);
  ASSERT_TRUE(freq.ok()) << freq.status();
  EXPECT_DOUBLE_EQ((*freq)[0], 1.0);
  EXPECT_DOUBLE_EQ((*freq)[1], 0.1);  // 10000^(-2/8)
  EXPECT_DOUBLE_EQ((*freq)[2], 0.01);
  EXPECT_DOUBLE_EQ((*freq)[3], 0.001);
  EXPECT_EQ(RopeAttentionFactor(rope), 1.0);
  auto table = MakeRopeCosSin(rope, 8, 5000);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->shape(), (Shape{5000, 8}));
  ExpectTableMatches(*table, {1.0, 0.1, 0.01, 0.001}, 1.0);
  // Row 0 is the identity rotation.
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(table->data_as<float>()[i], 1.0f);
    EXPECT_EQ(table->data_as<float>()[4 + i], 0.0f);
  }
}

TEST(RopeTableTest, LinearDividesFrequencies) {
  RopeConfig rope;
  rope.theta = 500000;
  rope.scaling.type = Type::kLinear;
  rope.scaling.factor = 4;
  auto freq = RopeInvFreq(rope, 16);
  ASSERT_TRUE(freq.ok());
  std::vector<double> expected;
  for (int64_t i = 0; i < 8; ++i) expected.push_back(Base(500000, i, 16) / 4);
  for (int64_t i = 0; i < 8; ++i) EXPECT_NEAR((*freq)[i], expected[i], 1e-15 * expected[i]);
  auto table = MakeRopeCosSin(rope, 16, 100);
  ASSERT_TRUE(table.ok());
  ExpectTableMatches(*table, expected, 1.0);
}

// YaRN for DeepSeek-V2's rope_scaling, with the correction range derived by hand:
// d(r) = 64 ln(4096 / (2 pi r)) / (2 ln 10000); d(32) = 10.47 -> low 10, d(1) = 22.52 -> high 23.
TEST(RopeTableTest, YarnDeepSeekV2) {
  const double low = 10, high = 23;
  EXPECT_NEAR(64 * std::log(4096 / (2 * kPi * 32)) / (2 * std::log(10000.0)), 10.47, 0.01);
  EXPECT_NEAR(64 * std::log(4096 / (2 * kPi * 1)) / (2 * std::log(10000.0)), 22.52, 0.01);
  auto freq = RopeInvFreq(V2Rope(), 64);
  ASSERT_TRUE(freq.ok()) << freq.status();
  std::vector<double> expected(32);
  for (int64_t i = 0; i < 32; ++i) {
    const double ramp = std::min(1.0, std::max(0.0, (i - low) / (high - low)));
    expected[i] = Base(10000, i, 64) * (1 - ramp) + Base(10000, i, 64) / 40 * ramp;
    ASSERT_NEAR((*freq)[i], expected[i], 1e-15) << i;
  }
  // The bands: pairs 0..10 keep their frequency, 23..31 are divided by the factor.
  EXPECT_DOUBLE_EQ((*freq)[0], 1.0);
  EXPECT_DOUBLE_EQ((*freq)[10], Base(10000, 10, 64));
  EXPECT_NEAR((*freq)[16], Base(10000, 16, 64) * (7.0 / 13 + 6.0 / 13 / 40), 1e-15);
  EXPECT_NEAR((*freq)[23], Base(10000, 23, 64) / 40, 1e-18);
  EXPECT_NEAR((*freq)[31], Base(10000, 31, 64) / 40, 1e-18);
  // mscale == mscale_all_dim: no magnitude change.
  EXPECT_DOUBLE_EQ(RopeAttentionFactor(V2Rope()), 1.0);
  auto table = MakeRopeCosSin(V2Rope(), 64, 163840);
  ASSERT_TRUE(table.ok());
  ExpectTableMatches(*table, expected, 1.0);
}

TEST(RopeTableTest, YarnDeepSeekV3AndKimiK2) {
  auto v3 = RopeInvFreq(V3Rope(), 64);
  auto v2 = RopeInvFreq(V2Rope(), 64);
  ASSERT_TRUE(v3.ok() && v2.ok());
  EXPECT_EQ(*v3, *v2);  // V3 differs from V2 only in mscale, which cancels
  EXPECT_DOUBLE_EQ(RopeAttentionFactor(V3Rope()), 1.0);

  // K2: theta 50000, factor 32, beta_fast = beta_slow = 1: d(1) = 64 ln(4096 / 2 pi) /
  // (2 ln 50000) = 19.16, so low 19, high 20: a one-step ramp.
  EXPECT_NEAR(64 * std::log(4096 / (2 * kPi)) / (2 * std::log(50000.0)), 19.16, 0.01);
  auto k2 = RopeInvFreq(K2Rope(), 64);
  ASSERT_TRUE(k2.ok());
  for (int64_t i = 0; i < 32; ++i) {
    const double expected = i <= 19 ? Base(50000, i, 64) : Base(50000, i, 64) / 32;
    ASSERT_NEAR((*k2)[i], expected, 1e-15) << i;
  }
  auto table = MakeRopeCosSin(K2Rope(), 64, 5000);
  ASSERT_TRUE(table.ok());
  ExpectTableMatches(*table, *k2, 1.0);
}

TEST(RopeTableTest, YarnAttentionFactor) {
  // No mscale keys (a Llama-style draft): 0.1 ln(factor) + 1 on cos and sin.
  RopeConfig draft = Yarn(10000, 40, 4096, 32, 1, 1.0, 0.0);
  EXPECT_NEAR(RopeAttentionFactor(draft), 0.1 * std::log(40.0) + 1, 1e-15);
  // DeepSeek's _mscale = get_mscale(f, mscale) / get_mscale(f, mscale_all_dim).
  RopeConfig mixed = Yarn(10000, 40, 4096, 32, 1, 0.707, 1.0);
  EXPECT_NEAR(RopeAttentionFactor(mixed),
              (0.1 * 0.707 * std::log(40.0) + 1) / (0.1 * std::log(40.0) + 1), 1e-15);
  // An explicit attention_factor wins.
  RopeConfig explicit_factor = Yarn(10000, 40, 4096, 32, 1, 0.707, 0.707);
  explicit_factor.scaling.attention_factor = 0.5;
  EXPECT_EQ(RopeAttentionFactor(explicit_factor), 0.5);
  // factor <= 1: get_mscale is 1.
  EXPECT_EQ(RopeAttentionFactor(Yarn(10000, 1, 4096, 32, 1, 1.0, 0.0)), 1.0);

  auto freq = RopeInvFreq(draft, 64);
  ASSERT_TRUE(freq.ok());
  auto table = MakeRopeCosSin(draft, 64, 300);
  ASSERT_TRUE(table.ok());
  ExpectTableMatches(*table, *freq, 0.1 * std::log(40.0) + 1);
  auto halved = MakeRopeCosSin(explicit_factor, 64, 2);
  ASSERT_TRUE(halved.ok());
  EXPECT_EQ(halved->data_as<float>()[0], 0.5f);  // cos(0) * 0.5
}

// When the clamped correction range collapses (low == high), the reference widens it by 0.001
// instead of dividing by zero: pair 0 keeps its frequency, every other pair is interpolated.
TEST(RopeTableTest, YarnDegenerateRampGuard) {
  // original = 64: d(11) = 64 ln(64 / (22 pi)) / (2 ln 10000) = -0.27 -> ceil -0 -> high 0;
  // d(32) < 0 -> low clamped to 0.
  RopeConfig rope = Yarn(10000, 8, 64, 32, 11, 1.0, 0.0);
  auto freq = RopeInvFreq(rope, 16);
  ASSERT_TRUE(freq.ok());
  EXPECT_DOUBLE_EQ((*freq)[0], 1.0);
  for (int64_t i = 1; i < 8; ++i) EXPECT_NEAR((*freq)[i], Base(10000, i, 16) / 8, 1e-16) << i;
}

// transformers' llama3 rule, Llama 3.1's parameters (theta 500000, factor 8, low 1, high 4,
// original 8192): wavelengths above 8192 are divided by 8, below 2048 kept, between interpolated.
TEST(RopeTableTest, Llama3Bands) {
  RopeConfig rope;
  rope.theta = 500000;
  rope.scaling.type = Type::kLlama3;
  rope.scaling.factor = 8;
  rope.scaling.low_freq_factor = 1;
  rope.scaling.high_freq_factor = 4;
  rope.scaling.original_max_position_embeddings = 8192;
  auto freq = RopeInvFreq(rope, 128);
  ASSERT_TRUE(freq.ok());
  int kept = 0, divided = 0, smoothed = 0;
  for (int64_t i = 0; i < 64; ++i) {
    const double base = Base(500000, i, 128);
    const double wavelen = 2 * kPi / base;
    double expected;
    if (wavelen < 8192.0 / 4) {
      expected = base;
      ++kept;
    } else if (wavelen > 8192.0) {
      expected = base / 8;
      ++divided;
    } else {
      const double smooth = (8192 / wavelen - 1) / (4 - 1);
      expected = (1 - smooth) * base / 8 + smooth * base;
      ++smoothed;
    }
    ASSERT_NEAR((*freq)[i], expected, 1e-15 * base) << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0);
  EXPECT_EQ(RopeAttentionFactor(rope), 1.0);
}

// The real V2 config.json, parsed, gives the table checked above.
TEST(RopeTableTest, FromRealDeepSeekV2Config) {
  auto config = DeepseekV2Config::FromFile(testing::ConfigPath("deepseek-ai_DeepSeek-V2.json"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope, V2Rope());
  auto from_config = MakeRopeCosSin(config->rope, config->qk_rope_head_dim, 64);
  auto direct = MakeRopeCosSin(V2Rope(), 64, 64);
  ASSERT_TRUE(from_config.ok() && direct.ok());
  for (int64_t i = 0; i < 64 * 64; ++i) {
    ASSERT_EQ(from_config->data_as<float>()[i], direct->data_as<float>()[i]);
  }
}

// The documented gap to references that form the angle in fp32.
TEST(RopeTableTest, Fp32AngleReferenceWithinStatedTolerance) {
  auto freq = RopeInvFreq(V2Rope(), 64);
  auto table = MakeRopeCosSin(V2Rope(), 64, 163840);
  ASSERT_TRUE(freq.ok() && table.ok());
  double worst = 0;
  for (int64_t p : {100, 4096, 50000, 163839}) {
    for (int64_t i = 0; i < 32; ++i) {
      const float angle = static_cast<float>(p) * static_cast<float>((*freq)[i]);
      const double bound = 1.2e-7 * static_cast<double>(p) * (*freq)[0] + 1e-6;
      const double diff = std::abs(table->data_as<float>()[p * 64 + i] - std::cos(angle));
      worst = std::max(worst, diff);
      ASSERT_LE(diff, bound) << "p " << p << " i " << i;
    }
  }
  EXPECT_GT(worst, 1e-4);  // the fp32 angle error is real at long positions
}

TEST(RopeTableTest, FillsStridedOutput) {
  std::vector<float> buffer(3 * 10, -7.0f);
  TensorView out(buffer.data(), DType::kF32, Shape{3, 8}, Shape{10, 1}, Device::Cpu());
  ASSERT_TRUE(FillRopeCosSin(V2Rope(), 8, out).ok());
  auto dense = MakeRopeCosSin(V2Rope(), 8, 3);
  ASSERT_TRUE(dense.ok());
  for (int64_t p = 0; p < 3; ++p) {
    for (int64_t i = 0; i < 8; ++i)
      EXPECT_EQ(buffer[p * 10 + i], dense->data_as<float>()[p * 8 + i]);
    EXPECT_EQ(buffer[p * 10 + 8], -7.0f);
    EXPECT_EQ(buffer[p * 10 + 9], -7.0f);
  }
}

class CudaLabelledAllocator final : public Allocator {
 public:
  Device device() const override { return Device::Cuda(0); }
  absl::StatusOr<void*> Allocate(size_t, size_t) override { return nullptr; }
  void Deallocate(void*, size_t) override {}
};

TEST(RopeTableTest, RejectsBadArguments) {
  RopeConfig none;
  ExpectInvalid(RopeInvFreq(none, 7).status(), {"rope_dim must be even and >= 2, got 7"});
  ExpectInvalid(RopeInvFreq(none, 0).status(), {"rope_dim", "got 0"});
  RopeConfig bad_theta;
  bad_theta.theta = 0;
  ExpectInvalid(RopeInvFreq(bad_theta, 8).status(), {"theta must be finite and > 0, got 0"});
  RopeConfig no_original = V2Rope();
  no_original.scaling.original_max_position_embeddings = 0;
  ExpectInvalid(RopeInvFreq(no_original, 64).status(),
                {"yarn original_max_position_embeddings must be > 0, got 0"});
  RopeConfig bad_beta = V2Rope();
  bad_beta.scaling.beta_slow = 0;
  ExpectInvalid(RopeInvFreq(bad_beta, 64).status(), {"beta_slow 0", "must be finite and > 0"});
  RopeConfig bad_factor = V2Rope();
  bad_factor.scaling.factor = -2;
  ExpectInvalid(RopeInvFreq(bad_factor, 64).status(),
                {"yarn factor must be finite and > 0, got -2"});
  RopeConfig bad_attention = V2Rope();
  bad_attention.scaling.attention_factor = 0.0;
  ExpectInvalid(RopeInvFreq(bad_attention, 64).status(), {"attention_factor", "got 0"});
  RopeConfig llama3;
  llama3.scaling.type = Type::kLlama3;
  llama3.scaling.factor = 8;
  llama3.scaling.original_max_position_embeddings = 8192;
  llama3.scaling.low_freq_factor = 2;
  llama3.scaling.high_freq_factor = 2;
  ExpectInvalid(RopeInvFreq(llama3, 64).status(), {"llama3", "distinct"});

  std::vector<float> buffer(64);
  ExpectInvalid(FillRopeCosSin(none, 8, TensorView(buffer.data(), DType::kF32, Shape{4, 16})),
                {"out f32[4, 16] cpu", "[P, rope_dim = 8]"});
  ExpectInvalid(FillRopeCosSin(none, 8, TensorView(buffer.data(), DType::kBF16, Shape{4, 8})),
                {"out bf16[4, 8] cpu", "f32 host"});
  ExpectInvalid(FillRopeCosSin(none, 8,
                               TensorView(buffer.data(), DType::kF32, Shape{4, 8}, Shape{8, 1},
                                          Device::Cuda(0))),
                {"cuda:0", "f32 host"});
  ExpectInvalid(MakeRopeCosSin(none, 8, -1).status(), {"num_positions must be >= 0, got -1"});
  CudaLabelledAllocator device_allocator;
  ExpectInvalid(MakeRopeCosSin(none, 8, 4, device_allocator).status(), {"host memory", "cuda:0"});
}

}  // namespace
}  // namespace eagle3
