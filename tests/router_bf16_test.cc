// A MoE router kept in bf16 with its products on f32 activations (GemmOptions::keep_f32_activations)
// on the CPU reference: Gemm of f32 activations against bf16 weights gives, bit for bit, the f32
// Gemm of the same weight values (the weights widened exactly, the activations never rounded), at
// router shapes (V3 256 x 7168, K2 384 x 7168) and edge shapes, row-strided, with alpha, beta and
// bias, on one thread and several; BatchedGemm follows; the refusals name the tensor; and the rule by
// which FeedForwardBlock keeps a router in bf16 (FeedForwardBlock::RouterDtype).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "eagle3/backend.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/half.h"
#include "eagle3/quantized_weight_view.h"
#include "eagle3/tensor.h"
#include "feed_forward_block.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;

// N(0, stddev) f32 values, [rows, ld] (the columns past `cols` are NaN: a read of them would show).
Tensor RandomRows(int64_t rows, int64_t cols, int64_t ld, uint32_t seed, float stddev = 1.0f) {
  Tensor t = *Tensor::Empty(DType::kF32, Shape{rows, ld});
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < ld; ++j) t.data_as<float>()[r * ld + j] = j < cols ? dist(rng) : std::nanf("");
  }
  return t;
}

// The bf16 bits of `f32` (NaN padding stays NaN).
Tensor ToBf16(const Tensor& f32) {
  Tensor out = *Tensor::Empty(DType::kBF16, f32.shape());
  for (int64_t i = 0; i < f32.numel(); ++i) out.data_as<uint16_t>()[i] = FloatToBf16(f32.data_as<float>()[i]);
  return out;
}

// The [rows, cols] values of bf16 rows `ld` apart, widened into a contiguous f32 tensor.
Tensor Widened(const Tensor& bf16, int64_t cols) {
  const int64_t rows = bf16.shape()[0], ld = bf16.shape()[1];
  Tensor out = *Tensor::Empty(DType::kF32, Shape{rows, cols});
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      out.data_as<float>()[r * cols + j] = Bf16ToFloat(bf16.data_as<uint16_t>()[r * ld + j]);
    }
  }
  return out;
}

TensorView RowView(const Tensor& t, int64_t cols) {
  return TensorView(t.data(), t.dtype(), Shape{t.shape()[0], cols}, Shape{t.shape()[1], 1}, t.device());
}

void ExpectBitwiseEqual(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  for (int64_t i = 0; i < got.numel(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got.data_as<float>()[i]), std::bit_cast<uint32_t>(want.data_as<float>()[i]))
        << what << ": element " << i << " " << got.data_as<float>()[i] << " vs " << want.data_as<float>()[i];
  }
}

struct Case {
  int64_t m, n, k;
  int64_t b_pad = 0;  // weight rows k + b_pad elements apart
};

// Every case: the flagged product over bf16 weights equals the f32 product over their values, bit
// for bit (one thread and three, with and without alpha, beta and bias), and both are within fp32
// summation error of a double-precision dot product of a (not rounded) and the weights.
TEST(RouterBf16Test, KeepF32ActivationsIsTheF32ProductOfTheSameValues) {
  const std::vector<Case> cases = {{1, 256, 7168},    {8, 256, 7168}, {16, 384, 7168}, {3, 1, 7171, 5},
                                   {5, 7, 3, 1},      {2, 33, 1003, 13}};
  uint32_t seed = 1;
  for (const Case& c : cases) {
    const int64_t ld = c.k + c.b_pad;
    const Tensor b_bf16 = ToBf16(RandomRows(c.n, c.k, ld, seed++, 1.0f / std::sqrt(static_cast<float>(c.k))));
    const Tensor b_f32 = Widened(b_bf16, c.k);
    const Tensor a = RandomRows(c.m, c.k, c.k, seed++);
    const Tensor bias = RandomRows(1, c.n, c.n, seed++);
    const TensorView bias_view(bias.data(), DType::kF32, Shape{c.n});
    const Tensor c0 = RandomRows(c.m, c.n, c.n, seed++);
    for (const int threads : {1, 3}) {
      cpu::CpuBackend cpu(cpu::CpuBackendOptions{.num_threads = threads});
      for (const bool epilogue : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "M " << c.m << " N " << c.n << " K " << c.k << " ld " << ld << ", "
                                          << threads << " threads" << (epilogue ? ", alpha beta bias" : ""));
        GemmOptions options = kF32ActivationsWeightsGemm;
        if (epilogue) {
          options.alpha = 0.75f;
          options.beta = 0.5f;
          options.bias = &bias_view;
        }
        Tensor got = *Tensor::Empty(DType::kF32, Shape{c.m, c.n}), want = *Tensor::Empty(DType::kF32, Shape{c.m, c.n});
        std::copy_n(c0.data_as<float>(), c0.numel(), got.data_as<float>());
        std::copy_n(c0.data_as<float>(), c0.numel(), want.data_as<float>());
        const absl::Status status = cpu.Gemm(a, RowView(b_bf16, c.k), got, options);
        ASSERT_TRUE(status.ok()) << status;
        GemmOptions f32_options = options;
        f32_options.keep_f32_activations = false;
        ASSERT_TRUE(cpu.Gemm(a, b_f32, want, f32_options).ok());
        ExpectBitwiseEqual(got, want, "against the f32 weights");
        for (int64_t r = 0; r < c.m; ++r) {
          for (int64_t j = 0; j < c.n; ++j) {
            double dot = 0, mag = 0;
            for (int64_t q = 0; q < c.k; ++q) {
              const double p =
                  static_cast<double>(a.data_as<float>()[r * c.k + q]) * b_f32.data_as<float>()[j * c.k + q];
              dot += p;
              mag += std::fabs(p);
            }
            double expected = dot;
            if (epilogue) expected = 0.75 * dot + 0.5 * c0.data_as<float>()[r * c.n + j] + bias.data_as<float>()[j];
            ASSERT_NEAR(got.data_as<float>()[r * c.n + j], expected, 1e-5 * (1.0 + mag))
                << "c[" << r << ", " << j << "]";
          }
        }
      }
    }
  }
}

// BatchedGemm takes the flag as Gemm does, item by item.
TEST(RouterBf16Test, BatchedGemmFollowsGemm) {
  cpu::CpuBackend cpu;
  const int64_t items = 3, m = 4, n = 24, k = 40;
  const Tensor b_bf16 = ToBf16(RandomRows(items * n, k, k, 50, 0.2f));
  const Tensor b_f32 = Widened(b_bf16, k);
  const Tensor a = RandomRows(items * m, k, k, 51);
  Tensor got = *Tensor::Empty(DType::kF32, Shape{items, m, n}), want = *Tensor::Empty(DType::kF32, Shape{items, m, n});
  const auto items_of = [&](const Tensor& t, int64_t rows, int64_t cols) {
    return TensorView(t.data(), t.dtype(), Shape{items, rows, cols}, Shape{rows * cols, cols, 1}, t.device());
  };
  ASSERT_TRUE(cpu.BatchedGemm(items_of(a, m, k), items_of(b_bf16, n, k), got, kF32ActivationsWeightsGemm).ok());
  ASSERT_TRUE(cpu.BatchedGemm(items_of(a, m, k), items_of(b_f32, n, k), want, kWeightsGemm).ok());
  ExpectBitwiseEqual(got, want, "BatchedGemm");
}

// bf16 weights without the flag are refused as before, and the flag admits only f32 activations
// against bf16 weights (bf16 `a`, f16 weights: refused naming the tensor); QuantizedGemm does not
// take it.
TEST(RouterBf16Test, RefusalsNameTheTensor) {
  cpu::CpuBackend cpu;
  const Tensor a = RandomRows(2, 8, 8, 60);
  const Tensor b = ToBf16(RandomRows(4, 8, 8, 61));
  Tensor c = *Tensor::Empty(DType::kF32, Shape{2, 4});
  const auto expect_invalid = [](const absl::Status& status, const std::vector<std::string>& needles) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    for (const std::string& needle : needles) EXPECT_THAT(std::string(status.message()), HasSubstr(needle));
  };
  expect_invalid(cpu.Gemm(a, b, c, kWeightsGemm), {"Gemm", "b", "bf16[4, 8] cpu", "f32 only"});
  const Tensor a_bf16 = ToBf16(a);
  expect_invalid(cpu.Gemm(a_bf16, b, c, kF32ActivationsWeightsGemm), {"Gemm", "a", "bf16[2, 8] cpu", "f32 only"});
  const Tensor b_f16 = *Tensor::Zeros(DType::kF16, Shape{4, 8});
  expect_invalid(cpu.Gemm(a, b_f16, c, kF32ActivationsWeightsGemm), {"Gemm", "b", "f16[4, 8] cpu", "f32 only"});
  expect_invalid(cpu.QuantizedGemm(a, QuantizedWeightView{}, c, kF32ActivationsWeightsGemm),
                 {"QuantizedGemm", "keep_f32_activations", "expected false"});
}

// The router is kept in bf16 only where the checkpoint stores it in bf16 (its values are then bf16
// numbers) and the model's weights are bf16 (the backend streams bf16: CUDA); else in f32 (the CPU
// reference, whose weights are f32; f32 and f16 checkpoints, whose values bf16 could round).
TEST(RouterBf16Test, RouterDtypeRule) {
  EXPECT_EQ(FeedForwardBlock::RouterDtype(DType::kBF16, DType::kBF16), DType::kBF16);
  EXPECT_EQ(FeedForwardBlock::RouterDtype(DType::kBF16, DType::kF32), DType::kF32);
  EXPECT_EQ(FeedForwardBlock::RouterDtype(DType::kF32, DType::kBF16), DType::kF32);
  EXPECT_EQ(FeedForwardBlock::RouterDtype(DType::kF16, DType::kBF16), DType::kF32);
  cpu::CpuBackend cpu;
  EXPECT_EQ(FeedForwardBlock::RouterDtype(DType::kBF16, cpu.preferred_weight_dtype()), DType::kF32);
}

}  // namespace
}  // namespace eagle3
