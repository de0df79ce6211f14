// Backend::QuantizedMoeExperts on the CPU reference against MoeExperts on the dequantized experts
// (within 1e-6 relative: the same fp32 arithmetic, up to the order Eigen sums a matrix product's
// blocks in), for FP8 block-scaled and INT4 group experts whose slices start inside a scale block,
// group or packed word, with their scales as the whole global grid or only the touched blocks,
// accumulate on and off; and every bad input refused naming the field.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "eagle3/backend.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/tensor.h"
#include "eagle3/testing/random_quantized_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "host_tensor_util.h"
#include "quantized_moe_util.h"

namespace eagle3 {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kInter = 40;
constexpr int64_t kHidden = 200;

// Slices starting inside a 128 block, a 32 group and a packed word (row0 / col0 not multiples),
// and a layout on the grid.
std::vector<ExpertSlices> Layouts() {
  return {
      {300, 448, 256, 320, Slice{70, kInter, 36, kHidden}, Slice{20, kHidden, 100, kInter}},
      {kInter, kHidden + 56, kHidden, 128, Slice{0, kInter, 0, kHidden}, Slice{0, kHidden, 2 * kInter, kInter}},
      {200, 512, 300, 192, Slice{129, kInter, 257, kHidden}, Slice{97, kHidden, 131, kInter}},
  };
}

double RelError(const Tensor& got, const Tensor& want) {
  double diff = 0, scale = 1e-30;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const float g = got.data_as<float>()[i], w = want.data_as<float>()[i];
    if (std::isnan(g) || std::isnan(w)) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, static_cast<double>(std::fabs(g - w)));
    scale = std::max(scale, static_cast<double>(std::fabs(w)));
  }
  return diff / scale;
}

void CheckAgainstMoeExperts(const QuantizationConfig& quantization, uint64_t seed) {
  constexpr int64_t kExperts = 7, kTokens = 6, kTopK = 3;
  const QuantizedExperts experts = MakeQuantizedExperts(quantization, kExperts, Layouts(), seed);
  cpu::CpuBackend cpu;
  const Tensor x = RandomF32(Shape{kTokens, kHidden}, 1);
  Tensor ids, weights;
  RandomRouting(kTokens, kTopK, kExperts, 2, ids, weights);
  ids.data_as<int32_t>()[4] = ids.data_as<int32_t>()[0];  // tokens 0 and 1 share an expert
  for (const bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
    // Without accumulate out is write-only: NaNs there must not leak into the result.
    const float start = accumulate ? 0.5f : std::numeric_limits<float>::quiet_NaN();
    Tensor got = Filled(Shape{kTokens, kHidden}, start), want = Filled(Shape{kTokens, kHidden}, start);
    const absl::Status status = cpu.QuantizedMoeExperts(x, ids, weights, experts.views, got, accumulate);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_TRUE(cpu.MoeExperts(x, ids, weights, experts.dense, want, accumulate).ok());
    EXPECT_LE(RelError(got, want), 1e-6);
  }
}

TEST(QuantizedMoeTest, Fp8ExpertsMatchMoeExpertsOnTheDequantizedWeights) {
  CheckAgainstMoeExperts(DeepseekV3Fp8Quantization(), 100);
}

TEST(QuantizedMoeTest, Int4ExpertsMatchMoeExpertsOnTheDequantizedWeights) {
  CheckAgainstMoeExperts(KimiK2ThinkingInt4Quantization(), 200);
}

TEST(QuantizedMoeTest, NoTokensAndNoExperts) {
  cpu::CpuBackend cpu;
  const QuantizedExperts experts = MakeQuantizedExperts(DeepseekV3Fp8Quantization(), 2, Layouts(), 5);
  Tensor x = *Tensor::Empty(DType::kF32, Shape{0, kHidden}), out = *Tensor::Empty(DType::kF32, Shape{0, kHidden});
  Tensor ids = *Tensor::Empty(DType::kI32, Shape{0, 2}), weights = *Tensor::Empty(DType::kF32, Shape{0, 2});
  EXPECT_TRUE(cpu.QuantizedMoeExperts(x, ids, weights, experts.views, out, false).ok());
  // No slot: out is zeroed (or kept) whatever the experts.
  Tensor x1 = RandomF32(Shape{2, kHidden}, 3), out1 = Filled(Shape{2, kHidden}, 1.0f);
  Tensor ids1 = *Tensor::Empty(DType::kI32, Shape{2, 0}), weights1 = *Tensor::Empty(DType::kF32, Shape{2, 0});
  ASSERT_TRUE(cpu.QuantizedMoeExperts(x1, ids1, weights1, {}, out1, false).ok());
  EXPECT_EQ(out1.data_as<float>()[0], 0.0f);
}

class QuantizedMoeBadInputTest : public ::testing::Test {
 protected:
  QuantizedMoeBadInputTest()
      : fp8_(MakeQuantizedExperts(DeepseekV3Fp8Quantization(), 3, Layouts(), 10)),
        int4_(MakeQuantizedExperts(KimiK2ThinkingInt4Quantization(), 3, Layouts(), 20)),
        x_(RandomF32(Shape{2, kHidden}, 1)),
        out_(Filled(Shape{2, kHidden}, 0.0f)) {
    RandomRouting(2, 2, 3, 4, ids_, weights_);
  }

  // The call with `experts` must fail naming every needle.
  void ExpectRefused(const std::vector<QuantizedExpertWeights>& experts, const std::vector<std::string>& needles) {
    ExpectRefused(x_, ids_, experts, needles);
  }
  void ExpectRefused(const Tensor& x, const Tensor& ids, const std::vector<QuantizedExpertWeights>& experts,
                     const std::vector<std::string>& needles) {
    const absl::Status s = cpu_.QuantizedMoeExperts(x, ids, weights_, experts, out_, false);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("QuantizedMoeExperts"));
    for (const std::string& n : needles) EXPECT_THAT(std::string(s.message()), HasSubstr(n));
  }

  cpu::CpuBackend cpu_;
  QuantizedExperts fp8_, int4_;
  Tensor x_, out_, ids_, weights_;
};

TEST_F(QuantizedMoeBadInputTest, GoodInputsPass) {
  EXPECT_TRUE(cpu_.QuantizedMoeExperts(x_, ids_, weights_, fp8_.views, out_, false).ok());
  EXPECT_TRUE(cpu_.QuantizedMoeExperts(x_, ids_, weights_, int4_.views, out_, true).ok());
}

TEST_F(QuantizedMoeBadInputTest, IdsOutOfRange) {
  for (const int32_t bad : {-1, 3}) {
    Tensor ids = *Tensor::Empty(DType::kI32, Shape{2, 2});
    std::memcpy(ids.data(), ids_.data(), ids.nbytes());
    ids.data_as<int32_t>()[3] = bad;
    Tensor out = Filled(Shape{2, kHidden}, 7.0f);
    const absl::Status s = cpu_.QuantizedMoeExperts(x_, ids, weights_, fp8_.views, out, false);
    EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("QuantizedMoeExperts"), HasSubstr("ids[1, 1]")));
    EXPECT_EQ(out.data_as<float>()[0], 7.0f) << "nothing written before the ids are checked";
  }
}

TEST_F(QuantizedMoeBadInputTest, MixedFormats) {
  std::vector<QuantizedExpertWeights> experts = fp8_.views;
  experts[1].gate = int4_.views[1].gate;
  ExpectRefused(experts, {"experts[1].gate", "one format"});
}

TEST_F(QuantizedMoeBadInputTest, MixedBlockSizes) {
  std::vector<QuantizedExpertWeights> experts = fp8_.views;
  experts[2].down.block_cols = 64;
  ExpectRefused(experts, {"experts[2].down", "64"});
}

TEST_F(QuantizedMoeBadInputTest, IntermediateMismatch) {
  std::vector<QuantizedExpertWeights> experts = fp8_.views;
  experts[1].up.codes = experts[1].up.codes.Narrow(0, 0, kInter - 1);
  ExpectRefused(experts, {"experts[1].up", "[I, H]", std::to_string(kInter)});
  experts = int4_.views;
  experts[2].down.k = kInter - 8;
  ExpectRefused(experts, {"experts[2].down", "[H, I]"});
}

TEST_F(QuantizedMoeBadInputTest, HiddenMismatch) {
  const Tensor x = RandomF32(Shape{2, kHidden - 8}, 9);
  Tensor out = Filled(Shape{2, kHidden - 8}, 0.0f);
  const absl::Status s = cpu_.QuantizedMoeExperts(x, ids_, weights_, fp8_.views, out, false);
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("experts[0].gate"), HasSubstr("H from x")));
}

TEST_F(QuantizedMoeBadInputTest, ScalesTooSmall) {
  std::vector<QuantizedExpertWeights> experts = int4_.views;
  experts[1].down.scales = experts[1].down.scales.Narrow(1, 0, 1);
  ExpectRefused(experts, {"experts[1].down", "w.scales"});
  experts = fp8_.views;
  experts[0].gate.scales = experts[0].gate.scales.Narrow(0, 0, 0);
  ExpectRefused(experts, {"experts[0].gate", "w.scales"});
}

TEST_F(QuantizedMoeBadInputTest, WrongCodesDtype) {
  std::vector<QuantizedExpertWeights> experts = fp8_.views;
  const TensorView& c = experts[2].up.codes;
  experts[2].up.codes = TensorView(c.data(), DType::kU8, c.shape(), c.strides(), c.device());
  ExpectRefused(experts, {"experts[2].up", "w.codes", "f8_e4m3"});
}

TEST_F(QuantizedMoeBadInputTest, WrongDevice) {
  std::vector<QuantizedExpertWeights> experts = fp8_.views;
  for (TensorView* t : {&experts[1].down.codes, &experts[1].down.scales}) {
    *t = TensorView(t->data(), t->dtype(), t->shape(), t->strides(), Device::Cuda(0));
  }
  ExpectRefused(experts, {"experts[1].down", "codes"});
  const TensorView& xv = x_.view();
  const Tensor ids = *Tensor::Empty(DType::kI32, Shape{2, 2});
  const absl::Status s = cpu_.QuantizedMoeExperts(
      TensorView(xv.data(), xv.dtype(), xv.shape(), xv.strides(), Device::Cuda(0)), ids_, weights_, fp8_.views,
      out_, false);
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("QuantizedMoeExperts"), HasSubstr("x is")));
}

TEST_F(QuantizedMoeBadInputTest, TokenOperands) {
  Tensor ids64 = *Tensor::Zeros(DType::kI64, Shape{2, 2});
  ExpectRefused(x_, ids64, fp8_.views, {"ids"});
  Tensor ids3 = *Tensor::Zeros(DType::kI32, Shape{3, 2});
  ExpectRefused(x_, ids3, fp8_.views, {"ids", "T = 2"});
  const Tensor x_bf16 = *Tensor::Zeros(DType::kBF16, Shape{2, kHidden});
  ExpectRefused(x_bf16, ids_, fp8_.views, {"x is", "f32"});
}

TEST_F(QuantizedMoeBadInputTest, UnquantizedView) {
  std::vector<QuantizedExpertWeights> experts = fp8_.views;
  experts[0].gate.format = WeightFormat::kUnquantized;
  ExpectRefused(experts, {"experts[0].gate", "w.format"});
}

TEST_F(QuantizedMoeBadInputTest, CodesOverlappingOut) {
  std::vector<QuantizedExpertWeights> experts = fp8_.views;
  const TensorView& codes = experts[0].down.codes;
  const Tensor out_over = *Tensor::Empty(DType::kF32, Shape{2, kHidden});
  const TensorView alias(codes.data(), DType::kF32, Shape{2, kHidden}, out_over.device());
  const absl::Status s = cpu_.QuantizedMoeExperts(x_, ids_, weights_, experts, alias, false);
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("QuantizedMoeExperts"), HasSubstr("experts[0]")));
}

}  // namespace
}  // namespace eagle3
