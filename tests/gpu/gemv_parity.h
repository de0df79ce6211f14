// The fixture of the GEMV-path tests of CudaBackend::Gemm (cuda_gemv_test.cc, cuda_router_gemv_test.cc):
// weights as the GPU stores them and as the CPU multiplies them, and one product run on the GPU and
// on the CPU reference with row-strided, offset operands, alpha, beta and a bias, c outside its view
// checked untouched. Skipped where no CUDA device is visible (parity::ParityTest).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <cuda_runtime_api.h>

#include "eagle3/backend.h"
#include "eagle3/half.h"
#include "eagle3/tensor.h"
#include "gemv_ops.h"
#include "gtest/gtest.h"
#include "parity_util.h"

namespace eagle3::parity {

// The view of `t`'s storage that starts `offset` elements in, with the given shape and strides.
inline TensorView At(const Tensor& t, int64_t offset, const Shape& shape, const Shape& strides) {
  auto* data = static_cast<char*>(t.data()) + offset * static_cast<int64_t>(DTypeSize(t.dtype()));
  return TensorView(data, t.dtype(), shape, strides, t.device());
}

// f32 values as the CPU multiplies them: rounded to bf16 when `round`, else as they are.
inline Tensor Values(const Tensor& f32, bool round) {
  Tensor out = *Tensor::Empty(DType::kF32, f32.shape());
  for (int64_t i = 0; i < f32.numel(); ++i) {
    const float x = f32.data_as<float>()[i];
    out.data_as<float>()[i] = round ? Bf16ToFloat(FloatToBf16(x)) : x;
  }
  return out;
}

// f32 values stored as `dtype` (bf16 bits, or a copy), for upload.
inline Tensor Stored(const Tensor& f32, DType dtype) {
  if (dtype == DType::kF32) return Values(f32, false);
  Tensor out = *Tensor::Empty(DType::kBF16, f32.shape());
  for (int64_t i = 0; i < f32.numel(); ++i) out.data_as<uint16_t>()[i] = FloatToBf16(f32.data_as<float>()[i]);
  return out;
}

// [rows, cols] of a row-major host view, made contiguous.
inline Tensor Rows(const TensorView& v) {
  Tensor out = *Tensor::Empty(DType::kF32, Shape{v.dim(0), v.dim(1)});
  for (int64_t i = 0; i < v.dim(0); ++i) {
    std::memcpy(out.data_as<float>() + i * v.dim(1), v.data_as<float>() + i * v.stride(0),
                static_cast<size_t>(v.dim(1)) * sizeof(float));
  }
  return out;
}

// RelError, with any NaN in `got` (which RelError's max skips) counted as a failure.
inline double CheckedRelError(const Tensor& got, const Tensor& want) {
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::isnan(got.data_as<float>()[i])) return std::numeric_limits<double>::infinity();
  }
  return RelError(got, want);
}

// Weights [n, k] (rows ld >= k apart) as the GPU stores them and as the CPU multiplies them.
struct Weights {
  Tensor gpu_storage, cpu_storage;
  TensorView gpu, cpu;
};

// One Gemm case: a [m, k] in rows of k + a_pad elements starting a_offset in; c likewise;
// GemmOptions::keep_f32_activations on both backends (then the CPU multiplies `a` unrounded).
struct GemmCase {
  int64_t m = 1;
  DType a_type = DType::kF32;
  int64_t a_pad = 0, a_offset = 0;
  int64_t c_pad = 0, c_offset = 0;
  bool bias = false;
  float alpha = 1.0f, beta = 0.0f;
  bool keep_f32_activations = false;
};

// Captures gpu.Gemm(a, b, c, options) into a CUDA graph on the backend's stream and, where the call
// succeeded, replays the graph and waits for it; returns the call's status.
inline absl::Status CaptureAndReplayGemm(cuda::CudaBackend& gpu, const TensorView& a, const TensorView& b,
                                         const TensorView& c, const GemmOptions& options) {
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(gpu.stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status captured = gpu.Gemm(a, b, c, options);
  EXPECT_EQ(cudaStreamEndCapture(gpu.stream(), &graph), cudaSuccess);
  if (captured.ok() && graph != nullptr) {
    cudaGraphExec_t exec = nullptr;
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    EXPECT_EQ(cudaGraphLaunch(exec, gpu.stream()), cudaSuccess);
    EXPECT_TRUE(gpu.Synchronize().ok());
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  return captured;
}

class GemvParityTest : public ParityTest {
 protected:
  // The GEMV path (CudaBackendOptions::small_m_gemv, on by default) is on unless a suite turns it off.
  cuda::CudaBackendOptions Options() const override {
    cuda::CudaBackendOptions options;
    options.small_m_gemv = true;
    return options;
  }

  // ld 0: rows of k. The padding past k is NaN: a product that read it would show.
  Weights MakeWeights(int64_t n, int64_t k, DType dtype, uint32_t seed, int64_t ld = 0) {
    ld = ld == 0 ? k : ld;
    const Tensor b = Random(Shape{n, ld}, seed, 1.0f / std::sqrt(static_cast<float>(k)));
    for (int64_t i = 0; i < n; ++i) {
      std::fill(b.data_as<float>() + i * ld + k, b.data_as<float>() + (i + 1) * ld,
                std::numeric_limits<float>::quiet_NaN());
    }
    Weights w{Upload(Stored(b, dtype)), Values(b, dtype == DType::kBF16), {}, {}};
    w.gpu = At(w.gpu_storage, 0, Shape{n, k}, Shape{ld, 1});
    w.cpu = At(w.cpu_storage, 0, Shape{n, k}, Shape{ld, 1});
    return w;
  }

  // Runs the case on both backends; returns the relative error over c's view, and checks that c
  // outside the view is untouched.
  double RunGemm(const GemmCase& g, const Weights& w, uint32_t seed) {
    const int64_t m = g.m, n = w.gpu.dim(0), k = w.gpu.dim(1);
    const bool bf16_weights = w.gpu.dtype() == DType::kBF16;
    const int64_t lda = k + g.a_pad, ldc = n + g.c_pad;
    const Tensor a = Random(Shape{g.a_offset + m * lda}, seed);
    const Tensor a_gpu = Upload(Stored(a, g.a_type));
    const Tensor a_cpu = Values(a, bf16_weights && !g.keep_f32_activations);
    const Tensor c_start = Random(Shape{g.c_offset + m * ldc}, seed + 1);
    Tensor c_gpu_start = Values(c_start, false);
    if (g.beta == 0.0f) {  // c must not be read: NaN would show
      for (int64_t i = 0; i < c_gpu_start.numel(); ++i) {
        c_gpu_start.data_as<float>()[i] = std::numeric_limits<float>::quiet_NaN();
      }
    }
    const Tensor c_gpu = Upload(c_gpu_start);
    Tensor c_cpu = Values(c_start, false);
    const Tensor bias = Random(Shape{n}, seed + 2);
    const Tensor bias_gpu = Upload(bias);
    const TensorView bias_gpu_view = bias_gpu.view(), bias_cpu_view = bias.view();
    const Shape a_shape{m, k}, a_strides{lda, 1}, c_shape{m, n}, c_strides{ldc, 1};
    GemmOptions options{g.alpha, g.beta, g.bias ? &bias_gpu_view : nullptr};
    options.keep_f32_activations = g.keep_f32_activations;
    const absl::Status gpu = gpu_->Gemm(At(a_gpu, g.a_offset, a_shape, a_strides), w.gpu,
                                        At(c_gpu, g.c_offset, c_shape, c_strides), options);
    EXPECT_TRUE(gpu.ok()) << gpu;
    options.bias = g.bias ? &bias_cpu_view : nullptr;
    const absl::Status cpu = cpu_.Gemm(At(a_cpu, g.a_offset, a_shape, a_strides), w.cpu,
                                       At(c_cpu, g.c_offset, c_shape, c_strides), options);
    EXPECT_TRUE(cpu.ok()) << cpu;
    const Tensor got = Download(c_gpu);
    // Outside the view: the bits uploaded.
    for (int64_t i = 0; i < got.numel(); ++i) {
      const int64_t row = (i - g.c_offset) / ldc, col = (i - g.c_offset) % ldc;
      if (i >= g.c_offset && row < m && col < n) continue;
      if (std::memcmp(got.data_as<float>() + i, c_gpu_start.data_as<float>() + i, sizeof(float)) != 0) {
        ADD_FAILURE() << "element " << i << " outside c's view was written";
        break;
      }
    }
    return CheckedRelError(Rows(At(got, g.c_offset, c_shape, c_strides)),
                           Rows(At(c_cpu, g.c_offset, c_shape, c_strides)));
  }

  // m rows against `w`, a shape that splits K over a cluster on this device (asserted: GemvKSplit):
  // within `tol` of the CPU plainly and with a strided, offset a and c, bias, alpha and beta.
  void ExpectKSplitMatchesCpu(int64_t m, const Weights& w, bool keep_f32_activations, double tol, uint32_t seed) {
    int device = 0, sms = 0;
    ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
    const cuda::GemvType type = w.gpu.dtype() == DType::kBF16 ? cuda::GemvType::kBF16 : cuda::GemvType::kF32;
    const cuda::GemvActivations activations =
        keep_f32_activations ? cuda::GemvActivations::kKeepF32 : cuda::GemvActivations::kRoundToBf16;
    EXPECT_GT(cuda::GemvKSplit(type, activations, m, w.gpu.dim(0), w.gpu.dim(1), 1, sms), 1);
    EXPECT_LE(RunGemm({.m = m, .keep_f32_activations = keep_f32_activations}, w, seed), tol);
    EXPECT_LE(RunGemm({.m = m, .a_pad = 5, .a_offset = 3, .c_pad = 2, .c_offset = 1, .bias = true, .alpha = 0.5f,
                       .beta = 2.0f, .keep_f32_activations = keep_f32_activations},
                      w, seed + 1),
              tol);
  }
};

}  // namespace eagle3::parity
