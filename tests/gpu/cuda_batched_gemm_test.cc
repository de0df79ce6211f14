// CudaBackend::BatchedGemm (one strided-batched cuBLASLt call) against the CPU reference's per-item
// Gemm loop, on the layouts the absorbed MLA path uses: head-major views of [T, heads * d] rows
// (items interleaved along each row) and a row block of every head of kv_b (W_UV).
//
// Tolerances (max |gpu - cpu| / max |cpu|): f32 operands 1e-5 (summation order only: no TF32);
// f32 activations x bf16 weights 2e-5 against the CPU on bf16(a) and the f32 value of b (every
// product exact in fp32 on both sides).
#include <cstdint>
#include <cstring>
#include <vector>

#include "eagle3/half.h"
#include "eagle3/tensor_convert.h"
#include "parity_util.h"

namespace eagle3::parity {
namespace {

class CudaBatchedGemmTest : public ParityTest {
 protected:
  // [n, rows, cols] head-major view of columns [col, col + cols) of the n heads of a [rows, n * d]
  // tensor.
  static TensorView HeadMajor(const Tensor& t, int64_t n, int64_t d, int64_t col, int64_t cols) {
    auto* data = static_cast<char*>(t.data()) + col * static_cast<int64_t>(DTypeSize(t.dtype()));
    return TensorView(data, t.dtype(), Shape{n, t.shape()[0], cols}, Shape{d, t.shape()[1], 1}, t.device());
  }
  static Tensor ToBf16(const Tensor& f32) {
    Tensor out = *Tensor::Empty(DType::kBF16, f32.shape());
    EXPECT_TRUE(ConvertTensor(f32, out).ok());
    return out;
  }
  static Tensor Clone(const Tensor& t) {
    Tensor out = *Tensor::Empty(t.dtype(), t.shape());
    std::memcpy(out.data(), t.data(), static_cast<size_t>(t.numel()) * DTypeSize(t.dtype()));
    return out;
  }
  // The weights the GPU gets (bf16 or as they are) and what the CPU multiplies by (their f32 value).
  static Tensor Stored(const Tensor& f32, bool bf16) { return bf16 ? ToBf16(f32) : Clone(f32); }
  static Tensor Widened(const Tensor& f32, bool bf16) { return bf16 ? RoundedToBf16(f32) : Clone(f32); }
  static Tensor RoundedToBf16(const Tensor& f32) {
    Tensor out = *Tensor::Empty(DType::kF32, f32.shape());
    for (int64_t i = 0; i < f32.numel(); ++i) {
      out.data_as<float>()[i] = Bf16ToFloat(FloatToBf16(f32.data_as<float>()[i]));
    }
    return out;
  }

  // The W_UK product of the absorbed path: q [T, heads * qk] (first `nope` columns of each head) x
  // w [heads, latent, nope] -> q_lat [T, heads * width] (first `latent` columns of each head).
  double WukParity(int64_t t, int64_t heads, bool bf16_weights, float beta) {
    const int64_t qk = 192, nope = 128, latent = 512, width = 576;
    const Tensor q = Random(Shape{t, heads * qk}, 1);
    const Tensor w = Random(Shape{heads, latent, nope}, 2, 0.05f);
    const Tensor c0 = Random(Shape{t, heads * width}, 3);
    const Tensor q_gpu = Upload(q);
    const Tensor w_gpu = Upload(Stored(w, bf16_weights));
    const Tensor c_gpu = Upload(c0);
    const Tensor q_cpu = Widened(q, bf16_weights);
    const Tensor w_cpu = Widened(w, bf16_weights);
    Tensor c_cpu = *Tensor::Empty(DType::kF32, c0.shape());
    EXPECT_TRUE(cpu_.Copy(c0, c_cpu).ok());
    const GemmOptions options{1.0f, beta, nullptr};
    const absl::Status gpu = gpu_->BatchedGemm(HeadMajor(q_gpu, heads, qk, 0, nope), w_gpu,
                                               HeadMajor(c_gpu, heads, width, 0, latent), options);
    EXPECT_TRUE(gpu.ok()) << gpu;
    const absl::Status cpu = cpu_.BatchedGemm(HeadMajor(q_cpu, heads, qk, 0, nope), w_cpu,
                                              HeadMajor(c_cpu, heads, width, 0, latent), options);
    EXPECT_TRUE(cpu.ok()) << cpu;
    const Tensor got = Download(c_gpu);
    // Columns beyond each head's `latent` (the rope part) must be untouched.
    for (int64_t r = 0; r < t; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t j = latent; j < width; ++j) {
          const int64_t i = r * heads * width + h * width + j;
          EXPECT_EQ(got.data_as<float>()[i], c0.data_as<float>()[i]) << "row " << r << " head " << h;
        }
      }
    }
    return RelError(got, c_cpu);
  }
};

TEST_F(CudaBatchedGemmTest, WukF32MatchesCpuPerHeadLoop) {
  for (int64_t t : {1, 7, 64}) {
    for (int64_t heads : {8, 16, 128}) {
      SCOPED_TRACE(testing::Message() << "T " << t << " heads " << heads);
      EXPECT_LE(WukParity(t, heads, false, 0.0f), 1e-5);
    }
  }
}

TEST_F(CudaBatchedGemmTest, WukBf16WeightsMatchCpuOnRoundedActivations) {
  for (int64_t t : {1, 16, 64}) {
    SCOPED_TRACE(testing::Message() << "T " << t);
    EXPECT_LE(WukParity(t, 16, true, 0.0f), 2e-5);
    EXPECT_LE(WukParity(t, 16, true, 0.5f), 2e-5);  // c read back (beta != 0)
  }
}

// W_UV: o_lat [T, heads * latent] x rows [h (nope + vdim) + nope, + vdim) of kv_b -> attn [T, heads * vdim].
TEST_F(CudaBatchedGemmTest, WuvStridedWeightBlockMatchesCpu) {
  const int64_t heads = 16, nope = 128, vdim = 128, latent = 512;
  for (bool bf16 : {false, true}) {
    for (int64_t t : {1, 33}) {
      SCOPED_TRACE(testing::Message() << "bf16 " << bf16 << " T " << t);
      const Tensor o = Random(Shape{t, heads * latent}, 4);
      const Tensor kv_b = Random(Shape{heads * (nope + vdim), latent}, 5, 0.05f);
      const Tensor o_gpu = Upload(o), kv_gpu = Upload(Stored(kv_b, bf16));
      const Tensor o_cpu = Widened(o, bf16), kv_cpu = Widened(kv_b, bf16);
      auto w_uv = [&](const Tensor& kv) {
        auto* data = static_cast<char*>(kv.data()) + nope * latent * static_cast<int64_t>(DTypeSize(kv.dtype()));
        return TensorView(data, kv.dtype(), Shape{heads, vdim, latent}, Shape{(nope + vdim) * latent, latent, 1},
                          kv.device());
      };
      Tensor out_gpu = *Tensor::Empty(DType::kF32, Shape{t, heads * vdim}, gpu_->allocator());
      Tensor out_cpu = *Tensor::Empty(DType::kF32, Shape{t, heads * vdim});
      const absl::Status gpu = gpu_->BatchedGemm(HeadMajor(o_gpu, heads, latent, 0, latent), w_uv(kv_gpu),
                                                 HeadMajor(out_gpu, heads, vdim, 0, vdim), {});
      ASSERT_TRUE(gpu.ok()) << gpu;
      ASSERT_TRUE(cpu_.BatchedGemm(HeadMajor(o_cpu, heads, latent, 0, latent), w_uv(kv_cpu),
                                   HeadMajor(out_cpu, heads, vdim, 0, vdim), {})
                      .ok());
      EXPECT_LE(RelError(Download(out_gpu), out_cpu), bf16 ? 2e-5 : 1e-5);
    }
  }
}

// A bias takes Backend's per-item path on the GPU: same results as the CPU.
TEST_F(CudaBatchedGemmTest, BiasIsAddedToEveryItem) {
  const int64_t items = 3, m = 5, n = 24, k = 40;
  const Tensor a = Random(Shape{items, m, k}, 6), b = Random(Shape{items, n, k}, 7), bias = Random(Shape{n}, 8);
  const Tensor a_gpu = Upload(a), b_gpu = Upload(b), bias_gpu = Upload(bias);
  Tensor c_gpu = *Tensor::Empty(DType::kF32, Shape{items, m, n}, gpu_->allocator());
  Tensor c_cpu = *Tensor::Empty(DType::kF32, Shape{items, m, n});
  const TensorView bias_gpu_view = bias_gpu.view(), bias_cpu_view = bias.view();
  ASSERT_TRUE(gpu_->BatchedGemm(a_gpu, b_gpu, c_gpu, {1.0f, 0.0f, &bias_gpu_view}).ok());
  ASSERT_TRUE(cpu_.BatchedGemm(a, b, c_cpu, {1.0f, 0.0f, &bias_cpu_view}).ok());
  EXPECT_LE(RelError(Download(c_gpu), c_cpu), 1e-5);
}

TEST_F(CudaBatchedGemmTest, BadOperandsAreRefusedNamingThem) {
  const Tensor a = Upload(Random(Shape{4, 2, 8}, 9)), b = Upload(Random(Shape{4, 3, 8}, 10));
  Tensor c = *Tensor::Empty(DType::kF32, Shape{4, 2, 3}, gpu_->allocator());
  // bf16 activations with f32 weights: refused as Gemm refuses them.
  const Tensor a_bf16 = Upload(ToBf16(Random(Shape{4, 2, 8}, 11)));
  const absl::Status types = gpu_->BatchedGemm(a_bf16, b, c, {});
  EXPECT_EQ(types.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(types.message().find("bf16"), std::string::npos) << types;
  // Items of c overlapping one another.
  const TensorView overlapping(c.data(), DType::kF32, Shape{4, 2, 3}, Shape{1, 3, 1}, c.device());
  const absl::Status overlap = gpu_->BatchedGemm(a, b, overlapping, {});
  EXPECT_EQ(overlap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(overlap.message().find("overlap"), std::string::npos) << overlap;
}

}  // namespace
}  // namespace eagle3::parity
