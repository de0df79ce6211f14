// CudaBackend::QuantizedGemm against the CPU reference, for FP8 block-scaled and INT4 group weights:
// M = 1, 4, 16 (one quantized GEMV launch), 17 and 64 (a batched launch of 16-row chunks plus the
// rest), 300 (dequantized into bf16 scratch, then cuBLASLt); slices that start inside a scale block
// or group with their scales as the whole grid or only the touched blocks; slices off the GEMV
// kernels' layout (dequantized path at every M); the dequantized path forced at small M; alpha,
// beta and bias; a GEMV-path call captured into a CUDA graph and the scratch's refusal to grow
// during a capture; LoadLinearWeight keeping a checkpoint's weights quantized on the device; bad
// inputs the CUDA backend refuses. Skipped where no CUDA device is visible.
//
// Tolerances, as max |gpu - ref| / max |ref| over a call's output:
//  - 3e-5 against a bf16 model of the path: the CPU Gemm on `a` rounded to bf16 and on the weights
//    the path multiplies (the GEMV path: the exact f32 weights, whose FP8 block scales and INT4 group
//    scales the kernel applies to fp32 block and group sums; the dequantized path: the f32 weights
//    rounded to bf16). Only fp32 summation order and rounding differ from it; a wrong block, group,
//    nibble or row chunk moves results by whole weights, orders of magnitude above it.
//  - 1e-2 against the exact CPU reference (f32 activations and weights): bf16 rounding of the
//    activations, and of the weights where the path rounds them (relative 2^-9 each, random signs).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/cuda_graph.h"
#include "eagle3/half.h"
#include "eagle3/quantized_weight_view.h"
#include "eagle3/testing/random_quantized_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "linear_weight.h"
#include "parity_util.h"
#include "quantized_gemm_parity.h"
#include "quantized_test_util.h"
#include "quantized_view_util.h"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;

constexpr double kModelTol = 3e-5;
constexpr double kExactTol = 1e-2;

// A copy of `t` (f32) with every element rounded to bf16.
Tensor RoundedToBf16(const Tensor& t) {
  Tensor out = *Tensor::Empty(DType::kF32, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) out.data_as<float>()[i] = Bf16ToFloat(FloatToBf16(t.data_as<float>()[i]));
  return out;
}

class CudaQuantizedGemmTest : public QuantizedGemmParityTest {
 protected:
  // Whether CudaBackend takes the quantized GEMV path for this view and M (the file comment of
  // cuda/cuda_backend_quantized.cc): the model of the FP8 weights depends on it.
  bool GemvPath(const QuantizationConfig& q, const Slice& s, int64_t m) const {
    if (m > gpu_->options().quantized_gemv_max_rows) return false;
    if (q.format == WeightFormat::kInt4Group) return s.col0 % 8 == 0;
    return q.block_out == 128 && q.block_in == 128 && s.col0 % 16 == 0;
  }

  // QuantizedGemm of slice `s` of `m` at each M, against both references.
  void CheckSlice(const QuantizedMatrix& m, const Slice& s, const std::vector<int64_t>& ms) {
    const QuantizedWeightView host = SliceView(m.quantization, m.codes, m.scales, s);
    const DeviceView d = ToDevice(host);
    const QuantizedWeightView& device = d.view;
    const Tensor exact_w = DequantizedSlice(m, s);
    const Tensor bf16_w = RoundedToBf16(exact_w);
    const Tensor bias = Random(Shape{s.rows}, 3);
    const Tensor d_bias = Upload(bias);
    for (const int64_t rows : ms) {
      const Tensor a = Random(Shape{rows, s.cols}, static_cast<uint32_t>(rows));
      const Tensor c0 = Random(Shape{rows, s.rows}, static_cast<uint32_t>(rows + 1));
      const Tensor d_a = Upload(a);
      for (const bool epilogue : {false, true}) {
        const Call call = RunCall(a, d_a, host, device, c0, epilogue, bias, d_bias, s);
        Tensor model = Clone(c0);
        const bool exact_weights = GemvPath(m.quantization, s, rows);
        ASSERT_TRUE(cpu_.Gemm(RoundedToBf16(a), exact_weights ? exact_w : bf16_w, model, call.options).ok()) << call.what;
        EXPECT_LE(parity::RelError(call.got, model), kModelTol) << call.what;
        EXPECT_LE(parity::RelError(call.got, call.exact), kExactTol) << call.what;
      }
    }
  }
};

// 33 and 48: a full 32-row pass and a remainder launch; 64: two 32-row items of one launch.
const std::vector<int64_t> kRows = {1, 4, 16, 17, 32, 33, 48, 64, 300};

TEST_F(CudaQuantizedGemmTest, Fp8MatchesTheCpuReference) {
  const QuantizedMatrix m = RandomQuantizedMatrix(DeepseekV3Fp8Quantization(), 320, 512, 21);
  CheckSlice(m, Slice{0, 320, 0, 512, false}, kRows);
  CheckSlice(m, Slice{64, 200, 144, 352, true}, kRows);   // starts inside block (0, 1)
  CheckSlice(m, Slice{100, 120, 8, 300, false}, {1, 17});  // col0 % 16 != 0: dequantized at every M
}

TEST_F(CudaQuantizedGemmTest, Fp8OddBlocksAreDequantized) {
  QuantizationConfig q = DeepseekV3Fp8Quantization();
  q.block_out = 24;
  q.block_in = 40;
  const QuantizedMatrix m = RandomQuantizedMatrix(q, 100, 130, 22);
  CheckSlice(m, Slice{30, 50, 16, 90, true}, {1, 64});
}

TEST_F(CudaQuantizedGemmTest, Int4MatchesTheCpuReference) {
  const QuantizedMatrix m = RandomQuantizedMatrix(KimiK2ThinkingInt4Quantization(), 256, 512, 23);
  CheckSlice(m, Slice{0, 256, 0, 512, false}, kRows);
  CheckSlice(m, Slice{8, 200, 40, 384, true}, kRows);     // column 40: inside group 1
  CheckSlice(m, Slice{8, 100, 12, 300, true}, {1, 17});   // column 12 inside a word: dequantized
}

TEST_F(CudaQuantizedGemmTest, CapturedGemvPathReplays) {
  const QuantizedMatrix m = RandomQuantizedMatrix(DeepseekV3Fp8Quantization(), 256, 256, 24);
  const Slice s{0, 256, 0, 256, false};
  const DeviceView d = ToDevice(SliceView(m.quantization, m.codes, m.scales, s));
  const QuantizedWeightView& w = d.view;
  Tensor d_a = Upload(Random(Shape{20, 256}, 5));
  Tensor d_c = Upload(Random(Shape{20, 256}, 6));
  auto graph = cuda::CudaGraph::Capture(gpu_->stream(), [&] { return gpu_->QuantizedGemm(d_a, w, d_c, kWeightsGemm); });
  ASSERT_TRUE(graph.ok()) << graph.status();
  const Tensor a = Random(Shape{20, 256}, 7);
  ASSERT_TRUE(gpu_->Copy(a, d_a).ok());
  ASSERT_TRUE((*graph)->Launch(gpu_->stream()).ok());
  const Tensor got = Download(d_c);
  Tensor want = *Tensor::Zeros(DType::kF32, Shape{20, 256});
  ASSERT_TRUE(cpu_.Gemm(RoundedToBf16(a), DequantizedSlice(m, s), want, kWeightsGemm).ok());
  EXPECT_LE(parity::RelError(got, want), kModelTol);
}

TEST_F(CudaQuantizedGemmTest, DequantScratchDoesNotGrowDuringCapture) {
  const QuantizedMatrix m = RandomQuantizedMatrix(KimiK2ThinkingInt4Quantization(), 64, 256, 25);
  const Slice s{0, 64, 0, 256, false};
  const DeviceView d = ToDevice(SliceView(m.quantization, m.codes, m.scales, s));
  const QuantizedWeightView& w = d.view;
  Tensor d_a = Upload(Random(Shape{100, 256}, 8));
  Tensor d_c = Upload(Random(Shape{100, 64}, 9));
  auto graph = cuda::CudaGraph::Capture(gpu_->stream(), [&] { return gpu_->QuantizedGemm(d_a, w, d_c, {}); });
  ASSERT_FALSE(graph.ok());
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kFailedPrecondition) << graph.status();
  EXPECT_THAT(graph.status().message(), HasSubstr("QuantizedGemm"));
  // Outside a capture the scratch is allocated; a capture may then use it.
  ASSERT_TRUE(gpu_->QuantizedGemm(d_a, w, d_c, {}).ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  graph = cuda::CudaGraph::Capture(gpu_->stream(), [&] { return gpu_->QuantizedGemm(d_a, w, d_c, {}); });
  EXPECT_TRUE(graph.ok()) << graph.status();
}

TEST_F(CudaQuantizedGemmTest, RefusesWhatTheCudaBackendDoesNotTake) {
  const QuantizedMatrix m = RandomQuantizedMatrix(KimiK2ThinkingInt4Quantization(), 64, 256, 26);
  const Slice s{0, 64, 0, 256, false};
  const Tensor d_codes = Upload(m.codes), d_scales = Upload(m.scales);
  const Tensor d_f32_scales = Upload(F32Copy(m.scales));
  const Tensor d_a = Upload(Random(Shape{2, 256}, 10));
  Tensor d_c = Upload(Random(Shape{2, 64}, 11));
  QuantizedWeightView w = SliceView(m.quantization, d_codes, d_f32_scales, s);
  absl::Status status = gpu_->QuantizedGemm(d_a, w, d_c, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("w.scales")) << status;
  w = SliceView(m.quantization, m.codes, m.scales, s);  // host memory
  status = gpu_->QuantizedGemm(d_a, w, d_c, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("w.codes")) << status;
  w = SliceView(m.quantization, d_codes, d_scales, s);
  const Tensor d_a_f16 = Upload(*Tensor::Zeros(DType::kF16, Shape{2, 256}));
  status = gpu_->QuantizedGemm(d_a_f16, w, d_c, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("a ")) << status;
}

// The device tiler against the host one (CpuBackend::TileQuantizedCodes, the reference), byte for
// byte over the whole tiles (filled with a marker first, so that a byte the kernel leaves unwritten
// shows): slices on the fast path (whole aligned 16-byte chunks) and off it (fp8 from column 48, a
// partial last step and 16-row group; fp8 in 24 x 40 blocks; int4 from columns 8 and 24, rows of an
// odd word count, one row). Then QuantizedGemm on the tiled view, bit for bit the row-major view's
// result on every path: the GEMV (one launch, a batched launch of 32-row items plus the rest), the
// dequantizing path (past quantized_gemv_max_rows, and at every M for the odd blocks).
TEST_F(CudaQuantizedGemmTest, TileQuantizedCodesMatchesTheHostTiler) {
  struct Case {
    QuantizationConfig quantization;
    int64_t n, k;
    Slice slice;
  };
  QuantizationConfig odd = DeepseekV3Fp8Quantization();
  odd.block_out = 24;
  odd.block_in = 40;
  const Case cases[] = {
      {DeepseekV3Fp8Quantization(), 256, 1024, {0, 256, 0, 1024, false}},
      {DeepseekV3Fp8Quantization(), 256, 1024, {5, 37, 48, 300, true}},
      {DeepseekV3Fp8Quantization(), 256, 1024, {7, 1, 16, 200, false}},
      {odd, 100, 320, {10, 50, 64, 200, true}},
      {KimiK2ThinkingInt4Quantization(), 64, 512, {0, 64, 0, 512, false}},
      {KimiK2ThinkingInt4Quantization(), 64, 512, {3, 23, 8, 100, true}},
      {KimiK2ThinkingInt4Quantization(), 64, 512, {40, 9, 24, 35, false}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << WeightFormatName(c.quantization.format) << " " << c.slice);
    const QuantizedMatrix m = RandomQuantizedMatrix(c.quantization, c.n, c.k, 40);
    const QuantizedWeightView host = SliceView(m.quantization, m.codes, m.scales, c.slice);
    const DeviceView d = ToDevice(host);
    const Shape shape = WarpTiledCodesShape(host);
    Tensor want = *Tensor::Empty(host.codes.dtype(), shape);
    ASSERT_TRUE(cpu_.TileQuantizedCodes(host, want).ok());
    Tensor d_tiles = *Tensor::Empty(host.codes.dtype(), shape, gpu_->allocator());
    ASSERT_EQ(cudaMemset(d_tiles.data(), 0xab, d_tiles.nbytes()), cudaSuccess);
    // cudaMemset is asynchronous and the backend's stream is non-blocking: without this wait the
    // marker could land after the tiler's stores.
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const absl::Status status = gpu_->TileQuantizedCodes(d.view, d_tiles);
    ASSERT_TRUE(status.ok()) << status;
    const Tensor got = Download(d_tiles);
    ASSERT_EQ(got.nbytes(), want.nbytes());
    const auto* g = static_cast<const uint8_t*>(got.data());
    const auto* w = static_cast<const uint8_t*>(want.data());
    for (size_t i = 0; i < want.nbytes(); ++i) ASSERT_EQ(g[i], w[i]) << "byte " << i;

    const QuantizedWeightView tiled = WithWarpTiledCodes(d.view, d_tiles);
    ASSERT_TRUE(tiled.Check("test").ok());
    // The row-major codes with rows padded to 16 bytes, as loads place them, so that the row-major
    // product takes the path the tiled one takes (an unpadded slice of 300 columns would be
    // dequantized, whose bf16 weights round differently from the GEMV's exact e4m3 products).
    const int64_t align = 16 / static_cast<int64_t>(DTypeSize(host.codes.dtype()));
    const int64_t ld = (host.codes.dim(1) + align - 1) / align * align;
    Tensor d_padded = *Tensor::Empty(host.codes.dtype(), Shape{host.codes.dim(0), ld}, gpu_->allocator());
    const TensorView padded_codes = d_padded.view().Narrow(1, 0, host.codes.dim(1));
    ASSERT_TRUE(gpu_->Copy(Contiguous(host.codes), padded_codes).ok());
    QuantizedWeightView row_major = d.view;
    row_major.codes = padded_codes;
    for (const int64_t rows : {int64_t{2}, int64_t{40}, int64_t{300}}) {
      SCOPED_TRACE(testing::Message() << "M " << rows);
      const Tensor d_a = Upload(Random(Shape{rows, c.slice.cols}, 10));
      const Tensor c0 = Random(Shape{rows, c.slice.rows}, 11);
      const Tensor d_bias = Upload(Random(Shape{c.slice.rows}, 12));
      GemmOptions options = kWeightsGemm;
      options.beta = 0.5f;
      options.bias = &d_bias.view();
      Tensor d_row_major = Upload(c0), d_tiled = Upload(c0);
      ASSERT_TRUE(gpu_->QuantizedGemm(d_a, row_major, d_row_major, options).ok());
      const absl::Status tiled_status = gpu_->QuantizedGemm(d_a, tiled, d_tiled, options);
      ASSERT_TRUE(tiled_status.ok()) << tiled_status;
      const Tensor want_c = Download(d_row_major), got_c = Download(d_tiled);
      for (int64_t i = 0; i < want_c.numel(); ++i) {
        ASSERT_EQ(got_c.data_as<float>()[i], want_c.data_as<float>()[i]) << "element " << i;
      }
    }
  }
}

// The dequantized path at every M (quantized_gemv_max_rows 0): at M <= 8 the bf16 GEMV of Gemm
// multiplies the scratch.
class CudaQuantizedGemmDequantizedTest : public CudaQuantizedGemmTest {
 protected:
  cuda::CudaBackendOptions Options() const override {
    cuda::CudaBackendOptions options;
    options.quantized_gemv_max_rows = 0;
    return options;
  }
};

TEST_F(CudaQuantizedGemmDequantizedTest, BothFormatsMatchTheCpuReference) {
  const QuantizedMatrix fp8 = RandomQuantizedMatrix(DeepseekV3Fp8Quantization(), 200, 384, 27);
  CheckSlice(fp8, Slice{64, 100, 144, 200, true}, {1, 4, 16});
  const QuantizedMatrix int4 = RandomQuantizedMatrix(KimiK2ThinkingInt4Quantization(), 200, 384, 28);
  CheckSlice(int4, Slice{8, 100, 40, 300, true}, {1, 4, 16});
}

// LoadLinearWeight on the CUDA backend keeps both formats quantized (codes rows on 16-byte
// boundaries) and applies them as the CPU backend applies the dense weights.
class CudaLinearWeightTest : public parity::ParityTest,
                             public ::testing::WithParamInterface<std::pair<std::string, QuantizationConfig>> {};

TEST_P(CudaLinearWeightTest, KeepsWeightsQuantizedAndAppliesThem) {
  const DeepseekV2Config config = QuantTestConfig(GetParam().second);
  ScopedTempDir dir, plain_dir;
  WriteQuantTestCheckpoint(config, dir.path(), plain_dir.path());
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const std::vector<WeightSpec> specs = DeepseekV2Weights(config);
  const std::vector<StoredForm> forms = StoredForms(config, specs);
  ASSERT_TRUE(gpu_->keeps_quantized(config.quantization.format));
  int checked = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (forms[i] == StoredForm::kPlain) continue;
    for (int rank : {0, 3}) {
      const ShardSpec shard = specs[i].ForRank(8, rank);
      auto dense = LoadLinearWeight(cpu_, **checkpoint, specs[i], forms[i], config.quantization, shard);
      if (!dense.ok()) continue;  // tp 8 does not divide this tensor's split dim
      const std::string what = specs[i].name + " rank " + std::to_string(rank);
      auto kept = LoadLinearWeight(*gpu_, **checkpoint, specs[i], forms[i], config.quantization, shard,
                                   LinearWeightLoad{.dense_dtype = DType::kBF16});
      ASSERT_TRUE(kept.ok()) << what << ": " << kept.status();
      ASSERT_TRUE(kept->quantized()) << what;
      const TensorView& codes = kept->quantized_view().codes;
      EXPECT_EQ(codes.stride(0) * static_cast<int64_t>(DTypeSize(codes.dtype())) % 16, 0) << what;
      for (int64_t rows : {1, 20}) {
        const Tensor a = Random(Shape{rows, dense->cols()}, static_cast<uint32_t>(i + rows));
        Tensor want = *Tensor::Zeros(DType::kF32, Shape{rows, dense->rows()});
        ASSERT_TRUE(dense->Apply(cpu_, a, want).ok());
        const Tensor d_a = Upload(a);
        Tensor d_c = Upload(want);
        ASSERT_TRUE(kept->Apply(*gpu_, d_a, d_c).ok()) << what;
        EXPECT_LE(parity::RelError(Download(d_c), want), kExactTol) << what << " M " << rows;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaLinearWeightTest, ::testing::ValuesIn(TestQuantizations()),
                         [](const auto& info) { return info.param.first; });

}  // namespace
}  // namespace eagle3
