// The W8A8 FP8 path of CudaBackend::QuantizedGemm (CudaBackendOptions::fp8_w8a8_min_rows): the
// activation quantization kernel (act_quant_ops.h) bit for bit against a host model of DeepSeek's
// per-token-group rule, the product at DeepSeek-V3 shapes (q_a, a TP 8 o_proj column slice with its
// scales as the whole grid, which the path copies into cuBLASLt's layout, and as only its own
// blocks, which cuBLASLt reads in place; a row slice; an N that ends inside a block) against a host
// model and the exact CPU reference, alpha / beta / bias, a captured call, and the calls the path
// leaves to the other paths (bit-identical to a backend without the option). Skipped where no CUDA
// device is visible.
//
// Tolerances, as max |gpu - ref| / max |ref| over a call's output:
//  - kModelTol against the host model: the CPU Gemm (fp32) on the activations the kernel's rule
//    quantizes, dequantized (e4m3 value times scale), and the exact f32 weights. What is left is
//    summation order and the FP8 tensor cores' accumulator inside each 128-deep block, which keeps
//    about 14 bits rather than fp32's 24 (DeepSeek-V3 report, section 3.3.2: their reason for
//    promoting partial sums every 128 products): 2^-14 ~ 6e-5 of a block's partial sums per
//    accumulation step, a few steps per block, so 1e-3 leaves room; a wrong scale, block or row
//    moves results by whole scales (order 1).
//  - kExactTol against the exact CPU reference (f32 activations and weights): e4m3 rounding of the
//    activations, relative error uniform within half a step of 3 mantissa bits (2^-4 to 2^-5 of the
//    value), RMS 2% to 4%; with random signs each output's error is about that fraction of the
//    output's typical size, and the largest error over a call about that fraction of its largest
//    output: 6e-2 leaves about 2x.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "act_quant_ops.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/cuda_graph.h"
#include "eagle3/half.h"
#include "eagle3/quantized_weight_view.h"
#include "fp8_w8a8_layout.h"
#include "gtest/gtest.h"
#include "parity_util.h"
#include "quantized_gemm_parity.h"
#include "quantized_view_util.h"

namespace eagle3 {
namespace {

constexpr double kModelTol = 1e-3;
constexpr double kExactTol = 6e-2;
// Row counts the path does not take (Fp8W8A8RowsTaken) against the exact reference: bf16
// activations on the weight-only paths (~0.2 % here), far below what e4m3 activations give (~3 %).
constexpr double kWeightOnlyTol = 6e-3;

// e4m3fn round to nearest, ties to even, saturating to +-448 (NaN is outside the tests).
uint8_t HostE4m3(float x) {
  static const std::vector<float> values = [] {
    std::vector<float> v;
    for (int code = 0; code <= 0x7e; ++code) v.push_back(F8E4M3ToFloat(static_cast<uint8_t>(code)));
    return v;
  }();
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float f = std::fabs(x);
  if (f >= values.back()) return sign | 0x7e;
  const auto above = std::lower_bound(values.begin(), values.end(), f);
  const int hi = static_cast<int>(above - values.begin());
  if (values[hi] == f || hi == 0) return sign | static_cast<uint8_t>(hi);
  const int lo = hi - 1;
  const double down = f - values[lo], up = values[hi] - f;
  const int code = down < up ? lo : up < down ? hi : (lo % 2 == 0 ? lo : hi);
  return sign | static_cast<uint8_t>(code);
}

// The kernel's rule on the host: codes [m, k] and scales in the VEC128_32F layout (Fp8ActScaleLd).
struct HostQuantized {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};
HostQuantized HostQuantize(const std::vector<float>& x, int64_t m, int64_t k) {
  HostQuantized q;
  q.codes.resize(static_cast<size_t>(m * k));
  q.scales.resize(static_cast<size_t>(cuda::Fp8ActScaleCount(m, k)));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < cuda::Fp8W8A8KBlocks(k); ++j) {
      const int64_t begin = j * 128, end = std::min(k, begin + 128);
      float amax = 0.0f;
      for (int64_t c = begin; c < end; ++c) amax = std::max(amax, std::fabs(x[r * k + c]));
      float scale = amax / 448.0f;
      if (scale == 0.0f) scale = 1.0f;
      q.scales[cuda::Fp8ActScaleIndex(m, r, j)] = scale;
      for (int64_t c = begin; c < end; ++c) q.codes[r * k + c] = HostE4m3(x[r * k + c] / scale);
    }
  }
  return q;
}

// The activations the W8A8 path multiplies: f32 [m, k] of e4m3 value times scale.
Tensor Dequantized(const HostQuantized& q, int64_t m, int64_t k) {
  Tensor out = *Tensor::Empty(DType::kF32, Shape{m, k});
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      out.data_as<float>()[r * k + c] = static_cast<float>(static_cast<double>(F8E4M3ToFloat(q.codes[r * k + c])) *
                                                           q.scales[cuda::Fp8ActScaleIndex(m, r, c / 128)]);
    }
  }
  return out;
}

std::vector<float> Values(const Tensor& t) {
  return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel());
}

bool BitEqual(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// ---- The activation quantization kernel ---------------------------------------------------------

class Fp8ActQuantTest : public parity::ParityTest {
 protected:
  // x [m, k] (host values, row stride ldx) through the kernel as f32 or bf16, against HostQuantize.
  void Check(const std::vector<float>& x, int64_t m, int64_t k, int64_t ldx, bool bf16) {
    const std::string what = "m " + std::to_string(m) + " k " + std::to_string(k) + " ldx " + std::to_string(ldx) +
                             (bf16 ? " bf16" : " f32");
    std::vector<float> dense(static_cast<size_t>(m * k));
    Tensor host = *Tensor::Empty(bf16 ? DType::kBF16 : DType::kF32, Shape{m, ldx});
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < ldx; ++c) {
        const float v = c < k ? x[r * k + c] : 1e30f;  // padding the kernel must not read into a scale
        if (bf16) {
          host.data_as<uint16_t>()[r * ldx + c] = FloatToBf16(v);
          if (c < k) dense[r * k + c] = Bf16ToFloat(FloatToBf16(v));
        } else {
          host.data_as<float>()[r * ldx + c] = v;
          if (c < k) dense[r * k + c] = v;
        }
      }
    }
    const HostQuantized want = HostQuantize(dense, m, k);
    const Tensor d_x = Upload(host);
    Tensor d_codes = *Tensor::Empty(DType::kU8, Shape{m, k}, gpu_->allocator());
    Tensor d_scales = *Tensor::Empty(DType::kF32, Shape{cuda::Fp8ActScaleCount(m, k)}, gpu_->allocator());
    const cudaError_t error =
        bf16 ? cuda::LaunchFp8ActQuant(d_x.data_as<const uint16_t>(), ldx, m, k, d_codes.data_as<uint8_t>(), k,
                                       d_scales.data_as<float>(), cuda::Fp8ActScaleLd(m), true, gpu_->stream())
             : cuda::LaunchFp8ActQuant(d_x.data_as<const float>(), ldx, m, k, d_codes.data_as<uint8_t>(), k,
                                       d_scales.data_as<float>(), cuda::Fp8ActScaleLd(m), true, gpu_->stream());
    ASSERT_EQ(error, cudaSuccess) << what << ": " << cudaGetErrorString(error);
    const Tensor codes = Download(d_codes), scales = Download(d_scales);
    int64_t bad_codes = 0, bad_scales = 0;
    for (int64_t i = 0; i < m * k; ++i) bad_codes += codes.data_as<uint8_t>()[i] != want.codes[i];
    for (int64_t r = 0; r < m; ++r) {  // the padding rows' scales are never written nor read
      for (int64_t j = 0; j < cuda::Fp8W8A8KBlocks(k); ++j) {
        const int64_t i = cuda::Fp8ActScaleIndex(m, r, j);
        bad_scales += std::memcmp(&scales.data_as<float>()[i], &want.scales[i], sizeof(float)) != 0;
      }
    }
    EXPECT_EQ(bad_codes, 0) << what;
    EXPECT_EQ(bad_scales, 0) << what;
  }
};

TEST_F(Fp8ActQuantTest, MatchesTheHostModelBitForBit) {
  for (const bool bf16 : {false, true}) {
    for (const auto& [m, k, ldx] : std::vector<std::array<int64_t, 3>>{
             {1, 7168, 7168}, {5, 384, 384}, {17, 300, 300}, {3, 256, 259}, {64, 2048, 2048}}) {
      std::vector<float> x = Values(Random(Shape{m, k}, static_cast<uint32_t>(m * k)));
      if (m >= 3 && k >= 256) {
        for (int64_t c = 128; c < 256; ++c) x[0 * k + c] = 0.0f;  // an all-zero group: scale 1, codes 0
        x[1 * k + 5] = 1e6f;     // dominates its group: 448 exactly, the others flushed toward 0
        x[2 * k + 130] = -3.0f;  // amax 3: 3 / (3 / 448) may round past 448 and must saturate to 448
        for (int64_t c = 0; c < 128; ++c) x[2 * k + c] *= 1e-30f;  // a group of tiny values: its scale far below 1
      }
      Check(x, m, k, ldx, bf16);
    }
  }
}

TEST_F(Fp8ActQuantTest, SaturatesAtTheLargestFiniteCode) {
  // Every value of a group equal: each divides to 448 (or a rounding away from it), code 0x7e.
  const int64_t m = 2, k = 128;
  std::vector<float> x(static_cast<size_t>(m * k));
  for (int64_t c = 0; c < k; ++c) x[c] = 1.0f / 3.0f, x[k + c] = -7.77f;
  Check(x, m, k, k, false);
  EXPECT_EQ(HostE4m3(448.00003f), 0x7e);
  EXPECT_EQ(HostE4m3(-1e9f), 0xfe);
  EXPECT_EQ(HostE4m3(0.0f), 0x00);
}

// ---- The product through CudaBackend::QuantizedGemm ----------------------------------------------

class CudaFp8W8A8Test : public QuantizedGemmParityTest {
 protected:
  cuda::CudaBackendOptions Options() const override {
    cuda::CudaBackendOptions options;
    options.fp8_w8a8_min_rows = 1;
    return options;
  }

  // QuantizedGemm of slice `s` on the W8A8 path at each M against the host model and the exact
  // reference; alpha, beta and bias at the M listed in `epilogue_rows`.
  void CheckSlice(const QuantizedMatrix& w, const Slice& s, const std::vector<int64_t>& ms,
                  const std::vector<int64_t>& epilogue_rows) {
    const QuantizedWeightView host = SliceView(w.quantization, w.codes, w.scales, s);
    const DeviceView d = ToDevice(host);
    const Tensor exact_w = DequantizedSlice(w, s);
    const Tensor bias = Random(Shape{s.rows}, 3);
    const Tensor d_bias = Upload(bias);
    for (const int64_t rows : ms) {
      const Tensor a = Random(Shape{rows, s.cols}, static_cast<uint32_t>(rows + 11));
      const Tensor a_model = Dequantized(HostQuantize(Values(a), rows, s.cols), rows, s.cols);
      const Tensor c0 = Random(Shape{rows, s.rows}, static_cast<uint32_t>(rows + 12));
      const Tensor d_a = Upload(a);
      const bool with_epilogue = std::find(epilogue_rows.begin(), epilogue_rows.end(), rows) != epilogue_rows.end();
      for (const bool epilogue : {false, true}) {
        if (epilogue && !with_epilogue) continue;
        const Call call = RunCall(a, d_a, host, d.view, c0, epilogue, bias, d_bias, s);
        Tensor model = Clone(c0);
        ASSERT_TRUE(cpu_.Gemm(a_model, exact_w, model, call.options).ok()) << call.what;
        const double model_error = parity::RelError(call.got, model);
        const double exact_error = parity::RelError(call.got, call.exact);
        std::printf("W8A8 %s: vs model %.3g, vs exact %.3g\n", call.what.c_str(), model_error, exact_error);
        if (!cuda::Fp8W8A8RowsTaken(rows)) {
          // Not a W8A8 row count: the weight-only paths run, with bf16 activations, an order of
          // magnitude closer to the exact product than e4m3 activations can be.
          EXPECT_LE(exact_error, kWeightOnlyTol) << call.what;
          continue;
        }
        EXPECT_LE(model_error, kModelTol) << call.what;
        EXPECT_LE(exact_error, kExactTol) << call.what;
      }
    }
  }
};

const std::vector<int64_t> kRows = {1, 4, 16, 17, 20, 64, 256, 1000};

TEST_F(CudaFp8W8A8Test, V3QaMatchesTheReferences) {
  const QuantizedMatrix q_a = RandomQuantizedMatrix(DeepseekV3Fp8Quantization(), 1536, 7168, 31);
  CheckSlice(q_a, Slice{0, 1536, 0, 7168, false}, kRows, {17, 64});
}

TEST_F(CudaFp8W8A8Test, V3OprojTpSliceMatchesTheReferences) {
  // o_proj's TP 8 shape [7168, 2048], a column slice starting at block 16 (a narrower global K than
  // V3's 16384 keeps the host model quick; the slice's layout is the same).
  const QuantizedMatrix o_proj = RandomQuantizedMatrix(DeepseekV3Fp8Quantization(), 7168, 4096, 32);
  CheckSlice(o_proj, Slice{0, 7168, 2048, 2048, false}, kRows, {17});  // scales copied (row stride 32, L4 16)
  CheckSlice(o_proj, Slice{0, 7168, 2048, 2048, true}, {1, 64}, {});   // read in place (row stride 16)
}

TEST_F(CudaFp8W8A8Test, RowSlicesAndRaggedBlocksMatchTheReferences) {
  const QuantizedMatrix m = RandomQuantizedMatrix(DeepseekV3Fp8Quantization(), 1024, 1536, 33);
  CheckSlice(m, Slice{512, 256, 0, 1536, false}, {1, 17, 300}, {17});  // rank 2 of 4 of a row split
  // N = 576 (kv_a's): the last block row half used; K = 640: 5 blocks, L4 8 (copied and padded).
  const QuantizedMatrix kv = RandomQuantizedMatrix(DeepseekV3Fp8Quantization(), 576, 1280, 34);
  CheckSlice(kv, Slice{0, 576, 0, 1280, false}, {1, 64}, {});
  CheckSlice(kv, Slice{0, 576, 640, 640, true}, {1, 64}, {64});
}

TEST_F(CudaFp8W8A8Test, CapturedCallReplays) {
  const QuantizedMatrix m = RandomQuantizedMatrix(DeepseekV3Fp8Quantization(), 512, 1024, 35);
  const Slice s{0, 512, 0, 1024, false};
  const DeviceView d = ToDevice(SliceView(m.quantization, m.codes, m.scales, s));
  Tensor d_a = Upload(Random(Shape{40, 1024}, 5));
  Tensor d_c = Upload(Random(Shape{40, 512}, 6));
  ASSERT_TRUE(gpu_->QuantizedGemm(d_a, d.view, d_c, kWeightsGemm).ok());  // sizes the scratch
  ASSERT_TRUE(gpu_->Synchronize().ok());
  auto graph =
      cuda::CudaGraph::Capture(gpu_->stream(), [&] { return gpu_->QuantizedGemm(d_a, d.view, d_c, kWeightsGemm); });
  ASSERT_TRUE(graph.ok()) << graph.status();
  const Tensor a = Random(Shape{40, 1024}, 7);
  ASSERT_TRUE(gpu_->Copy(a, d_a).ok());
  ASSERT_TRUE((*graph)->Launch(gpu_->stream()).ok());
  const Tensor got = Download(d_c);
  Tensor want = *Tensor::Zeros(DType::kF32, Shape{40, 512});
  ASSERT_TRUE(cpu_.Gemm(Dequantized(HostQuantize(Values(a), 40, 1024), 40, 1024), DequantizedSlice(m, s),
                        want, kWeightsGemm)
                  .ok());
  EXPECT_LE(parity::RelError(got, want), kModelTol);
}

// What the path does not take runs as on a backend without the option, bit for bit; and the option
// below its row count changes nothing.
TEST_F(CudaFp8W8A8Test, OtherCallsKeepTheirPaths) {
  cuda::CudaBackendOptions defaults;
  EXPECT_EQ(defaults.fp8_w8a8_min_rows, 0);
  auto plain = cuda::CudaBackend::Create(defaults);
  ASSERT_TRUE(plain.ok()) << plain.status();
  cuda::CudaBackendOptions high;
  high.fp8_w8a8_min_rows = 100;
  auto above = cuda::CudaBackend::Create(high);
  ASSERT_TRUE(above.ok()) << above.status();
  const QuantizedMatrix fp8 = RandomQuantizedMatrix(DeepseekV3Fp8Quantization(), 384, 640, 36);
  const QuantizedMatrix int4 = RandomQuantizedMatrix(KimiK2ThinkingInt4Quantization(), 256, 512, 37);
  struct Case {
    const QuantizedMatrix* w;
    Slice slice;
    cuda::CudaBackend* backend;  // the option's backend under test
    int64_t rows;
  };
  const std::vector<Case> cases = {
      {&fp8, Slice{0, 384, 144, 256, false}, gpu_.get(), 17},   // starts inside a block column
      {&fp8, Slice{64, 256, 0, 640, false}, gpu_.get(), 300},   // starts inside a block row
      {&fp8, Slice{0, 384, 0, 300, false}, gpu_.get(), 17},     // K not a multiple of 128
      {&fp8, Slice{0, 200, 0, 640, false}, gpu_.get(), 300},    // N not a multiple of 16
      {&int4, Slice{0, 256, 0, 512, false}, gpu_.get(), 17},    // INT4: never W8A8
      {&fp8, Slice{0, 384, 0, 640, false}, above->get(), 64},   // below fp8_w8a8_min_rows
      {&fp8, Slice{0, 384, 0, 640, false}, above->get(), 1},
  };
  for (const Case& t : cases) {
    const std::string what = ::testing::PrintToString(t.slice) + " M " + std::to_string(t.rows);
    const DeviceView d = ToDevice(SliceView(t.w->quantization, t.w->codes, t.w->scales, t.slice));
    const Tensor d_a = Upload(Random(Shape{t.rows, t.slice.cols}, 8));
    const Tensor c0 = Random(Shape{t.rows, t.slice.rows}, 9);
    Tensor d_c = Upload(c0), d_want = Upload(c0);
    ASSERT_TRUE(gpu_->Synchronize().ok());
    const GemmOptions options{.alpha = 0.75f, .beta = 0.5f, .b_is_weights = true};
    ASSERT_TRUE(t.backend->QuantizedGemm(d_a, d.view, d_c, options).ok()) << what;
    ASSERT_TRUE((*plain)->QuantizedGemm(d_a, d.view, d_want, options).ok()) << what;
    ASSERT_TRUE(t.backend->Synchronize().ok());
    ASSERT_TRUE((*plain)->Synchronize().ok());
    EXPECT_TRUE(BitEqual(Download(d_c), Download(d_want))) << what;
  }
}

}  // namespace
}  // namespace eagle3
