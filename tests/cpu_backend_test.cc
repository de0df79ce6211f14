#include "eagle3/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "eagle3/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3::cpu {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// gmock prints Debian abseil's string_view char by char; match on std::string instead.
std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// An f32 [rows, cols] matrix stored with row stride `ld` >= cols. The padding holds NaN so that a
// read outside the view poisons the result, and a write outside it is caught by PaddingIntact().
struct Mat {
  int64_t rows, cols, ld;
  std::vector<float> data;

  Mat(int64_t r, int64_t c, int64_t pad = 0)
      : rows(r),
        cols(c),
        ld(c + pad),
        data(static_cast<size_t>(std::max<int64_t>(r * (c + pad), 1)), kNaN) {}
  float& at(int64_t r, int64_t c) { return data[r * ld + c]; }
  float at(int64_t r, int64_t c) const { return data[r * ld + c]; }
  TensorView view() {
    return TensorView(data.data(), DType::kF32, Shape{rows, cols}, Shape{ld, 1}, Device::Cpu());
  }
  void Fill(std::mt19937& rng, float scale = 1.0f) {
    std::normal_distribution<float> normal(0.0f, scale);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) at(r, c) = normal(rng);
    }
  }
  bool PaddingIntact() const {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = cols; c < ld; ++c) {
        if (!std::isnan(at(r, c))) return false;
      }
    }
    return true;
  }
};

TensorView Vec(std::vector<float>& v) {
  return TensorView(v.data(), DType::kF32, Shape{static_cast<int64_t>(v.size())});
}

std::vector<float> RandomVec(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(1.0f, 0.5f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

void ExpectInvalid(const absl::Status& s, const std::vector<std::string>& needles) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (const std::string& n : needles) EXPECT_THAT(Msg(s), HasSubstr(n));
}

// ---- Gemm ---------------------------------------------------------------------------------------

struct GemmCase {
  int64_t m, n, k;
};

class CpuBackendGemmShapeTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(CpuBackendGemmShapeTest, MatchesNaiveLoops) {
  const auto [m, n, k] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(m * 131 + n * 17 + k));
  for (int threads : {1, 3}) {
    CpuBackend backend(CpuBackendOptions{.num_threads = threads});
    for (int64_t pad : {0, 5}) {
      for (auto [alpha, beta] :
           {std::pair{1.0f, 0.0f}, {0.5f, 0.0f}, {1.0f, 1.0f}, {2.0f, -0.5f}}) {
        for (bool with_bias : {false, true}) {
          SCOPED_TRACE(testing::Message() << "threads " << threads << " pad " << pad << " alpha "
                                          << alpha << " beta " << beta << " bias " << with_bias);
          Mat a(m, k, pad), b(n, k, pad), c(m, n, pad);
          a.Fill(rng);
          b.Fill(rng);
          if (beta != 0.0f) c.Fill(rng);  // with beta == 0, c stays NaN: it must never be read
          const Mat c0 = c;
          std::vector<float> bias = RandomVec(n, rng);
          TensorView bias_view = Vec(bias);
          GemmOptions options{
              .alpha = alpha, .beta = beta, .bias = with_bias ? &bias_view : nullptr};
          ASSERT_TRUE(backend.Gemm(a.view(), b.view(), c.view(), options).ok());
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t j = 0; j < n; ++j) {
              double dot = 0.0, mag = 0.0;
              for (int64_t q = 0; q < k; ++q) {
                dot += static_cast<double>(a.at(r, q)) * b.at(j, q);
                mag += std::abs(static_cast<double>(a.at(r, q)) * b.at(j, q));
              }
              const double old_c = beta != 0.0f ? beta * static_cast<double>(c0.at(r, j)) : 0.0;
              const double expected = alpha * dot + old_c + (with_bias ? bias[j] : 0.0);
              ASSERT_NEAR(c.at(r, j), expected,
                          1e-5 * (1.0 + std::abs(alpha) * mag + std::abs(old_c)))
                  << "c[" << r << ", " << j << "]";
            }
          }
          EXPECT_TRUE(c.PaddingIntact());
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuBackendGemmShapeTest,
                         ::testing::Values(GemmCase{1, 1, 1}, GemmCase{1, 17, 33},
                                           GemmCase{5, 7, 3}, GemmCase{8, 64, 128},
                                           GemmCase{64, 96, 200}, GemmCase{0, 4, 4},
                                           GemmCase{3, 0, 5}, GemmCase{3, 4, 0}),
                         [](const ::testing::TestParamInfo<GemmCase>& info) {
                           return "m" + std::to_string(info.param.m) + "n" +
                                  std::to_string(info.param.n) + "k" + std::to_string(info.param.k);
                         });

TEST(CpuBackendGemmTest, ThreadedMatchesSingleThreaded) {
  std::mt19937 rng(5);
  Mat a(33, 256), b(515, 256), c1(33, 515), c4(33, 515);
  a.Fill(rng);
  b.Fill(rng);
  CpuBackend single;
  CpuBackend threaded(CpuBackendOptions{.num_threads = 4});
  EXPECT_EQ(single.num_threads(), 1);
  EXPECT_EQ(threaded.num_threads(), 4);
  for (int iteration = 0; iteration < 20; ++iteration) {  // the pool is reused across calls
    ASSERT_TRUE(single.Gemm(a.view(), b.view(), c1.view(), {}).ok());
    ASSERT_TRUE(threaded.Gemm(a.view(), b.view(), c4.view(), {}).ok());
    for (size_t i = 0; i < c1.data.size(); ++i) ASSERT_NEAR(c1.data[i], c4.data[i], 1e-4);
  }
}

TEST(CpuBackendGemmTest, RejectsBadOperands) {
  CpuBackend backend;
  Mat a(4, 8), b(16, 8), c(4, 16), b7(16, 7), c_bad(4, 15);
  std::vector<float> bias(15);
  TensorView bias_view = Vec(bias);

  ExpectInvalid(backend.Gemm(a.view(), b7.view(), c.view(), {}),
                {"Gemm", "K mismatch", "f32[4, 8] cpu", "f32[16, 7] cpu"});
  ExpectInvalid(backend.Gemm(a.view(), b.view(), c_bad.view(), {}),
                {"c f32[4, 15] cpu", "[4, 16]"});
  ExpectInvalid(backend.Gemm(a.view(), b.view(), c.view(), {.bias = &bias_view}),
                {"bias f32[15] cpu", "[16]"});
  ExpectInvalid(backend.Gemm(a.view().Reshape(Shape{32}), b.view(), c.view(), {}),
                {"a must be 2-D [M, K]", "f32[32] cpu"});

  std::vector<uint16_t> half(32);
  ExpectInvalid(
      backend.Gemm(TensorView(half.data(), DType::kBF16, Shape{4, 8}), b.view(), c.view(), {}),
      {"Gemm", "bf16[4, 8] cpu", "f32 only"});
  ExpectInvalid(
      backend.Gemm(
          a.view(), b.view(),
          TensorView(c.data.data(), DType::kF32, Shape{4, 16}, Shape{16, 1}, Device::Cuda(0)), {}),
      {"c is f32[4, 16] cuda:0", "runs on cpu"});
  // Column-strided and row-overlapping views are not row-strided matrices.
  ExpectInvalid(
      backend.Gemm(TensorView(a.data.data(), DType::kF32, Shape{4, 4}, Shape{8, 2}, Device::Cpu()),
                   Mat(16, 4).view(), c.view(), {}),
      {"unit stride along dim 1"});
  ExpectInvalid(
      backend.Gemm(TensorView(a.data.data(), DType::kF32, Shape{4, 8}, Shape{4, 1}, Device::Cpu()),
                   b.view(), c.view(), {}),
      {"row stride 4 < its row length 8"});
  // c must not alias an input.
  ExpectInvalid(
      backend.Gemm(a.view(), b.view(), TensorView(b.data.data(), DType::kF32, Shape{4, 16}), {}),
      {"c f32[4, 16] cpu overlaps b"});
  ExpectInvalid(backend.Gemm(a.view(), b.view(), c.view(), {.alpha = kNaN}), {"must be finite"});
}

// ---- RmsNorm / AddRmsNorm
// -------------------------------------------------------------------------

// HF LlamaRMSNorm / DeepseekV2RMSNorm: x * rsqrt(mean(x^2) + eps) * weight.
std::vector<double> NaiveNorm(const std::vector<double>& x, const std::vector<float>& w,
                              float eps) {
  double ms = 0.0;
  for (double v : x) ms += v * v;
  ms /= static_cast<double>(x.size());
  const double inv = 1.0 / std::sqrt(ms + eps);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * inv * w[i];
  return out;
}

TEST(CpuBackendNormTest, RmsNormMatchesNaive) {
  CpuBackend backend;
  std::mt19937 rng(1);
  for (auto [t, h, pad] : {std::tuple{1, 1, 0}, {3, 64, 0}, {7, 300, 3}, {0, 8, 0}}) {
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(testing::Message()
                   << t << "x" << h << " pad " << pad << " in place " << in_place);
      Mat x(t, h, pad), out(t, h, pad);
      x.Fill(rng, 3.0f);
      const Mat x0 = x;
      std::vector<float> w = RandomVec(h, rng);
      Mat& dst = in_place ? x : out;
      ASSERT_TRUE(backend.RmsNorm(x.view(), Vec(w), 1e-6f, dst.view()).ok());
      for (int64_t r = 0; r < t; ++r) {
        std::vector<double> row(h);
        for (int64_t i = 0; i < h; ++i) row[i] = x0.at(r, i);
        const std::vector<double> expected = NaiveNorm(row, w, 1e-6f);
        for (int64_t i = 0; i < h; ++i) {
          ASSERT_NEAR(dst.at(r, i), expected[i], 1e-5 * (1 + std::abs(expected[i])));
        }
      }
      EXPECT_TRUE(dst.PaddingIntact());
    }
  }
}

TEST(CpuBackendNormTest, EpsDominatesForZeroRows) {
  CpuBackend backend;
  Mat x(1, 4), out(1, 4);
  for (int i = 0; i < 4; ++i) x.at(0, i) = 0.0f;
  std::vector<float> w(4, 1.0f);
  ASSERT_TRUE(backend.RmsNorm(x.view(), Vec(w), 1e-6f, out.view()).ok());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out.at(0, i), 0.0f);
}

TEST(CpuBackendNormTest, AddRmsNormUpdatesResidualThenNormalizesIt) {
  CpuBackend backend;
  std::mt19937 rng(2);
  for (bool out_is_x : {false, true}) {
    const int64_t t = 5, h = 96;
    Mat x(t, h, 2), residual(t, h, 1), out(t, h);
    x.Fill(rng);
    residual.Fill(rng);
    const Mat x0 = x, r0 = residual;
    std::vector<float> w = RandomVec(h, rng);
    Mat& dst = out_is_x ? x : out;
    ASSERT_TRUE(backend.AddRmsNorm(x.view(), residual.view(), Vec(w), 1e-5f, dst.view()).ok());
    for (int64_t r = 0; r < t; ++r) {
      std::vector<double> sum(h);
      for (int64_t i = 0; i < h; ++i) {
        EXPECT_EQ(residual.at(r, i), x0.at(r, i) + r0.at(r, i));  // one f32 add, exact
        sum[i] = residual.at(r, i);
      }
      const std::vector<double> expected = NaiveNorm(sum, w, 1e-5f);
      for (int64_t i = 0; i < h; ++i) {
        ASSERT_NEAR(dst.at(r, i), expected[i], 1e-5 * (1 + std::abs(expected[i])));
      }
    }
    EXPECT_TRUE(residual.PaddingIntact());
    EXPECT_TRUE(x.PaddingIntact());
  }
}

TEST(CpuBackendNormTest, RejectsBadOperands) {
  CpuBackend backend;
  Mat x(2, 8), out(2, 8), residual(2, 8), wrong(3, 8);
  std::vector<float> w(8), w7(7);
  ExpectInvalid(backend.RmsNorm(x.view(), Vec(w7), 1e-6f, out.view()),
                {"RmsNorm", "weight f32[7] cpu", "[H] = [8]", "f32[2, 8] cpu"});
  ExpectInvalid(backend.RmsNorm(x.view(), Vec(w), 1e-6f, wrong.view()),
                {"RmsNorm", "out f32[3, 8] cpu must have the shape of x f32[2, 8] cpu"});
  ExpectInvalid(backend.RmsNorm(x.view(), Vec(w), -1.0f, out.view()),
                {"eps must be finite and >= 0"});
  std::vector<uint16_t> half(16);
  ExpectInvalid(
      backend.RmsNorm(TensorView(half.data(), DType::kF16, Shape{2, 8}), Vec(w), 1e-6f, out.view()),
      {"RmsNorm", "x is f16[2, 8] cpu", "f32 only"});
  ExpectInvalid(backend.AddRmsNorm(x.view(), wrong.view(), Vec(w), 1e-6f, out.view()),
                {"AddRmsNorm", "residual f32[3, 8] cpu"});
  ExpectInvalid(backend.AddRmsNorm(x.view(), residual.view(), Vec(w), 1e-6f, residual.view()),
                {"AddRmsNorm", "out f32[2, 8] cpu overlaps residual"});
  // Shifted by one element: overlapping but not in place (rejected before anything is touched).
  ExpectInvalid(backend.RmsNorm(x.view(), Vec(w), 1e-6f,
                                TensorView(x.data.data() + 1, DType::kF32, Shape{2, 8})),
                {"RmsNorm", "overlaps x", "only exact in-place"});
}

// ---- RmsNormPair
// -----------------------------------------------------------------------------------

// RmsNormPair's operands as MlaBlock passes them: two column slices of one row-strided matrix
// [x0 | x1 | tail] (q_a's output, c, k_pe), normed in place; or (apart) four padded matrices.
struct PairCase {
  int64_t rows, h0, h1;
};

TensorView Columns(Mat& m, int64_t first, int64_t count) {
  return TensorView(m.data.data() + first, DType::kF32, Shape{m.rows, count}, Shape{m.ld, 1}, Device::Cpu());
}

TEST(CpuBackendNormTest, RmsNormPairEqualsTwoRmsNormsBitForBit) {
  CpuBackend backend;
  std::mt19937 rng(4);
  for (const PairCase c : {PairCase{1, 1536, 512}, {64, 1536, 512}, {1, 7, 33}, {64, 7, 33}, {5, 33, 7}}) {
    SCOPED_TRACE(testing::Message() << c.rows << " rows, widths " << c.h0 << " and " << c.h1);
    std::vector<float> w0 = RandomVec(c.h0, rng), w1 = RandomVec(c.h1, rng);
    // In place, in one row: the tail (k_pe's columns) must be left as it is.
    Mat row(c.rows, c.h0 + c.h1 + 3);
    row.Fill(rng, 2.0f);
    Mat expected = row;
    ASSERT_TRUE(backend.RmsNorm(Columns(expected, 0, c.h0), Vec(w0), 1e-6f, Columns(expected, 0, c.h0)).ok());
    ASSERT_TRUE(
        backend.RmsNorm(Columns(expected, c.h0, c.h1), Vec(w1), 1e-6f, Columns(expected, c.h0, c.h1)).ok());
    const TensorView x0 = Columns(row, 0, c.h0), x1 = Columns(row, c.h0, c.h1);
    ASSERT_TRUE(backend.RmsNormPair(x0, Vec(w0), x0, x1, Vec(w1), x1, 1e-6f).ok());
    EXPECT_EQ(std::memcmp(row.data.data(), expected.data.data(), row.data.size() * sizeof(float)), 0);

    // Out of place, every operand its own padded matrix.
    Mat a0(c.rows, c.h0, 2), a1(c.rows, c.h1, 1), out0(c.rows, c.h0, 3), out1(c.rows, c.h1, 5);
    a0.Fill(rng);
    a1.Fill(rng, 4.0f);
    const Mat a0_before = a0, a1_before = a1;
    Mat ref0 = out0, ref1 = out1;
    ASSERT_TRUE(backend.RmsNorm(a0.view(), Vec(w0), 1e-5f, ref0.view()).ok());
    ASSERT_TRUE(backend.RmsNorm(a1.view(), Vec(w1), 1e-5f, ref1.view()).ok());
    ASSERT_TRUE(backend.RmsNormPair(a0.view(), Vec(w0), out0.view(), a1.view(), Vec(w1), out1.view(), 1e-5f).ok());
    EXPECT_EQ(std::memcmp(out0.data.data(), ref0.data.data(), out0.data.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(out1.data.data(), ref1.data.data(), out1.data.size() * sizeof(float)), 0);
    EXPECT_TRUE(out0.PaddingIntact() && out1.PaddingIntact());
    EXPECT_EQ(std::memcmp(a0.data.data(), a0_before.data.data(), a0.data.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(a1.data.data(), a1_before.data.data(), a1.data.size() * sizeof(float)), 0);
  }
}

// Every refusal names the operand and comes before anything is written.
TEST(CpuBackendNormTest, RmsNormPairRefusesBadOperandsBeforeWriting) {
  CpuBackend backend;
  std::mt19937 rng(5);
  Mat row(4, 8 + 5 + 2);
  row.Fill(rng);
  const Mat row_before = row;
  std::vector<float> w8 = RandomVec(8, rng), w5 = RandomVec(5, rng), w7(7);
  const TensorView x0 = Columns(row, 0, 8), x1 = Columns(row, 8, 5);
  const auto expect_refused = [&](const absl::Status& s, const std::vector<std::string>& needles) {
    ExpectInvalid(s, needles);
    EXPECT_EQ(std::memcmp(row.data.data(), row_before.data.data(), row.data.size() * sizeof(float)), 0);
  };
  // Row counts differ.
  Mat three(3, 5), three_out(3, 5);
  expect_refused(backend.RmsNormPair(x0, Vec(w8), x0, three.view(), Vec(w5), three_out.view(), 1e-6f),
                 {"RmsNormPair", "x1 f32[3, 5] cpu", "x0's row count T = 4"});
  // out0 reaching into x1's columns (one element more than x0).
  std::vector<float> w9 = RandomVec(9, rng);
  expect_refused(backend.RmsNormPair(Columns(row, 0, 9), Vec(w9), Columns(row, 0, 9), x1, Vec(w5), x1, 1e-6f),
                 {"RmsNormPair", "out0 f32[4, 9] cpu overlaps x1 f32[4, 5] cpu"});
  // out1 over x0's columns, out1 over out0, out1 over weight0.
  Mat other(4, 8), lone(4, 5);
  expect_refused(backend.RmsNormPair(x0, Vec(w8), other.view(), lone.view(), Vec(w5), Columns(row, 3, 5), 1e-6f),
                 {"RmsNormPair", "out1 f32[4, 5] cpu overlaps x0 f32[4, 8] cpu"});
  expect_refused(backend.RmsNormPair(x0, Vec(w8), other.view(), lone.view(), Vec(w5), Columns(other, 2, 5), 1e-6f),
                 {"RmsNormPair", "out1 f32[4, 5] cpu overlaps out0 f32[4, 8] cpu"});
  Mat one0(1, 8), one1(1, 5);
  one0.Fill(rng);
  one1.Fill(rng);
  const TensorView on_weight0(w8.data() + 2, DType::kF32, Shape{1, 5});
  ExpectInvalid(backend.RmsNormPair(one0.view(), Vec(w8), one0.view(), one1.view(), Vec(w5), on_weight0, 1e-6f),
                {"RmsNormPair", "out1 f32[1, 5] cpu overlaps weight0 f32[8] cpu"});
  // Weight widths.
  expect_refused(backend.RmsNormPair(x0, Vec(w8), x0, x1, Vec(w7), x1, 1e-6f),
                 {"RmsNormPair", "weight1 f32[7] cpu must be [H] = [5] for x1 f32[4, 5] cpu"});
  expect_refused(backend.RmsNormPair(x0, Vec(w5), x0, x1, Vec(w5), x1, 1e-6f),
                 {"RmsNormPair", "weight0 f32[5] cpu must be [H] = [8] for x0"});
  // Dtypes: the second half's, found before the first half is written.
  std::vector<uint16_t> half(4 * 5);
  const TensorView f16(half.data(), DType::kF16, Shape{4, 5});
  expect_refused(backend.RmsNormPair(x0, Vec(w8), x0, f16, Vec(w5), f16, 1e-6f),
                 {"RmsNormPair", "x1 is f16[4, 5] cpu", "f32 only"});
  expect_refused(backend.RmsNormPair(x0, Vec(w8), x0, x1, TensorView(half.data(), DType::kF16, Shape{5}), x1, 1e-6f),
                 {"RmsNormPair", "weight1 is f16[5] cpu"});
  // Out shape and eps, as RmsNorm's.
  expect_refused(backend.RmsNormPair(x0, Vec(w8), x0, x1, Vec(w5), three_out.view(), 1e-6f),
                 {"RmsNormPair", "out1 f32[3, 5] cpu must have the shape of x1 f32[4, 5] cpu"});
  expect_refused(backend.RmsNormPair(x0, Vec(w8), x0, x1, Vec(w5), x1, -1.0f), {"RmsNormPair", "eps"});
}

// ---- SiluMul
// --------------------------------------------------------------------------------------

TEST(CpuBackendSiluMulTest, MatchesNaive) {
  CpuBackend backend;
  std::mt19937 rng(3);
  for (auto [t, inter, pad] : {std::tuple{1, 1, 0}, {4, 37, 0}, {9, 128, 4}}) {
    Mat gate_up(t, 2 * inter, pad), out(t, inter, pad);
    gate_up.Fill(rng, 4.0f);
    gate_up.at(0, 0) = -100.0f;  // exp(-g) overflows: silu must still be finite (-0)
    ASSERT_TRUE(backend.SiluMul(gate_up.view(), out.view()).ok());
    for (int64_t r = 0; r < t; ++r) {
      for (int64_t i = 0; i < inter; ++i) {
        const double g = gate_up.at(r, i), u = gate_up.at(r, inter + i);
        const double expected = g / (1.0 + std::exp(-g)) * u;
        ASSERT_NEAR(out.at(r, i), expected, 1e-5 * (1 + std::abs(expected)));
      }
    }
    EXPECT_TRUE(out.PaddingIntact());
  }
}

TEST(CpuBackendSiluMulTest, RejectsBadOperands) {
  CpuBackend backend;
  Mat gate_up(2, 9), out(2, 4), out_rows(3, 4);
  ExpectInvalid(backend.SiluMul(gate_up.view(), out.view()),
                {"SiluMul", "gate_up f32[2, 9] cpu must be [T, 2 * I]", "out f32[2, 4] cpu"});
  Mat gate_up8(2, 8);
  ExpectInvalid(backend.SiluMul(gate_up8.view(), out_rows.view()), {"SiluMul", "f32[3, 4] cpu"});
  ExpectInvalid(backend.SiluMul(gate_up8.view(), gate_up8.view().Narrow(1, 0, 4)), {"overlaps"});
}

// ---- EmbeddingLookup
// ------------------------------------------------------------------------------

template <typename Id>
void CheckEmbedding(DType id_dtype) {
  CpuBackend backend;
  std::mt19937 rng(4);
  const int64_t shard = 10, hidden = 12, vocab_start = 20;
  Mat table(shard, hidden, 3), out(7, hidden, 2);
  table.Fill(rng);
  std::vector<Id> ids = {20, 29, 19, 30, 25, 0, 1000};
  ASSERT_TRUE(backend
                  .EmbeddingLookup(TensorView(ids.data(), id_dtype, Shape{7}), table.view(),
                                   vocab_start, out.view())
                  .ok());
  for (int64_t t = 0; t < 7; ++t) {
    const int64_t local = static_cast<int64_t>(ids[t]) - vocab_start;
    for (int64_t i = 0; i < hidden; ++i) {
      const float expected = (local >= 0 && local < shard) ? table.at(local, i) : 0.0f;
      ASSERT_EQ(out.at(t, i), expected) << "token " << t << " id " << ids[t];
    }
  }
  EXPECT_TRUE(out.PaddingIntact());

  // A negative id names its position and leaves out untouched.
  const Mat before = out;
  ids[4] = -3;
  ExpectInvalid(backend.EmbeddingLookup(TensorView(ids.data(), id_dtype, Shape{7}), table.view(),
                                        vocab_start, out.view()),
                {"EmbeddingLookup", "ids[4] = -3 is negative"});
  for (size_t i = 0; i < out.data.size(); ++i) {
    ASSERT_TRUE(out.data[i] == before.data[i] ||
                (std::isnan(out.data[i]) && std::isnan(before.data[i])));
  }
}

TEST(CpuBackendEmbeddingTest, VocabParallelLookupI32) { CheckEmbedding<int32_t>(DType::kI32); }
TEST(CpuBackendEmbeddingTest, VocabParallelLookupI64) { CheckEmbedding<int64_t>(DType::kI64); }

TEST(CpuBackendEmbeddingTest, RejectsBadOperands) {
  CpuBackend backend;
  Mat table(10, 4), out(3, 4), out_wide(3, 5);
  std::vector<int32_t> ids = {1, 2, 3};
  std::vector<float> float_ids = {1, 2, 3};
  TensorView id_view(ids.data(), DType::kI32, Shape{3});
  ExpectInvalid(backend.EmbeddingLookup(TensorView(float_ids.data(), DType::kF32, Shape{3}),
                                        table.view(), 0, out.view()),
                {"EmbeddingLookup", "ids f32[3] cpu must be i32 or i64"});
  ExpectInvalid(backend.EmbeddingLookup(id_view, table.view(), 0, out_wide.view()),
                {"out f32[3, 5] cpu must be [T, H] = [3, 4]"});
  ExpectInvalid(backend.EmbeddingLookup(id_view, table.view(), -1, out.view()),
                {"vocab_start must be >= 0"});
  ExpectInvalid(backend.EmbeddingLookup(
                    TensorView(ids.data(), DType::kI32, Shape{2}, Shape{2}, Device::Cpu()),
                    table.view(), 0, Mat(2, 4).view()),
                {"ids", "must be contiguous"});
}

// ---- Softmax / Argmax / TopK
// -----------------------------------------------------------------------

TEST(CpuBackendSoftmaxTest, MatchesNaiveWithTemperature) {
  CpuBackend backend;
  std::mt19937 rng(6);
  for (float temperature : {1.0f, 0.7f, 2.5f}) {
    for (bool in_place : {false, true}) {
      Mat logits(4, 301, 3), out(4, 301, 1);
      logits.Fill(rng, 5.0f);
      logits.at(1, 7) = -kInf;  // masked entry: probability 0
      logits.at(2, 0) = 80.0f;  // exp overflows without max subtraction
      const Mat l0 = logits;
      Mat& dst = in_place ? logits : out;
      ASSERT_TRUE(backend.Softmax(logits.view(), temperature, dst.view()).ok());
      for (int64_t r = 0; r < 4; ++r) {
        double max = -INFINITY, sum = 0.0, total = 0.0;
        for (int64_t i = 0; i < 301; ++i) max = std::max(max, static_cast<double>(l0.at(r, i)));
        for (int64_t i = 0; i < 301; ++i) sum += std::exp((l0.at(r, i) - max) / temperature);
        for (int64_t i = 0; i < 301; ++i) {
          const double expected = std::exp((l0.at(r, i) - max) / temperature) / sum;
          ASSERT_NEAR(dst.at(r, i), expected, 1e-6 + 1e-5 * expected);
          total += dst.at(r, i);
        }
        EXPECT_NEAR(total, 1.0, 1e-5);
      }
      EXPECT_EQ(dst.at(1, 7), 0.0f);
      EXPECT_TRUE(dst.PaddingIntact());
    }
  }
}

TEST(CpuBackendSoftmaxTest, RejectsBadRowsAndTemperature) {
  CpuBackend backend;
  Mat logits(3, 5), out(3, 5);
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t i = 0; i < 5; ++i) logits.at(r, i) = 0.0f;
  }
  ExpectInvalid(backend.Softmax(logits.view(), 0.0f, out.view()),
                {"temperature must be finite and > 0"});
  ExpectInvalid(backend.Softmax(logits.view(), -1.0f, out.view()), {"temperature"});
  logits.at(1, 3) = kNaN;
  ExpectInvalid(backend.Softmax(logits.view(), 1.0f, out.view()),
                {"Softmax", "row 1", "nan", "index 3"});
  logits.at(1, 3) = kInf;
  ExpectInvalid(backend.Softmax(logits.view(), 1.0f, out.view()), {"row 1", "inf"});
  logits.at(1, 3) = 0.0f;
  for (int64_t i = 0; i < 5; ++i) logits.at(2, i) = -kInf;
  ExpectInvalid(backend.Softmax(logits.view(), 1.0f, out.view()), {"row 2", "no finite logit"});
  ExpectInvalid(backend.Softmax(logits.view(), 1.0f, Mat(3, 4).view()), {"out f32[3, 4] cpu"});
}

TEST(CpuBackendArgmaxTest, FirstMaximumWinsAndBothIndexTypes) {
  CpuBackend backend;
  std::mt19937 rng(8);
  Mat logits(6, 1000, 2);
  logits.Fill(rng);
  for (int64_t i = 0; i < 1000; ++i) logits.at(3, i) = 1.0f;  // all tied -> 0
  logits.at(4, 10) = 9.0f;
  logits.at(4, 500) = 9.0f;  // tie -> 10
  for (int64_t i = 0; i < 1000; ++i) logits.at(5, i) = -kInf;
  logits.at(5, 999) = -1.0f;
  std::vector<int32_t> out32(6);
  std::vector<int64_t> out64(6);
  ASSERT_TRUE(backend.Argmax(logits.view(), TensorView(out32.data(), DType::kI32, Shape{6})).ok());
  ASSERT_TRUE(backend.Argmax(logits.view(), TensorView(out64.data(), DType::kI64, Shape{6})).ok());
  for (int64_t r = 0; r < 6; ++r) {
    int64_t best = 0;
    for (int64_t i = 1; i < 1000; ++i) {
      if (logits.at(r, i) > logits.at(r, best)) best = i;
    }
    EXPECT_EQ(out32[r], best) << "row " << r;
    EXPECT_EQ(out64[r], best) << "row " << r;
  }
  EXPECT_EQ(out64[3], 0);
  EXPECT_EQ(out64[4], 10);
  EXPECT_EQ(out64[5], 999);
}

TEST(CpuBackendArgmaxTest, RejectsNaNRowsAndBadOutputs) {
  CpuBackend backend;
  Mat logits(3, 4);
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t i = 0; i < 4; ++i) logits.at(r, i) = static_cast<float>(i);
  }
  logits.at(2, 1) = kNaN;
  std::vector<int64_t> out(3);
  ExpectInvalid(backend.Argmax(logits.view(), TensorView(out.data(), DType::kI64, Shape{3})),
                {"Argmax", "row 2 of logits f32[3, 4] cpu has NaN at index 1"});
  ExpectInvalid(backend.Argmax(logits.view(), TensorView(out.data(), DType::kI64, Shape{2})),
                {"out i64[2] cpu must be [R] = [3]"});
  std::vector<float> fout(3);
  ExpectInvalid(backend.Argmax(logits.view(), Vec(fout)), {"out f32[3] cpu must be i32 or i64"});
  ExpectInvalid(backend.Argmax(Mat(3, 0).view(), TensorView(out.data(), DType::kI64, Shape{3})),
                {"V >= 1"});
}

template <typename Index>
void CheckTopK(DType index_dtype, int k) {
  CpuBackend backend;
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> small(-5, 5);  // many ties
  const int64_t rows = 5, v = 200;
  Mat values(rows, v, 3), out_values(rows, k, 1);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < v; ++i) values.at(r, i) = static_cast<float>(small(rng));
  }
  values.at(0, 150) = -kInf;
  values.at(1, 3) = kInf;
  std::vector<Index> idx(rows * (k + 2), -1);
  TensorView idx_view(idx.data(), index_dtype, Shape{rows, k}, Shape{k + 2, 1}, Device::Cpu());
  ASSERT_TRUE(backend.TopK(values.view(), k, out_values.view(), idx_view).ok());
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> order(v);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t p, int64_t q) { return values.at(r, p) > values.at(r, q); });
    for (int j = 0; j < k; ++j) {
      ASSERT_EQ(idx[r * (k + 2) + j], order[j]) << "row " << r << " rank " << j;
      ASSERT_EQ(out_values.at(r, j), values.at(r, order[j]));
    }
    EXPECT_EQ(idx[r * (k + 2) + k], -1);  // row padding untouched
  }
  EXPECT_TRUE(out_values.PaddingIntact());
}

TEST(CpuBackendTopKTest, DescendingTiesLowestIndexFirst) {
  for (int k : {1, 3, 17, 200}) {
    SCOPED_TRACE(k);
    CheckTopK<int32_t>(DType::kI32, k);
    CheckTopK<int64_t>(DType::kI64, k);
  }
}

TEST(CpuBackendTopKTest, RejectsBadArguments) {
  CpuBackend backend;
  Mat values(2, 6), out_values(2, 3);
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t i = 0; i < 6; ++i) values.at(r, i) = static_cast<float>(i);
  }
  std::vector<int64_t> idx(6);
  TensorView idx_view(idx.data(), DType::kI64, Shape{2, 3});
  ExpectInvalid(backend.TopK(values.view(), 0, out_values.view(), idx_view),
                {"k = 0 must be in [1, V]"});
  ExpectInvalid(backend.TopK(values.view(), 7, Mat(2, 7).view(), idx_view),
                {"k = 7", "f32[2, 6] cpu"});
  ExpectInvalid(backend.TopK(values.view(), 2, out_values.view(), idx_view),
                {"out_values f32[2, 3] cpu must be [R, k] = [2, 2]"});
  ExpectInvalid(backend.TopK(values.view(), 3, out_values.view(),
                             TensorView(idx.data(), DType::kF32, Shape{2, 3})),
                {"out_indices f32[2, 3] cpu must be i32 or i64"});
  values.at(1, 4) = kNaN;
  ExpectInvalid(backend.TopK(values.view(), 3, out_values.view(), idx_view),
                {"TopK", "row 1", "NaN at index 4"});
}

// ---- Copy and the rest
// -----------------------------------------------------------------------------

TEST(CpuBackendCopyTest, ContiguousStridedAndScalar) {
  CpuBackend backend;
  std::vector<int64_t> src(2 * 3 * 4);
  std::iota(src.begin(), src.end(), 0);
  TensorView full(src.data(), DType::kI64, Shape{2, 3, 4});

  std::vector<int64_t> dst(24, -1);
  ASSERT_TRUE(backend.Copy(full, TensorView(dst.data(), DType::kI64, Shape{2, 3, 4})).ok());
  EXPECT_EQ(dst, src);

  // Strided source (a window along dims 1 and 2) into a contiguous destination.
  TensorView window = full.Narrow(1, 1, 2).Narrow(2, 1, 2);
  std::vector<int64_t> packed(8, -1);
  ASSERT_TRUE(backend.Copy(window, TensorView(packed.data(), DType::kI64, Shape{2, 2, 2})).ok());
  EXPECT_EQ(packed, (std::vector<int64_t>{5, 6, 9, 10, 17, 18, 21, 22}));

  // Contiguous source into a transposed (column-major) destination.
  std::vector<uint16_t> half_src = {1, 2, 3, 4, 5, 6}, half_dst(6, 0);
  ASSERT_TRUE(
      backend
          .Copy(TensorView(half_src.data(), DType::kBF16, Shape{2, 3}),
                TensorView(half_dst.data(), DType::kBF16, Shape{2, 3}, Shape{1, 2}, Device::Cpu()))
          .ok());
  EXPECT_EQ(half_dst, (std::vector<uint16_t>{1, 4, 2, 5, 3, 6}));

  float a = 3.5f, b = 0.0f;
  ASSERT_TRUE(
      backend.Copy(TensorView(&a, DType::kF32, Shape{}), TensorView(&b, DType::kF32, Shape{}))
          .ok());
  EXPECT_EQ(b, 3.5f);
}

TEST(CpuBackendCopyTest, RejectsMismatches) {
  CpuBackend backend;
  std::vector<float> a(8), b(8);
  ExpectInvalid(
      backend.Copy(TensorView(a.data(), DType::kF32, Shape{2, 4}),
                   TensorView(b.data(), DType::kF32, Shape{4, 2})),
      {"Copy", "src f32[2, 4] cpu and dst f32[4, 2] cpu must have the same shape and dtype"});
  ExpectInvalid(backend.Copy(TensorView(a.data(), DType::kF32, Shape{8}),
                             TensorView(b.data(), DType::kI32, Shape{8})),
                {"i32[8]"});
  ExpectInvalid(
      backend.Copy(TensorView(a.data(), DType::kF32, Shape{8}),
                   TensorView(b.data(), DType::kF32, Shape{8}, Shape{1}, Device::Cuda(1))),
      {"host memory only", "cuda:1"});
  ExpectInvalid(backend.Copy(TensorView(a.data(), DType::kF32, Shape{4}),
                             TensorView(a.data() + 2, DType::kF32, Shape{4})),
                {"overlaps"});
}

// Views into one row-strided buffer whose columns per row are disjoint (a row [q | c | heads] that
// one op reads a part of and writes another of) do not overlap, for Copy, Gemm and BatchedGemm's
// head-major items alike; shifted so that the columns meet, they do, by one element or by a row.
TEST(CpuBackendCopyTest, DisjointColumnBandsOfOneBufferDoNotOverlap) {
  CpuBackend backend;
  constexpr int64_t kRows = 3, kLd = 24;
  std::vector<float> buf(kRows * kLd);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  const auto cols = [&](int64_t col, int64_t n) {
    return TensorView(buf.data() + col, DType::kF32, Shape{kRows, n}, Shape{kLd, 1}, Device::Cpu());
  };
  EXPECT_TRUE(backend.Copy(cols(0, 4), cols(20, 4)).ok());
  EXPECT_EQ(buf[kLd + 20], static_cast<float>(kLd));
  EXPECT_TRUE(backend.Copy(cols(8, 4), cols(4, 4)).ok());  // the band just before
  ExpectInvalid(backend.Copy(cols(0, 4), cols(3, 4)), {"Copy", "overlaps"});
  ExpectInvalid(backend.Copy(cols(19, 3), cols(21, 3)), {"overlaps"});
  // A band wrapping into the next row (columns 22 .. 25 of a 24-wide row) meets column 0 of it.
  const TensorView wrap(buf.data() + 22, DType::kF32, Shape{kRows - 1, 4}, Shape{kLd, 1}, Device::Cpu());
  const TensorView first(buf.data(), DType::kF32, Shape{kRows - 1, 4}, Shape{kLd, 1}, Device::Cpu());
  ExpectInvalid(backend.Copy(wrap, first), {"overlaps"});
  // Gemm: a = columns [0, 4), c = columns [8, 10) of the same rows.
  std::vector<float> w(2 * 4, 0.5f);
  const TensorView b(w.data(), DType::kF32, Shape{2, 4});
  EXPECT_TRUE(backend.Gemm(cols(0, 4), b, cols(8, 2), {}).ok());
  EXPECT_FLOAT_EQ(buf[kLd + 8], 0.5f * (24 + 25 + 26 + 27));
  ExpectInvalid(backend.Gemm(cols(0, 4), b, cols(3, 2), {}), {"Gemm", "overlaps"});
  // BatchedGemm over 2 head-major items [2, rows, 2] (head stride 2) of columns [0, 4) into [12, 16).
  const auto heads = [&](int64_t col) {
    return TensorView(buf.data() + col, DType::kF32, Shape{2, kRows, 2}, Shape{2, kLd, 1}, Device::Cpu());
  };
  std::vector<float> bw(2 * 2 * 2, 1.0f);
  const TensorView bb(bw.data(), DType::kF32, Shape{2, 2, 2});
  EXPECT_TRUE(backend.BatchedGemm(heads(0), bb, heads(12), {}).ok());
  ExpectInvalid(backend.BatchedGemm(heads(0), bb, heads(2), {}), {"BatchedGemm", "overlaps"});
}

TEST(CpuBackendTest, DeviceAllocatorAndSynchronize) {
  CpuBackend backend;
  EXPECT_TRUE(backend.device().is_cpu());
  EXPECT_TRUE(backend.Synchronize().ok());
  auto t = Tensor::Empty(DType::kF32, Shape{3, 4}, backend.allocator());
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->device().is_cpu());
  Backend& base = backend;  // usable through the interface
  Mat x(1, 3), out(1, 3);
  std::vector<float> w = {1, 1, 1};
  for (int i = 0; i < 3; ++i) x.at(0, i) = 2.0f;
  ASSERT_TRUE(base.RmsNorm(x.view(), Vec(w), 0.0f, out.view()).ok());
  EXPECT_FLOAT_EQ(out.at(0, 0), 1.0f);
}

}  // namespace
}  // namespace eagle3::cpu

namespace eagle3 {
namespace {

// The CPU reference's PrefetchWeights only checks its views: host views (empty ones and strided
// ones too) are taken and left as they were; a view of another device or with a negative stride is
// refused by its index.
TEST(CpuBackendPrefetchTest, ChecksViewsAndChangesNothing) {
  cpu::CpuBackend backend;
  Tensor w = *Tensor::Empty(DType::kF32, Shape{4, 6});
  for (int64_t i = 0; i < 24; ++i) w.data_as<float>()[i] = static_cast<float>(i);
  const TensorView strided(w.data(), DType::kF32, Shape{2, 6}, Shape{12, 1}, Device::Cpu());
  const std::vector<TensorView> ok = {w.view(), TensorView(), strided};
  EXPECT_TRUE(backend.PrefetchWeights(ok).ok());
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(w.data_as<float>()[i], static_cast<float>(i));

  const std::vector<TensorView> other_device = {w.view(), TensorView(w.data(), DType::kF32, Shape{24}, Device::Cuda(0))};
  const absl::Status refused = backend.PrefetchWeights(other_device);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("weights[1]"));

  const std::vector<TensorView> negative = {TensorView(w.data(), DType::kF32, Shape{2}, Shape{-1}, Device::Cpu())};
  EXPECT_EQ(backend.PrefetchWeights(negative).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace eagle3
