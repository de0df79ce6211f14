// Backend::QuantizedGemm on the CPU reference against Gemm on the dequantized weights (bit for bit:
// the reference dequantizes exactly, then runs the same Gemm), for FP8 and INT4 slices that start
// inside a scale block, group or packed word, with their scales as the whole global grid or only
// the touched blocks, with alpha, beta and bias; DequantizeWeight against the writer's dequantized
// weights; and every inconsistent view or operand refused naming the tensor.
#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "eagle3/backend.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/quantized_weight_view.h"
#include "eagle3/tensor.h"
#include "eagle3/testing/random_quantized_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "host_tensor_util.h"
#include "quantized_view_util.h"

namespace eagle3 {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// QuantizedGemm over `w` against Gemm over the dequantized slice, with and without the epilogue.
void CheckAgainstGemm(const QuantizedMatrix& m, const QuantizedWeightView& w, const Slice& s, int64_t rows,
                      const std::string& what) {
  cpu::CpuBackend cpu;
  const Tensor weights = DequantizedSlice(m, s);
  Tensor dequantized = *Tensor::Empty(DType::kF32, Shape{s.rows, s.cols});
  ASSERT_TRUE(DequantizeWeight(w, dequantized).ok()) << what;
  ExpectBitwiseEqual(dequantized, weights, what + " DequantizeWeight");

  const Tensor a = RandomF32(Shape{rows, s.cols}, 1);
  const Tensor bias = RandomF32(Shape{s.rows}, 2);
  const Tensor c0 = RandomF32(Shape{rows, s.rows}, 3);
  for (const GemmOptions& options :
       {GemmOptions{}, GemmOptions{.alpha = 0.75f, .beta = 0.5f, .bias = &bias.view(), .b_is_weights = true}}) {
    Tensor got = Clone(c0), want = Clone(c0);
    const absl::Status status = cpu.QuantizedGemm(a, w, got, options);
    ASSERT_TRUE(status.ok()) << what << ": " << status;
    ASSERT_TRUE(cpu.Gemm(a, weights, want, options).ok());
    ExpectBitwiseEqual(got, want, what + (options.bias != nullptr ? " with alpha, beta, bias" : ""));
  }
}

TEST(QuantizedGemmTest, Fp8SlicesMatchGemmOnTheDequantizedWeights) {
  const QuantizedMatrix m = RandomQuantizedMatrix(DeepseekV3Fp8Quantization(), 320, 400, 7);
  const std::vector<Slice> slices = {
      {0, 320, 0, 400, false},     // the whole matrix (partial last blocks)
      {64, 200, 48, 250, false},   // starts inside block (0, 0), ends inside (2, 2)
      {160, 100, 176, 150, true},  // only the touched blocks (1..2 x 1..2) held
      {200, 1, 300, 100, true},    // one row, last column block partial
  };
  for (const Slice& s : slices) {
    const QuantizedWeightView w = SliceView(m.quantization, m.codes, m.scales, s);
    ASSERT_TRUE(w.Check("test").ok()) << w.Check("test");
    for (int64_t rows : {1, 5}) CheckAgainstGemm(m, w, s, rows, ::testing::PrintToString(s));
  }
}

TEST(QuantizedGemmTest, Fp8OddBlocksMatchGemmOnTheDequantizedWeights) {
  QuantizationConfig q = DeepseekV3Fp8Quantization();
  q.block_out = 24;
  q.block_in = 40;
  const QuantizedMatrix m = RandomQuantizedMatrix(q, 100, 130, 8);
  for (const Slice& s : {Slice{30, 50, 17, 90, true}, Slice{0, 100, 0, 130, false}}) {
    CheckAgainstGemm(m, SliceView(q, m.codes, m.scales, s), s, 3, ::testing::PrintToString(s));
  }
}

TEST(QuantizedGemmTest, Int4SlicesMatchGemmOnTheDequantizedWeights) {
  const QuantizedMatrix m = RandomQuantizedMatrix(KimiK2ThinkingInt4Quantization(), 48, 256, 9);
  const Tensor f32_scales = F32Copy(m.scales);
  const std::vector<Slice> slices = {
      {0, 48, 0, 256, false},
      {8, 24, 40, 150, true},    // column 40: inside group 1, on a word boundary
      {8, 24, 12, 100, false},   // column 12: inside word 1 and group 0
      {47, 1, 203, 53, true},    // one row, starting inside a word of the last group
  };
  for (const Slice& s : slices) {
    for (const Tensor* scales : {&m.scales, &f32_scales}) {
      const QuantizedWeightView w = SliceView(m.quantization, m.codes, *scales, s);
      ASSERT_TRUE(w.Check("test").ok()) << w.Check("test");
      const std::string what = ::testing::PrintToString(s) + " scales " + std::string(DTypeName(scales->dtype()));
      for (int64_t rows : {1, 4}) CheckAgainstGemm(m, w, s, rows, what);
    }
  }
}

TEST(QuantizedGemmTest, CpuBackendDequantizesAtLoad) {
  cpu::CpuBackend cpu;
  EXPECT_FALSE(cpu.keeps_quantized(WeightFormat::kFp8Block));
  EXPECT_FALSE(cpu.keeps_quantized(WeightFormat::kInt4Group));
}

TEST(QuantizedGemmTest, EmptyProductsWriteTheEpilogue) {
  cpu::CpuBackend cpu;
  const QuantizedMatrix m = RandomQuantizedMatrix(DeepseekV3Fp8Quantization(), 16, 32, 10);
  const QuantizedWeightView w = SliceView(m.quantization, m.codes, m.scales, Slice{0, 16, 5, 0, false});
  const Tensor a = *Tensor::Empty(DType::kF32, Shape{2, 0});
  const Tensor bias = RandomF32(Shape{16}, 4);
  Tensor c = RandomF32(Shape{2, 16}, 5);
  const Tensor c0 = Clone(c);
  ASSERT_TRUE(cpu.QuantizedGemm(a, w, c, GemmOptions{.beta = 2.0f, .bias = &bias.view()}).ok());
  for (int64_t i = 0; i < c.numel(); ++i) {
    EXPECT_FLOAT_EQ(c.data_as<float>()[i], 2.0f * c0.data_as<float>()[i] + bias.data_as<float>()[i % 16]) << i;
  }
}

// Each bad input: InvalidArgument naming the op and the tensor.
struct BadCase {
  std::string name;
  std::function<void(QuantizedWeightView&, TensorView& a, TensorView& c)> edit;
  std::string substring;
};

TEST(QuantizedGemmTest, RefusesBadInputsNamingTheTensor) {
  const QuantizedMatrix fp8 = RandomQuantizedMatrix(DeepseekV3Fp8Quantization(), 64, 256, 11);
  const QuantizedMatrix int4 = RandomQuantizedMatrix(KimiK2ThinkingInt4Quantization(), 64, 256, 12);
  const Slice slice{0, 64, 16, 160, true};
  const Tensor a_full = RandomF32(Shape{3, 161}, 13);
  const Tensor c_full = RandomF32(Shape{3, 65}, 14);
  const Tensor a_bf16 = *Tensor::Zeros(DType::kBF16, Shape{3, 160});
  const Tensor i64 = *Tensor::Zeros(DType::kI64, Shape{64, 64});
  const Tensor u8 = *Tensor::Zeros(DType::kU8, Shape{64, 256});
  const Tensor bf16_scales = *Tensor::Zeros(DType::kBF16, Shape{1, 2});
  const std::vector<BadCase> cases = {
      {"unquantized", [](auto& w, auto&, auto&) { w.format = WeightFormat::kUnquantized; }, "w.format"},
      {"fp8 codes u8", [&](auto& w, auto&, auto&) { w.codes = u8.view().Narrow(1, 16, 160); }, "w.codes"},
      {"fp8 scales bf16", [&](auto& w, auto&, auto&) { w.scales = bf16_scales; }, "w.scales"},
      {"scales miss a block column",
       [](auto& w, auto&, auto&) { w.scales = w.scales.Narrow(1, 0, w.scales.dim(1) - 1); }, "w.scales"},
      {"scales start past the slice", [](auto& w, auto&, auto&) { w.scale_col0 = 1; }, "w.scales"},
      {"k beyond the codes", [](auto& w, auto&, auto&) { w.k = 161; }, "w.codes"},
      {"negative col0", [](auto& w, auto&, auto&) { w.col0 = -1; }, "w.col0"},
      {"zero block", [](auto& w, auto&, auto&) { w.block_cols = 0; }, "w.block_cols"},
      {"codes 1-D", [](auto& w, auto&, auto&) { w.codes = w.codes.Narrow(0, 0, 1).Reshape(Shape{160}); }, "w.codes"},
      {"k mismatch", [&](auto&, auto& a, auto&) { a = a_full.view(); }, "K mismatch: a"},
      {"c shape", [&](auto&, auto&, auto& c) { c = c_full.view(); }, "c "},
      {"a bf16", [&](auto&, auto& a, auto&) { a = a_bf16.view(); }, "a "},
  };
  cpu::CpuBackend cpu;
  const Tensor a = RandomF32(Shape{3, 160}, 15);
  const Tensor c = RandomF32(Shape{3, 64}, 16);
  for (const BadCase& bad : cases) {
    QuantizedWeightView w = SliceView(fp8.quantization, fp8.codes, fp8.scales, slice);
    TensorView av = a.view(), cv = c.view();
    bad.edit(w, av, cv);
    const absl::Status status = cpu.QuantizedGemm(av, w, cv, {});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad.name << ": " << status;
    EXPECT_THAT(status.message(), AllOf(HasSubstr("QuantizedGemm: "), HasSubstr(bad.substring))) << bad.name;
  }
  // INT4-specific fields.
  const std::vector<BadCase> int4_cases = {
      {"int4 codes i64", [&](auto& w, auto&, auto&) { w.codes = i64.view().Narrow(1, 2, 20); }, "w.codes"},
      {"two weight rows per scale row", [](auto& w, auto&, auto&) { w.block_rows = 2; }, "w.block_rows"},
      {"words too few for col0 % 8",
       [](auto& w, auto&, auto&) {
         w.col0 = 20;  // values 4 .. 163 of the words: 21 words, 20 held
       },
       "w.codes"},
      {"scale rows too few", [](auto& w, auto&, auto&) { w.scales = w.scales.Narrow(0, 0, 63); }, "w.scales"},
  };
  for (const BadCase& bad : int4_cases) {
    QuantizedWeightView w = SliceView(int4.quantization, int4.codes, int4.scales, slice);
    TensorView av = a.view(), cv = c.view();
    bad.edit(w, av, cv);
    const absl::Status status = cpu.QuantizedGemm(av, w, cv, {});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad.name << ": " << status;
    EXPECT_THAT(status.message(), AllOf(HasSubstr("QuantizedGemm: "), HasSubstr(bad.substring))) << bad.name;
  }
  // A bias of the wrong length, and an output overlapping the codes.
  const QuantizedWeightView w = SliceView(fp8.quantization, fp8.codes, fp8.scales, slice);
  const Tensor short_bias = RandomF32(Shape{63}, 17);
  absl::Status status = cpu.QuantizedGemm(a, w, c, GemmOptions{.bias = &short_bias.view()});
  EXPECT_THAT(status.message(), HasSubstr("bias")) << status;
  Tensor f32_codes = *Tensor::Zeros(DType::kF32, Shape{64, 64});
  QuantizedWeightView aliased = w;
  aliased.scales = f32_codes.view().Narrow(0, 0, 1).Narrow(1, 0, 2);
  status = cpu.QuantizedGemm(a, aliased, f32_codes.view().Narrow(0, 0, 3), {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("w.scales")) << status;
  // DequantizeWeight names its output.
  Tensor wrong = *Tensor::Empty(DType::kF32, Shape{64, 159});
  status = DequantizeWeight(w, wrong);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr("DequantizeWeight"), HasSubstr("out "))) << status;
}

}  // namespace
}  // namespace eagle3
