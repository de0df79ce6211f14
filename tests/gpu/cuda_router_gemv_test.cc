// f32 activations against bf16 weights with the activations kept f32 (GemmOptions::
// keep_f32_activations; cuda/gemv_ops.h GemvActivations::kKeepF32): a MoE router kept in bf16, on
// CudaBackend::Gemm / BatchedGemm against the CPU reference's same mode (which widens the weights
// and multiplies the unrounded activations). Router shapes (V3 256 x 7168, K2 384 x 7168) at 1, 8
// and 16 rows; K not a multiple of 8 and a single output column; the cluster K split (the f32
// router's split for the shape); the paths past the GEMV (more rows, misaligned weights,
// small_m_gemv off) through the f32 copy of the weights; determinism; capture into a CUDA graph; the
// launcher's refusals.
//
// Tolerance (max |gpu - cpu| / max |cpu|) 1e-5, the f32 one: both sides form the same exact
// products, only the summation order differs. Rounding the activations to bf16 instead shows as
// ~1e-3 (NotRoundedAsTheDefaultMixedProductIs checks that the tolerance tells the two apart).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "gemv_ops.h"
#include "gemv_parity.h"
#include "parity_util.h"

namespace eagle3::parity {
namespace {

using cuda::GemvActivations;
using cuda::GemvType;

constexpr double kTol = 1e-5;

class CudaRouterGemvTest : public GemvParityTest {
 protected:
  // bf16 router weights [n, k] in rows ld apart (0: k), NaN past k.
  Weights MakeRouter(int64_t n, int64_t k, uint32_t seed, int64_t ld = 0) {
    return MakeWeights(n, k, DType::kBF16, seed, ld);
  }
  // The product under keep_f32_activations on both backends: the relative error over c's view.
  double Run(GemmCase g, const Weights& w, uint32_t seed) {
    g.keep_f32_activations = true;
    return RunGemm(g, w, seed);
  }
};

// The same on a backend whose GEMV path is off (CudaBackendOptions::small_m_gemv).
class CudaRouterNoGemvTest : public CudaRouterGemvTest {
 protected:
  cuda::CudaBackendOptions Options() const override {
    cuda::CudaBackendOptions options;
    options.small_m_gemv = false;
    return options;
  }
};

// bf16 weights under kKeepF32 split K as f32 weights of the same shape do (the rule was placed on
// the f32 router), unlike bf16 weights with rounded activations, which take the tensor cores from 2
// rows. Pinned for an H200 (132 SMs): the V3 router unsplit at 1 row, 8 ways at 8; K2's 4 ways.
TEST(RouterGemvKSplitTest, SplitsAsF32Weights) {
  for (const int sms : {132, 114, 78}) {
    for (const int64_t n : {int64_t{1}, int64_t{37}, int64_t{256}, int64_t{384}}) {
      for (const int64_t k : {int64_t{1003}, int64_t{7168}, int64_t{7171}}) {
        for (int64_t m = 1; m <= cuda::kGemvMaxRows; ++m) {
          for (const int64_t batch : {int64_t{1}, int64_t{3}}) {
            EXPECT_EQ(cuda::GemvKSplit(GemvType::kBF16, GemvActivations::kKeepF32, m, n, k, batch, sms),
                      cuda::GemvKSplit(GemvType::kF32, GemvActivations::kRoundToBf16, m, n, k, batch, sms))
                << "M " << m << " N " << n << " K " << k << " batch " << batch << " SMs " << sms;
          }
        }
      }
    }
  }
  EXPECT_EQ(cuda::GemvKSplit(GemvType::kBF16, GemvActivations::kKeepF32, 1, 256, 7168, 1, 132), 1);
  EXPECT_EQ(cuda::GemvKSplit(GemvType::kBF16, GemvActivations::kKeepF32, 8, 256, 7168, 1, 132), 8);
  EXPECT_EQ(cuda::GemvKSplit(GemvType::kBF16, GemvActivations::kKeepF32, 8, 384, 7168, 1, 132), 4);
  EXPECT_EQ(cuda::GemvKSplit(GemvType::kBF16, GemvActivations::kRoundToBf16, 8, 256, 7168, 1, 132), 1);
}

// The V3 and K2 routers at decode (1 row), verify (8) and past the GEMV (16: the f32 copy of the
// weights and cuBLASLt), plainly and with a strided, offset a and c, bias, alpha and beta.
TEST_F(CudaRouterGemvTest, RouterShapesMatchCpu) {
  uint32_t seed = 10;
  for (const int64_t n : {int64_t{256}, int64_t{384}}) {
    const Weights w = MakeRouter(n, 7168, seed++);
    for (const int64_t m : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{8}, int64_t{16}}) {
      SCOPED_TRACE(::testing::Message() << "M " << m << " N " << n);
      EXPECT_LE(Run({.m = m}, w, seed++), kTol);
      EXPECT_LE(Run({.m = m, .a_pad = 5, .a_offset = 3, .c_pad = 2, .c_offset = 1, .bias = true, .alpha = 0.5f,
                     .beta = 2.0f},
                    w, seed++),
                kTol);
    }
  }
}

// K not a multiple of 8 (the partial last chunk; rows padded to 16 bytes so that the GEMV takes
// them, the padding NaN), K below one chunk, a single output column, N not a multiple of a block's
// rows; a at an odd offset (staged element by element) and in 16-byte aligned rows (by quads).
TEST_F(CudaRouterGemvTest, EdgeShapesMatchCpu) {
  struct Shape3 {
    int64_t n, k, ld;
  };
  uint32_t seed = 100;
  for (const Shape3& s : {Shape3{1, 7171, 7176}, Shape3{1, 21504, 0}, Shape3{384, 7175, 7176}, Shape3{5, 3, 8},
                          Shape3{33, 1003, 1008}, Shape3{1, 1, 8}}) {
    const Weights w = MakeRouter(s.n, s.k, seed++, s.ld);
    ASSERT_TRUE(cuda::GemvWeightsAligned(w.gpu.data(), GemvType::kBF16, w.gpu.stride(0), 0, s.n, 1));
    for (const int64_t m : {int64_t{1}, int64_t{3}, cuda::kGemvMaxRows, cuda::kGemvMaxRows + 1}) {
      const int64_t aligned_pad = (s.k + 3) / 4 * 4 - s.k + 4;
      for (const auto& [a_pad, a_offset] : {std::pair<int64_t, int64_t>{5, 3}, {aligned_pad, 0}}) {
        SCOPED_TRACE(::testing::Message() << "M " << m << " N " << s.n << " K " << s.k << " a offset " << a_offset);
        EXPECT_LE(Run({.m = m, .a_pad = a_pad, .a_offset = a_offset, .c_pad = 3, .c_offset = 1, .bias = true,
                       .alpha = 0.75f, .beta = 0.5f},
                      w, seed++),
                  kTol);
      }
    }
  }
}

// Shapes that split K over a cluster on this device (asserted), the last part's tail chunk partial
// where K is ragged: as the CPU.
TEST_F(CudaRouterGemvTest, KSplitShapesMatchCpu) {
  struct Case {
    int64_t n, k, ld, m;
  };
  uint32_t seed = 200;
  for (const Case& c : {Case{256, 7168, 0, 8}, Case{256, 7168, 0, 4}, Case{384, 7168, 0, 8},
                        Case{37, 7171, 7176, 1}, Case{37, 7171, 7176, 5}}) {
    SCOPED_TRACE(::testing::Message() << "M " << c.m << " N " << c.n << " K " << c.k);
    ExpectKSplitMatchesCpu(c.m, MakeRouter(c.n, c.k, seed++, c.ld), true, kTol, seed);
    seed += 2;
  }
}

// Through the launcher: kKeepF32 matches the exact f32 products within the f32 tolerance, where
// the default mixed product (kRoundToBf16, the tensor cores at 4 rows) misses it by the activations'
// bf16 rounding: the tolerance tells the modes apart.
TEST_F(CudaRouterGemvTest, NotRoundedAsTheDefaultMixedProductIs) {
  const int64_t m = 4, n = 256, k = 7168;
  const Weights w = MakeRouter(n, k, 300);
  const Tensor a = Random(Shape{m, k}, 301);
  const Tensor a_gpu = Upload(a);
  Tensor want = *Tensor::Empty(DType::kF32, Shape{m, n});
  ASSERT_TRUE(cpu_.Gemm(a, w.cpu, want, kF32ActivationsWeightsGemm).ok());
  for (const GemvActivations mode : {GemvActivations::kKeepF32, GemvActivations::kRoundToBf16}) {
    Tensor c = *Tensor::Empty(DType::kF32, Shape{m, n}, gpu_->allocator());
    ASSERT_EQ(cuda::LaunchGemv(a_gpu.data(), GemvType::kF32, k, 0, w.gpu.data(), GemvType::kBF16, k, 0, mode,
                               c.data_as<float>(), n, 0, nullptr, 1, m, n, k, 1.0f, 0.0f, false, gpu_->stream()),
              cudaSuccess);
    const double error = RelError(Download(c), want);
    if (mode == GemvActivations::kKeepF32) {
      EXPECT_LE(error, kTol);
    } else {
      EXPECT_GT(error, 10 * kTol) << "rounding the activations should show";
    }
  }
}

// The same product twice gives the same bits (the split router at 8 rows included).
TEST_F(CudaRouterGemvTest, Deterministic) {
  const Weights w = MakeRouter(256, 7168, 400);
  for (const int64_t m : {int64_t{1}, int64_t{8}}) {
    const Tensor a = Upload(Random(Shape{m, 7168}, 401));
    Tensor c1 = *Tensor::Empty(DType::kF32, Shape{m, 256}, gpu_->allocator());
    Tensor c2 = *Tensor::Empty(DType::kF32, Shape{m, 256}, gpu_->allocator());
    ASSERT_TRUE(gpu_->Gemm(a, w.gpu, c1, kF32ActivationsWeightsGemm).ok());
    ASSERT_TRUE(gpu_->Gemm(a, w.gpu, c2, kF32ActivationsWeightsGemm).ok());
    const Tensor h1 = Download(c1), h2 = Download(c2);
    EXPECT_EQ(std::memcmp(h1.data(), h2.data(), h1.nbytes()), 0) << "M " << m;
  }
}

// BatchedGemm under the flag: up to kGemvMaxRows rows in the one batched GEMV launch, beyond them
// item by item; with a bias, alpha and beta.
TEST_F(CudaRouterGemvTest, BatchedMatchesCpu) {
  const int64_t items = 3, n = 24, k = 1000;
  for (const int64_t m : {int64_t{1}, int64_t{5}, cuda::kGemvMaxRows + 1}) {
    SCOPED_TRACE(::testing::Message() << "M " << m);
    const Tensor a = Random(Shape{items, m, k}, 500), b = Stored(Random(Shape{items, n, k}, 501, 0.03f), DType::kBF16);
    const Tensor bias = Random(Shape{n}, 502), c_start = Random(Shape{items, m, n}, 503);
    const Tensor a_gpu = Upload(a), b_gpu = Upload(b), bias_gpu = Upload(bias), c_gpu = Upload(c_start);
    Tensor c_cpu = Values(c_start, false);
    const TensorView bias_gpu_view = bias_gpu.view(), bias_cpu_view = bias.view();
    GemmOptions options = kF32ActivationsWeightsGemm;
    options.alpha = 0.5f;
    options.beta = 2.0f;
    options.bias = &bias_gpu_view;
    ASSERT_TRUE(gpu_->BatchedGemm(a_gpu, b_gpu, c_gpu, options).ok());
    options.bias = &bias_cpu_view;
    ASSERT_TRUE(cpu_.BatchedGemm(a, b, c_cpu, options).ok());
    EXPECT_LE(RelError(Download(c_gpu), c_cpu), kTol);
  }
}

// Calls the GEMV does not take multiply the f32 copy of the weights on cuBLASLt, with the same
// result: weight rows off a 16-byte boundary, and (below) a backend with small_m_gemv off.
TEST_F(CudaRouterGemvTest, UnalignedWeightsMatchCpu) {
  const int64_t n = 96, k = 520;
  const Tensor b = Random(Shape{1 + n * (k + 1)}, 600, 0.05f);
  Weights w{Upload(Stored(b, DType::kBF16)), Values(b, true), {}, {}};
  w.gpu = At(w.gpu_storage, 1, Shape{n, k}, Shape{k + 1, 1});
  w.cpu = At(w.cpu_storage, 1, Shape{n, k}, Shape{k + 1, 1});
  EXPECT_FALSE(cuda::GemvWeightsAligned(w.gpu.data(), GemvType::kBF16, k + 1, 0, n, 1));
  for (const int64_t m : {int64_t{1}, int64_t{4}}) EXPECT_LE(Run({.m = m}, w, 601), kTol) << "M " << m;
}

TEST_F(CudaRouterNoGemvTest, RouterMatchesCpu) {
  const Weights w = MakeRouter(256, 7168, 602);
  for (const int64_t m : {int64_t{1}, int64_t{8}}) {
    EXPECT_LE(Run({.m = m, .bias = true, .beta = 0.5f}, w, 603), kTol) << "M " << m;
  }
}

// Up to kGemvMaxRows rows the mode needs no scratch: a backend without any captures the router's
// product into a CUDA graph with no eager step first, and the graph replays it. More rows need the
// f32 copy of the weights, which capture refuses to allocate (FailedPrecondition naming it).
TEST_F(CudaRouterGemvTest, CapturedWithoutScratchUpToTheGemvRows) {
  auto created = cuda::CudaBackend::Create({.activation_scratch_bytes = 0, .small_m_gemv = true});
  ASSERT_TRUE(created.ok()) << created.status();
  cuda::CudaBackend& gpu = **created;
  const int64_t n = 256, k = 7168;
  const Tensor b = Stored(Random(Shape{n, k}, 700, 0.01f), DType::kBF16);
  Tensor b_gpu = *Tensor::Empty(DType::kBF16, b.shape(), gpu.allocator());
  ASSERT_TRUE(gpu.Copy(b, b_gpu).ok());
  for (const int64_t m : {cuda::kGemvMaxRows, cuda::kGemvMaxRows + 1}) {
    SCOPED_TRACE(::testing::Message() << "M " << m);
    const Tensor a = Random(Shape{m, k}, 701);
    Tensor a_gpu = *Tensor::Empty(DType::kF32, a.shape(), gpu.allocator());
    Tensor c_gpu = *Tensor::Empty(DType::kF32, Shape{m, n}, gpu.allocator());
    ASSERT_TRUE(gpu.Copy(a, a_gpu).ok());
    ASSERT_TRUE(gpu.Synchronize().ok());
    const absl::Status captured = CaptureAndReplayGemm(gpu, a_gpu, b_gpu, c_gpu, kF32ActivationsWeightsGemm);
    if (m > cuda::kGemvMaxRows) {
      EXPECT_EQ(captured.code(), absl::StatusCode::kFailedPrecondition) << captured;
      EXPECT_NE(captured.message().find("f32 copy of bf16 weights"), std::string::npos) << captured;
      continue;
    }
    ASSERT_TRUE(captured.ok()) << captured;
    Tensor got = *Tensor::Empty(DType::kF32, Shape{m, n});
    ASSERT_TRUE(gpu.Copy(c_gpu, got).ok());
    ASSERT_TRUE(gpu.Synchronize().ok());
    Tensor want = *Tensor::Empty(DType::kF32, Shape{m, n});
    ASSERT_TRUE(cpu_.Gemm(a, b, want, kF32ActivationsWeightsGemm).ok());
    EXPECT_LE(RelError(got, want), kTol);
  }
}

// The launcher's refusals of the mode need no device (it checks before launching): bf16
// activations, weights off a 16-byte boundary, weight rows not 16-byte multiples apart.
TEST(RouterGemvLauncherTest, RefusesOutOfContractArguments) {
  alignas(16) static float a[64], c[64];
  alignas(16) static uint16_t b[128];
  const auto launch = [&](const void* a_ptr, GemvType a_type, const void* b_ptr, int64_t ldb, int64_t n) {
    return cuda::LaunchGemv(a_ptr, a_type, 8, 0, b_ptr, GemvType::kBF16, ldb, 0, GemvActivations::kKeepF32, c, 8, 0,
                            nullptr, 1, 2, n, 8, 1.0f, 0.0f, false, nullptr);
  };
  EXPECT_EQ(launch(a, GemvType::kBF16, b, 8, 2), cudaErrorInvalidValue);   // bf16 a under kKeepF32
  EXPECT_EQ(launch(a, GemvType::kF32, b + 1, 8, 2), cudaErrorInvalidValue);  // b misaligned
  EXPECT_EQ(launch(a, GemvType::kF32, b, 12, 2), cudaErrorInvalidValue);     // 24-byte rows
  EXPECT_EQ(launch(a, GemvType::kF32, nullptr, 8, 2), cudaErrorInvalidValue);  // no b
}

}  // namespace
}  // namespace eagle3::parity
