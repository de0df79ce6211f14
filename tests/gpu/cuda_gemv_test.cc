// The GEMV path of CudaBackend::Gemm / BatchedGemm (M <= kGemvMaxRows, cuda/gemv_ops.h)
// against the CPU reference, with M = kGemvMaxRows + 1 and 16 (cuBLASLt) alongside for contrast:
// decode shapes of DeepSeek-V2 / V3 (K up to 21504, N up to 7168), ragged K and N, row-strided and
// odd-offset activations and outputs, bias, alpha and beta (beta 0 over a NaN-filled c: never
// read), head-major batched layouts of the absorbed MLA path, unaligned weights (the cuBLASLt
// fallback), determinism, and capture into a CUDA graph with no activation scratch.
//
// Tolerances (max |gpu - cpu| / max |cpu|): f32 operands 1e-5 (summation order only: no TF32);
// bf16 weights 2e-5 against the CPU on bf16(a) and the f32 value of b (every product exact in fp32
// on both sides, only the summation order differs).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gemv_ops.h"
#include "gemv_parity.h"
#include "parity_util.h"

namespace eagle3::parity {
namespace {

using cuda::kGemvMaxRows;

constexpr double kTolF32 = 1e-5;
constexpr double kTolBf16 = 2e-5;

class CudaGemvTest : public GemvParityTest {};

// Decode shapes: V2 TP8 rank (kv_a 576 x 5120, q_b 3072 x 1536, W_UK-sized 512 x 128, 576 x 512),
// V3 (7168 x 7168, the draft's fc 7168 x 21504) and a single output column.
TEST_F(CudaGemvTest, DecodeShapesMatchCpu) {
  struct Nk {
    int64_t n, k;
  };
  const std::vector<Nk> shapes = {{1, 128},     {512, 128},  {576, 512},    {576, 5120},
                                  {3072, 1536}, {7168, 7168}, {1, 21504}, {7168, 21504}};
  uint32_t seed = 100;
  for (const DType b_type : {DType::kBF16, DType::kF32}) {
    for (const Nk& s : shapes) {
      if (b_type == DType::kF32 && s.n * s.k > 7168 * 7168) continue;  // f32 stays within 200 MiB
      const Weights w = MakeWeights(s.n, s.k, b_type, seed++);
      for (const int64_t m : {int64_t{1}, int64_t{2}, int64_t{7}, kGemvMaxRows, kGemvMaxRows + 1, int64_t{16}}) {
        SCOPED_TRACE(::testing::Message() << DTypeName(b_type) << " weights, M " << m << " N " << s.n << " K " << s.k);
        EXPECT_LE(RunGemm({.m = m}, w, seed++), b_type == DType::kBF16 ? kTolBf16 : kTolF32);
      }
    }
  }
}

// K not a multiple of a 16-byte chunk (and smaller than one; weight rows padded to 16 bytes, so
// that the GEMV path takes them), N not a multiple of the rows a block takes; a in padded rows at an
// odd offset or 16-byte aligned, c row-strided, bias, alpha and beta (0: c unread).
TEST_F(CudaGemvTest, RaggedStridedWithBiasAlphaBetaMatchesCpu) {
  struct Nk {
    int64_t n, k;
  };
  uint32_t seed = 200;
  for (const DType b_type : {DType::kBF16, DType::kF32}) {
    for (const Nk& s : {Nk{5, 3}, Nk{5, 7}, Nk{33, 1003}, Nk{577, 4097}, Nk{130, 12289}}) {
      const Weights w = MakeWeights(s.n, s.k, b_type, seed++, (s.k + 7) / 8 * 8);
      ASSERT_TRUE(cuda::GemvWeightsAligned(w.gpu.data(), b_type == DType::kBF16 ? cuda::GemvType::kBF16
                                                                                  : cuda::GemvType::kF32,
                                           w.gpu.stride(0), 0, s.n, 1));
      for (const int64_t m : {int64_t{1}, int64_t{3}, kGemvMaxRows, kGemvMaxRows + 1}) {
        for (const float beta : {0.0f, 0.5f}) {
          SCOPED_TRACE(::testing::Message() << DTypeName(b_type) << " weights, M " << m << " N " << s.n << " K "
                                            << s.k << " beta " << beta);
          // a at an odd offset (staged element by element), and a in 16-byte aligned rows (staged
          // by quads, the last one partial).
          const int64_t aligned_pad = (s.k + 3) / 4 * 4 - s.k + 4;
          for (const auto& [a_pad, a_offset] : {std::pair<int64_t, int64_t>{5, 3}, {aligned_pad, 0}}) {
            const GemmCase g{.m = m, .a_pad = a_pad, .a_offset = a_offset, .c_pad = 3, .c_offset = 1,
                             .bias = true, .alpha = 0.75f, .beta = beta};
            EXPECT_LE(RunGemm(g, w, seed++), b_type == DType::kBF16 ? kTolBf16 : kTolF32) << "a offset " << a_offset;
          }
        }
      }
    }
  }
}

// bf16 activations with bf16 weights: widened exactly, so the same tolerance as mixed.
TEST_F(CudaGemvTest, Bf16ActivationsMatchCpu) {
  const Weights w = MakeWeights(576, 5120, DType::kBF16, 300);
  for (const int64_t m : {int64_t{1}, int64_t{5}, kGemvMaxRows}) {
    SCOPED_TRACE(::testing::Message() << "M " << m);
    EXPECT_LE(RunGemm({.m = m, .a_type = DType::kBF16, .bias = true, .beta = 0.5f}, w, 301), kTolBf16);
  }
}

// Weight rows off a 16-byte boundary leave the product to cuBLASLt: same results.
TEST_F(CudaGemvTest, UnalignedWeightsFallBackAndMatchCpu) {
  const int64_t n = 96, k = 520;
  const Tensor b = Random(Shape{1 + n * (k + 1)}, 310, 0.05f);
  const Tensor b_gpu = Upload(Stored(b, DType::kBF16));
  const Tensor b_cpu = Values(b, true);
  EXPECT_FALSE(cuda::GemvWeightsAligned(At(b_gpu, 1, Shape{n, k}, Shape{k + 1, 1}).data(), cuda::GemvType::kBF16,
                                        k + 1, 0, n, 1));
  for (const int64_t m : {int64_t{1}, int64_t{4}}) {
    const Tensor a = Random(Shape{m, k}, 311);
    const Tensor a_gpu = Upload(a);
    const Tensor a_cpu = Values(a, true);
    Tensor c_gpu = *Tensor::Empty(DType::kF32, Shape{m, n}, gpu_->allocator());
    Tensor c_cpu = *Tensor::Empty(DType::kF32, Shape{m, n});
    ASSERT_TRUE(gpu_->Gemm(a_gpu, At(b_gpu, 1, Shape{n, k}, Shape{k + 1, 1}), c_gpu, {}).ok());
    ASSERT_TRUE(cpu_.Gemm(a_cpu, At(b_cpu, 1, Shape{n, k}, Shape{k + 1, 1}), c_cpu, {}).ok());
    EXPECT_LE(RelError(Download(c_gpu), c_cpu), kTolBf16) << "M " << m;
  }
}

// The same product twice gives the same bits.
TEST_F(CudaGemvTest, Deterministic) {
  struct Nk {
    int64_t n, k;
    DType b_type;
  };
  // q_b of a V2 rank, and a V3 router (K split over a cluster).
  for (const Nk& s : {Nk{3072, 1536, DType::kBF16}, Nk{256, 7168, DType::kF32}}) {
    const Weights w = MakeWeights(s.n, s.k, s.b_type, 320);
    for (const int64_t m : {int64_t{1}, kGemvMaxRows}) {
      const Tensor a = Upload(Random(Shape{m, s.k}, 321));
      Tensor c1 = *Tensor::Empty(DType::kF32, Shape{m, s.n}, gpu_->allocator());
      Tensor c2 = *Tensor::Empty(DType::kF32, Shape{m, s.n}, gpu_->allocator());
      ASSERT_TRUE(gpu_->Gemm(a, w.gpu, c1, {}).ok());
      ASSERT_TRUE(gpu_->Gemm(a, w.gpu, c2, {}).ok());
      const Tensor h1 = Download(c1), h2 = Download(c2);
      EXPECT_EQ(std::memcmp(h1.data(), h2.data(), h1.nbytes()), 0) << "M " << m << " N " << s.n;
    }
  }
}

// Few rows over a long K, the unsplit grid short of the bytes in flight the copy rate needs: a MoE
// router's product (256 x 7168, f32 weights at 3, 4 and 8 rows; 128 x 7168 bf16 at 1), ragged N and K (the last part's tail
// chunk partial; weight rows padded with NaN, which a part reading past its end would show) and a
// single-row-group K. Each case asserts that LaunchGemv splits K over a cluster (GemvKSplit), then
// matches the CPU plainly and with a strided, offset a and c, bias, alpha and beta (Deterministic
// covers the router's split product).
TEST_F(CudaGemvTest, KSplitShapesMatchCpu) {
  struct Case {
    int64_t n, k, ld, m;
    DType b_type;
  };
  uint32_t seed = 400;
  for (const Case& c : {Case{256, 7168, 0, 4, DType::kF32}, Case{256, 7168, 0, 3, DType::kF32},
                        Case{256, 7168, 0, 8, DType::kF32}, Case{128, 7168, 0, 1, DType::kBF16},
                        Case{37, 7171, 7172, 1, DType::kF32}, Case{37, 7171, 7172, 5, DType::kF32},
                        Case{5, 20001, 20008, 1, DType::kBF16}, Case{1, 21504, 0, 2, DType::kF32}}) {
    SCOPED_TRACE(::testing::Message() << DTypeName(c.b_type) << " weights, M " << c.m << " N " << c.n << " K "
                                      << c.k);
    const Weights w = MakeWeights(c.n, c.k, c.b_type, seed++, c.ld);
    ExpectKSplitMatchesCpu(c.m, w, false, c.b_type == DType::kBF16 ? kTolBf16 : kTolF32, seed);
    seed += 2;
  }
}

// The split applies only where the unsplit grid keeps too few bytes in flight and would fill less
// than half the GPU: the router at 8 rows, not at 1 (its 64 blocks hold enough; the split measured
// slower there), not V3's wide products, nor the tensor-core path (bf16 weights, 2+ rows).
TEST(GemvKSplitTest, OnlyNarrowGridsSplit) {
  const auto split = [](cuda::GemvType type, int64_t m, int64_t n, int64_t k, int64_t batch, int sms) {
    return cuda::GemvKSplit(type, cuda::GemvActivations::kRoundToBf16, m, n, k, batch, sms);
  };
  EXPECT_EQ(split(cuda::GemvType::kF32, 1, 256, 7168, 1, 132), 1);
  EXPECT_EQ(split(cuda::GemvType::kF32, 4, 256, 7168, 1, 132), 2);
  EXPECT_EQ(split(cuda::GemvType::kF32, 8, 256, 7168, 1, 132), 8);
  EXPECT_EQ(split(cuda::GemvType::kF32, 1, 37, 7171, 1, 132), 4);
  EXPECT_EQ(split(cuda::GemvType::kBF16, 1, 7168, 7168, 1, 132), 1);
  EXPECT_EQ(split(cuda::GemvType::kBF16, 4, 256, 7168, 1, 132), 1);
  EXPECT_EQ(split(cuda::GemvType::kF32, 1, 256, 7168, 16, 132), 1);  // 16 items fill it
  EXPECT_EQ(split(cuda::GemvType::kF32, 1, 256, 64, 1, 132), 1);     // K too short to share
  EXPECT_EQ(split(cuda::GemvType::kF32, 9, 256, 7168, 1, 132), 1);    // not a GEMV size
}

// GemmOptions::b_is_weights launches the GEMV as a programmatic dependent that reads its first
// weights before the kernel writing its input has finished: a chain of products, each reading the
// output of the one before (a) and accumulating into a buffer the one before also wrote (c), gives
// bit for bit the results of the same chain launched the ordinary way, eagerly and from a CUDA graph.
TEST_F(CudaGemvTest, WeightsGemmWaitsForTheKernelBeforeIt) {
  constexpr int kChain = 6;
  const int64_t n = 2048;
  std::vector<Weights> w;
  for (int i = 0; i < kChain; ++i) w.push_back(MakeWeights(n, n, DType::kBF16, 400 + i));
  for (const int64_t m : {int64_t{1}, int64_t{4}}) {
    const Tensor x0 = Upload(Random(Shape{m, n}, 410));
    auto run_chain = [&](bool weights, bool graph) -> Tensor {
      std::vector<Tensor> x;
      for (int i = 0; i <= kChain; ++i) x.push_back(*Tensor::Empty(DType::kF32, Shape{m, n}, gpu_->allocator()));
      Tensor acc = Upload(*Tensor::Zeros(DType::kF32, Shape{m, n}));
      EXPECT_TRUE(gpu_->Copy(x0, x[0]).ok());
      EXPECT_TRUE(gpu_->Synchronize().ok());
      GemmOptions plain{.b_is_weights = weights};
      GemmOptions accumulate{.beta = 1.0f, .b_is_weights = weights};
      auto enqueue = [&] {
        for (int i = 0; i < kChain; ++i) {
          EXPECT_TRUE(gpu_->Gemm(x[i], w[i].gpu, x[i + 1], plain).ok());
          EXPECT_TRUE(gpu_->Gemm(x[i + 1], w[i].gpu, acc, accumulate).ok());
        }
      };
      if (graph) {
        cudaGraph_t g = nullptr;
        cudaGraphExec_t exec = nullptr;
        EXPECT_EQ(cudaStreamBeginCapture(gpu_->stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
        enqueue();
        EXPECT_EQ(cudaStreamEndCapture(gpu_->stream(), &g), cudaSuccess);
        EXPECT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
        EXPECT_EQ(cudaGraphLaunch(exec, gpu_->stream()), cudaSuccess);
        EXPECT_TRUE(gpu_->Synchronize().ok());
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(g);
      } else {
        enqueue();
      }
      return Download(acc);
    };
    const Tensor want = run_chain(false, false);
    for (const bool graph : {false, true}) {
      const Tensor got = run_chain(true, graph);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.nbytes()), 0) << "M " << m << " graph " << graph;
    }
  }
}

// Up to kGemvMaxRows rows, bf16 weights need no activation scratch: a backend without any captures
// the product into a CUDA graph with no eager step first, and the graph replays it.
TEST_F(CudaGemvTest, CapturedWithoutActivationScratch) {
  auto created = cuda::CudaBackend::Create({.activation_scratch_bytes = 0, .small_m_gemv = true});
  ASSERT_TRUE(created.ok()) << created.status();
  cuda::CudaBackend& gpu = **created;
  const int64_t m = 4, n = 576, k = 5120;
  const Tensor b = Random(Shape{n, k}, 330, 0.02f);
  const Tensor a = Random(Shape{m, k}, 331);
  Tensor b_gpu = *Tensor::Empty(DType::kBF16, b.shape(), gpu.allocator());
  Tensor a_gpu = *Tensor::Empty(DType::kF32, a.shape(), gpu.allocator());
  Tensor c_gpu = *Tensor::Empty(DType::kF32, Shape{m, n}, gpu.allocator());
  ASSERT_TRUE(gpu.Copy(Stored(b, DType::kBF16), b_gpu).ok());
  ASSERT_TRUE(gpu.Copy(a, a_gpu).ok());
  ASSERT_TRUE(gpu.Synchronize().ok());
  const absl::Status captured = CaptureAndReplayGemm(gpu, a_gpu, b_gpu, c_gpu, {});
  ASSERT_TRUE(captured.ok()) << captured;
  Tensor got = *Tensor::Empty(DType::kF32, Shape{m, n});
  ASSERT_TRUE(gpu.Copy(c_gpu, got).ok());
  ASSERT_TRUE(gpu.Synchronize().ok());
  Tensor want = *Tensor::Empty(DType::kF32, Shape{m, n});
  ASSERT_TRUE(cpu_.Gemm(Values(a, true), Values(b, true), want, {}).ok());
  EXPECT_LE(RelError(got, want), kTolBf16);
}

// BatchedGemm on the absorbed MLA layouts (16 heads): W_UK, q [T, heads * 192] (first 128 columns of
// each head) x w [heads, 512, 128] -> [T, heads * 576] (first 512 columns of each head); W_UV,
// o [T, heads * 512] x rows [h * 256 + 128, + 128) of kv_b [heads * 256, 512] -> [T, heads * 128].
TEST_F(CudaGemvTest, BatchedHeadMajorMatchesCpu) {
  const int64_t heads = 16;
  uint32_t seed = 400;
  for (const DType b_type : {DType::kBF16, DType::kF32}) {
    const bool bf16 = b_type == DType::kBF16;
    const Tensor w_uk = Random(Shape{heads, 512, 128}, seed++, 0.05f);
    const Tensor kv_b = Random(Shape{heads * 256, 512}, seed++, 0.05f);
    const Tensor w_uk_gpu = Upload(Stored(w_uk, b_type)), kv_b_gpu = Upload(Stored(kv_b, b_type));
    const Tensor w_uk_cpu = Values(w_uk, bf16), kv_b_cpu = Values(kv_b, bf16);
    for (const int64_t t : {int64_t{1}, int64_t{3}, kGemvMaxRows, kGemvMaxRows + 1}) {
      for (const float beta : {0.0f, 0.5f}) {
        SCOPED_TRACE(::testing::Message() << DTypeName(b_type) << " weights, T " << t << " beta " << beta);
        const Tensor q = Random(Shape{t, heads * 192}, seed++), o = Random(Shape{t, heads * 512}, seed++);
        const Tensor q_gpu = Upload(q), o_gpu = Upload(o);
        const Tensor q_cpu = Values(q, bf16), o_cpu = Values(o, bf16);
        const Tensor c_start = Random(Shape{t, heads * 576}, seed++);
        const Tensor uk_gpu = Upload(c_start);
        Tensor uk_cpu = Values(c_start, false);
        Tensor uv_gpu = *Tensor::Empty(DType::kF32, Shape{t, heads * 128}, gpu_->allocator());
        Tensor uv_cpu = *Tensor::Empty(DType::kF32, Shape{t, heads * 128});
        const GemmOptions options{1.0f, beta, nullptr};
        const Shape q_shape{heads, t, 128}, q_strides{192, heads * 192, 1};
        const Shape uk_shape{heads, t, 512}, uk_strides{576, heads * 576, 1};
        ASSERT_TRUE(gpu_->BatchedGemm(At(q_gpu, 0, q_shape, q_strides), w_uk_gpu,
                                      At(uk_gpu, 0, uk_shape, uk_strides), options)
                        .ok());
        ASSERT_TRUE(cpu_.BatchedGemm(At(q_cpu, 0, q_shape, q_strides), w_uk_cpu, At(uk_cpu, 0, uk_shape, uk_strides),
                                     options)
                        .ok());
        const Tensor uk_got = Download(uk_gpu);
        EXPECT_LE(CheckedRelError(uk_got, uk_cpu), bf16 ? kTolBf16 : kTolF32);
        // The rope columns of each head (beyond 512) keep their bits.
        for (int64_t i = 0; i < uk_got.numel(); ++i) {
          if (i % 576 < 512) continue;
          ASSERT_EQ(uk_got.data_as<float>()[i], c_start.data_as<float>()[i]) << "element " << i;
        }
        const Shape o_shape{heads, t, 512}, o_strides{512, heads * 512, 1};
        const Shape w_shape{heads, 128, 512}, w_strides{256 * 512, 512, 1};
        const Shape uv_shape{heads, t, 128}, uv_strides{128, heads * 128, 1};
        ASSERT_TRUE(gpu_->BatchedGemm(At(o_gpu, 0, o_shape, o_strides), At(kv_b_gpu, 128 * 512, w_shape, w_strides),
                                      At(uv_gpu, 0, uv_shape, uv_strides), {})
                        .ok());
        ASSERT_TRUE(cpu_.BatchedGemm(At(o_cpu, 0, o_shape, o_strides), At(kv_b_cpu, 128 * 512, w_shape, w_strides),
                                     At(uv_cpu, 0, uv_shape, uv_strides), {})
                        .ok());
        EXPECT_LE(CheckedRelError(Download(uv_gpu), uv_cpu), bf16 ? kTolBf16 : kTolF32);
      }
    }
  }
}

// A bias goes to every item in the one batched launch (item-major c, alpha and beta).
TEST_F(CudaGemvTest, BatchedBiasAlphaBetaMatchesCpu) {
  const int64_t items = 3, n = 24, k = 40;
  for (const int64_t m : {int64_t{1}, int64_t{5}}) {
    const Tensor a = Random(Shape{items, m, k}, 500), b = Random(Shape{items, n, k}, 501);
    const Tensor bias = Random(Shape{n}, 502), c_start = Random(Shape{items, m, n}, 503);
    const Tensor a_gpu = Upload(a), b_gpu = Upload(Stored(b, DType::kBF16)), bias_gpu = Upload(bias);
    const Tensor a_cpu = Values(a, true), b_cpu = Values(b, true);
    const Tensor c_gpu = Upload(c_start);
    Tensor c_cpu = Values(c_start, false);
    const TensorView bias_gpu_view = bias_gpu.view(), bias_cpu_view = bias.view();
    ASSERT_TRUE(gpu_->BatchedGemm(a_gpu, b_gpu, c_gpu, {0.5f, 2.0f, &bias_gpu_view}).ok());
    ASSERT_TRUE(cpu_.BatchedGemm(a_cpu, b_cpu, c_cpu, {0.5f, 2.0f, &bias_cpu_view}).ok());
    EXPECT_LE(RelError(Download(c_gpu), c_cpu), kTolBf16) << "M " << m;
  }
}

// The one batched launch adds the bias to every item, so a bias lying in a later item of c is
// refused before it runs (naming the item), as the per-item path refuses it.
TEST_F(CudaGemvTest, BatchedBiasOverlappingAnItemIsRefused) {
  const int64_t items = 3, m = 2, n = 8, k = 16;
  const Tensor a = Upload(Random(Shape{items, m, k}, 510));
  const Tensor b = Upload(Stored(Random(Shape{items, n, k}, 511), DType::kBF16));
  Tensor c = *Tensor::Empty(DType::kF32, Shape{items, m, n}, gpu_->allocator());
  const TensorView bias = At(c, m * n, Shape{n}, Shape{1});  // row 0 of item 1
  const absl::Status status = gpu_->BatchedGemm(a, b, c, {1.0f, 0.0f, &bias});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("item 1"), std::string::npos) << status;
  EXPECT_NE(status.message().find("bias"), std::string::npos) << status;
}

// The launcher's refusals need no device (it checks before launching).
TEST(GemvLauncherTest, RefusesOutOfContractArguments) {
  alignas(16) static float a[64], b[64], c[64];
  const auto launch = [&](const void* a_ptr, cuda::GemvType a_type, const void* b_ptr, cuda::GemvType b_type,
                          int64_t lda, int64_t ldb, int64_t batch, int64_t m, int64_t n, int64_t k) {
    return cuda::LaunchGemv(a_ptr, a_type, lda, 0, b_ptr, b_type, ldb, 0, cuda::GemvActivations::kRoundToBf16, c, 8,
                            0, nullptr, batch, m, n, k, 1.0f, 0.0f, false, nullptr);
  };
  const auto f32 = cuda::GemvType::kF32, bf16 = cuda::GemvType::kBF16;
  EXPECT_EQ(launch(a, f32, b, f32, 4, 4, 1, 0, 2, 4), cudaErrorInvalidValue);                 // m 0
  EXPECT_EQ(launch(a, f32, b, f32, 4, 4, 1, kGemvMaxRows + 1, 2, 4), cudaErrorInvalidValue);  // m too large
  EXPECT_EQ(launch(a, f32, b, f32, 4, 4, 1, 1, 2, 0), cudaErrorInvalidValue);                 // k 0
  EXPECT_EQ(launch(a, f32, b, f32, 4, 4, 0, 1, 2, 4), cudaErrorInvalidValue);                 // batch 0
  EXPECT_EQ(launch(nullptr, f32, b, f32, 4, 4, 1, 1, 2, 4), cudaErrorInvalidValue);           // no a
  EXPECT_EQ(launch(a, bf16, b, f32, 4, 4, 1, 1, 2, 4), cudaErrorInvalidValue);                // bf16 a, f32 b
  EXPECT_EQ(launch(a, f32, b, f32, 3, 4, 1, 2, 2, 4), cudaErrorInvalidValue);                 // lda < k
  EXPECT_EQ(launch(a, f32, b, f32, 4, 3, 1, 1, 2, 4), cudaErrorInvalidValue);                 // ldb < k
  EXPECT_EQ(launch(a, f32, b + 1, f32, 4, 4, 1, 1, 2, 4), cudaErrorInvalidValue);             // b misaligned
  EXPECT_EQ(launch(a, f32, b, f32, 4, 5, 1, 1, 2, 4), cudaErrorInvalidValue);                 // rows misaligned

  EXPECT_TRUE(cuda::GemvWeightsAligned(b, bf16, 8, 0, 2, 1));
  EXPECT_TRUE(cuda::GemvWeightsAligned(b, bf16, 3, 0, 1, 1));   // one row: its stride is free
  EXPECT_FALSE(cuda::GemvWeightsAligned(b, bf16, 12, 0, 2, 1)); // 24-byte rows
  EXPECT_TRUE(cuda::GemvWeightsAligned(b, f32, 12, 0, 2, 1));   // 48-byte rows
  EXPECT_FALSE(cuda::GemvWeightsAligned(b, f32, 4, 6, 2, 2));   // 24-byte items
  EXPECT_TRUE(cuda::GemvWeightsAligned(b, f32, 4, 6, 2, 1));    // one item: its stride is free
}

}  // namespace
}  // namespace eagle3::parity
