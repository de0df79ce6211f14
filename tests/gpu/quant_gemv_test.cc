// The quantized GEMV launchers (cuda/quant_gemv_ops.h) against a CPU reference that dequantizes the
// weights as the checkpoint loader does (src/quantized_weights.cc: fp8 code * scale_inv in f32; int4
// q * scale, exact in f32) and sums in double: FP8 block-scaled and INT4 group-quantized weights
// written with the library's own packing (eagle3/detail/int4_packing.h), M = 1..32, N and K off every
// tile size, tensor-parallel slices that start inside a scale block or group (scales by GLOBAL
// index), a slice's result ≡ the matching rows / column-sum of the whole matrix's, f32 and bf16
// activations, strided a and c, alpha / beta / bias (beta 0 over a NaN c: never read), batched
// items, grouped items (device pointer arrays and count, programmatic), determinism, the
// programmatic-launch flag, and bad arguments refused with cudaErrorInvalidValue; every path of the
// kernel through explicit plans (quant_gemv_plan.h: rows per block, K split over a cluster, several
// activation tiles; 1, 2 or 4 8-row operands) and every kernel choice for tiled codes, and a row's
// bits independent of the operand that holds it. Skipped where no CUDA device is visible. The
// planner's rules, host code, are tested with the CPU suite (tests/quant_gemv_plan_test.cc).
//
// Tolerance (max |gpu - ref| / max |ref|): 3e-5. The GPU multiplies bf16-rounded activations by
// codes that are exact in bf16 (fp8 codes; int4's q / 2) with fp32 accumulation, and applies fp8's
// block scales and int4's group scales to fp32 block and group sums: only fp32 summation order and
// rounding differ from the reference. A scale taken from the wrong block or group, a misplaced
// nibble or a dropped chunk moves results by whole weights, orders of magnitude above it.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "device_buffer.h"
#include "eagle3/cuda/device_allocator.h"
#include "eagle3/detail/int4_packing.h"
#include "eagle3/detail/quant_tiles.h"
#include "eagle3/half.h"
#include "core_ops.h"
#include "gtest/gtest.h"
#include "quant_gemv_ops.h"
#include "quant_gemv_plan.h"
#include "quant_gemv_problem.h"

namespace eagle3::cuda {
namespace {

constexpr double kTol = 3e-5;

// Largest |got - want| over the largest |want| (1e-30 when want is all zero).
double MaxRelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < got.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(got[i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
  }
  return diff / scale;
}
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <typename T>
void Upload(const DeviceBuffer& d, const std::vector<T>& h) {
  ASSERT_EQ(cudaMemcpy(d.ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}
template <typename T>
std::vector<T> Download(const DeviceBuffer& d, size_t count) {
  std::vector<T> h(count);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(h.data(), d.ptr, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// A global quantized weight matrix [rows, cols] on the host: fp8 codes and block scales, or int4
// values (packed per row with PackInt4Row) and group scales.
struct Fp8Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;  // [rows, cols]
  std::vector<float> scales;   // [ceil(rows / 128), ceil(cols / 128)]
  int64_t scale_cols() const { return (cols + 127) / 128; }
  // The f32 weight the loader dequantizes (ReadFp8): code * scale_inv, rounded once in f32.
  float Weight(int64_t r, int64_t c) const {
    return F8E4M3ToFloat(codes[r * cols + c]) * scales[(r / 128) * scale_cols() + c / 128];
  }
};

Fp8Matrix RandomFp8(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  Fp8Matrix w;
  w.rows = rows, w.cols = cols;
  w.codes.resize(rows * cols);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& code : w.codes) {
    do {
      code = static_cast<uint8_t>(byte(rng));
    } while ((code & 0x7f) == 0x7f);  // every finite code, subnormals and zeros included
  }
  // Scales of full f32 precision spread over a few binades, so a block read from its neighbour shows.
  std::uniform_real_distribution<float> frac(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-14, -8);
  w.scales.resize(((rows + 127) / 128) * w.scale_cols());
  for (float& s : w.scales) s = std::ldexp(frac(rng), exponent(rng));
  return w;
}

struct Int4Matrix {
  int64_t rows = 0, cols = 0, group = 32;
  std::vector<int8_t> values;      // [rows, cols], -8..7
  std::vector<int32_t> packed;     // [rows, ceil(cols / 8)]
  std::vector<uint16_t> scales;    // [rows, cols / group], bf16
  int64_t words() const { return Int4PackedWords(cols); }
  int64_t groups() const { return (cols + group - 1) / group; }
  // The weight the GPU multiplies: the loader's exact f32 dequantization (the kernel applies the
  // group scale to fp32 sums of exact products).
  float Weight(int64_t r, int64_t c) const {
    return static_cast<float>(Int4At(packed.data() + r * words(), c)) * Bf16ToFloat(scales[r * groups() + c / group]);
  }
};

Int4Matrix RandomInt4(int64_t rows, int64_t cols, int64_t group, uint32_t seed) {
  std::mt19937 rng(seed);
  Int4Matrix w;
  w.rows = rows, w.cols = cols, w.group = group;
  w.values.resize(rows * cols);
  std::uniform_int_distribution<int> value(-8, 7);
  for (int8_t& v : w.values) v = static_cast<int8_t>(value(rng));
  w.packed.resize(rows * w.words());
  for (int64_t r = 0; r < rows; ++r) PackInt4Row(w.values.data() + r * cols, cols, w.packed.data() + r * w.words());
  std::uniform_real_distribution<float> frac(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-9, -4);
  w.scales.resize(rows * w.groups());
  for (uint16_t& s : w.scales) s = FloatToBf16(std::ldexp(frac(rng), exponent(rng)));
  return w;
}

// One call's activations, output and epilogue.
struct Case {
  int64_t m = 1, batch = 1;
  GemvType a_type = GemvType::kF32;
  int64_t a_pad = 0, c_pad = 0;  // extra elements per row (strided a and c)
  bool bias = false;
  float alpha = 1.0f, beta = 0.0f;
  bool programmatic = false;
};

// Activations [batch, m, lda] (values as uploaded, and as the GPU multiplies them: bf16-rounded).
struct Activations {
  std::vector<float> values;   // rounded to bf16
  std::vector<uint16_t> bf16;  // the bf16 upload
  std::vector<float> f32;      // the f32 upload
};

Activations RandomActivations(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Activations a;
  for (int64_t i = 0; i < count; ++i) {
    const float x = dist(rng);
    a.f32.push_back(x);
    a.bf16.push_back(FloatToBf16(x));
    a.values.push_back(Bf16ToFloat(a.bf16.back()));
  }
  return a;
}

// Host reference of c for item `item`: c[mr][r] = alpha sum_c w(r, c) a[mr][c] + beta c0 + bias.
template <typename WeightFn>
std::vector<float> Reference(const Case& cs, int64_t n, int64_t k, const Activations& a, int64_t lda,
                             const std::vector<float>& c0, int64_t ldc, const std::vector<float>& bias,
                             int64_t item, WeightFn weight) {
  std::vector<float> out(static_cast<size_t>(cs.m * n));
  for (int64_t mr = 0; mr < cs.m; ++mr) {
    for (int64_t r = 0; r < n; ++r) {
      double sum = 0;
      for (int64_t c = 0; c < k; ++c) {
        sum += static_cast<double>(weight(r, c)) * a.values[(item * cs.m + mr) * lda + c];
      }
      double v = cs.alpha * sum;
      if (cs.beta != 0.0f) v += cs.beta * static_cast<double>(c0[(item * cs.m + mr) * ldc + r]);
      if (cs.bias) v += bias[r];
      out[mr * n + r] = static_cast<float>(v);
    }
  }
  return out;
}

// Runs `launch` (which calls a launcher with the device a, c and bias of the case) and compares c
// with the reference for every item; c outside [m, n] of each item (row padding) must keep its bits.
// Returns the downloaded c.
template <typename LaunchFn, typename WeightFn>
std::vector<float> RunAndCheck(const Case& cs, int64_t n, int64_t k, uint32_t seed, LaunchFn launch,
                               WeightFn weight_of_item) {
  const int64_t lda = k + cs.a_pad, ldc = n + cs.c_pad;
  const Activations a = RandomActivations(cs.batch * cs.m * lda, seed);
  std::vector<float> c0 = RandomActivations(cs.batch * cs.m * ldc, seed + 1).f32;
  if (cs.beta == 0.0f) std::fill(c0.begin(), c0.end(), kNaN);  // never read: NaN would show
  for (int64_t i = 0; i < cs.batch * cs.m; ++i) std::fill(c0.begin() + i * ldc + n, c0.begin() + (i + 1) * ldc, -7.0f);
  const std::vector<float> bias = RandomActivations(n, seed + 2).f32;
  DeviceBuffer a_dev(a.f32.size() * sizeof(float)), c_dev(c0.size() * sizeof(float)), bias_dev(n * sizeof(float));
  if (cs.a_type == GemvType::kF32) {
    Upload(a_dev, a.f32);
  } else {
    Upload(a_dev, a.bf16);
  }
  Upload(c_dev, c0);
  Upload(bias_dev, bias);
  EXPECT_EQ(launch(a_dev.ptr, lda, cs.m * lda, c_dev.as<float>(), ldc, cs.m * ldc,
                   cs.bias ? bias_dev.as<float>() : nullptr),
            cudaSuccess);
  const std::vector<float> got = Download<float>(c_dev, c0.size());
  for (int64_t item = 0; item < cs.batch; ++item) {
    const std::vector<float> want = Reference(cs, n, k, a, lda, c0, ldc, bias, item, weight_of_item(item));
    double diff = 0, scale = 1e-30;
    for (int64_t mr = 0; mr < cs.m; ++mr) {
      for (int64_t r = 0; r < n; ++r) {
        const float g = got[(item * cs.m + mr) * ldc + r];
        if (std::isnan(g)) {
          diff = std::numeric_limits<double>::infinity();
          continue;
        }
        diff = std::max(diff, static_cast<double>(std::fabs(g - want[mr * n + r])));
        scale = std::max(scale, static_cast<double>(std::fabs(want[mr * n + r])));
      }
      for (int64_t r = n; r < ldc; ++r) EXPECT_EQ(got[(item * cs.m + mr) * ldc + r], -7.0f) << "padding written";
    }
    EXPECT_LE(diff / scale, kTol) << "item " << item << " m " << cs.m << " n " << n << " k " << k;
  }
  return got;
}

class QuantGemvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

// ---- FP8 -------------------------------------------------------------------------------------------

// A slice [row0, row0 + n) x [col0, col0 + k) of `w` uploaded with rows `ld` bytes apart (the
// padding holds code 0x7e = 448: a read past k would show), the global scales beside it.
struct Fp8Slice {
  DeviceBuffer codes, scales;
  Fp8BlockWeights weights;
  Fp8Slice(const Fp8Matrix& w, int64_t row0, int64_t col0, int64_t n, int64_t k, int64_t ld)
      : codes(static_cast<size_t>(n * ld)), scales(w.scales.size() * sizeof(float)) {
    std::vector<uint8_t> host(static_cast<size_t>(n * ld), 0x7e);
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(host.data() + r * ld, w.codes.data() + (row0 + r) * w.cols + col0, static_cast<size_t>(k));
    }
    Upload(codes, host);
    Upload(scales, w.scales);
    weights.codes = codes.as<uint8_t>();
    weights.ld = ld;
    weights.scale_inv = scales.as<float>();
    weights.scale_ld = w.scale_cols();
    weights.row0 = row0;
    weights.col0 = col0;
  }
};

int64_t Ld16(int64_t k) { return (k + 15) / 16 * 16 + 16; }

// The warp-step tiled copy (eagle3/detail/quant_tiles.h) of a slice's row-major device codes (fp8
// bytes or int4 words, rows `ld` elements apart).
std::unique_ptr<DeviceBuffer> TiledCodes(bool int4, const DeviceBuffer& codes, int64_t ld, int64_t n, int64_t k,
                                         int64_t col0) {
  const std::vector<uint8_t> host = Download<uint8_t>(codes, static_cast<size_t>(n * ld * (int4 ? 4 : 1)));
  std::vector<uint8_t> tiled(static_cast<size_t>(QuantTiledBytes(int4, n, k, col0)));
  TileQuantizedCodes(int4, host.data(), ld, n, k, col0, tiled.data());
  auto out = std::make_unique<DeviceBuffer>(tiled.size());
  Upload(*out, tiled);
  return out;
}

// The slice's product checked against the reference, through LaunchFp8BlockGemv, or with `plan`
// (quant_gemv_plan.h) when given, on the row-major codes or (`tiled`) their warp-step tiles; returns c.
std::vector<float> CheckFp8(const Case& cs, const Fp8Matrix& w, int64_t row0, int64_t col0, int64_t n, int64_t k,
                            uint32_t seed, const QuantGemvPlan* plan = nullptr, bool tiled = false) {
  const Fp8Slice slice(w, row0, col0, n, k, Ld16(k));
  std::unique_ptr<DeviceBuffer> tiles;
  Fp8BlockWeights weights = slice.weights;
  if (tiled) {
    tiles = TiledCodes(false, slice.codes, Ld16(k), n, k, col0);
    weights.codes = tiles->as<uint8_t>();
    weights.ld = 0;
    weights.tiled = true;
  }
  return RunAndCheck(
      cs, n, k, seed,
      [&](const void* a, int64_t lda, int64_t sa, float* c, int64_t ldc, int64_t sc, const float* bias) {
        if (plan != nullptr) {
          return LaunchFp8BlockGemvPlanned(a, cs.a_type, lda, sa, weights, c, ldc, sc, bias, cs.batch, cs.m, n, k,
                                           cs.alpha, cs.beta, plan, cs.programmatic, nullptr);
        }
        return LaunchFp8BlockGemv(a, cs.a_type, lda, sa, weights, c, ldc, sc, bias, cs.batch, cs.m, n, k, cs.alpha,
                                  cs.beta, cs.programmatic, nullptr);
      },
      [&](int64_t) { return [&](int64_t r, int64_t c) { return w.Weight(row0 + r, col0 + c); }; });
}

TEST_F(QuantGemvTest, Fp8EveryRowCount) {
  const Fp8Matrix w = RandomFp8(300, 1000, 1);
  for (int64_t m = 1; m <= kQuantGemvMaxRows; ++m) {
    Case cs;
    cs.m = m;
    CheckFp8(cs, w, 0, 0, 300, 1000, 10 + static_cast<uint32_t>(m));
  }
}

TEST_F(QuantGemvTest, Fp8Bf16ActivationsStridedWithEpilogue) {
  const Fp8Matrix w = RandomFp8(517, 333, 2);
  for (const int64_t m : {1, 5, 8, 9, 16, 17, 32}) {
    Case cs;
    cs.m = m;
    cs.a_type = GemvType::kBF16;
    cs.a_pad = 3;
    cs.c_pad = 5;
    cs.bias = true;
    cs.alpha = 0.75f;
    cs.beta = 0.5f;
    CheckFp8(cs, w, 0, 0, 517, 333, 30 + static_cast<uint32_t>(m));
    cs.a_type = GemvType::kF32;
    CheckFp8(cs, w, 0, 0, 517, 333, 40 + static_cast<uint32_t>(m));
  }
}

// Decode shapes of a DeepSeek-V3 TP8 rank (kv_a, routed expert down, dense gate_up's K): the split
// and multi-tile paths.
TEST_F(QuantGemvTest, Fp8DecodeShapes) {
  const Fp8Matrix kv_a = RandomFp8(576, 7168, 3);
  const Fp8Matrix down = RandomFp8(7168, 256, 4);
  const Fp8Matrix wide = RandomFp8(2048, 7168, 5);
  for (const int64_t m : {1, 4, 8, 16, 24, 32}) {
    Case cs;
    cs.m = m;
    CheckFp8(cs, kv_a, 0, 0, 576, 7168, 50 + static_cast<uint32_t>(m));
    CheckFp8(cs, down, 0, 0, 7168, 256, 60 + static_cast<uint32_t>(m));
  }
  for (const int64_t m : {3, 16, 32}) {
    Case cs;
    cs.m = m;
    CheckFp8(cs, wide, 0, 0, 2048, 7168, 70 + static_cast<uint32_t>(m));
  }
}

// Subnormal e4m3 codes (exponent field 0) alone: their exact bf16 widening is all the result.
TEST_F(QuantGemvTest, Fp8SubnormalCodes) {
  Fp8Matrix w = RandomFp8(200, 300, 21);
  for (uint8_t& code : w.codes) code &= 0x87;  // sign and mantissa kept, exponent 0
  for (const int64_t m : {1, 8, 16, 32}) {
    Case cs;
    cs.m = m;
    CheckFp8(cs, w, 0, 0, 200, 300, 130 + static_cast<uint32_t>(m));
  }
}

// A slice that starts inside a 128 x 128 block (row0 % 128 = 72, col0 % 128 = 48) takes the
// global blocks' scales.
TEST_F(QuantGemvTest, Fp8SliceInsideBlock) {
  const Fp8Matrix w = RandomFp8(600, 900, 6);
  for (const int64_t m : {1, 7, 12, 19}) {
    Case cs;
    cs.m = m;
    CheckFp8(cs, w, 200, 48, 300, 560, 80 + static_cast<uint32_t>(m));
    CheckFp8(cs, w, 72, 784, 500, 116, 90 + static_cast<uint32_t>(m));
  }
}

// Row slices give the whole matrix's rows, and column slices (accumulated with beta = 1) its sums:
// the scale of every element is that of its global position.
TEST_F(QuantGemvTest, Fp8SlicesMatchWholeMatrix) {
  const int64_t rows = 400, cols = 1040, m = 6;
  const Fp8Matrix w = RandomFp8(rows, cols, 7);
  const Activations a = RandomActivations(m * cols, 8);
  DeviceBuffer a_dev(a.f32.size() * sizeof(float));
  Upload(a_dev, a.f32);
  DeviceBuffer whole_c(m * rows * sizeof(float)), part_c(m * rows * sizeof(float));
  const Fp8Slice whole(w, 0, 0, rows, cols, Ld16(cols));
  ASSERT_EQ(LaunchFp8BlockGemv(a_dev.ptr, GemvType::kF32, cols, 0, whole.weights, whole_c.as<float>(), rows, 0,
                               nullptr, 1, m, rows, cols, 1.0f, 0.0f, false, nullptr),
            cudaSuccess);
  const std::vector<float> want = Download<float>(whole_c, m * rows);
  // Rows 72 .. 72 + 250 of the whole matrix, written at the same place of c.
  {
    const Fp8Slice slice(w, 72, 0, 250, cols, Ld16(cols));
    ASSERT_EQ(LaunchFp8BlockGemv(a_dev.ptr, GemvType::kF32, cols, 0, slice.weights, part_c.as<float>() + 72, rows,
                                 0, nullptr, 1, m, 250, cols, 1.0f, 0.0f, false, nullptr),
              cudaSuccess);
    const std::vector<float> got = Download<float>(part_c, m * rows);
    double diff = 0, scale = 1e-30;
    for (int64_t mr = 0; mr < m; ++mr) {
      for (int64_t r = 72; r < 72 + 250; ++r) {
        diff = std::max(diff, static_cast<double>(std::fabs(got[mr * rows + r] - want[mr * rows + r])));
        scale = std::max(scale, static_cast<double>(std::fabs(want[mr * rows + r])));
      }
    }
    EXPECT_LE(diff / scale, kTol);
  }
  // Columns [0, 176), [176, 656), [656, 1040): boundaries inside blocks, c accumulated.
  const int64_t bounds[] = {0, 176, 656, cols};
  for (int s = 0; s < 3; ++s) {
    const int64_t col0 = bounds[s], k = bounds[s + 1] - bounds[s];
    const Fp8Slice slice(w, 0, col0, rows, k, Ld16(k));
    ASSERT_EQ(LaunchFp8BlockGemv(static_cast<const float*>(a_dev.ptr) + col0, GemvType::kF32, cols, 0,
                                 slice.weights, part_c.as<float>(), rows, 0, nullptr, 1, m, rows, k, 1.0f,
                                 s == 0 ? 0.0f : 1.0f, false, nullptr),
              cudaSuccess);
  }
  const std::vector<float> got = Download<float>(part_c, m * rows);
  EXPECT_LE(MaxRelativeError(got, want), kTol);
}

// Head-major items (W_UK / W_UV of absorbed MLA): each item's codes and scales at their strides.
TEST_F(QuantGemvTest, Fp8Batched) {
  const int64_t items = 3, n = 130, k = 200, ld = Ld16(k);
  std::vector<Fp8Matrix> w;
  for (int64_t i = 0; i < items; ++i) w.push_back(RandomFp8(n, k, 100 + static_cast<uint32_t>(i)));
  const int64_t scale_items = w[0].scales.size();
  std::vector<uint8_t> codes(items * n * ld, 0x7e);
  std::vector<float> scales;
  for (int64_t i = 0; i < items; ++i) {
    for (int64_t r = 0; r < n; ++r) std::memcpy(codes.data() + (i * n + r) * ld, w[i].codes.data() + r * k, k);
    scales.insert(scales.end(), w[i].scales.begin(), w[i].scales.end());
  }
  DeviceBuffer codes_dev(codes.size()), scales_dev(scales.size() * sizeof(float));
  Upload(codes_dev, codes);
  Upload(scales_dev, scales);
  Fp8BlockWeights b;
  b.codes = codes_dev.as<uint8_t>();
  b.ld = ld;
  b.batch_stride = n * ld;
  b.scale_inv = scales_dev.as<float>();
  b.scale_ld = w[0].scale_cols();
  b.scale_batch_stride = scale_items;
  // The planner's plan, and explicit ones (quant_gemv_plan.h): K (2 units) split over a cluster of
  // 2, and 16-row blocks whose warp parts 2..7 are idle.
  const QuantGemvPlan split{2, 2, 1, 1}, narrow{8, 1, 1, 1};
  for (const QuantGemvPlan* plan : {static_cast<const QuantGemvPlan*>(nullptr), &split, &narrow}) {
    for (const int64_t m : {1, 4, 11, 20}) {
      Case cs;
      cs.m = m;
      cs.batch = items;
      cs.bias = true;
      cs.beta = 1.0f;
      RunAndCheck(
          cs, n, k, 110 + static_cast<uint32_t>(m),
          [&](const void* a, int64_t lda, int64_t sa, float* c, int64_t ldc, int64_t sc, const float* bias) {
            if (plan != nullptr) {
              return LaunchFp8BlockGemvPlanned(a, cs.a_type, lda, sa, b, c, ldc, sc, bias, items, m, n, k, cs.alpha,
                                               cs.beta, plan, false, nullptr);
            }
            return LaunchFp8BlockGemv(a, cs.a_type, lda, sa, b, c, ldc, sc, bias, items, m, n, k, cs.alpha, cs.beta,
                                      false, nullptr);
          },
          [&](int64_t item) { return [&, item](int64_t r, int64_t c) { return w[item].Weight(r, c); }; });
    }
  }
}

// The same bits every run, and with the programmatic-launch flag.
TEST_F(QuantGemvTest, Fp8DeterministicAndProgrammatic) {
  const Fp8Matrix w = RandomFp8(1536, 2048, 9);
  Case cs;
  cs.m = 8;
  const std::vector<float> first = CheckFp8(cs, w, 0, 0, 1536, 2048, 120);
  const std::vector<float> again = CheckFp8(cs, w, 0, 0, 1536, 2048, 120);
  cs.programmatic = true;
  const std::vector<float> programmatic = CheckFp8(cs, w, 0, 0, 1536, 2048, 120);
  EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(first.data(), programmatic.data(), first.size() * sizeof(float)), 0);
}

// ---- INT4 ------------------------------------------------------------------------------------------

// A slice [row0, row0 + n) x [col0, col0 + k) (col0 a multiple of 8) of `w`: packed words from word
// col0 / 8 of each row, rows `ld` words apart (padding 0x77777777, value -1 everywhere: a read past
// the slice's words would show), and the slice's rows of the global scales.
struct Int4Slice {
  DeviceBuffer packed, scales;
  Int4GroupWeights weights;
  Int4Slice(const Int4Matrix& w, int64_t row0, int64_t col0, int64_t n, int64_t k, int64_t ld)
      : packed(static_cast<size_t>(n * ld * 4)), scales(static_cast<size_t>(n * w.groups() * 2)) {
    const int64_t words = Int4PackedWords(k);
    std::vector<int32_t> host(static_cast<size_t>(n * ld), 0x77777777);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t j = 0; j < words; ++j) {
        // Word j of the slice is word col0 / 8 + j of the global row: values col0 + 8j .. + 7, which
        // past k are the next global columns (zero nibbles past the global row).
        int8_t values[8] = {};
        for (int e = 0; e < 8; ++e) {
          const int64_t c = col0 + 8 * j + e;
          values[e] = c < w.cols ? w.values[(row0 + r) * w.cols + c] : static_cast<int8_t>(-8);
        }
        PackInt4Row(values, 8, host.data() + r * ld + j);
      }
    }
    Upload(packed, host);
    std::vector<uint16_t> rows_scales(w.scales.begin() + row0 * w.groups(), w.scales.begin() + (row0 + n) * w.groups());
    Upload(scales, rows_scales);
    weights.packed = packed.as<int32_t>();
    weights.ld = ld;
    weights.scale = scales.as<uint16_t>();
    weights.scale_ld = w.groups();
    weights.col0 = col0;
    weights.group_size = w.group;
  }
};

int64_t LdWords(int64_t k) { return (Int4PackedWords(k) + 3) / 4 * 4 + 4; }

std::vector<float> CheckInt4(const Case& cs, const Int4Matrix& w, int64_t row0, int64_t col0, int64_t n, int64_t k,
                             uint32_t seed, const QuantGemvPlan* plan = nullptr, bool tiled = false) {
  const Int4Slice slice(w, row0, col0, n, k, LdWords(k));
  std::unique_ptr<DeviceBuffer> tiles;
  Int4GroupWeights weights = slice.weights;
  if (tiled) {
    tiles = TiledCodes(true, slice.packed, LdWords(k), n, k, col0);
    weights.packed = tiles->as<int32_t>();
    weights.ld = 0;
    weights.tiled = true;
  }
  return RunAndCheck(
      cs, n, k, seed,
      [&](const void* a, int64_t lda, int64_t sa, float* c, int64_t ldc, int64_t sc, const float* bias) {
        if (plan != nullptr) {
          return LaunchInt4GroupGemvPlanned(a, cs.a_type, lda, sa, weights, c, ldc, sc, bias, cs.batch, cs.m, n, k,
                                            cs.alpha, cs.beta, plan, cs.programmatic, nullptr);
        }
        return LaunchInt4GroupGemv(a, cs.a_type, lda, sa, weights, c, ldc, sc, bias, cs.batch, cs.m, n, k, cs.alpha,
                                   cs.beta, cs.programmatic, nullptr);
      },
      [&](int64_t) { return [&](int64_t r, int64_t c) { return w.Weight(row0 + r, col0 + c); }; });
}

// The packing the kernel reads is int4_packing.h's: a hand-packed row (value j in nibble j % 8 of
// word j / 8, stored as q + 8) against one weight row of ones.
TEST_F(QuantGemvTest, Int4HandPackedRow) {
  // Values 1, -2, 3, -4, 5, -6, 7, -8 then 0 .. 7 -> words 0x0f2b4d69 ... (nibble = value + 8).
  const int8_t values[16] = {1, -2, 3, -4, 5, -6, 7, -8, 0, 1, 2, 3, 4, 5, 6, 7};
  uint32_t words[2] = {0u, 0u};
  for (int j = 0; j < 16; ++j) words[j / 8] |= static_cast<uint32_t>(values[j] + 8) << (4 * (j % 8));
  int32_t packed[2];
  PackInt4Row(values, 16, packed);
  ASSERT_EQ(static_cast<uint32_t>(packed[0]), words[0]);
  ASSERT_EQ(static_cast<uint32_t>(packed[1]), words[1]);
  // One row of 32 columns (the hand-packed 16, then zeros), group 32, scale 0.5; activations e_j
  // pick each value out: c[j] = 0.5 * value j.
  const int64_t k = 32, m = 16;
  std::vector<int32_t> row(8, static_cast<int32_t>(0x88888888u));
  row[0] = static_cast<int32_t>(words[0]);
  row[1] = static_cast<int32_t>(words[1]);
  std::vector<float> a(m * k, 0.0f);
  for (int64_t j = 0; j < m; ++j) a[j * k + j] = 1.0f;
  const std::vector<uint16_t> scale = {FloatToBf16(0.5f)};
  DeviceBuffer row_dev(row.size() * 4), a_dev(a.size() * 4), scale_dev(2), c_dev(m * 4);
  Upload(row_dev, row);
  Upload(a_dev, a);
  Upload(scale_dev, scale);
  Int4GroupWeights b;
  b.packed = row_dev.as<int32_t>();
  b.ld = 8;
  b.scale = scale_dev.as<uint16_t>();
  b.scale_ld = 1;
  ASSERT_EQ(LaunchInt4GroupGemv(a_dev.ptr, GemvType::kF32, k, 0, b, c_dev.as<float>(), 1, 0, nullptr, 1, m, 1, k,
                                1.0f, 0.0f, false, nullptr),
            cudaSuccess);
  const std::vector<float> c = Download<float>(c_dev, m);
  for (int64_t j = 0; j < m; ++j) EXPECT_EQ(c[j], 0.5f * values[j]) << "column " << j;
}

TEST_F(QuantGemvTest, Int4EveryRowCount) {
  const Int4Matrix w = RandomInt4(300, 1000, 32, 11);
  for (int64_t m = 1; m <= kQuantGemvMaxRows; ++m) {
    Case cs;
    cs.m = m;
    CheckInt4(cs, w, 0, 0, 300, 1000, 200 + static_cast<uint32_t>(m));
  }
}

TEST_F(QuantGemvTest, Int4Bf16ActivationsStridedWithEpilogue) {
  const Int4Matrix w = RandomInt4(517, 1004, 32, 12);  // k not a multiple of 8: a partial last word
  for (const int64_t m : {1, 6, 8, 10, 16, 23, 32}) {
    Case cs;
    cs.m = m;
    cs.a_type = GemvType::kBF16;
    cs.a_pad = 5;
    cs.c_pad = 3;
    cs.bias = true;
    cs.alpha = 1.25f;
    cs.beta = -0.5f;
    CheckInt4(cs, w, 0, 0, 517, 1004, 220 + static_cast<uint32_t>(m));
    cs.a_type = GemvType::kF32;
    CheckInt4(cs, w, 0, 0, 517, 1004, 240 + static_cast<uint32_t>(m));
  }
}

// Kimi-K2.5 routed expert shapes at a TP8 rank: gate_up [512, 7168] and down [7168, 256] (a slice of
// the global [7168, 2048] at column 256 * rank).
TEST_F(QuantGemvTest, Int4DecodeShapes) {
  const Int4Matrix gate_up = RandomInt4(512, 7168, 32, 13);
  const Int4Matrix down = RandomInt4(7168, 2048, 32, 14);
  for (const int64_t m : {1, 4, 8, 16, 24, 32}) {
    Case cs;
    cs.m = m;
    CheckInt4(cs, gate_up, 0, 0, 512, 7168, 260 + static_cast<uint32_t>(m));
    CheckInt4(cs, down, 0, 768, 7168, 256, 280 + static_cast<uint32_t>(m));
  }
}

// Slices that start inside a group (col0 % 32 = 8, 16, 24; col0 % 64 = 40 with group 64): each
// chunk's words take the scale of their own global group.
TEST_F(QuantGemvTest, Int4SliceInsideGroup) {
  const Int4Matrix w32 = RandomInt4(260, 700, 32, 15);
  const Int4Matrix w64 = RandomInt4(260, 700, 64, 16);
  for (const int64_t m : {1, 9, 26}) {
    Case cs;
    cs.m = m;
    for (const int64_t col0 : {8, 16, 24, 104}) CheckInt4(cs, w32, 3, col0, 250, 700 - col0 - 5, 300 + static_cast<uint32_t>(col0 + m));
    CheckInt4(cs, w64, 0, 40, 260, 600, 320 + static_cast<uint32_t>(m));
  }
}

TEST_F(QuantGemvTest, Int4SlicesMatchWholeMatrix) {
  const int64_t rows = 300, cols = 1024, m = 5;
  const Int4Matrix w = RandomInt4(rows, cols, 32, 17);
  const Activations a = RandomActivations(m * cols, 18);
  DeviceBuffer a_dev(a.f32.size() * sizeof(float));
  Upload(a_dev, a.f32);
  DeviceBuffer whole_c(m * rows * sizeof(float)), part_c(m * rows * sizeof(float));
  const Int4Slice whole(w, 0, 0, rows, cols, LdWords(cols));
  ASSERT_EQ(LaunchInt4GroupGemv(a_dev.ptr, GemvType::kF32, cols, 0, whole.weights, whole_c.as<float>(), rows, 0,
                                nullptr, 1, m, rows, cols, 1.0f, 0.0f, false, nullptr),
            cudaSuccess);
  const std::vector<float> want = Download<float>(whole_c, m * rows);
  const int64_t bounds[] = {0, 8, 336, 600, cols};  // inside groups
  for (int s = 0; s < 4; ++s) {
    const int64_t col0 = bounds[s], k = bounds[s + 1] - bounds[s];
    const Int4Slice slice(w, 0, col0, rows, k, LdWords(k));
    ASSERT_EQ(LaunchInt4GroupGemv(static_cast<const float*>(a_dev.ptr) + col0, GemvType::kF32, cols, 0,
                                  slice.weights, part_c.as<float>(), rows, 0, nullptr, 1, m, rows, k, 1.0f,
                                  s == 0 ? 0.0f : 1.0f, false, nullptr),
              cudaSuccess);
  }
  const std::vector<float> got = Download<float>(part_c, m * rows);
  EXPECT_LE(MaxRelativeError(got, want), kTol);
}

TEST_F(QuantGemvTest, Int4BatchedDeterministicProgrammatic) {
  const int64_t items = 4, n = 96, k = 512, ld = LdWords(k);
  std::vector<Int4Matrix> w;
  std::vector<int32_t> packed(items * n * ld, 0x77777777);
  std::vector<uint16_t> scales;
  for (int64_t i = 0; i < items; ++i) {
    w.push_back(RandomInt4(n, k, 32, 400 + static_cast<uint32_t>(i)));
    for (int64_t r = 0; r < n; ++r) {
      std::copy(w[i].packed.begin() + r * w[i].words(), w[i].packed.begin() + (r + 1) * w[i].words(),
                packed.begin() + (i * n + r) * ld);
    }
    scales.insert(scales.end(), w[i].scales.begin(), w[i].scales.end());
  }
  DeviceBuffer packed_dev(packed.size() * 4), scales_dev(scales.size() * 2);
  Upload(packed_dev, packed);
  Upload(scales_dev, scales);
  Int4GroupWeights b;
  b.packed = packed_dev.as<int32_t>();
  b.ld = ld;
  b.batch_stride = n * ld;
  b.scale = scales_dev.as<uint16_t>();
  b.scale_ld = w[0].groups();
  b.scale_batch_stride = n * w[0].groups();
  std::vector<std::vector<float>> runs;
  for (const bool programmatic : {false, false, true}) {
    Case cs;
    cs.m = 8;
    cs.batch = items;
    cs.programmatic = programmatic;
    runs.push_back(RunAndCheck(
        cs, n, k, 420,
        [&](const void* a, int64_t lda, int64_t sa, float* c, int64_t ldc, int64_t sc, const float* bias) {
          return LaunchInt4GroupGemv(a, cs.a_type, lda, sa, b, c, ldc, sc, bias, items, cs.m, n, k, 1.0f, 0.0f,
                                     programmatic, nullptr);
        },
        [&](int64_t item) { return [&, item](int64_t r, int64_t c) { return w[item].Weight(r, c); }; }));
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
  // Explicit plans (quant_gemv_plan.h): K (4 units) split over a cluster of 4, and 32-row blocks of 4
  // warp parts of one unit; each the same bits twice.
  const QuantGemvPlan split{1, 4, 1, 1}, parts{4, 1, 1, 1};
  for (const QuantGemvPlan* plan : {&split, &parts}) {
    for (const int64_t m : {3, 12, 27}) {
      Case cs;
      cs.m = m;
      cs.batch = items;
      std::vector<std::vector<float>> planned;
      for (int run = 0; run < 2; ++run) {
        planned.push_back(RunAndCheck(
            cs, n, k, 430 + static_cast<uint32_t>(m),
            [&](const void* a, int64_t lda, int64_t sa, float* c, int64_t ldc, int64_t sc, const float* bias) {
              return LaunchInt4GroupGemvPlanned(a, cs.a_type, lda, sa, b, c, ldc, sc, bias, items, cs.m, n, k, 1.0f,
                                                0.0f, plan, false, nullptr);
            },
            [&](int64_t item) { return [&, item](int64_t r, int64_t c) { return w[item].Weight(r, c); }; }));
      }
      EXPECT_EQ(planned[0], planned[1]) << "wk " << plan->wk << " split " << plan->split << " m " << m;
    }
  }
}

// Single rows, single columns and chunks cut short by k.
TEST_F(QuantGemvTest, TinyShapes) {
  const Fp8Matrix f = RandomFp8(9, 40, 22);
  const Int4Matrix q = RandomInt4(9, 40, 32, 23);
  for (const int64_t m : {1, 2, 16, 32}) {
    Case cs;
    cs.m = m;
    for (const int64_t n : {1, 3, 9}) {
      for (const int64_t k : {1, 5, 17, 40}) {
        CheckFp8(cs, f, 0, 0, n, k, 140 + static_cast<uint32_t>(m + n + k));
        CheckInt4(cs, q, 0, 0, n, k, 150 + static_cast<uint32_t>(m + n + k));
      }
    }
  }
}

// ---- Grouped launches (QuantGemvItems) -------------------------------------------------------------

// `items` random [n, k] matrices (int4: group 32, seeds seed, seed + 1, ...; fp8: seed + 10, ...) on
// the host and the device, and their device pointers in item order, or reversed (matrix i at slot
// items - 1 - i).
struct ItemWeights {
  std::vector<Fp8Matrix> f;
  std::vector<Int4Matrix> q;
  std::vector<std::unique_ptr<DeviceBuffer>> codes, scales;
  std::vector<const void*> code_ptrs, scale_ptrs;
};

ItemWeights UploadItemWeights(bool int4, int64_t items, int64_t n, int64_t k, uint32_t seed, bool reversed,
                              bool tiled = false) {
  ItemWeights w;
  w.code_ptrs.resize(items);
  w.scale_ptrs.resize(items);
  for (int64_t i = 0; i < items; ++i) {
    if (int4) {
      w.q.push_back(RandomInt4(n, k, 32, seed + static_cast<uint32_t>(i)));
      w.codes.push_back(std::make_unique<DeviceBuffer>(w.q.back().packed.size() * 4));
      w.scales.push_back(std::make_unique<DeviceBuffer>(w.q.back().scales.size() * 2));
      Upload(*w.codes.back(), w.q.back().packed);
      Upload(*w.scales.back(), w.q.back().scales);
      if (tiled) w.codes.back() = TiledCodes(true, *w.codes.back(), w.q.back().words(), n, k, 0);
    } else {
      w.f.push_back(RandomFp8(n, k, seed + 10 + static_cast<uint32_t>(i)));
      w.codes.push_back(std::make_unique<DeviceBuffer>(w.f.back().codes.size()));
      w.scales.push_back(std::make_unique<DeviceBuffer>(w.f.back().scales.size() * 4));
      Upload(*w.codes.back(), w.f.back().codes);
      Upload(*w.scales.back(), w.f.back().scales);
      if (tiled) w.codes.back() = TiledCodes(false, *w.codes.back(), k, n, k, 0);
    }
    const int64_t slot = reversed ? items - 1 - i : i;
    w.code_ptrs[slot] = w.codes.back()->ptr;
    w.scale_ptrs[slot] = w.scales.back()->ptr;
  }
  return w;
}

// Both kernel choices for tiled codes (QuantGemvTiledKernel): each must give the bits of the
// row-major codes' run.
constexpr QuantGemvTiledKernel kTiledKernels[] = {QuantGemvTiledKernel::kSpecialized, QuantGemvTiledKernel::kGeneric};

const char* TiledKernelName(QuantGemvTiledKernel kernel) {
  switch (kernel) {
    case QuantGemvTiledKernel::kSpecialized: return "specialized";
    case QuantGemvTiledKernel::kGeneric: return "generic";
  }
  return "?";
}

// Sets the process-wide choice for a scope, then restores the previous one.
class TiledKernelScope {
 public:
  explicit TiledKernelScope(QuantGemvTiledKernel kernel) : previous_(GetQuantGemvTiledKernel()) {
    SetQuantGemvTiledKernel(kernel);
  }
  ~TiledKernelScope() { SetQuantGemvTiledKernel(previous_); }
  TiledKernelScope(const TiledKernelScope&) = delete;
  TiledKernelScope& operator=(const TiledKernelScope&) = delete;

 private:
  QuantGemvTiledKernel previous_;
};

// An MoE's product as quant_moe_kernels.cu launches it: items' weights through device pointer arrays
// (listed in reverse, so an item read through the batched stride would show), a device count below
// max_items (the last item's c must keep its bits), per-item row counts below m (item i takes
// (i + 5) % 9 rows: none, some or all 8; the rows past them keep their bits), and a programmatic
// launch, whose blocks must read the count, rows and pointers only after the kernels before them
// (here: the uploads) are done.
void CheckGrouped(bool int4, int64_t items = 3, int64_t count = 2, int64_t n = 96, bool tiled = false) {
  SCOPED_TRACE(tiled ? "tiled codes" : "row-major codes");
  const int64_t m = 8, k = 256;
  const Activations a = RandomActivations(items * m * k, int4 ? 501 : 502);
  // Matrix i's pointers sit at item slot items - 1 - i.
  const ItemWeights w = UploadItemWeights(int4, items, n, k, 510, /*reversed=*/true, tiled);
  const std::vector<Fp8Matrix>& f = w.f;
  const std::vector<Int4Matrix>& q = w.q;
  const std::vector<const void*>& code_ptrs = w.code_ptrs;
  const std::vector<const void*>& scale_ptrs = w.scale_ptrs;
  std::vector<int32_t> rows(items);
  for (int64_t i = 0; i < items; ++i) rows[i] = static_cast<int32_t>((i + 5) % 9);
  DeviceBuffer a_dev(a.bf16.size() * 2), c_dev(static_cast<size_t>(items * m * n) * 4), code_table(items * 8),
      scale_table(items * 8), count_dev(4), rows_dev(items * 4);
  Upload(rows_dev, rows);
  Upload(a_dev, a.bf16);
  Upload(c_dev, std::vector<float>(static_cast<size_t>(items * m * n), -7.0f));
  Upload(code_table, code_ptrs);
  Upload(scale_table, scale_ptrs);
  Upload(count_dev, std::vector<int32_t>{static_cast<int32_t>(count)});
  QuantGemvItems list;
  list.codes = code_table.as<const void* const>();
  list.scales = scale_table.as<const void* const>();
  list.count = count_dev.as<int32_t>();
  list.rows = rows_dev.as<int32_t>();
  if (int4) {
    Int4GroupWeights b;
    b.ld = q[0].words();
    b.tiled = tiled;
    b.scale_ld = q[0].groups();
    b.group_size = 32;
    ASSERT_EQ(LaunchInt4GroupGemvGrouped(a_dev.ptr, GemvType::kBF16, k, m * k, b, c_dev.as<float>(), n, m * n, nullptr,
                                         list, items, m, n, k, 1.0f, 0.0f, true, nullptr),
              cudaSuccess);
  } else {
    Fp8BlockWeights b;
    b.ld = k;
    b.tiled = tiled;
    b.scale_ld = f[0].scale_cols();
    ASSERT_EQ(LaunchFp8BlockGemvGrouped(a_dev.ptr, GemvType::kBF16, k, m * k, b, c_dev.as<float>(), n, m * n, nullptr,
                                        list, items, m, n, k, 1.0f, 0.0f, true, nullptr),
              cudaSuccess);
  }
  const std::vector<float> got = Download<float>(c_dev, static_cast<size_t>(items * m * n));
  for (int64_t item = 0; item < items; ++item) {
    const int64_t w = items - 1 - item;
    double diff = 0, scale = 1e-30;
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t o = 0; o < n; ++o) {
        const float g = got[(item * m + r) * n + o];
        if (item >= count || r >= rows[item]) {
          EXPECT_EQ(g, -7.0f) << "item " << item << " row " << r << " past the count or the item's rows was written";
          continue;
        }
        double want = 0;
        for (int64_t c = 0; c < k; ++c) {
          want += static_cast<double>(int4 ? q[w].Weight(o, c) : f[w].Weight(o, c)) * a.values[(item * m + r) * k + c];
        }
        diff = std::max(diff, std::isnan(g) ? std::numeric_limits<double>::infinity() : std::fabs(g - want));
        scale = std::max(scale, std::fabs(want));
      }
    }
    if (item < count) EXPECT_LE(diff / scale, kTol) << (int4 ? "int4" : "fp8") << " item " << item;
  }
}

TEST_F(QuantGemvTest, Fp8GroupedProgrammatic) {
  CheckGrouped(false);
  for (const QuantGemvTiledKernel kernel : kTiledKernels) {
    SCOPED_TRACE(TiledKernelName(kernel));
    const TiledKernelScope scope(kernel);
    CheckGrouped(false, 3, 2, 96, /*tiled=*/true);
  }
}
TEST_F(QuantGemvTest, Int4GroupedProgrammatic) {
  CheckGrouped(true);
  for (const QuantGemvTiledKernel kernel : kTiledKernels) {
    SCOPED_TRACE(TiledKernelName(kernel));
    const TiledKernelScope scope(kernel);
    CheckGrouped(true, 3, 2, 96, /*tiled=*/true);
  }
}

// The experts' down product of a verify step (short K, more blocks than a wave): the chooser takes
// a row-looped plan (each warp several 16-row groups, 9000 rows a partial last group) on a device of
// up to 200 multiprocessors.
// Indexed items (QuantGemvIndexedItems), as a decode round's routed experts are launched: a device
// table of entries with two roles each (a gate and an up matrix), whose scales pointers sit kSkip
// bytes before the scales (scales_skip adds them back), and ids naming entries out of order, one of
// them past the table. Every item's rows must be the bits of the same product launched through
// pointer arrays and row counts (the same sizes, so the same plan), from one f32 activation row
// shared by all items (stride 0); the bad id's two items keep their rows, and its index is
// recorded in the flag. ids_final: the launch reads its items before its programmatic wait (the ids
// are uploaded before it, so they are final). by_token: the ids are two tokens' (two ids, four items
// each: token_items, a_by_token), each token its own activation row (the reference: pointer arrays
// to the rows), and the bad id, in token 1, records kErrorIndex + 1.
void CheckIndexed(bool int4, bool tiled, bool ids_final, bool by_token = false) {
  SCOPED_TRACE(testing::Message() << (int4 ? "int4" : "fp8") << (tiled ? ", tiled codes" : ", row-major codes")
                                  << (ids_final ? ", ids final" : "") << (by_token ? ", two tokens" : ""));
  const int64_t entries = 3, n = 96, k = 256, m = 1;
  const std::vector<int32_t> ids = {2, 0, static_cast<int32_t>(entries), 1};
  const int64_t items = 2 * static_cast<int64_t>(ids.size());
  constexpr int64_t kSkip = 64;
  constexpr int kErrorCode = 5 << kDeviceErrorIndexBits;
  constexpr int64_t kErrorIndex = 11;
  const ItemWeights w = UploadItemWeights(int4, 2 * entries, n, k, 620, /*reversed=*/false, tiled);
  struct Entry {
    const void* codes[2];
    const void* scales[2];
  };
  std::vector<Entry> table(entries);
  for (int64_t e = 0; e < entries; ++e) {
    for (int r = 0; r < 2; ++r) {
      table[e].codes[r] = w.code_ptrs[2 * e + r];
      table[e].scales[r] = static_cast<const char*>(w.scale_ptrs[2 * e + r]) - kSkip;
    }
  }
  std::vector<const void*> codes(items), scales(items);
  std::vector<int32_t> rows(items);
  for (int64_t i = 0; i < items; ++i) {
    const int32_t e = ids[i / 2];
    const bool good = e >= 0 && e < entries;
    codes[i] = w.code_ptrs[good ? 2 * e + i % 2 : 0];
    scales[i] = w.scale_ptrs[good ? 2 * e + i % 2 : 0];
    rows[i] = good ? 1 : 0;
  }
  const int64_t token_items = by_token ? items / 2 : items;  // items of one activation row
  const Activations a = RandomActivations((by_token ? 2 : 1) * k, int4 ? 621 : 622);
  DeviceBuffer a_dev(a.f32.size() * 4), table_dev(table.size() * sizeof(Entry)), ids_dev(ids.size() * 4),
      code_table(items * 8), scale_table(items * 8), rows_dev(items * 4), flag(4),
      c_ref(static_cast<size_t>(items * n) * 4), c_ix(static_cast<size_t>(items * n) * 4), a_table(items * 8);
  Upload(a_dev, a.f32);
  std::vector<const void*> a_rows(items);
  for (int64_t i = 0; i < items; ++i) a_rows[i] = a_dev.as<float>() + (i / token_items) * k;
  Upload(a_table, a_rows);
  Upload(table_dev, table);
  Upload(ids_dev, ids);
  Upload(code_table, codes);
  Upload(scale_table, scales);
  Upload(rows_dev, rows);
  Upload(flag, std::vector<int>{0});
  for (DeviceBuffer* c : {&c_ref, &c_ix}) Upload(*c, std::vector<float>(static_cast<size_t>(items * n), -7.0f));
  QuantGemvItems by_pointer;
  by_pointer.codes = code_table.as<const void* const>();
  by_pointer.scales = scale_table.as<const void* const>();
  by_pointer.rows = rows_dev.as<int32_t>();
  if (by_token) {
    by_pointer.a = a_table.as<const void* const>();
    by_pointer.a_aligned16 = true;
  }
  QuantGemvItems by_id;
  by_id.indexed.ids = ids_dev.as<int32_t>();
  by_id.indexed.table = table_dev.ptr;
  by_id.indexed.entry_bytes = static_cast<int64_t>(sizeof(Entry));
  by_id.indexed.num_entries = static_cast<int>(entries);
  by_id.indexed.per_id = 2;
  for (int r = 0; r < 2; ++r) {
    by_id.indexed.codes_at[r] = static_cast<int64_t>(offsetof(Entry, codes) + 8 * r);
    by_id.indexed.scales_at[r] = static_cast<int64_t>(offsetof(Entry, scales) + 8 * r);
  }
  by_id.indexed.scales_skip = kSkip;
  by_id.indexed.error_flag = flag.as<int>();
  by_id.indexed.error_code = kErrorCode;
  by_id.indexed.error_index = kErrorIndex;
  by_id.indexed.ids_final = ids_final;
  if (by_token) {
    by_id.indexed.token_items = token_items;
    by_id.indexed.a_by_token = true;
  }
  for (const bool indexed : {false, true}) {
    const QuantGemvItems& list = indexed ? by_id : by_pointer;
    float* c = (indexed ? c_ix : c_ref).as<float>();
    if (int4) {
      Int4GroupWeights b;
      b.ld = w.q[0].words();
      b.tiled = tiled;
      b.scale_ld = w.q[0].groups();
      b.group_size = 32;
      ASSERT_EQ(LaunchInt4GroupGemvGrouped(a_dev.ptr, GemvType::kF32, k, by_token ? k : 0, b, c, n, m * n, nullptr,
                                           list, items, m, n, k, 1.0f, 0.0f, true, nullptr),
                cudaSuccess);
    } else {
      Fp8BlockWeights b;
      b.ld = k;
      b.tiled = tiled;
      b.scale_ld = w.f[0].scale_cols();
      ASSERT_EQ(LaunchFp8BlockGemvGrouped(a_dev.ptr, GemvType::kF32, k, by_token ? k : 0, b, c, n, m * n, nullptr,
                                          list, items, m, n, k, 1.0f, 0.0f, true, nullptr),
                cudaSuccess);
    }
  }
  const std::vector<float> ref = Download<float>(c_ref, static_cast<size_t>(items * n));
  const std::vector<float> got = Download<float>(c_ix, static_cast<size_t>(items * n));
  for (int64_t i = 0; i < items; ++i) {
    const int32_t e = ids[i / 2];
    double diff = 0, scale = 1e-30;
    for (int64_t o = 0; o < n; ++o) {
      const float g = got[i * n + o];
      ASSERT_EQ(std::memcmp(&g, &ref[i * n + o], 4), 0) << "item " << i << " row " << o << ": " << g << " vs "
                                                         << ref[i * n + o];
      if (rows[i] == 0) {
        EXPECT_EQ(g, -7.0f) << "item " << i << " of a bad id was written";
        continue;
      }
      const int64_t mat = 2 * e + i % 2, row = i / token_items;
      double want = 0;
      for (int64_t col = 0; col < k; ++col) {
        want += static_cast<double>(int4 ? w.q[mat].Weight(o, col) : w.f[mat].Weight(o, col)) *
                a.values[row * k + col];
      }
      diff = std::max(diff, std::fabs(g - want));
      scale = std::max(scale, std::fabs(want));
    }
    if (rows[i] > 0) {
      EXPECT_LE(diff / scale, kTol) << "item " << i;
    }
  }
  EXPECT_EQ(Download<int>(flag, 1)[0], kErrorCode | static_cast<int>(kErrorIndex + (by_token ? 1 : 0)));
}

TEST_F(QuantGemvTest, GroupedIndexedItems) {
  for (const bool int4 : {false, true}) {
    CheckIndexed(int4, /*tiled=*/false, /*ids_final=*/false);
    CheckIndexed(int4, /*tiled=*/true, /*ids_final=*/false);
    CheckIndexed(int4, /*tiled=*/true, /*ids_final=*/true);
    CheckIndexed(int4, /*tiled=*/true, /*ids_final=*/true, /*by_token=*/true);
    CheckIndexed(int4, /*tiled=*/false, /*ids_final=*/false, /*by_token=*/true);
  }
}

// The relative error of a combined row `out` (every 97th of its n columns) against the double sum
// (accumulate ? out0 : 0) + sum_j weights[j] * rows[j * n + o] of the pairs' rows.
double CombineError(const std::vector<float>& out, const std::vector<float>& rows, const std::vector<float>& weights,
                    const std::vector<float>& out0, int64_t n, bool accumulate) {
  double diff = 0, scale = 1e-30;
  for (int64_t o = 0; o < n; o += 97) {
    double want = accumulate ? out0[o] : 0.0;
    for (size_t j = 0; j < weights.size(); ++j) want += static_cast<double>(weights[j]) * rows[j * n + o];
    diff = std::max(diff, std::fabs(out[o] - want));
    scale = std::max(scale, std::fabs(want));
  }
  return diff / scale;
}

// QuantGemvCombine::in_block: the gated down product (INT4 or FP8) of `tokens` tokens over indexed
// items (a decode or small verify round's, as DirectRound launches it: ids final, one id an item,
// token-major, tiled codes, a row-looped plan), combined in each block against the same launch
// combined through the counters: out and every item's rows the same bits, for top_k = 8 items a
// token (all of a block's warps), 6 (two idle) and 9 (kQuantGemvMaxTileItems: the block of 9 warps),
// with and without accumulate, and with one id past the table in the last token (that token keeps
// its row, the item's rows are not written, its token's index is recorded; the other tokens are
// combined). The in-block launch is given counters poisoned far past any tile's count, which it must
// leave as they are: a launch that fell back to the counters would never complete a tile, and so
// fail both checks.
void CheckCombineInBlock(bool int4, int64_t tokens, int64_t top_k, bool accumulate, bool bad_id) {
  SCOPED_TRACE(testing::Message() << (int4 ? "int4" : "fp8") << ", " << tokens << " tokens, top_k " << top_k
                                  << (accumulate ? ", accumulate" : "") << (bad_id ? ", a bad id" : ""));
  const int64_t entries = 10, n = 9000, k = 256, pairs = tokens * top_k;
  constexpr int kErrorCode = 6 << kDeviceErrorIndexBits;
  constexpr int64_t kErrorIndex = 3;
  const ItemWeights w = UploadItemWeights(int4, entries, n, k, 630, /*reversed=*/false, /*tiled=*/true);
  struct Entry {
    const void* codes;
    const void* scales;
  };
  std::vector<Entry> table(entries);
  for (int64_t e = 0; e < entries; ++e) table[e] = {w.code_ptrs[e], w.scale_ptrs[e]};
  std::vector<int32_t> ids(pairs);
  for (int64_t q = 0; q < pairs; ++q) ids[q] = static_cast<int32_t>((3 * q + 1 + q / top_k) % entries);
  const int64_t bad_pair = (tokens - 1) * top_k + top_k / 2;  // in the last token
  if (bad_id) ids[bad_pair] = static_cast<int32_t>(entries);
  std::mt19937 rng(static_cast<uint32_t>(tokens * 64 + top_k * 4 + (accumulate ? 2 : 0) + (bad_id ? 1 : 0)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> gate_up(static_cast<size_t>(pairs * 2 * k)), weights(pairs), out0(tokens * n);
  for (float& v : gate_up) v = normal(rng);
  for (float& v : weights) v = normal(rng);
  for (float& v : out0) v = normal(rng);
  const int64_t tiles = (n + 15) / 16;
  DeviceBuffer a_dev(gate_up.size() * 4), table_dev(table.size() * sizeof(Entry)), ids_dev(ids.size() * 4),
      weights_dev(weights.size() * 4), counters(tiles * 4), poisoned(tiles * 4), flag(4), c0(pairs * n * 4),
      c1(pairs * n * 4), out0_dev(tokens * n * 4), out1_dev(tokens * n * 4);
  constexpr int32_t kPoison = 1 << 24;
  DeviceBuffer* const c_dev[2] = {&c0, &c1};
  DeviceBuffer* const out_dev[2] = {&out0_dev, &out1_dev};
  Upload(a_dev, gate_up);
  Upload(table_dev, table);
  Upload(ids_dev, ids);
  Upload(weights_dev, weights);
  Upload(counters, std::vector<int32_t>(tiles, 0));
  Upload(poisoned, std::vector<int32_t>(tiles, kPoison));
  for (int v = 0; v < 2; ++v) {
    Upload(*c_dev[v], std::vector<float>(static_cast<size_t>(pairs * n), -7.0f));
    Upload(*out_dev[v], out0);
  }
  for (int v = 0; v < 2; ++v) {  // 0: the counters' combine, 1: in the block
    Upload(flag, std::vector<int>{0});
    QuantGemvItems list;
    list.indexed.ids = ids_dev.as<int32_t>();
    list.indexed.table = table_dev.ptr;
    list.indexed.entry_bytes = static_cast<int64_t>(sizeof(Entry));
    list.indexed.num_entries = static_cast<int>(entries);
    list.indexed.codes_at[0] = static_cast<int64_t>(offsetof(Entry, codes));
    list.indexed.scales_at[0] = static_cast<int64_t>(offsetof(Entry, scales));
    list.indexed.error_flag = flag.as<int>();
    list.indexed.error_code = kErrorCode;
    list.indexed.error_index = kErrorIndex;
    list.indexed.ids_final = true;
    if (tokens > 1) list.indexed.token_items = top_k;
    list.silu_up_offset = k;
    list.combine.counters = (v == 1 ? poisoned : counters).as<int32_t>();
    list.combine.row_ld = n;
    list.combine.ids = ids_dev.as<int32_t>();
    list.combine.ids_stride = top_k;
    list.combine.weights = weights_dev.as<float>();
    list.combine.weights_stride = top_k;
    list.combine.pair_rows = 1;
    list.combine.out = out_dev[v]->as<float>();
    list.combine.out_stride = n;
    list.combine.tokens = static_cast<int>(tokens);
    list.combine.top_k = static_cast<int>(top_k);
    list.combine.num_experts = static_cast<int>(entries);
    list.combine.accumulate = accumulate;
    list.combine.in_block = v == 1;
    if (int4) {
      Int4GroupWeights b;
      b.tiled = true;
      b.ld = w.q[0].words();
      b.scale_ld = w.q[0].groups();
      b.group_size = 32;
      ASSERT_EQ(LaunchInt4GroupGemvGrouped(a_dev.ptr, GemvType::kF32, k, 2 * k, b, c_dev[v]->as<float>(), n, n,
                                           nullptr, list, pairs, 1, n, k, 1.0f, 0.0f, true, nullptr),
                cudaSuccess);
    } else {
      Fp8BlockWeights b;
      b.tiled = true;
      b.ld = k;
      b.scale_ld = w.f[0].scale_cols();
      ASSERT_EQ(LaunchFp8BlockGemvGrouped(a_dev.ptr, GemvType::kF32, k, 2 * k, b, c_dev[v]->as<float>(), n, n, nullptr,
                                          list, pairs, 1, n, k, 1.0f, 0.0f, true, nullptr),
                cudaSuccess);
    }
    EXPECT_EQ(Download<int>(flag, 1)[0], bad_id ? kErrorCode | static_cast<int>(kErrorIndex + tokens - 1) : 0);
  }
  EXPECT_EQ(Download<int32_t>(counters, tiles), std::vector<int32_t>(tiles, 0)) << "counters left non-zero";
  EXPECT_EQ(Download<int32_t>(poisoned, tiles), std::vector<int32_t>(tiles, kPoison))
      << "the in-block launch used the counters";
  const std::vector<float> c_ref = Download<float>(c0, static_cast<size_t>(pairs * n));
  const std::vector<float> c_got = Download<float>(c1, static_cast<size_t>(pairs * n));
  const std::vector<float> out_ref = Download<float>(out0_dev, static_cast<size_t>(tokens * n));
  const std::vector<float> out_got = Download<float>(out1_dev, static_cast<size_t>(tokens * n));
  for (int64_t i = 0; i < pairs * n; ++i) {
    ASSERT_EQ(std::memcmp(&c_got[i], &c_ref[i], 4), 0) << "item " << i / n << " row " << i % n << ": " << c_got[i]
                                                       << " vs " << c_ref[i];
  }
  for (int64_t o = 0; o < tokens * n; ++o) {
    ASSERT_EQ(std::memcmp(&out_got[o], &out_ref[o], 4), 0) << "token " << o / n << " row " << o % n << ": "
                                                           << out_got[o] << " vs " << out_ref[o];
    if (bad_id && o >= (tokens - 1) * n) ASSERT_EQ(out_got[o], out0[o]) << "the token's row written, row " << o % n;
  }
  // The reference is a combine the other tests check against the products; here, that each good
  // token's row combined its own items.
  for (int64_t t = 0; t < tokens - (bad_id ? 1 : 0); ++t) {
    SCOPED_TRACE(testing::Message() << "token " << t);
    const auto span = [&](const std::vector<float>& v, int64_t at, int64_t count) {
      return std::vector<float>(v.begin() + at, v.begin() + at + count);
    };
    EXPECT_LE(CombineError(span(out_got, t * n, n), span(c_ref, t * top_k * n, top_k * n),
                           span(weights, t * top_k, top_k), span(out0, t * n, n), n, accumulate),
              1e-5);
  }
  if (bad_id) {
    for (int64_t o = 0; o < n; ++o) ASSERT_EQ(c_got[bad_pair * n + o], -7.0f) << "the bad id's rows written";
  }
}

TEST_F(QuantGemvTest, CombineInBlock) {
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  for (const bool int4 : {true, false}) {
    // The shapes take row-looped plans (the in-block combine's) on devices of up to 132
    // multiprocessors.
    QuantGemvProblem problem = ProblemOf(int4, 6, 1, 9000, 256, 0);
    problem.a_bytes = 2;  // gated rows are planned as their bf16 activations
    if (sms <= 132) EXPECT_GT(ChooseQuantGemvPlan(problem, sms).row_loops, 0);
    for (const int64_t top_k : {int64_t{8}, int64_t{6}, int64_t{kQuantGemvMaxTileItems}}) {
      for (const bool accumulate : {false, true}) CheckCombineInBlock(int4, 1, top_k, accumulate, /*bad_id=*/false);
      CheckCombineInBlock(int4, 1, top_k, /*accumulate=*/true, /*bad_id=*/true);
    }
    // Rounds of several tokens (a block row of the grid a token).
    for (const int64_t tokens : {int64_t{2}, int64_t{5}}) {
      const int64_t top_k = tokens == 2 ? kQuantGemvMaxTileItems : 8;
      problem.batch = tokens * top_k;
      if (sms <= 132) EXPECT_GT(ChooseQuantGemvPlan(problem, sms).row_loops, 0) << tokens << " tokens";
      CheckCombineInBlock(int4, tokens, top_k, /*accumulate=*/tokens == 2, /*bad_id=*/false);
      CheckCombineInBlock(int4, tokens, top_k, /*accumulate=*/true, /*bad_id=*/true);
    }
  }
}

// A decode round's gate-up and down products as one kernel (LaunchInt4GroupGemvChain) against the
// two grouped launches it stands for: the gate-up rows of every good pair, the down rows and the
// combined row bitwise equal, the same error recorded, the chain's counters back at zero; launched
// `launches` times in a row (programmatic), each launch the same bits (a counter left non-zero
// would make the next launch skip or repeat work, or hang). Tiled int4 experts of the Kimi-K2
// rank shape (hidden 7168, expert slice 256), whose gate-up plan is split over a cluster that the
// chain folds into one block's warps on devices of up to 132 multiprocessors.
void CheckChain(int64_t top_k, bool accumulate, bool bad_id, int launches) {
  SCOPED_TRACE(testing::Message() << "top_k " << top_k << (accumulate ? ", accumulate" : "")
                                  << (bad_id ? ", a bad id" : ""));
  const int64_t entries = 10, hidden = 7168, inter = 256;
  constexpr int kErrorCode = 6 << kDeviceErrorIndexBits;
  constexpr int64_t kErrorIndex = 2;
  const ItemWeights gate = UploadItemWeights(true, entries, inter, hidden, 700, false, /*tiled=*/true);
  const ItemWeights up = UploadItemWeights(true, entries, inter, hidden, 720, false, /*tiled=*/true);
  const ItemWeights down = UploadItemWeights(true, entries, hidden, inter, 740, false, /*tiled=*/true);
  struct Entry {
    const void* codes[3];
    const void* scales[3];
  };
  std::vector<Entry> table(entries);
  for (int64_t e = 0; e < entries; ++e) {
    table[e] = {{gate.code_ptrs[e], up.code_ptrs[e], down.code_ptrs[e]},
                {gate.scale_ptrs[e], up.scale_ptrs[e], down.scale_ptrs[e]}};
  }
  std::vector<int32_t> ids(top_k);
  for (int64_t j = 0; j < top_k; ++j) ids[j] = static_cast<int32_t>((7 * j + 2) % entries);
  if (bad_id) ids[top_k - 2] = -1;
  std::mt19937 rng(static_cast<uint32_t>(top_k * 4 + (accumulate ? 2 : 0) + (bad_id ? 1 : 0)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(hidden), weights(top_k), out0(hidden);
  for (float& v : x) v = normal(rng);
  for (float& v : weights) v = normal(rng);
  for (float& v : out0) v = normal(rng);
  const int64_t tiles = (hidden + 15) / 16;
  DeviceBuffer x_dev(hidden * 4), table_dev(table.size() * sizeof(Entry)), ids_dev(top_k * 4),
      weights_dev(top_k * 4), counters(tiles * 4), sync(kQuantGemvChainSyncInts * 4), flag(4);
  Upload(x_dev, x);
  Upload(table_dev, table);
  Upload(ids_dev, ids);
  Upload(weights_dev, weights);
  Upload(counters, std::vector<int32_t>(tiles, 0));
  Upload(sync, std::vector<int32_t>(kQuantGemvChainSyncInts, 0));
  const auto products = [&](DeviceBuffer& gate_up_c, DeviceBuffer& down_c, DeviceBuffer& out,
                            Int4GroupedProduct& first, Int4GroupedProduct& second) {
    QuantGemvIndexedItems ix;
    ix.ids = ids_dev.as<int32_t>();
    ix.table = table_dev.ptr;
    ix.entry_bytes = static_cast<int64_t>(sizeof(Entry));
    ix.num_entries = static_cast<int>(entries);
    ix.error_flag = flag.as<int>();
    ix.error_code = kErrorCode;
    ix.error_index = kErrorIndex;
    Int4GroupWeights b;
    b.tiled = true;
    b.group_size = 32;
    first.a = x_dev.ptr;
    first.lda = hidden;
    first.b = b;
    first.b.scale_ld = gate.q[0].groups();
    first.c = gate_up_c.as<float>();
    first.ldc = inter;
    first.batch_stride_c = 3 * inter;  // a gap between items, as an MoE round's slots leave
    first.items.indexed = ix;
    first.items.indexed.per_id = 2;
    for (int r = 0; r < 2; ++r) {
      first.items.indexed.codes_at[r] = static_cast<int64_t>(offsetof(Entry, codes) + r * sizeof(void*));
      first.items.indexed.scales_at[r] = static_cast<int64_t>(offsetof(Entry, scales) + r * sizeof(void*));
    }
    first.max_items = 2 * top_k;
    first.m = 1;
    first.n = inter;
    first.k = hidden;
    second.a = gate_up_c.ptr;
    second.lda = inter;
    second.batch_stride_a = 2 * first.batch_stride_c;
    second.b = b;
    second.b.scale_ld = down.q[0].groups();
    second.c = down_c.as<float>();
    second.ldc = hidden;
    second.batch_stride_c = hidden;
    second.items.indexed = ix;
    second.items.indexed.codes_at[0] = static_cast<int64_t>(offsetof(Entry, codes) + 2 * sizeof(void*));
    second.items.indexed.scales_at[0] = static_cast<int64_t>(offsetof(Entry, scales) + 2 * sizeof(void*));
    second.items.indexed.ids_final = true;
    second.items.silu_up_offset = first.batch_stride_c;
    QuantGemvCombine& cb = second.items.combine;
    cb.counters = counters.as<int32_t>();
    cb.row_ld = hidden;
    cb.ids = ids_dev.as<int32_t>();
    cb.ids_stride = top_k;
    cb.weights = weights_dev.as<float>();
    cb.weights_stride = top_k;
    cb.pair_rows = 1;
    cb.out = out.as<float>();
    cb.out_stride = hidden;
    cb.tokens = 1;
    cb.top_k = static_cast<int>(top_k);
    cb.num_experts = static_cast<int>(entries);
    cb.accumulate = accumulate;
    cb.in_block = true;
    second.max_items = top_k;
    second.m = 1;
    second.n = hidden;
    second.k = inter;
  };
  const size_t gate_up_floats = static_cast<size_t>(2 * top_k * 3 * inter);
  const auto fresh = [&](DeviceBuffer& gate_up_c, DeviceBuffer& down_c, DeviceBuffer& out) {
    Upload(gate_up_c, std::vector<float>(gate_up_floats, -7.0f));
    Upload(down_c, std::vector<float>(static_cast<size_t>(top_k * hidden), -7.0f));
    Upload(out, out0);
    Upload(flag, std::vector<int>{0});
  };
  // The reference: the two launches.
  DeviceBuffer ref_gate_up(gate_up_floats * 4), ref_down(top_k * hidden * 4), ref_out(hidden * 4);
  Int4GroupedProduct first, second;
  products(ref_gate_up, ref_down, ref_out, first, second);
  fresh(ref_gate_up, ref_down, ref_out);
  for (const Int4GroupedProduct* d : {&first, &second}) {
    ASSERT_EQ(LaunchInt4GroupGemvGrouped(d->a, d->a_type, d->lda, d->batch_stride_a, d->b, d->c, d->ldc,
                                         d->batch_stride_c, nullptr, d->items, d->max_items, d->m, d->n, d->k, 1.0f,
                                         0.0f, true, nullptr),
              cudaSuccess);
  }
  const int want_flag = bad_id ? kErrorCode | static_cast<int>(kErrorIndex) : 0;
  EXPECT_EQ(Download<int>(flag, 1)[0], want_flag);
  const std::vector<float> gate_up_ref = Download<float>(ref_gate_up, gate_up_floats);
  const std::vector<float> down_ref = Download<float>(ref_down, static_cast<size_t>(top_k * hidden));
  const std::vector<float> out_ref = Download<float>(ref_out, static_cast<size_t>(hidden));

  DeviceBuffer gate_up_c(gate_up_floats * 4), down_c(top_k * hidden * 4), out(hidden * 4);
  products(gate_up_c, down_c, out, first, second);
  for (int l = 0; l < launches; ++l) {
    SCOPED_TRACE(testing::Message() << "launch " << l);
    fresh(gate_up_c, down_c, out);
    ASSERT_EQ(LaunchInt4GroupGemvChain(first, second, sync.as<int32_t>(), true, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(Download<int>(flag, 1)[0], want_flag);
    EXPECT_EQ(Download<int32_t>(sync, kQuantGemvChainSyncInts), std::vector<int32_t>(kQuantGemvChainSyncInts, 0))
        << "the chain's counters left non-zero";
    EXPECT_EQ(Download<int32_t>(counters, tiles), std::vector<int32_t>(tiles, 0)) << "tile counters left non-zero";
    const std::vector<float> gate_up_got = Download<float>(gate_up_c, gate_up_floats);
    const std::vector<float> down_got = Download<float>(down_c, static_cast<size_t>(top_k * hidden));
    const std::vector<float> out_got = Download<float>(out, static_cast<size_t>(hidden));
    ASSERT_EQ(std::memcmp(gate_up_got.data(), gate_up_ref.data(), gate_up_floats * 4), 0) << "gate-up rows";
    ASSERT_EQ(std::memcmp(down_got.data(), down_ref.data(), down_got.size() * 4), 0) << "down rows";
    ASSERT_EQ(std::memcmp(out_got.data(), out_ref.data(), out_got.size() * 4), 0) << "combined row";
  }
  // The reference products themselves (the gate-up and down launches are checked elsewhere): a bad
  // id's rows untouched and the token's row kept, else the row combined from the down rows.
  if (bad_id) {
    for (int64_t o = 0; o < hidden; ++o) ASSERT_EQ(out_ref[o], out0[o]) << "the token's row written, row " << o;
    for (int64_t o = 0; o < hidden; ++o) ASSERT_EQ(down_ref[(top_k - 2) * hidden + o], -7.0f) << "the bad id's rows";
  } else {
    EXPECT_LE(CombineError(out_ref, down_ref, weights, out0, hidden, accumulate), 1e-5);
  }
}

TEST_F(QuantGemvTest, ChainedRound) {
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  // The chain takes these plans where the gate-up's cluster ranks fold into one block's 8 warps and
  // the down product is row-looped: the H100's and H200's 132 multiprocessors.
  if (sms != 132) GTEST_SKIP() << sms << " multiprocessors: the chain's plans are checked on 132";
  QuantGemvProblem gate_up = ProblemOf(/*int4=*/true, 16, 1, 256, 7168, 0);
  gate_up.a_bytes = 2;
  const QuantGemvPlan plan = ChooseQuantGemvPlan(gate_up, sms);
  EXPECT_GT(plan.split, 1) << "no cluster ranks to fold";
  for (const int64_t top_k : {8, 6}) {
    CheckChain(top_k, /*accumulate=*/false, /*bad_id=*/false, 3);
    CheckChain(top_k, /*accumulate=*/true, /*bad_id=*/false, 1);
    CheckChain(top_k, /*accumulate=*/true, /*bad_id=*/true, 2);
  }
}

// Pairs that are not such a round are left to the two launches (cudaErrorNotSupported), before
// anything runs.
TEST_F(QuantGemvTest, ChainRefusesOtherProducts) {
  Int4GroupedProduct first, second;
  first.a = reinterpret_cast<const void*>(0x1000);
  first.b.packed = reinterpret_cast<const int32_t*>(0x1000);
  first.b.scale = reinterpret_cast<const uint16_t*>(0x1000);
  first.b.ld = 256;
  first.b.scale_ld = 64;
  first.c = reinterpret_cast<float*>(0x2000);
  first.ldc = 256;
  first.batch_stride_c = 256;
  first.max_items = 2;
  first.m = 1;
  first.n = 256;
  first.k = 2048;
  second = first;
  second.a = first.c;
  second.batch_stride_a = 512;
  second.max_items = 1;
  second.n = 2048;
  second.k = 256;
  second.b.ld = 32;
  second.b.scale_ld = 8;
  int32_t* const sync = reinterpret_cast<int32_t*>(0x3000);
  // Not indexed: not a round.
  EXPECT_EQ(LaunchInt4GroupGemvChain(first, second, sync, false, nullptr), cudaErrorNotSupported);
  // A bad product is refused as the grouped launchers refuse it.
  Int4GroupedProduct bad = first;
  bad.m = 0;
  EXPECT_EQ(LaunchInt4GroupGemvChain(bad, second, sync, false, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchInt4GroupGemvChain(first, second, nullptr, false, nullptr), cudaErrorInvalidValue);
}

TEST_F(QuantGemvTest, GroupedRowLooped) {
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  const int64_t items = 16, count = 12, n = 9000;
  for (const bool int4 : {false, true}) {
    QuantGemvProblem problem;
    problem.int4 = int4;
    problem.batch = items;
    problem.m = 8;
    problem.n = n;
    problem.k = 256;
    problem.a_bytes = 2;
    problem.weight_bytes = static_cast<double>(items) * n * (int4 ? 128 + 16 : 256);
    if (sms <= 200) EXPECT_GT(ChooseQuantGemvPlan(problem, sms).row_loops, 1) << (int4 ? "int4" : "fp8");
    CheckGrouped(int4, items, count, n);
    CheckGrouped(int4, items, count, n, /*tiled=*/true);
  }
}

// The routed experts' down product with both MoE folds (QuantGemvItems::silu_up_offset and
// QuantGemvCombine), as quant_moe_kernels.cu launches it: item i's activations are silu(gate) * up
// of f32 gate rows at i * 2 m rows and up rows m rows after them; then the tokens' rows of out
// gathered from the items' output rows by the last block of each tile. Checked: c against the
// double reference of bf16(silu(g) * u) (1e-3: the host's expf may put an activation on the other
// side of a bf16 rounding boundary), out against the same gather of the downloaded c in the same
// order (a bad token keeps its row), and the counters back at zero. Shapes: a short K over many
// rows (the row-looped kernel) and a long K over few rows (the K-split kernel, clusters where the
// chooser takes them), each with accumulate on and off.
void CheckGatedCombined(bool int4, int64_t items, int64_t count, int64_t n, int64_t k, bool accumulate) {
  SCOPED_TRACE(testing::Message() << (int4 ? "int4" : "fp8") << " items " << items << " n " << n << " k " << k
                                  << (accumulate ? " accumulate" : ""));
  const int64_t m = 8, tokens = 3, top_k = 3, num_experts = 5;
  std::mt19937 rng(static_cast<uint32_t>(n + k + (int4 ? 1 : 0)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> gate_up(static_cast<size_t>(items * 2 * m * k));
  for (float& v : gate_up) v = normal(rng);
  const ItemWeights w = UploadItemWeights(int4, items, n, k, 610, /*reversed=*/false);
  const std::vector<Fp8Matrix>& f = w.f;
  const std::vector<Int4Matrix>& q = w.q;
  const std::vector<const void*>& code_ptrs = w.code_ptrs;
  const std::vector<const void*>& scale_ptrs = w.scale_ptrs;
  std::vector<int32_t> rows(items);
  for (int64_t i = 0; i < items; ++i) rows[i] = static_cast<int32_t>(1 + i % m);
  // Pair (t, j) reads output row slot_of[t * top_k + j]: row j % rows of item (t + 2 j) % count.
  std::vector<int32_t> slot_of(tokens * top_k), ids(tokens * top_k);
  std::vector<float> weights(tokens * top_k);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t item = (t + 2 * j) % count;
      slot_of[t * top_k + j] = static_cast<int32_t>(item * m + j % rows[item]);
      ids[t * top_k + j] = static_cast<int32_t>((t + j) % num_experts);
      weights[t * top_k + j] = normal(rng);
    }
  }
  ids[1 * top_k + 1] = static_cast<int32_t>(num_experts);  // token 1: a bad id, its row kept
  std::vector<float> out0(static_cast<size_t>(tokens * n));
  for (float& v : out0) v = normal(rng);
  const int64_t tiles = (n + 15) / 16;
  DeviceBuffer a_dev(gate_up.size() * 4), c_dev(static_cast<size_t>(items * m * n) * 4), code_table(items * 8),
      scale_table(items * 8), count_dev(4), rows_dev(items * 4), counters(tiles * 4), slot_dev(slot_of.size() * 4),
      ids_dev(ids.size() * 4), weights_dev(weights.size() * 4), out_dev(out0.size() * 4);
  Upload(a_dev, gate_up);
  Upload(c_dev, std::vector<float>(static_cast<size_t>(items * m * n), -7.0f));
  Upload(code_table, code_ptrs);
  Upload(scale_table, scale_ptrs);
  Upload(count_dev, std::vector<int32_t>{static_cast<int32_t>(count)});
  Upload(rows_dev, rows);
  Upload(counters, std::vector<int32_t>(tiles, 0));
  Upload(slot_dev, slot_of);
  Upload(ids_dev, ids);
  Upload(weights_dev, weights);
  Upload(out_dev, out0);
  QuantGemvItems list;
  list.codes = code_table.as<const void* const>();
  list.scales = scale_table.as<const void* const>();
  list.count = count_dev.as<int32_t>();
  list.rows = rows_dev.as<int32_t>();
  list.silu_up_offset = m * k;
  list.combine.counters = counters.as<int32_t>();
  list.combine.row_ld = n;
  list.combine.ids = ids_dev.as<int32_t>();
  list.combine.ids_stride = top_k;
  list.combine.weights = weights_dev.as<float>();
  list.combine.weights_stride = top_k;
  list.combine.slot_of = slot_dev.as<int32_t>();
  list.combine.out = out_dev.as<float>();
  list.combine.out_stride = n;
  list.combine.tokens = static_cast<int>(tokens);
  list.combine.top_k = static_cast<int>(top_k);
  list.combine.num_experts = static_cast<int>(num_experts);
  list.combine.accumulate = accumulate;
  // Twice: the counters the first launch leaves must serve the second.
  for (int launch = 0; launch < 2; ++launch) {
    if (int4) {
      Int4GroupWeights b;
      b.ld = q[0].words();
      b.scale_ld = q[0].groups();
      b.group_size = 32;
      ASSERT_EQ(LaunchInt4GroupGemvGrouped(a_dev.ptr, GemvType::kF32, k, 2 * m * k, b, c_dev.as<float>(), n, m * n,
                                           nullptr, list, items, m, n, k, 1.0f, 0.0f, true, nullptr),
                cudaSuccess);
    } else {
      Fp8BlockWeights b;
      b.ld = k;
      b.scale_ld = f[0].scale_cols();
      ASSERT_EQ(LaunchFp8BlockGemvGrouped(a_dev.ptr, GemvType::kF32, k, 2 * m * k, b, c_dev.as<float>(), n, m * n,
                                          nullptr, list, items, m, n, k, 1.0f, 0.0f, true, nullptr),
                cudaSuccess);
    }
    if (launch == 0 && accumulate) Upload(out_dev, out0);  // the second launch accumulates into out0 again
  }
  const std::vector<float> c = Download<float>(c_dev, static_cast<size_t>(items * m * n));
  for (int64_t item = 0; item < count; ++item) {
    double diff = 0, scale = 1e-30;
    for (int64_t r = 0; r < rows[item]; ++r) {
      const float* g = gate_up.data() + (item * 2 * m + r) * k;
      std::vector<float> act(k);
      for (int64_t col = 0; col < k; ++col) {
        act[col] = Bf16ToFloat(FloatToBf16(g[col] / (1.0f + std::exp(-g[col])) * g[col + m * k]));
      }
      for (int64_t o = 0; o < n; ++o) {
        double want = 0;
        for (int64_t col = 0; col < k; ++col) {
          want += static_cast<double>(int4 ? q[item].Weight(o, col) : f[item].Weight(o, col)) * act[col];
        }
        const float got = c[(item * m + r) * n + o];
        diff = std::max(diff, std::isnan(got) ? std::numeric_limits<double>::infinity() : std::fabs(got - want));
        scale = std::max(scale, std::fabs(want));
      }
    }
    EXPECT_LE(diff / scale, 1e-3) << "item " << item;
  }
  const std::vector<float> out = Download<float>(out_dev, out0.size());
  double diff = 0, scale = 1e-30;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t o = 0; o < n; ++o) {
      const float got = out[t * n + o];
      if (t == 1) {
        ASSERT_EQ(got, out0[t * n + o]) << "token 1 (a bad id) row written, column " << o;
        continue;
      }
      float want = accumulate ? out0[t * n + o] : 0.0f;
      for (int64_t j = 0; j < top_k; ++j) want += weights[t * top_k + j] * c[slot_of[t * top_k + j] * n + o];
      diff = std::max(diff, std::isnan(got) ? std::numeric_limits<double>::infinity()
                                            : static_cast<double>(std::fabs(got - want)));
      scale = std::max(scale, static_cast<double>(std::fabs(want)));
    }
  }
  EXPECT_LE(diff / scale, 1e-6) << "combined rows";
  EXPECT_EQ(Download<int32_t>(counters, tiles), std::vector<int32_t>(tiles, 0)) << "counters left non-zero";
}

TEST_F(QuantGemvTest, GroupedGatedAndCombined) {
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  for (const bool int4 : {false, true}) {
    for (const bool accumulate : {false, true}) {
      CheckGatedCombined(int4, 16, 12, 9000, 256, accumulate);  // row-looped (GroupedRowLooped's shape)
      CheckGatedCombined(int4, 3, 2, 200, 4096, accumulate);    // the K-split kernel
    }
    QuantGemvProblem problem;
    problem.int4 = int4;
    problem.batch = 3;
    problem.m = 8;
    problem.n = 200;
    problem.k = 4096;
    problem.a_bytes = 2;
    problem.weight_bytes = 3.0 * 200 * (int4 ? 4096 / 2 + 4096 / 16 : 4096);
    const QuantGemvPlan plan = ChooseQuantGemvPlan(problem, sms);
    EXPECT_EQ(plan.row_loops, 0) << (int4 ? "int4" : "fp8");
    if (sms <= 200) EXPECT_GT(plan.split, 1) << (int4 ? "int4: no cluster" : "fp8: no cluster");
  }
}

// ---- Every path of the kernel (explicit plans, quant_gemv_plan.h) ----------------------------------
//
// The planner picks one plan per shape and device; these run each path of the kernel whatever it
// picks: 16 to 128 rows per block, K split over a cluster (its last rank empty or not), several
// activation tiles (the last one partial), warp parts short or idle, warps wholly past n, one B
// operand (up to 8 activation rows), two (9 to 16) or four (17 to 32, whose staged rows take twice
// the shared memory per unit and whose shallower ring allows tiles of shorter parts).


// The problem an explicit plan is checked against by the launchers: any shared memory the kernel can
// take.
QuantGemvProblem ExplicitProblemOf(bool int4, int64_t m, int64_t n, int64_t k, int64_t col0) {
  QuantGemvProblem problem = ProblemOf(int4, 1, m, n, k, col0);
  problem.shared_limit = kQuantGemvSharedMax;
  return problem;
}

// Cases of one plan: m = 1, 8 (one B operand), 9, 16 (two), or (four_operands) 17, 24, 31, 32;
// f32 and bf16 activations, 16-byte staging loads (m = 1, or rows padded by `pad` to 16 bytes) and
// element loads, and an epilogue.
std::vector<Case> PlanCases(bool four_operands, int64_t pad) {
  std::vector<Case> cases;
  const std::vector<int64_t> ms = four_operands ? std::vector<int64_t>{17, 24, 31, 32} : std::vector<int64_t>{1, 8, 9, 16};
  for (const int64_t m : ms) {
    Case cs;
    cs.m = m;
    cs.a_type = m % 2 == 0 ? GemvType::kBF16 : GemvType::kF32;
    if (m == 9 || m == 17) {
      cs.bias = true;
      cs.alpha = 1.5f;
      cs.beta = 0.5f;
    }
    if (m == 16 || m == 24 || m == 31) cs.a_pad = pad;
    cases.push_back(cs);
  }
  return cases;
}

struct PlanSet {
  bool four_operands;
  std::vector<QuantGemvPlan> plans;
};

TEST_F(QuantGemvTest, Fp8EveryPath) {
  // Rows [72, 302) of 420 (72 rows into a scale block; a partial last warp; warps wholly past n when
  // a block holds 128 rows), columns [48, 1619) of 1700 (48 columns into a scale block, k % 16 = 3:
  // edge chunks at both ends): 13 units.
  const Fp8Matrix w = RandomFp8(420, 1700, 31);
  const int64_t row0 = 72, col0 = 48, n = 230, k = 1571;
  const PlanSet sets[] = {
      {false,
       {
           {1, 2, 7, 1},  // 128-row blocks, K split in two
           {8, 2, 1, 1},  // 16-row blocks: 8 parts of one unit for 7, the last idle
           {2, 3, 3, 1},  // a cluster of 3; the second part of each rank short
           {4, 1, 2, 2},  // two activation tiles, the second partial
           {2, 2, 2, 2},  // K split and two tiles
           {1, 8, 2, 1},  // 8 ranks of 2 units for 13: the last rank empty
           {1, 1, 4, 4},  // four tiles
       }},
      // 32 staged rows take 8 KB per unit: at most 5 units per tile within the default limit.
      {true,
       {
           {1, 3, 5, 1},  // 128-row blocks, a cluster of 3 (5, 5, 3 units), one tile
           {4, 4, 1, 1},  // 32-row blocks of 4 one-unit parts; the last rank's one unit leaves 3 idle
           {2, 2, 2, 2},  // K split and two tiles, the second partial
           {2, 1, 1, 7},  // tiles of one-unit parts (one 2-step ring cycle each), the last partial
           {1, 8, 2, 1},  // 8 ranks of 2 units for 13: the last rank empty
           {1, 1, 4, 4},  // four tiles
           {1, 1, 13, 1},  // all 13 units staged at once: past the default shared-memory limit
           {1, 2, 7, 1},   // a cluster of 2, one tile each, past the default limit from 26 rows
       }},
  };
  uint32_t seed = 500;
  for (const PlanSet& set : sets) {
    for (const QuantGemvPlan& plan : set.plans) {
      for (Case cs : PlanCases(set.four_operands, 5)) {  // pad 5: rows of 1576 elements, 16-byte aligned
        SCOPED_TRACE(testing::Message() << "wk " << plan.wk << " split " << plan.split << " part_units "
                                        << plan.part_units << " tiles " << plan.tiles << " m " << cs.m);
        ASSERT_TRUE(QuantGemvPlanValid(ExplicitProblemOf(false, cs.m, n, k, col0), plan));
        const std::vector<float> row_major = CheckFp8(cs, w, row0, col0, n, k, ++seed, &plan);
        for (const QuantGemvTiledKernel kernel : kTiledKernels) {
          const TiledKernelScope scope(kernel);
          const std::vector<float> tiled = CheckFp8(cs, w, row0, col0, n, k, seed, &plan, /*tiled=*/true);
          EXPECT_EQ(std::memcmp(row_major.data(), tiled.data(), tiled.size() * sizeof(float)), 0)
              << "tiled codes, " << TiledKernelName(kernel) << " kernel";
        }
      }
    }
  }
  // Split K: the same bits every run, at 5 and at 29 rows.
  for (const int64_t m : {5, 29}) {
    Case cs;
    cs.m = m;
    const QuantGemvPlan& plan = m > 16 ? sets[1].plans[0] : sets[0].plans[2];
    const std::vector<float> first = CheckFp8(cs, w, row0, col0, n, k, 600, &plan);
    const std::vector<float> again = CheckFp8(cs, w, row0, col0, n, k, 600, &plan);
    EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size() * sizeof(float)), 0) << "m " << m;
  }
}

TEST_F(QuantGemvTest, Int4EveryPath) {
  // Rows [3, 233) of 300, 1503 columns (k % 8 = 7: a partial last word): from column 104 with groups
  // of 32 (8 columns off the 32-column grid: every chunk read word by word, the first one 8 columns
  // before column 0), from column 0 (16-byte chunks), from 40 with groups of 64, from 96 with groups
  // of 256 (a lane's group changes from step to step): 12 units.
  struct Slice {
    int64_t group, col0;
  };
  const PlanSet sets[] = {
      {false,
       {
           {1, 2, 6, 1},  // 128-row blocks, K split in two
           {8, 2, 1, 1},  // 16-row blocks: 8 parts of one unit for 6, the last two idle
           {2, 3, 2, 1},  // a cluster of 3
           {2, 1, 4, 2},  // two activation tiles, the second partial
           {1, 8, 2, 1},  // 8 ranks of 2 units for 12: the last two ranks empty
           {1, 1, 4, 3},  // three tiles
       }},
      // 32 staged rows take 8 KB per unit: at most 5 units per tile within the default limit.
      {true,
       {
           {1, 3, 4, 1},  // 128-row blocks, a cluster of 3, one tile
           {4, 3, 1, 1},  // 32-row blocks of 4 one-unit parts, a cluster of 3
           {2, 1, 2, 3},  // tiles of 2-unit parts (one 2-step ring cycle each)
           {2, 2, 2, 2},  // K split and two tiles, the second partial
           {1, 8, 2, 1},  // 8 ranks of 2 units for 12: the last two ranks empty
           {1, 1, 4, 3},  // three tiles
           {1, 1, 12, 1},  // all 12 units staged at once: past the default shared-memory limit
       }},
  };
  const int64_t row0 = 3, n = 230, k = 1503;
  uint32_t seed = 700;
  for (const Slice slice : {Slice{32, 104}, Slice{32, 0}, Slice{64, 40}, Slice{256, 96}}) {
    const Int4Matrix w = RandomInt4(300, 1800, slice.group, 40 + static_cast<uint32_t>(slice.col0));
    for (const PlanSet& set : sets) {
      for (const QuantGemvPlan& plan : set.plans) {
        for (Case cs : PlanCases(set.four_operands, 1)) {  // pad 1: rows of 1504 elements, 16-byte aligned
          SCOPED_TRACE(testing::Message() << "group " << slice.group << " col0 " << slice.col0 << " wk " << plan.wk
                                          << " split " << plan.split << " part_units " << plan.part_units
                                          << " tiles " << plan.tiles << " m " << cs.m);
          ASSERT_TRUE(QuantGemvPlanValid(ExplicitProblemOf(true, cs.m, n, k, slice.col0), plan));
          const std::vector<float> row_major = CheckInt4(cs, w, row0, slice.col0, n, k, ++seed, &plan);
          for (const QuantGemvTiledKernel kernel : kTiledKernels) {
            const TiledKernelScope scope(kernel);
            const std::vector<float> tiled = CheckInt4(cs, w, row0, slice.col0, n, k, seed, &plan, /*tiled=*/true);
            EXPECT_EQ(std::memcmp(row_major.data(), tiled.data(), tiled.size() * sizeof(float)), 0)
                << "tiled codes, " << TiledKernelName(kernel) << " kernel";
          }
        }
      }
    }
  }
}

// Row-looped plans (quant_gemv_plan.h): 1, 2, 3 and 8 groups per warp over 1000 rows (the last
// block's warps with fewer groups, or none; a partial last group), fp8 rows from 72 (the block's rows
// over several scale rows, 72 rows into the first), int4 slices on and off the 32-column grid and
// with groups of 32 to 256; each within the tolerance of the reference and with the bits of the
// K-split kernel's plan of one warp per group and no cluster (the same sums in the same order).
TEST_F(QuantGemvTest, RowLoopedPlans) {
  const int64_t n = 1000;
  const int loops[] = {1, 2, 3, 8};
  {
    const Fp8Matrix w = RandomFp8(1100, 400, 61);
    const int64_t row0 = 72, col0 = 48, k = 300;  // 3 units: edge chunks at both ends
    uint32_t seed = 800;
    for (const int row_loops : loops) {
      for (Case cs : PlanCases(false, 4)) {  // pad 4: rows of 304 elements, 16-byte aligned
        const QuantGemvProblem problem = ProblemOf(false, 1, cs.m, n, k, col0);
        const std::optional<QuantGemvPlan> plan = QuantGemvRowLoopPlanFor(problem, row_loops);
        ASSERT_TRUE(plan.has_value()) << "fp8 row_loops " << row_loops << " m " << cs.m;
        SCOPED_TRACE(testing::Message() << "fp8 row_loops " << row_loops << " m " << cs.m);
        const std::vector<float> looped = CheckFp8(cs, w, row0, col0, n, k, ++seed, &*plan);
        const QuantGemvPlan split{1, 1, plan->part_units, 1};
        const std::vector<float> reference = CheckFp8(cs, w, row0, col0, n, k, seed, &split);
        EXPECT_EQ(std::memcmp(looped.data(), reference.data(), looped.size() * sizeof(float)), 0);
        const std::vector<float> tiled = CheckFp8(cs, w, row0, col0, n, k, seed, &*plan, /*tiled=*/true);
        EXPECT_EQ(std::memcmp(looped.data(), tiled.data(), looped.size() * sizeof(float)), 0) << "tiled codes";
      }
    }
  }
  struct Slice {
    int64_t group, col0;
  };
  const int64_t row0 = 3, k = 503;  // k % 8 = 7: a partial last word
  uint32_t seed = 900;
  for (const Slice slice : {Slice{32, 104}, Slice{32, 0}, Slice{64, 40}, Slice{256, 96}}) {
    const Int4Matrix w = RandomInt4(1010, 640, slice.group, 70 + static_cast<uint32_t>(slice.col0));
    for (const int row_loops : loops) {
      for (Case cs : PlanCases(false, 1)) {  // pad 1: rows of 504 elements, 16-byte aligned
        const QuantGemvProblem problem = ProblemOf(true, 1, cs.m, n, k, slice.col0);
        const std::optional<QuantGemvPlan> plan = QuantGemvRowLoopPlanFor(problem, row_loops);
        ASSERT_TRUE(plan.has_value()) << "int4 row_loops " << row_loops << " m " << cs.m;
        SCOPED_TRACE(testing::Message() << "int4 group " << slice.group << " col0 " << slice.col0 << " row_loops "
                                        << row_loops << " m " << cs.m);
        const std::vector<float> looped = CheckInt4(cs, w, row0, slice.col0, n, k, ++seed, &*plan);
        const QuantGemvPlan split{1, 1, plan->part_units, 1};
        const std::vector<float> reference = CheckInt4(cs, w, row0, slice.col0, n, k, seed, &split);
        EXPECT_EQ(std::memcmp(looped.data(), reference.data(), looped.size() * sizeof(float)), 0);
        const std::vector<float> tiled = CheckInt4(cs, w, row0, slice.col0, n, k, seed, &*plan, /*tiled=*/true);
        EXPECT_EQ(std::memcmp(looped.data(), tiled.data(), looped.size() * sizeof(float)), 0) << "tiled codes";
      }
    }
  }
}

// A row's sum is one chain whichever 8-row operand holds it (quant_gemv_kernels.cu): under one plan,
// the rows of 24- and 32-row calls whose activations repeat a 16-row call's have that call's bits,
// and a row matches its 1-row call (two chains) within the tolerance. Slices start inside an fp8
// block (row 40, column 48) and an int4 group (column 104).
TEST_F(QuantGemvTest, RowBitsIndependentOfTheirOperand) {
  const int64_t n = 250, k = 1000;
  const Fp8Matrix f = RandomFp8(300, 1100, 51);
  const Int4Matrix q = RandomInt4(300, 1100, 32, 52);
  const Fp8Slice fp8(f, 40, 48, n, k, Ld16(k));
  const Int4Slice int4(q, 7, 104, n, k, LdWords(k));
  const Activations a = RandomActivations(16 * k, 53);
  std::vector<float> rows(a.f32);  // 32 rows: rows 16..31 repeat rows 0..15
  rows.insert(rows.end(), a.f32.begin(), a.f32.end());
  DeviceBuffer a_dev(rows.size() * sizeof(float)), c_dev(32 * n * sizeof(float));
  Upload(a_dev, rows);
  for (const bool is_int4 : {false, true}) {
    SCOPED_TRACE(is_int4 ? "int4" : "fp8");
    // 9 (fp8) or 8 (int4) units over a cluster of 3 or 2: one tile at every m below.
    const QuantGemvPlan plan = is_int4 ? QuantGemvPlan{1, 2, 4, 1} : QuantGemvPlan{1, 3, 3, 1};
    // c of rows [first, first + m).
    const auto run = [&](int64_t first, int64_t m) {
      EXPECT_TRUE(QuantGemvPlanValid(ProblemOf(is_int4, 1, m, n, k, is_int4 ? 104 : 48), plan)) << "m " << m;
      const float* a_rows = a_dev.as<float>() + first * k;
      const cudaError_t error =
          is_int4 ? LaunchInt4GroupGemvPlanned(a_rows, GemvType::kF32, k, 0, int4.weights, c_dev.as<float>(), n, 0,
                                               nullptr, 1, m, n, k, 1.0f, 0.0f, &plan, false, nullptr)
                  : LaunchFp8BlockGemvPlanned(a_rows, GemvType::kF32, k, 0, fp8.weights, c_dev.as<float>(), n, 0,
                                              nullptr, 1, m, n, k, 1.0f, 0.0f, &plan, false, nullptr);
      EXPECT_EQ(error, cudaSuccess) << "m " << m;
      return Download<float>(c_dev, m * n);
    };
    const std::vector<float> c16 = run(0, 16);
    for (const int64_t m : {24, 32}) {
      const std::vector<float> c = run(0, m);
      for (int64_t r = 0; r < m; ++r) {
        EXPECT_EQ(std::memcmp(c.data() + r * n, c16.data() + (r % 16) * n, n * sizeof(float)), 0)
            << "row " << r << " of " << m;
      }
    }
    for (const int64_t r : {0, 9, 15}) {
      const std::vector<float> one = run(r, 1);
      EXPECT_LE(MaxRelativeError(one, std::vector<float>(c16.begin() + r * n, c16.begin() + (r + 1) * n)), kTol)
          << "row " << r;
    }
  }
}

// The plans refused: warps per group not 1, 2, 4 or 8, clusters of 0 or more than 8, tiles that do
// not cover a rank's units, several tiles of part runs that are not whole ring cycles, shared memory
// past the limit. Nothing is launched.
TEST_F(QuantGemvTest, BadPlansRefused) {
  const int64_t m = 16, n = 64, k = 2048;  // 16 units
  const int64_t max_m = 32;                  // the shared-memory case below
  DeviceBuffer a(max_m * k * 4), c(max_m * n * 4), codes(n * k), scales(64 * 4), packed(n * k / 2),
      iscales(n * k / 32 * 2);
  const std::vector<float> c_host(max_m * n, 3.0f);
  Upload(c, c_host);
  Fp8BlockWeights f;
  f.codes = codes.as<uint8_t>();
  f.ld = k;
  f.scale_inv = scales.as<float>();
  f.scale_ld = k / 128;
  Int4GroupWeights q;
  q.packed = packed.as<int32_t>();
  q.ld = k / 8;
  q.scale = iscales.as<uint16_t>();
  q.scale_ld = k / 32;
  const QuantGemvPlan bad[] = {
      {3, 1, 16, 1}, {16, 1, 1, 2},  // wk
      {1, 0, 16, 1}, {1, 9, 2, 1},   // split
      {1, 1, 0, 1},  {1, 1, 8, 0},   // empty
      {2, 2, 1, 1},                  // 2 units of a rank's 8
      {1, 1, 1, 16},                 // several tiles of 2-step (fp8) or 1-step (int4) runs
  };
  for (const QuantGemvPlan& plan : bad) {
    SCOPED_TRACE(testing::Message() << "wk " << plan.wk << " split " << plan.split << " part_units "
                                    << plan.part_units << " tiles " << plan.tiles);
    EXPECT_FALSE(QuantGemvPlanValid(ProblemOf(false, 1, m, n, k, 0), plan));
    EXPECT_FALSE(QuantGemvPlanValid(ProblemOf(true, 1, m, n, k, 0), plan));
    EXPECT_EQ(LaunchFp8BlockGemvPlanned(a.ptr, GemvType::kF32, k, 0, f, c.as<float>(), n, 0, nullptr, 1, m, n, k,
                                        1.0f, 0.0f, &plan, false, nullptr),
              cudaErrorInvalidValue);
    EXPECT_EQ(LaunchInt4GroupGemvPlanned(a.ptr, GemvType::kF32, k, 0, q, c.as<float>(), n, 0, nullptr, 1, m, n, k,
                                         1.0f, 0.0f, &plan, false, nullptr),
              cudaErrorInvalidValue);
  }
  // Shared memory: 16 rows of 16 units stage 66 KB, past the default limit the chooser keeps to
  // (and the problem's default shared_limit) but within what an explicit plan may take; 32 rows of
  // 16 units stage 133 KB, past kQuantGemvSharedMax: refused.
  const QuantGemvPlan whole_k{1, 1, 16, 1};
  for (const bool int4 : {false, true}) {
    EXPECT_FALSE(QuantGemvPlanValid(ProblemOf(int4, 1, m, n, k, 0), whole_k));
    EXPECT_TRUE(QuantGemvPlanValid(ExplicitProblemOf(int4, m, n, k, 0), whole_k));
    EXPECT_FALSE(QuantGemvPlanValid(ExplicitProblemOf(int4, max_m, n, k, 0), whole_k));
  }
  EXPECT_EQ(LaunchFp8BlockGemvPlanned(a.ptr, GemvType::kF32, k, 0, f, c.as<float>(), n, 0, nullptr, 1, max_m, n, k,
                                      1.0f, 0.0f, &whole_k, false, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchInt4GroupGemvPlanned(a.ptr, GemvType::kF32, k, 0, q, c.as<float>(), n, 0, nullptr, 1, max_m, n, k,
                                       1.0f, 0.0f, &whole_k, false, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(Download<float>(c, c_host.size()), c_host) << "a refused call wrote c";
  // The same shapes with a valid plan run (so the refusals above are the plans' doing).
  const QuantGemvPlan good{2, 2, 4, 1};
  EXPECT_EQ(LaunchFp8BlockGemvPlanned(a.ptr, GemvType::kF32, k, 0, f, c.as<float>(), n, 0, nullptr, 1, 4, n, k, 1.0f,
                                      0.0f, &good, false, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// ---- Bad arguments ---------------------------------------------------------------------------------

TEST_F(QuantGemvTest, BadArgumentsRefused) {
  const int64_t n = 64, k = 256;
  DeviceBuffer a(16 * k * 4), c(16 * n * 4), codes(n * k + 64), fscales(64 * 4), packed(n * k / 2 + 64),
      iscales(n * k / 32 * 2);
  const std::vector<float> c_host(16 * n, 3.0f);
  Upload(c, c_host);
  Fp8BlockWeights f;
  f.codes = codes.as<uint8_t>();
  f.ld = k;
  f.scale_inv = fscales.as<float>();
  f.scale_ld = 2;
  Int4GroupWeights q;
  q.packed = packed.as<int32_t>();
  q.ld = k / 8;
  q.scale = iscales.as<uint16_t>();
  q.scale_ld = k / 32;
  const auto fp8 = [&](const Fp8BlockWeights& b, int64_t m, int64_t nn, int64_t kk, int64_t lda = 256,
                       int64_t ldc = 64, const void* a_ptr = nullptr, int64_t batch = 1) {
    return LaunchFp8BlockGemv(a_ptr == nullptr ? a.ptr : a_ptr, GemvType::kF32, lda, 0, b, c.as<float>(), ldc, 0,
                              nullptr, batch, m, nn, kk, 1.0f, 0.0f, false, nullptr);
  };
  const auto int4 = [&](const Int4GroupWeights& b, int64_t m, int64_t nn, int64_t kk) {
    return LaunchInt4GroupGemv(a.ptr, GemvType::kF32, 256, 0, b, c.as<float>(), 64, 0, nullptr, 1, m, nn, kk, 1.0f,
                               0.0f, false, nullptr);
  };
  // The well-formed calls succeed (so the refusals below are the arguments' doing).
  EXPECT_EQ(fp8(f, 4, n, k), cudaSuccess);
  EXPECT_EQ(int4(q, 4, n, k), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Upload(c, c_host);

  EXPECT_EQ(fp8(f, 0, n, k), cudaErrorInvalidValue);
  EXPECT_EQ(fp8(f, kQuantGemvMaxRows + 1, n, k), cudaErrorInvalidValue);
  EXPECT_EQ(fp8(f, 4, 0, k), cudaErrorInvalidValue);
  EXPECT_EQ(fp8(f, 4, n, 0), cudaErrorInvalidValue);
  EXPECT_EQ(fp8(f, 4, n, k, /*lda=*/k - 1), cudaErrorInvalidValue);
  EXPECT_EQ(fp8(f, 4, n, k, k, /*ldc=*/n - 1), cudaErrorInvalidValue);
  EXPECT_EQ(fp8(f, 4, n, k, k, n, nullptr, /*batch=*/0), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchFp8BlockGemv(a.ptr, GemvType::kF32, k, 0, f, nullptr, n, 0, nullptr, 1, 4, n, k, 1.0f, 0.0f,
                               false, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchFp8BlockGemv(a.ptr, GemvType::kF32, k, 0, f, c.as<float>(), n, 0, nullptr, 1, 4, n, k, kNaN, 0.0f,
                               false, nullptr),
            cudaErrorInvalidValue);
  Fp8BlockWeights bad = f;
  bad.codes = nullptr;
  EXPECT_EQ(fp8(bad, 4, n, k), cudaErrorInvalidValue);
  bad = f;
  bad.scale_inv = nullptr;
  EXPECT_EQ(fp8(bad, 4, n, k), cudaErrorInvalidValue);
  bad = f;
  bad.codes = f.codes + 8;  // not 16-byte aligned
  EXPECT_EQ(fp8(bad, 4, n, k), cudaErrorInvalidValue);
  bad = f;
  bad.ld = k + 8;  // rows not 16-byte aligned
  EXPECT_EQ(fp8(bad, 4, n, k), cudaErrorInvalidValue);
  bad = f;
  bad.ld = k - 16;
  EXPECT_EQ(fp8(bad, 4, n, k), cudaErrorInvalidValue);
  bad = f;
  bad.col0 = 8;  // inside a 16-byte chunk
  EXPECT_EQ(fp8(bad, 4, n, k), cudaErrorInvalidValue);
  bad = f;
  bad.row0 = -1;
  EXPECT_EQ(fp8(bad, 4, n, k), cudaErrorInvalidValue);
  bad = f;
  bad.row0 = 100;  // rows 100 .. 163 span scale rows 0 and 1
  bad.scale_ld = 1;  // fewer than the 2 scale columns of k = 256
  EXPECT_EQ(fp8(bad, 4, n, k), cudaErrorInvalidValue);

  EXPECT_EQ(int4(q, 0, n, k), cudaErrorInvalidValue);
  EXPECT_EQ(int4(q, kQuantGemvMaxRows + 1, n, k), cudaErrorInvalidValue);
  Int4GroupWeights bad4 = q;
  bad4.packed = nullptr;
  EXPECT_EQ(int4(bad4, 4, n, k), cudaErrorInvalidValue);
  bad4 = q;
  bad4.scale = nullptr;
  EXPECT_EQ(int4(bad4, 4, n, k), cudaErrorInvalidValue);
  for (const int64_t group : {0, 8, 16, 48, 96}) {
    bad4 = q;
    bad4.group_size = group;
    EXPECT_EQ(int4(bad4, 4, n, k), cudaErrorInvalidValue) << "group " << group;
  }
  bad4 = q;
  bad4.col0 = 4;  // inside a word
  EXPECT_EQ(int4(bad4, 4, n, k), cudaErrorInvalidValue);
  bad4 = q;
  bad4.packed = q.packed + 1;  // not 16-byte aligned
  EXPECT_EQ(int4(bad4, 4, n, k), cudaErrorInvalidValue);
  bad4 = q;
  bad4.ld = k / 8 + 2;  // rows not 16-byte aligned
  EXPECT_EQ(int4(bad4, 4, n, k), cudaErrorInvalidValue);
  bad4 = q;
  bad4.scale_ld = k / 32 - 1;
  EXPECT_EQ(int4(bad4, 4, n, k), cudaErrorInvalidValue);

  // Tiled codes: an item stride that is neither 0 (shared) nor a whole item's tiles.
  bad = f;
  bad.tiled = true;
  bad.batch_stride = 16;
  EXPECT_EQ(fp8(bad, 4, n, k, k, n, nullptr, /*batch=*/2), cudaErrorInvalidValue);
  bad4 = q;
  bad4.tiled = true;
  bad4.batch_stride = 4;  // words
  EXPECT_EQ(LaunchInt4GroupGemv(a.ptr, GemvType::kF32, k, 0, bad4, c.as<float>(), n, 0, nullptr, 2, 4, n, k, 1.0f, 0.0f,
                                false, nullptr),
            cudaErrorInvalidValue);

  // Grouped launches' gated activations and combine epilogue (QuantGemvItems).
  DeviceBuffer counters(n * 4), ids(16 * 4), weights(16 * 4), slots(16 * 4), out(16 * n * 4);
  QuantGemvItems good;
  good.combine.counters = counters.as<int32_t>();
  good.combine.row_ld = n;
  good.combine.ids = ids.as<int32_t>();
  good.combine.weights = weights.as<float>();
  good.combine.slot_of = slots.as<int32_t>();
  good.combine.out = out.as<float>();
  good.combine.out_stride = n;
  good.combine.tokens = 1;
  good.combine.top_k = 1;
  good.combine.num_experts = 1;
  const auto grouped = [&](const QuantGemvItems& items, GemvType a_type) {
    return LaunchFp8BlockGemvGrouped(a.ptr, a_type, k, 0, f, c.as<float>(), n, 0, nullptr, items, 1, 1, n, k, 1.0f,
                                     0.0f, false, nullptr);
  };
  QuantGemvItems items = good;
  items.silu_up_offset = 4;  // gated activations are f32
  EXPECT_EQ(grouped(items, GemvType::kBF16), cudaErrorInvalidValue);
  items.silu_up_offset = -4;
  EXPECT_EQ(grouped(items, GemvType::kF32), cudaErrorInvalidValue);
  items = good;
  items.combine.ids = nullptr;
  EXPECT_EQ(grouped(items, GemvType::kF32), cudaErrorInvalidValue);
  items = good;
  items.combine.row_ld = n - 1;  // output rows would overlap
  EXPECT_EQ(grouped(items, GemvType::kF32), cudaErrorInvalidValue);
  items = good;
  items.combine.tokens = -1;
  EXPECT_EQ(grouped(items, GemvType::kF32), cudaErrorInvalidValue);
  float* const c_items = c.as<float>();
  DeviceBuffer c_table(8);
  Upload(c_table, std::vector<float*>{c_items});
  items = good;
  items.c = c_table.as<float* const>();  // the gathered rows must be c's, not per-item pointers
  EXPECT_EQ(grouped(items, GemvType::kF32), cudaErrorInvalidValue);
  items = good;
  items.combine.slot_of = nullptr;  // without slot_of, a pair's row is pair * pair_rows: >= 1
  EXPECT_EQ(grouped(items, GemvType::kF32), cudaErrorInvalidValue);

  // Indexed items (QuantGemvIndexedItems): a table of one entry, both roles at bytes 0 and 8.
  DeviceBuffer table(16), flag(4);
  Upload(table, std::vector<const void*>{f.codes, f.scale_inv});
  QuantGemvItems ix_good;
  ix_good.indexed.ids = ids.as<int32_t>();
  ix_good.indexed.table = table.ptr;
  ix_good.indexed.entry_bytes = 16;
  ix_good.indexed.num_entries = 1;
  ix_good.indexed.codes_at[0] = 0;
  ix_good.indexed.scales_at[0] = 8;
  ix_good.indexed.error_flag = flag.as<int>();
  const auto indexed = [&](const QuantGemvItems& items, int64_t max_items) {
    return LaunchFp8BlockGemvGrouped(a.ptr, GemvType::kBF16, k, 0, f, c.as<float>(), n, 0, nullptr, items, max_items,
                                     1, n, k, 1.0f, 0.0f, false, nullptr);
  };
  const std::vector<std::pair<const char*, std::function<void(QuantGemvItems&)>>> bad_indexed = {
      {"a codes array beside the ids", [&](QuantGemvItems& x) { x.codes = c_table.as<const void* const>(); }},
      {"a rows array beside the ids", [&](QuantGemvItems& x) { x.rows = ids.as<int32_t>(); }},
      {"no table", [&](QuantGemvItems& x) { x.indexed.table = nullptr; }},
      {"per_id 3", [&](QuantGemvItems& x) { x.indexed.per_id = 3; }},
      {"entry_bytes 4", [&](QuantGemvItems& x) { x.indexed.entry_bytes = 4; }},
      {"entry_bytes 12", [&](QuantGemvItems& x) { x.indexed.entry_bytes = 12; }},
      {"codes pointer past the entry", [&](QuantGemvItems& x) { x.indexed.codes_at[0] = 16; }},
      {"scales pointer not 8-aligned", [&](QuantGemvItems& x) { x.indexed.scales_at[0] = 4; }},
      {"negative num_entries", [&](QuantGemvItems& x) { x.indexed.num_entries = -1; }},
      {"negative error_index", [&](QuantGemvItems& x) { x.indexed.error_index = -1; }},
      {"ids_final with a device count",
       [&](QuantGemvItems& x) {
         x.indexed.ids_final = true;
         x.count = counters.as<int32_t>();
       }},
      {"negative token_items", [&](QuantGemvItems& x) { x.indexed.token_items = -1; }},
      {"a_by_token without token_items", [&](QuantGemvItems& x) { x.indexed.a_by_token = true; }},
      {"a_by_token beside an a array",
       [&](QuantGemvItems& x) {
         x.indexed.token_items = 1;
         x.indexed.a_by_token = true;
         x.a = c_table.as<const void* const>();
       }},
  };
  for (const auto& [what, mutate] : bad_indexed) {
    QuantGemvItems x = ix_good;
    mutate(x);
    EXPECT_EQ(indexed(x, 2), cudaErrorInvalidValue) << what;
  }
  {
    QuantGemvItems x = ix_good;
    x.indexed.per_id = 2;
    x.indexed.codes_at[1] = 0;
    x.indexed.scales_at[1] = 8;
    EXPECT_EQ(indexed(x, 3), cudaErrorInvalidValue) << "max_items not a multiple of per_id";
    x.indexed.scales_at[1] = 16;
    EXPECT_EQ(indexed(x, 2), cudaErrorInvalidValue) << "role 1's scales pointer past the entry";
    x.indexed.scales_at[1] = 8;
    x.indexed.token_items = 1;
    EXPECT_EQ(indexed(x, 2), cudaErrorInvalidValue) << "token_items not a multiple of per_id";
  }

  // Nothing was launched by a refused call.
  const std::vector<float> after = Download<float>(c, c_host.size());
  EXPECT_EQ(after, c_host);
}

}  // namespace
}  // namespace eagle3::cuda
