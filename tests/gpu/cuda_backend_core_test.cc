// CPU ≡ CUDA parity for the CudaBackend core: Copy (host <-> device, strided device views), Gemm
// (cuBLASLt), RmsNorm, RmsNormPair, AddRmsNorm, SiluMul, EmbeddingLookup, Softmax, Argmax, TopK,
// and the device error flag that Synchronize reports. Skipped where no CUDA device is visible.
//
// Tolerances, relative to the largest magnitude of the reference (RelError):
//  - f32 Gemm 1e-5 (only the summation order differs; no TF32);
//  - RmsNorm / RmsNormPair / AddRmsNorm / SiluMul 1e-6 (IEEE sqrt and division on both sides;
//    expf is within 2 ulp); RmsNormPair also bit for bit against two CUDA RmsNorm calls;
//  - Softmax: within 1e-6 of a double-precision softmax, and within 1e-6 plus the CPU's own error
//    of the CPU (whose sequential sum over 163840 logits is off by ~1e-5 itself);
//  - Copy, EmbeddingLookup, Argmax, TopK, the residual of AddRmsNorm: exact.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core_ops.h"
#include "eagle3/half.h"
#include "parity_util.h"

namespace eagle3::parity {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Tensor Clone(const Tensor& t) {
  Tensor c = *Tensor::Empty(t.dtype(), t.shape());
  std::memcpy(c.data(), t.data(), t.nbytes());
  return c;
}

// A strided view into t starting `offset` elements in.
TensorView View(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset = 0) {
  return TensorView(static_cast<char*>(t.data()) + offset * DTypeSize(t.dtype()), t.dtype(), shape,
                    strides, t.device());
}

bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

// Bitwise equality of two host tensors of equal dtype and size.
void ExpectSameBytes(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
}

int64_t IndexAt(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kI32 ? t.data_as<int32_t>()[i] : t.data_as<int64_t>()[i];
}

// max |a - b| / max |b| with b in double precision.
double RelErrorToDouble(const Tensor& a, const std::vector<double>& b) {
  double diff = 0, scale = 1e-30;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::fabs(a.data_as<float>()[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / scale;
}

class CudaBackendCoreTest : public ParityTest {
 protected:
  // The same contents on the host and on the device: run an op on equal views of both.
  struct Mirror {
    Tensor host;
    Tensor dev;
  };
  Mirror Mirrored(const Tensor& host) { return {Clone(host), Upload(host)}; }

  // The device side must end where the CPU side did, over the whole buffer (padding included).
  void ExpectClose(const Mirror& m, double tolerance) {
    Tensor back = Download(m.dev);
    EXPECT_LE(RelError(back, m.host), tolerance);
  }
  void ExpectExact(const Mirror& m) { ExpectSameBytes(Download(m.dev), m.host); }

  // Captures what `issue` enqueues on the backend's stream into a CUDA graph (issue's status must
  // be OK), replays the graph once and waits: a captured step's use of the ops.
  void CaptureAndReplay(const std::function<absl::Status()>& issue) {
    cudaStream_t stream = gpu_->stream();
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const absl::Status captured = issue();
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_TRUE(captured.ok()) << captured;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_TRUE(gpu_->Synchronize().ok());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }

  void CheckGemmMatchesCpu();  // defined with the Gemm tests
};

// ---- Creation -----------------------------------------------------------------------------------

TEST_F(CudaBackendCoreTest, CreateReportsDeviceAndStream) {
  EXPECT_EQ(gpu_->device(), Device::Cuda(0));
  EXPECT_EQ(gpu_->allocator().device(), Device::Cuda(0));
  EXPECT_NE(gpu_->stream(), nullptr);
  EXPECT_EQ(gpu_->options().device, 0);
  EXPECT_TRUE(gpu_->Synchronize().ok());

  auto missing = cuda::CudaBackend::Create({.device = cuda::CudaDeviceCount()});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument) << missing.status();
  auto bad_bounds = cuda::CudaBackend::Create({.max_rows = 0});
  EXPECT_EQ(bad_bounds.status().code(), absl::StatusCode::kInvalidArgument);
  auto bad_switch = cuda::CudaBackend::Create({.moe_grouped_min_tokens = 0});
  EXPECT_EQ(bad_switch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_switch.status().message().find("moe_grouped_min_tokens"), std::string::npos) << bad_switch.status();
  auto bad_direct = cuda::CudaBackend::Create({.quant_moe_direct_max_tokens_fp8 = 0});
  EXPECT_EQ(bad_direct.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_direct.status().message().find("quant_moe_direct_max_tokens_fp8 (0)"), std::string::npos)
      << bad_direct.status();

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    auto given = cuda::CudaBackend::Create({.stream = stream});
    ASSERT_TRUE(given.ok()) << given.status();
    EXPECT_EQ((*given)->stream(), stream);
    Tensor h = Random(Shape{16}, 1);
    Tensor d = *Tensor::Empty(DType::kF32, Shape{16}, (*given)->allocator());
    ASSERT_TRUE((*given)->Copy(h, d).ok());
    EXPECT_TRUE((*given)->Synchronize().ok());
  }
  // The backend did not own the stream: it is still usable.
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// ---- Copy ---------------------------------------------------------------------------------------

TEST_F(CudaBackendCoreTest, CopyContiguousRoundTripEveryElementSize) {
  for (DType dtype : {DType::kU8, DType::kBF16, DType::kF32, DType::kI64}) {
    Tensor host = RandomInts(DType::kU8, Shape{int64_t(DTypeSize(dtype)) * 3 * 5 * 7}, 3, 0, 256);
    const TensorView typed(host.data(), dtype, Shape{3, 5, 7});
    Tensor d1 = *Tensor::Empty(dtype, Shape{3, 5, 7}, gpu_->allocator());
    Tensor d2 = *Tensor::Empty(dtype, Shape{3, 5, 7}, gpu_->allocator());
    ASSERT_TRUE(gpu_->Copy(typed, d1).ok());
    ASSERT_TRUE(gpu_->Copy(d1, d2).ok());
    Tensor back = Download(d2);
    EXPECT_EQ(std::memcmp(back.data(), host.data(), back.nbytes()), 0) << DTypeName(dtype);
  }
}

// Uploads from pageable memory go through the backend's pinned buffers in chunks (StagedUpload):
// sizes from one byte to several chunks, a source changed and freed right after Copy returns (Copy
// has read it all by then), back-to-back uploads reusing both buffers, small ones between large
// ones, and a pinned source (the driver's path) after them.
TEST_F(CudaBackendCoreTest, CopyPageableUploadsThroughStaging) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  uint32_t seed = 40;
  std::vector<std::pair<Tensor, Tensor>> done;  // (expected host bytes, device copy)
  for (const int64_t bytes : {int64_t{1}, int64_t{4099}, kMiB + 7, 4 * kMiB, 8 * kMiB, 8 * kMiB + 1,
                              19 * kMiB + 12345, 33 * kMiB, int64_t{100}}) {
    SCOPED_TRACE(bytes);
    auto source = std::make_unique<Tensor>(RandomInts(DType::kU8, Shape{bytes}, seed++, 0, 256));
    Tensor expected = Clone(*source);
    Tensor dev = *Tensor::Empty(DType::kU8, Shape{bytes}, gpu_->allocator());
    ASSERT_TRUE(gpu_->Copy(*source, dev).ok());
    std::memset(source->data(), 0xab, static_cast<size_t>(bytes));
    source.reset();
    done.emplace_back(std::move(expected), std::move(dev));
  }
  Tensor pinned = *Tensor::Empty(DType::kU8, Shape{9 * kMiB}, gpu_->staging_allocator());
  std::memcpy(pinned.data(), done.back().first.data(), static_cast<size_t>(pinned.nbytes()));
  Tensor from_pinned = *Tensor::Empty(DType::kU8, Shape{9 * kMiB}, gpu_->allocator());
  ASSERT_TRUE(gpu_->Copy(pinned, from_pinned).ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  for (const auto& [expected, dev] : done) {
    Tensor back = Download(dev);
    EXPECT_EQ(std::memcmp(back.data(), expected.data(), back.nbytes()), 0) << back.nbytes() << " bytes";
  }
  Tensor back = Download(from_pinned);
  EXPECT_EQ(std::memcmp(back.data(), pinned.data(), back.nbytes()), 0);
}

// PrefetchWeights is a hint: spans of every shape (odd sizes and offsets, dim-0 slices apart, more
// views than one launch takes, more bytes than the cache bound) leave the tensors and a product
// over them as they were, inside a graph capture too; a host view is refused by its index.
TEST_F(CudaBackendCoreTest, PrefetchWeightsChangesNothingAndRefusesHostViews) {
  Tensor w = Random(Shape{64, 96}, 70);
  Tensor dw = Upload(w);
  Tensor big = *Tensor::Empty(DType::kU8, Shape{int64_t{96} << 20}, gpu_->allocator());
  const TensorView v = dw.view();
  // Every other 8-row slice (a W_UV-like view), a 3-element view at an odd offset, one scalar.
  const TensorView slices(dw.data(), DType::kF32, Shape{4, 8, 96}, Shape{16 * 96, 96, 1}, dw.device());
  const TensorView odd(static_cast<float*>(dw.data()) + 5, DType::kF32, Shape{3}, dw.device());
  std::vector<TensorView> views = {v, slices, odd, TensorView(), v.Narrow(0, 3, 1), big.view()};
  for (int i = 0; i < 40; ++i) views.push_back(v.Narrow(0, i, 1));
  ASSERT_TRUE(gpu_->PrefetchWeights(views).ok());
  ASSERT_TRUE(gpu_->PrefetchWeights({}).ok());
  CaptureAndReplay([&] { return gpu_->PrefetchWeights(views); });
  Tensor back = Download(dw);
  EXPECT_EQ(std::memcmp(back.data(), w.data(), w.nbytes()), 0);

  const std::vector<TensorView> with_host = {v, w.view()};
  const absl::Status refused = gpu_->PrefetchWeights(with_host);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(refused.message()).find("weights[1]"), std::string::npos) << refused;
}

// Rows of a wider matrix both ways (the lm_head logits columns, a narrowed block), and a strided
// column vector.
TEST_F(CudaBackendCoreTest, CopyRowStridedHostDevice) {
  const int64_t rows = 6, width = 40, cols = 13, start = 3;
  Mirror wide = Mirrored(Random(Shape{rows, width}, 4));
  const Shape block{rows, cols};
  const Shape row_strides{width, 1};

  // device -> host of a block
  Tensor got = *Tensor::Empty(DType::kF32, block);
  ASSERT_TRUE(gpu_->Copy(View(wide.dev, block, row_strides, start), got).ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  Tensor want = *Tensor::Empty(DType::kF32, block);
  ASSERT_TRUE(cpu_.Copy(View(wide.host, block, row_strides, start), want).ok());
  ExpectSameBytes(got, want);

  // host -> device into a block; the columns around it are untouched
  Tensor fresh = Random(block, 5);
  ASSERT_TRUE(gpu_->Copy(fresh, View(wide.dev, block, row_strides, start)).ok());
  ASSERT_TRUE(cpu_.Copy(fresh, View(wide.host, block, row_strides, start)).ok());
  ExpectExact(wide);

  // host row-strided -> device row-strided (different pitches)
  Mirror other = Mirrored(Random(Shape{rows, 20}, 6));
  ASSERT_TRUE(
      gpu_->Copy(View(wide.host, block, row_strides, 1), View(other.dev, block, {20, 1}, 2)).ok());
  ASSERT_TRUE(
      cpu_.Copy(View(wide.host, block, row_strides, 1), View(other.host, block, {20, 1}, 2)).ok());
  ExpectExact(other);

  // a column: rank 1 with stride `width`, both ways
  Tensor column = *Tensor::Empty(DType::kF32, Shape{rows});
  ASSERT_TRUE(gpu_->Copy(View(wide.dev, Shape{rows}, Shape{width}, 7), column).ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_EQ(column.data_as<float>()[r], wide.host.data_as<float>()[r * width + 7]);
  Tensor new_column = Random(Shape{rows}, 7);
  ASSERT_TRUE(gpu_->Copy(new_column, View(wide.dev, Shape{rows}, Shape{width}, 9)).ok());
  ASSERT_TRUE(cpu_.Copy(new_column, View(wide.host, Shape{rows}, Shape{width}, 9)).ok());
  ExpectExact(wide);
}

// The target model's k_pe copy: the rope part of each latent row, broadcast over heads with a zero
// stride, into the rope dims of every head of k.
TEST_F(CudaBackendCoreTest, CopyDeviceBroadcastSourceIntoStridedDestination) {
  const int64_t s = 5, heads = 4, latent = 512, rope = 64, width = latent + rope, nope = 128;
  const int64_t d = nope + rope;
  Mirror kva = Mirrored(Random(Shape{s, width}, 8));
  Mirror k3 = Mirrored(Random(Shape{s, heads, d}, 9));
  const Shape shape{s, heads, rope};
  const TensorView src_dev = View(kva.dev, shape, Shape{width, 0, 1}, latent);
  const TensorView src_host = View(kva.host, shape, Shape{width, 0, 1}, latent);
  ASSERT_TRUE(gpu_->Copy(src_dev, View(k3.dev, shape, Shape{heads * d, d, 1}, nope)).ok());
  ASSERT_TRUE(cpu_.Copy(src_host, View(k3.host, shape, Shape{heads * d, d, 1}, nope)).ok());
  ExpectExact(k3);
  // and the nope dims from a [s, heads, d'] source narrowed along dim 2
  Mirror kv = Mirrored(Random(Shape{s, heads, nope + 100}, 10));
  const Shape nope_shape{s, heads, nope};
  ASSERT_TRUE(gpu_->Copy(View(kv.dev, nope_shape, Shape{heads * (nope + 100), nope + 100, 1}),
                         View(k3.dev, nope_shape, Shape{heads * d, d, 1}))
                  .ok());
  ASSERT_TRUE(cpu_.Copy(View(kv.host, nope_shape, Shape{heads * (nope + 100), nope + 100, 1}),
                        View(k3.host, nope_shape, Shape{heads * d, d, 1}))
                  .ok());
  ExpectExact(k3);
}

// Permuted views on either side, for every element size, up to rank 6.
TEST_F(CudaBackendCoreTest, CopyDevicePermutations) {
  for (DType dtype : {DType::kBF16, DType::kF32, DType::kI64, DType::kU8}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    const int64_t a = 3, b = 5, c = 7;
    const int64_t bytes = a * b * c * static_cast<int64_t>(DTypeSize(dtype));
    Tensor raw = RandomInts(DType::kU8, Shape{bytes}, 11, 0, 256);
    Tensor src_host = *Tensor::Empty(dtype, Shape{a, b, c});
    std::memcpy(src_host.data(), raw.data(), bytes);
    Mirror src = Mirrored(src_host);
    Mirror dst = Mirrored(*Tensor::Zeros(dtype, Shape{c, a, b}));
    // dst[k][i][j] = src[i][j][k]: a strided destination
    const Shape shape{a, b, c};
    const Shape transposed{b, 1, a * b};
    ASSERT_TRUE(gpu_->Copy(src.dev, View(dst.dev, shape, transposed)).ok());
    ASSERT_TRUE(cpu_.Copy(src.host, View(dst.host, shape, transposed)).ok());
    ExpectExact(dst);
    // and back through a strided source into a contiguous destination
    Mirror again = Mirrored(*Tensor::Zeros(dtype, shape));
    ASSERT_TRUE(gpu_->Copy(View(dst.dev, shape, transposed), again.dev).ok());
    ASSERT_TRUE(cpu_.Copy(View(dst.host, shape, transposed), again.host).ok());
    ExpectExact(again);
    ExpectSameBytes(again.host, src_host);
  }
  // rank 6, reversed dims
  const Shape shape6{2, 3, 2, 4, 3, 2};
  Mirror src = Mirrored(Random(shape6, 12));
  Mirror dst = Mirrored(*Tensor::Zeros(DType::kF32, Shape{2, 3, 4, 2, 3, 2}));
  const Shape reversed{1, 2, 6, 12, 48, 144};
  ASSERT_TRUE(gpu_->Copy(src.dev, View(dst.dev, shape6, reversed)).ok());
  ASSERT_TRUE(cpu_.Copy(src.host, View(dst.host, shape6, reversed)).ok());
  ExpectExact(dst);
}

TEST_F(CudaBackendCoreTest, CopyRefusesWhatItCannotDo) {
  Tensor host = Random(Shape{3, 4, 5}, 13);
  Tensor dev = Upload(host);
  const TensorView permuted_host = View(host, Shape{5, 4, 3}, Shape{1, 5, 20});
  Tensor dev_permuted_target = *Tensor::Empty(DType::kF32, Shape{5, 4, 3}, gpu_->allocator());
  absl::Status status = gpu_->Copy(permuted_host, dev_permuted_target);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status, "contiguous device buffer")) << status;
  // a broadcast host source cannot be a pitched 2-D copy either
  status = gpu_->Copy(View(host, Shape{3, 5}, Shape{0, 1}), View(dev, Shape{3, 5}, Shape{20, 1}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  Tensor host2 = *Tensor::Empty(DType::kF32, Shape{3, 4, 5});
  status = gpu_->Copy(host, host2);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status, "cuda:0")) << status;
  const TensorView elsewhere(dev.data(), DType::kF32, Shape{3, 4, 5},
                             ContiguousStrides(Shape{3, 4, 5}),
                             Device::Cuda(cuda::CudaDeviceCount()));
  EXPECT_EQ(gpu_->Copy(elsewhere, dev).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->Copy(host, View(dev, Shape{60}, Shape{1})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

// ---- Gemm ---------------------------------------------------------------------------------------

struct GemmCase {
  int64_t m, n, k;
};

// Gemm vs the CPU at decode and prefill row counts, contiguous and strided; with the default
// options rows <= kGemvMaxRows (gemv_ops.h) take the GEMV kernel, the rest cuBLASLt.
void CudaBackendCoreTest::CheckGemmMatchesCpu() {
  uint32_t seed = 100;
  for (const GemmCase& g : {GemmCase{1, 192, 7168}, GemmCase{8, 192, 7168}, GemmCase{64, 192, 7168},
                            GemmCase{1, 7168, 128}, GemmCase{8, 7168, 128}, GemmCase{64, 7168, 128},
                            GemmCase{1, 37, 19}, GemmCase{8, 37, 19}, GemmCase{64, 37, 19}}) {
    SCOPED_TRACE(testing::Message() << "M " << g.m << " N " << g.n << " K " << g.k);
    // contiguous operands, c write-only
    {
      Mirror a = Mirrored(Random(Shape{g.m, g.k}, ++seed));
      Mirror b = Mirrored(Random(Shape{g.n, g.k}, ++seed));
      Mirror c = Mirrored(Random(Shape{g.m, g.n}, ++seed));
      ASSERT_TRUE(gpu_->Gemm(a.dev, b.dev, c.dev, {}).ok());
      ASSERT_TRUE(cpu_.Gemm(a.host, b.host, c.host, {}).ok());
      ExpectClose(c, 1e-5);
    }
    // row-strided views at unaligned offsets, alpha, beta accumulate and bias
    {
      Mirror a = Mirrored(Random(Shape{g.m, g.k + 5}, ++seed));
      Mirror b = Mirrored(Random(Shape{g.n, g.k + 3}, ++seed));
      Mirror c = Mirrored(Random(Shape{g.m, g.n + 3}, ++seed));
      Mirror bias = Mirrored(Random(Shape{g.n}, ++seed));
      const auto views = [&](const Tensor& ta, const Tensor& tb, const Tensor& tc,
                             const Tensor& tbias, auto&& run) {
        const TensorView bias_view = tbias;
        run(View(ta, {g.m, g.k}, {g.k + 5, 1}, 3), View(tb, {g.n, g.k}, {g.k + 3, 1}, 1),
            View(tc, {g.m, g.n}, {g.n + 3, 1}, 2), GemmOptions{0.5f, 0.75f, &bias_view});
      };
      views(a.dev, b.dev, c.dev, bias.dev, [&](auto va, auto vb, auto vc, GemmOptions o) {
        ASSERT_TRUE(gpu_->Gemm(va, vb, vc, o).ok());
      });
      views(a.host, b.host, c.host, bias.host, [&](auto va, auto vb, auto vc, GemmOptions o) {
        ASSERT_TRUE(cpu_.Gemm(va, vb, vc, o).ok());
      });
      ExpectClose(c, 1e-5);
    }
  }
}

TEST_F(CudaBackendCoreTest, GemmMatchesCpu) { CheckGemmMatchesCpu(); }

// The GEMV path off (CudaBackendOptions::small_m_gemv = false): cuBLASLt at every row count, as a
// backend created so runs.
class CudaBackendCoreCublasTest : public CudaBackendCoreTest {
 protected:
  cuda::CudaBackendOptions Options() const override {
    cuda::CudaBackendOptions options;
    options.small_m_gemv = false;
    return options;
  }
};

TEST_F(CudaBackendCoreCublasTest, GemmMatchesCpu) { CheckGemmMatchesCpu(); }

TEST_F(CudaBackendCoreTest, GemmBetaZeroNeverReadsC) {
  Mirror a = Mirrored(Random(Shape{8, 64}, 20));
  Mirror b = Mirrored(Random(Shape{32, 64}, 21));
  Tensor nans = *Tensor::Empty(DType::kF32, Shape{8, 32});
  for (int64_t i = 0; i < nans.numel(); ++i) nans.data_as<float>()[i] = kNaN;
  Mirror c = Mirrored(nans);
  ASSERT_TRUE(gpu_->Gemm(a.dev, b.dev, c.dev, {.alpha = 2.0f}).ok());
  ASSERT_TRUE(cpu_.Gemm(a.host, b.host, c.host, {.alpha = 2.0f}).ok());
  Tensor back = Download(c.dev);
  for (int64_t i = 0; i < back.numel(); ++i)
    ASSERT_FALSE(std::isnan(back.data_as<float>()[i])) << i;
  EXPECT_LE(RelError(back, c.host), 1e-5);
}

// K = 0: the product is empty, c = beta * c + bias.
TEST_F(CudaBackendCoreTest, GemmEmptyProduct) {
  Tensor a_dev = *Tensor::Empty(DType::kF32, Shape{4, 0}, gpu_->allocator());
  Tensor b_dev = *Tensor::Empty(DType::kF32, Shape{6, 0}, gpu_->allocator());
  Tensor a_host = *Tensor::Empty(DType::kF32, Shape{4, 0});
  Tensor b_host = *Tensor::Empty(DType::kF32, Shape{6, 0});
  Mirror bias = Mirrored(Random(Shape{6}, 22));
  for (float beta : {0.0f, 0.5f}) {
    Mirror c = Mirrored(Random(Shape{4, 6}, 23));
    const TensorView bias_dev = bias.dev;
    const TensorView bias_host = bias.host;
    ASSERT_TRUE(gpu_->Gemm(a_dev, b_dev, c.dev, {.beta = beta, .bias = &bias_dev}).ok());
    ASSERT_TRUE(cpu_.Gemm(a_host, b_host, c.host, {.beta = beta, .bias = &bias_host}).ok());
    ExpectClose(c, 1e-6);
  }
}

// bf16 activations and weights, f32 output: the CPU runs on the same values widened to f32, so
// only the summation order differs.
TEST_F(CudaBackendCoreTest, GemmBf16OperandsMatchCpu) {
  for (const GemmCase& g : {GemmCase{1, 256, 7168}, GemmCase{64, 96, 512}, GemmCase{8, 37, 19}}) {
    SCOPED_TRACE(testing::Message() << "M " << g.m << " N " << g.n << " K " << g.k);
    const auto bf16_pair = [&](const Shape& shape, uint32_t seed, Tensor* rounded) {
      Tensor f = Random(shape, seed);
      Tensor bits = *Tensor::Empty(DType::kBF16, shape);
      for (int64_t i = 0; i < f.numel(); ++i) {
        bits.data_as<uint16_t>()[i] = FloatToBf16(f.data_as<float>()[i]);
        f.data_as<float>()[i] = Bf16ToFloat(bits.data_as<uint16_t>()[i]);
      }
      *rounded = std::move(f);
      return Upload(bits);
    };
    Tensor a_host, b_host;
    Tensor a_dev = bf16_pair(Shape{g.m, g.k}, 30, &a_host);
    Tensor b_dev = bf16_pair(Shape{g.n, g.k}, 31, &b_host);
    Mirror c = Mirrored(Random(Shape{g.m, g.n}, 32));
    ASSERT_TRUE(gpu_->Gemm(a_dev, b_dev, c.dev, {.beta = 1.0f}).ok());
    ASSERT_TRUE(cpu_.Gemm(a_host, b_host, c.host, {.beta = 1.0f}).ok());
    ExpectClose(c, 1e-5);
  }
  // bf16 activations with f32 weights is no combination the backend runs: refused, naming the
  // dtypes (f32 a with bf16 b is cuda_bf16_weights_test.cc's).
  Tensor a = *Tensor::Empty(DType::kBF16, Shape{2, 8}, gpu_->allocator());
  Tensor b = Upload(Random(Shape{4, 8}, 33));
  Tensor c = *Tensor::Empty(DType::kF32, Shape{2, 4}, gpu_->allocator());
  const absl::Status status = gpu_->Gemm(a, b, c, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status, "bf16")) << status;
}

// ---- Norms and SiLU -----------------------------------------------------------------------------

TEST_F(CudaBackendCoreTest, RmsNormMatchesCpu) {
  uint32_t seed = 200;
  for (int64_t h : {int64_t{7168}, int64_t{5120}, int64_t{512}, int64_t{37}, int64_t{8200}}) {
    for (int64_t t : {int64_t{1}, int64_t{8}, int64_t{64}}) {
      SCOPED_TRACE(testing::Message() << "T " << t << " H " << h);
      Mirror w = Mirrored(Random(Shape{h}, ++seed));
      // strided x and out
      Mirror x = Mirrored(Random(Shape{t, h + 4}, ++seed));
      Mirror out = Mirrored(Random(Shape{t, h + 7}, ++seed));
      ASSERT_TRUE(gpu_->RmsNorm(View(x.dev, {t, h}, {h + 4, 1}, 1), w.dev, 1e-6f,
                                View(out.dev, {t, h}, {h + 7, 1}, 3))
                      .ok());
      ASSERT_TRUE(cpu_.RmsNorm(View(x.host, {t, h}, {h + 4, 1}, 1), w.host, 1e-6f,
                               View(out.host, {t, h}, {h + 7, 1}, 3))
                      .ok());
      ExpectClose(out, 1e-6);
      // in place
      ASSERT_TRUE(gpu_->RmsNorm(View(x.dev, {t, h}, {h + 4, 1}, 1), w.dev, 1e-5f,
                                View(x.dev, {t, h}, {h + 4, 1}, 1))
                      .ok());
      ASSERT_TRUE(cpu_.RmsNorm(View(x.host, {t, h}, {h + 4, 1}, 1), w.host, 1e-5f,
                               View(x.host, {t, h}, {h + 4, 1}, 1))
                      .ok());
      ExpectClose(x, 1e-6);
    }
  }
}

TEST_F(CudaBackendCoreTest, AddRmsNormMatchesCpu) {
  uint32_t seed = 300;
  for (int64_t h : {int64_t{7168}, int64_t{37}, int64_t{8200}}) {
    for (int64_t t : {int64_t{1}, int64_t{8}, int64_t{64}}) {
      SCOPED_TRACE(testing::Message() << "T " << t << " H " << h);
      Mirror w = Mirrored(Random(Shape{h}, ++seed));
      Mirror x = Mirrored(Random(Shape{t, h + 2}, ++seed));
      Mirror residual = Mirrored(Random(Shape{t, h + 5}, ++seed));
      Mirror out = Mirrored(Random(Shape{t, h}, ++seed));
      const auto xv = [&](const Tensor& b) { return View(b, {t, h}, {h + 2, 1}, 2); };
      const auto rv = [&](const Tensor& b) { return View(b, {t, h}, {h + 5, 1}, 1); };
      ASSERT_TRUE(gpu_->AddRmsNorm(xv(x.dev), rv(residual.dev), w.dev, 1e-6f, out.dev).ok());
      ASSERT_TRUE(cpu_.AddRmsNorm(xv(x.host), rv(residual.host), w.host, 1e-6f, out.host).ok());
      ExpectExact(residual);  // one IEEE add per element on both sides
      ExpectClose(out, 1e-6);
      // out is x itself
      ASSERT_TRUE(gpu_->AddRmsNorm(xv(x.dev), rv(residual.dev), w.dev, 1e-6f, xv(x.dev)).ok());
      ASSERT_TRUE(cpu_.AddRmsNorm(xv(x.host), rv(residual.host), w.host, 1e-6f, xv(x.host)).ok());
      ExpectExact(residual);
      ExpectClose(x, 1e-6);
    }
  }
}

// RmsNormPair: each half must carry the bits of the CUDA RmsNorm of that half alone (the pair's
// block is as wide as the wider half needs; the narrower half's extra threads add zeros to the
// block sum), and lie within RmsNorm's tolerance of the CPU. 1536 / 512 are DeepSeek's q_a and
// kv_a layernorms; 8200 takes the strided-loop row path beside a register one.
struct PairWidths {
  int64_t h0, h1;
};
constexpr PairWidths kPairWidths[] = {{1536, 512}, {512, 1536}, {7, 33}, {33, 7}, {1536, 8200}};

// As MlaBlock runs it: two column slices of one row [x0 | x1 | tail], in place; the tail (k_pe's
// columns) must stay as it was. Eagerly, and captured in a CUDA graph with programmatic launch on
// (as a decode step's graph runs it).
TEST_F(CudaBackendCoreTest, RmsNormPairInPlaceEqualsTwoRmsNormsBitForBit) {
  ASSERT_TRUE(gpu_->options().programmatic_launch);
  uint32_t seed = 350;
  for (const bool captured : {false, true}) {
    for (const PairWidths w : kPairWidths) {
      for (int64_t t : {int64_t{1}, int64_t{8}, int64_t{64}}) {
        SCOPED_TRACE(testing::Message() << "T " << t << " H0 " << w.h0 << " H1 " << w.h1 << " captured "
                                        << captured);
        const int64_t ld = w.h0 + w.h1 + 64;
        const Tensor rows = Random(Shape{t, ld}, ++seed, 2.0f);
        Mirror pair = Mirrored(rows);
        Tensor apart = Upload(rows);
        Mirror w0 = Mirrored(Random(Shape{w.h0}, ++seed));
        Mirror w1 = Mirrored(Random(Shape{w.h1}, ++seed));
        const auto x0 = [&](const Tensor& b) { return View(b, {t, w.h0}, {ld, 1}); };
        const auto x1 = [&](const Tensor& b) { return View(b, {t, w.h1}, {ld, 1}, w.h0); };
        const auto pair_op = [&] {
          return gpu_->RmsNormPair(x0(pair.dev), w0.dev, x0(pair.dev), x1(pair.dev), w1.dev, x1(pair.dev), 1e-6f);
        };
        if (captured) {
          ASSERT_TRUE(gpu_->Synchronize().ok());
          CaptureAndReplay(pair_op);
        } else {
          ASSERT_TRUE(pair_op().ok());
        }
        ASSERT_TRUE(gpu_->RmsNorm(x0(apart), w0.dev, 1e-6f, x0(apart)).ok());
        ASSERT_TRUE(gpu_->RmsNorm(x1(apart), w1.dev, 1e-6f, x1(apart)).ok());
        ASSERT_TRUE(
            cpu_.RmsNormPair(x0(pair.host), w0.host, x0(pair.host), x1(pair.host), w1.host, x1(pair.host), 1e-6f)
                .ok());
        ExpectSameBytes(Download(pair.dev), Download(apart));
        ExpectClose(pair, 1e-6);
      }
    }
  }
}

// Every operand its own padded matrix.
TEST_F(CudaBackendCoreTest, RmsNormPairOutOfPlaceEqualsTwoRmsNormsBitForBit) {
  uint32_t seed = 370;
  for (const PairWidths w : kPairWidths) {
    for (int64_t t : {int64_t{1}, int64_t{8}, int64_t{64}}) {
      SCOPED_TRACE(testing::Message() << "T " << t << " H0 " << w.h0 << " H1 " << w.h1);
      Mirror x0 = Mirrored(Random(Shape{t, w.h0 + 3}, ++seed));
      Mirror x1 = Mirrored(Random(Shape{t, w.h1 + 1}, ++seed, 4.0f));
      Mirror w0 = Mirrored(Random(Shape{w.h0}, ++seed));
      Mirror w1 = Mirrored(Random(Shape{w.h1}, ++seed));
      const Tensor out0_start = Random(Shape{t, w.h0 + 2}, ++seed);
      const Tensor out1_start = Random(Shape{t, w.h1 + 5}, ++seed);
      Mirror out0 = Mirrored(out0_start), out1 = Mirrored(out1_start);
      Tensor apart0 = Upload(out0_start), apart1 = Upload(out1_start);
      const auto v0 = [&](const Tensor& b, int64_t ld, int64_t offset) {
        return View(b, {t, w.h0}, {ld, 1}, offset);
      };
      const auto v1 = [&](const Tensor& b, int64_t ld, int64_t offset) {
        return View(b, {t, w.h1}, {ld, 1}, offset);
      };
      ASSERT_TRUE(gpu_->RmsNormPair(v0(x0.dev, w.h0 + 3, 1), w0.dev, v0(out0.dev, w.h0 + 2, 2),
                                    v1(x1.dev, w.h1 + 1, 0), w1.dev, v1(out1.dev, w.h1 + 5, 4), 1e-5f)
                      .ok());
      ASSERT_TRUE(gpu_->RmsNorm(v0(x0.dev, w.h0 + 3, 1), w0.dev, 1e-5f, v0(apart0, w.h0 + 2, 2)).ok());
      ASSERT_TRUE(gpu_->RmsNorm(v1(x1.dev, w.h1 + 1, 0), w1.dev, 1e-5f, v1(apart1, w.h1 + 5, 4)).ok());
      ASSERT_TRUE(cpu_.RmsNormPair(v0(x0.host, w.h0 + 3, 1), w0.host, v0(out0.host, w.h0 + 2, 2),
                                   v1(x1.host, w.h1 + 1, 0), w1.host, v1(out1.host, w.h1 + 5, 4), 1e-5f)
                      .ok());
      ExpectSameBytes(Download(out0.dev), Download(apart0));
      ExpectSameBytes(Download(out1.dev), Download(apart1));
      ExpectClose(out0, 1e-6);
      ExpectClose(out1, 1e-6);
      ExpectExact(x0);
      ExpectExact(x1);
    }
  }
}

// The shared checks name the half's operand; nothing is launched.
TEST_F(CudaBackendCoreTest, RmsNormPairRefusesByOperand) {
  Tensor rows = Upload(Random(Shape{4, 13}, 940));
  Tensor w8 = Upload(Random(Shape{8}, 941));
  Tensor w5 = Upload(Random(Shape{5}, 942));
  const TensorView x0 = View(rows, {4, 8}, {13, 1});
  const TensorView x1 = View(rows, {4, 5}, {13, 1}, 8);
  Tensor host_out = *Tensor::Empty(DType::kF32, Shape{4, 5});
  absl::Status status = gpu_->RmsNormPair(x0, w8, x0, x1, w5, host_out, 1e-6f);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status, "out1")) << status;
  EXPECT_TRUE(Contains(status, "cuda:0")) << status;
  Tensor bf16_out = *Tensor::Empty(DType::kBF16, Shape{4, 5}, gpu_->allocator());
  status = gpu_->RmsNormPair(x0, w8, x0, x1, w5, bf16_out, 1e-6f);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status, "out1 is bf16")) << status;
  EXPECT_TRUE(Contains(status, "f32 only")) << status;
  status = gpu_->RmsNormPair(x0, w8, x0, View(rows, {4, 6}, {13, 1}, 7), Upload(Random(Shape{6}, 943)),
                             View(rows, {4, 6}, {13, 1}, 7), 1e-6f);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status, "overlaps")) << status;
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

TEST_F(CudaBackendCoreTest, SiluMulMatchesCpu) {
  uint32_t seed = 400;
  for (int64_t inter : {int64_t{2048}, int64_t{37}}) {
    for (int64_t t : {int64_t{1}, int64_t{8}, int64_t{64}}) {
      SCOPED_TRACE(testing::Message() << "T " << t << " I " << inter);
      Mirror gate_up = Mirrored(Random(Shape{t, 2 * inter + 3}, ++seed, 4.0f));
      Mirror out = Mirrored(Random(Shape{t, inter + 1}, ++seed));
      ASSERT_TRUE(gpu_->SiluMul(View(gate_up.dev, {t, 2 * inter}, {2 * inter + 3, 1}, 3),
                                View(out.dev, {t, inter}, {inter + 1, 1}, 1))
                      .ok());
      ASSERT_TRUE(cpu_.SiluMul(View(gate_up.host, {t, 2 * inter}, {2 * inter + 3, 1}, 3),
                               View(out.host, {t, inter}, {inter + 1, 1}, 1))
                      .ok());
      ExpectClose(out, 1e-6);
    }
  }
}

// ---- Embedding ----------------------------------------------------------------------------------

TEST_F(CudaBackendCoreTest, EmbeddingLookupMatchesCpu) {
  const int64_t shard_rows = 50, hidden = 7168, vocab_start = 100, tokens = 64;
  Mirror table = Mirrored(Random(Shape{shard_rows, hidden + 3}, 500));
  const auto tv = [&](const Tensor& b) {
    return View(b, {shard_rows, hidden}, {hidden + 3, 1}, 1);
  };
  for (DType id_type : {DType::kI32, DType::kI64}) {
    SCOPED_TRACE(std::string(DTypeName(id_type)));
    Mirror ids = Mirrored(RandomInts(id_type, Shape{tokens}, 501, 0, 300));  // most out of shard
    Mirror out = Mirrored(Random(Shape{tokens, hidden + 2}, 502));
    const auto ov = [&](const Tensor& b) { return View(b, {tokens, hidden}, {hidden + 2, 1}, 2); };
    ASSERT_TRUE(gpu_->EmbeddingLookup(ids.dev, tv(table.dev), vocab_start, ov(out.dev)).ok());
    ASSERT_TRUE(cpu_.EmbeddingLookup(ids.host, tv(table.host), vocab_start, ov(out.host)).ok());
    ExpectExact(out);
    ASSERT_TRUE(gpu_->Synchronize().ok());
  }
}

TEST_F(CudaBackendCoreTest, EmbeddingNegativeIdReportedBySynchronize) {
  Tensor table = Upload(Random(Shape{10, 16}, 510));
  Tensor ids_host = RandomInts(DType::kI64, Shape{8}, 511, 0, 10);
  ids_host.data_as<int64_t>()[6] = -1;
  ids_host.data_as<int64_t>()[3] = -5;
  Tensor ids = Upload(ids_host);
  Tensor out = *Tensor::Empty(DType::kF32, Shape{8, 16}, gpu_->allocator());
  ASSERT_TRUE(gpu_->EmbeddingLookup(ids, table, 0, out).ok());  // found on the device
  const absl::Status status = gpu_->Synchronize();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status, "EmbeddingLookup")) << status;
  EXPECT_TRUE(Contains(status, "ids[3]")) << status;  // the lowest bad token
  EXPECT_TRUE(gpu_->Synchronize().ok());              // the flag was cleared
  // the CPU reference refuses the same ids
  EXPECT_EQ(cpu_.EmbeddingLookup(ids_host, Random(Shape{10, 16}, 512), 0,
                                 *Tensor::Empty(DType::kF32, Shape{8, 16}))
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- Softmax ------------------------------------------------------------------------------------

std::vector<double> SoftmaxInDouble(const Tensor& logits, float temperature) {
  const int64_t rows = logits.dim(0), v = logits.dim(1);
  std::vector<double> out(logits.numel());
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits.data_as<float>() + r * v;
    double max = -kInf;
    for (int64_t i = 0; i < v; ++i) max = std::max(max, static_cast<double>(x[i]));
    double sum = 0;
    for (int64_t i = 0; i < v; ++i) sum += std::exp((x[i] - max) / temperature);
    for (int64_t i = 0; i < v; ++i) out[r * v + i] = std::exp((x[i] - max) / temperature) / sum;
  }
  return out;
}

TEST_F(CudaBackendCoreTest, SoftmaxMatchesCpu) {
  uint32_t seed = 600;
  for (int64_t v : {int64_t{163840}, int64_t{1000}, int64_t{10}}) {
    for (int64_t rows : {int64_t{1}, int64_t{8}, int64_t{64}}) {
      SCOPED_TRACE(testing::Message() << "R " << rows << " V " << v);
      Tensor logits = Random(Shape{rows, v}, ++seed, 3.0f);
      for (int64_t r = 0; r < rows; ++r) logits.data_as<float>()[r * v + (r * 7) % v] = -kInf;
      const std::vector<double> exact = SoftmaxInDouble(logits, 0.7f);
      // strided logits (a block of a wider buffer), contiguous out
      Tensor wide = *Tensor::Zeros(DType::kF32, Shape{rows, v + 4});
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(wide.data_as<float>() + r * (v + 4) + 1, logits.data_as<float>() + r * v,
                    v * sizeof(float));
      }
      Tensor wide_dev = Upload(wide);
      Tensor out_dev = *Tensor::Empty(DType::kF32, Shape{rows, v}, gpu_->allocator());
      Tensor out_cpu = *Tensor::Empty(DType::kF32, Shape{rows, v});
      ASSERT_TRUE(gpu_->Softmax(View(wide_dev, {rows, v}, {v + 4, 1}, 1), 0.7f, out_dev).ok());
      ASSERT_TRUE(cpu_.Softmax(logits, 0.7f, out_cpu).ok());
      Tensor got = Download(out_dev);
      const double cpu_error = RelErrorToDouble(out_cpu, exact);
      EXPECT_LE(RelErrorToDouble(got, exact), 1e-6);
      EXPECT_LE(RelError(got, out_cpu), 1e-6 + cpu_error);
      // in place
      Tensor same = Upload(logits);
      ASSERT_TRUE(gpu_->Softmax(same, 0.7f, same).ok());
      EXPECT_LE(RelErrorToDouble(Download(same), exact), 1e-6);
    }
  }
}

TEST_F(CudaBackendCoreTest, SoftmaxBadRowsReportedBySynchronize) {
  Tensor logits = Random(Shape{4, 100}, 610);
  logits.data_as<float>()[2 * 100 + 5] = kNaN;
  logits.data_as<float>()[1 * 100 + 99] = kInf;
  Tensor dev = Upload(logits);
  Tensor out = *Tensor::Empty(DType::kF32, Shape{4, 100}, gpu_->allocator());
  ASSERT_TRUE(gpu_->Softmax(dev, 1.0f, out).ok());
  absl::Status status = gpu_->Synchronize();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status, "Softmax")) << status;
  EXPECT_TRUE(Contains(status, "row 1 ")) << status;
  EXPECT_EQ(cpu_.Softmax(logits, 1.0f, *Tensor::Empty(DType::kF32, Shape{4, 100})).code(),
            absl::StatusCode::kInvalidArgument);

  Tensor no_finite = *Tensor::Empty(DType::kF32, Shape{2, 8});
  for (int64_t i = 0; i < 16; ++i) no_finite.data_as<float>()[i] = i < 8 ? 1.0f : -kInf;
  Tensor no_finite_dev = Upload(no_finite);
  Tensor out2 = *Tensor::Empty(DType::kF32, Shape{2, 8}, gpu_->allocator());
  ASSERT_TRUE(gpu_->Softmax(no_finite_dev, 1.0f, out2).ok());
  status = gpu_->Synchronize();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status, "row 1 ")) << status;
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

// ---- Argmax and TopK ----------------------------------------------------------------------------

TEST_F(CudaBackendCoreTest, ArgmaxMatchesCpuWithTies) {
  uint32_t seed = 700;
  for (int64_t v : {int64_t{163840}, int64_t{10}}) {
    for (int64_t rows : {int64_t{1}, int64_t{8}, int64_t{64}}) {
      SCOPED_TRACE(testing::Message() << "R " << rows << " V " << v);
      Tensor logits = Random(Shape{rows, v + 3}, ++seed);
      float* x = logits.data_as<float>();
      for (int64_t r = 0; r < rows; ++r) {
        float* row = x + r * (v + 3);
        const int64_t first = (r * 131) % v, second = std::min(v - 1, first + 1 + r % 5);
        row[first] = row[second] = 100.0f;  // a tie: the lower index wins
        if (r == 2) {
          for (int64_t i = 0; i < v; ++i) row[i] = -kInf;  // only -inf: index 0
        }
        if (r == 3) {
          for (int64_t i = 0; i < v; ++i) row[i] = (i % 2) ? 0.0f : -0.0f;  // -0 and +0 tie
          row[v - 1] = -1.0f;
        }
      }
      Mirror m = Mirrored(logits);
      for (DType out_type : {DType::kI32, DType::kI64}) {
        Tensor out_dev = *Tensor::Empty(out_type, Shape{rows}, gpu_->allocator());
        Tensor out_cpu = *Tensor::Empty(out_type, Shape{rows});
        ASSERT_TRUE(gpu_->Argmax(View(m.dev, {rows, v}, {v + 3, 1}, 1), out_dev).ok());
        ASSERT_TRUE(cpu_.Argmax(View(m.host, {rows, v}, {v + 3, 1}, 1), out_cpu).ok());
        Tensor got = Download(out_dev);
        for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(IndexAt(got, r), IndexAt(out_cpu, r)) << r;
      }
    }
  }
}

TEST_F(CudaBackendCoreTest, TopKMatchesCpuWithTies) {
  uint32_t seed = 800;
  for (int64_t v : {int64_t{163840}, int64_t{100}}) {
    for (int64_t rows : {int64_t{1}, int64_t{8}, int64_t{64}}) {
      for (int k : {1, 8, 64, 4096}) {
        if (k > v || (k == 4096 && rows == 64)) continue;
        SCOPED_TRACE(testing::Message() << "R " << rows << " V " << v << " k " << k);
        // values on a coarse grid: many ties, and -0 next to +0
        Tensor values = Random(Shape{rows, v + 2}, ++seed);
        for (int64_t i = 0; i < values.numel(); ++i) {
          float& e = values.data_as<float>()[i];
          e = std::round(e * 4.0f) / 4.0f;
          if (e == 0.0f && i % 2 == 1) e = -0.0f;
        }
        Mirror m = Mirrored(values);
        for (DType index_type : {DType::kI32, DType::kI64}) {
          Mirror out_values = Mirrored(Random(Shape{rows, k + 1}, ++seed));
          Mirror out_indices = Mirrored(*Tensor::Zeros(index_type, Shape{rows, k + 3}));
          const auto vv = [&](const Tensor& b) { return View(b, {rows, v}, {v + 2, 1}, 2); };
          const auto ovv = [&](const Tensor& b) { return View(b, {rows, k}, {k + 1, 1}, 1); };
          const auto oiv = [&](const Tensor& b) { return View(b, {rows, k}, {k + 3, 1}, 0); };
          ASSERT_TRUE(gpu_->TopK(vv(m.dev), k, ovv(out_values.dev), oiv(out_indices.dev)).ok());
          ASSERT_TRUE(cpu_.TopK(vv(m.host), k, ovv(out_values.host), oiv(out_indices.host)).ok());
          ExpectExact(out_indices);
          ExpectExact(out_values);
        }
      }
    }
  }
}

TEST_F(CudaBackendCoreTest, ArgmaxAndTopKReportNaNRows) {
  Tensor values = Random(Shape{5, 300}, 900);
  values.data_as<float>()[4 * 300 + 10] = kNaN;
  values.data_as<float>()[3 * 300 + 299] = kNaN;
  Tensor dev = Upload(values);
  Tensor argmax = *Tensor::Empty(DType::kI64, Shape{5}, gpu_->allocator());
  ASSERT_TRUE(gpu_->Argmax(dev, argmax).ok());
  absl::Status status = gpu_->Synchronize();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status, "Argmax")) << status;
  EXPECT_TRUE(Contains(status, "row 3 ")) << status;

  Tensor top_values = *Tensor::Empty(DType::kF32, Shape{5, 4}, gpu_->allocator());
  Tensor top_indices = *Tensor::Empty(DType::kI32, Shape{5, 4}, gpu_->allocator());
  ASSERT_TRUE(gpu_->TopK(dev, 4, top_values, top_indices).ok());
  status = gpu_->Synchronize();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status, "TopK")) << status;
  EXPECT_TRUE(Contains(status, "row 3 ")) << status;
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

TEST_F(CudaBackendCoreTest, TopKRefusesKAboveTheLimit) {
  const int64_t v = cuda::kTopKMaxK + 10;
  Tensor dev = Upload(Random(Shape{1, v}, 910));
  const int k = cuda::kTopKMaxK + 1;
  Tensor top_values = *Tensor::Empty(DType::kF32, Shape{1, k}, gpu_->allocator());
  Tensor top_indices = *Tensor::Empty(DType::kI64, Shape{1, k}, gpu_->allocator());
  const absl::Status status = gpu_->TopK(dev, k, top_values, top_indices);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status, "limit")) << status;
}

// The first op to fail keeps the flag, whatever fails after it.
TEST_F(CudaBackendCoreTest, SynchronizeReportsTheFirstFailingOp) {
  Tensor values = Random(Shape{6, 50}, 920);
  values.data_as<float>()[5 * 50] = kNaN;
  Tensor dev = Upload(values);
  Tensor argmax = *Tensor::Empty(DType::kI32, Shape{6}, gpu_->allocator());
  Tensor probs = *Tensor::Empty(DType::kF32, Shape{6, 50}, gpu_->allocator());
  ASSERT_TRUE(gpu_->Argmax(dev, argmax).ok());
  ASSERT_TRUE(gpu_->Softmax(dev, 1.0f, probs).ok());
  const absl::Status status = gpu_->Synchronize();
  EXPECT_TRUE(Contains(status, "Argmax")) << status;
  EXPECT_TRUE(Contains(status, "row 5 ")) << status;
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

// Shape, device and dtype errors come from the shared checks (as on the CPU) before any launch.
TEST_F(CudaBackendCoreTest, ValidationErrorsBeforeLaunch) {
  Tensor x = Upload(Random(Shape{4, 8}, 930));
  Tensor w = Upload(Random(Shape{8}, 931));
  Tensor host_out = *Tensor::Empty(DType::kF32, Shape{4, 8});
  absl::Status status = gpu_->RmsNorm(x, w, 1e-6f, host_out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status, "cuda:0")) << status;
  Tensor bf16_out = *Tensor::Empty(DType::kBF16, Shape{4, 8}, gpu_->allocator());
  status = gpu_->RmsNorm(x, w, 1e-6f, bf16_out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status, "f32 only")) << status;
  Tensor narrow = *Tensor::Empty(DType::kF32, Shape{4, 7}, gpu_->allocator());
  EXPECT_EQ(gpu_->SiluMul(x, narrow).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->Softmax(x, 0.0f, x).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

}  // namespace
}  // namespace eagle3::parity
