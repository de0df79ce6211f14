// Helpers for the CPU-vs-CUDA parity tests: random host tensors, uploads and downloads through the
// CudaBackend, and a relative error. Tests skip when no CUDA device is visible.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/device_allocator.h"
#include "eagle3/tensor.h"
#include "gtest/gtest.h"

namespace eagle3::parity {

// Skips the test without a GPU; otherwise owns one CudaBackend and one CpuBackend.
class ParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    auto backend = cuda::CudaBackend::Create(Options());
    ASSERT_TRUE(backend.ok()) << backend.status();
    gpu_ = std::move(*backend);
  }

  // The GPU backend's options; a suite overrides them to test a path the defaults do not take.
  virtual cuda::CudaBackendOptions Options() const { return {}; }

  // Host tensor of N(0, stddev) values (f32), or uniform integers in [lo, hi) for integer dtypes.
  static Tensor Random(const Shape& shape, uint32_t seed, float stddev = 1.0f) {
    Tensor t = *Tensor::Empty(DType::kF32, shape);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, stddev);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng);
    return t;
  }
  static Tensor RandomInts(DType dtype, const Shape& shape, uint32_t seed, int64_t lo, int64_t hi) {
    Tensor t = *Tensor::Empty(dtype, shape);
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int64_t> dist(lo, hi - 1);
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (dtype == DType::kI64) t.data_as<int64_t>()[i] = dist(rng);
      if (dtype == DType::kI32) t.data_as<int32_t>()[i] = static_cast<int32_t>(dist(rng));
      if (dtype == DType::kU8 || dtype == DType::kBool) t.data_as<uint8_t>()[i] = static_cast<uint8_t>(dist(rng));
    }
    return t;
  }

  // A device copy of a host tensor.
  Tensor Upload(const Tensor& host) {
    Tensor d = *Tensor::Empty(host.dtype(), host.shape(), gpu_->allocator());
    EXPECT_TRUE(gpu_->Copy(host, d).ok());
    return d;
  }
  // A host copy of a (possibly strided) device view, made contiguous.
  Tensor Download(const TensorView& device) {
    Tensor h = *Tensor::Empty(device.dtype(), device.shape());
    EXPECT_TRUE(gpu_->Copy(device, h).ok());
    EXPECT_TRUE(gpu_->Synchronize().ok());
    return h;
  }

  std::unique_ptr<cuda::CudaBackend> gpu_;
  cpu::CpuBackend cpu_;
};

// max |a - b| / max(max |b|, 1e-30) over two host f32 tensors of equal size; +inf when an element
// is NaN on one side only (std::max would otherwise drop it and pass the comparison).
inline double RelError(const TensorView& a, const TensorView& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double diff = 0, scale = 1e-30;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) {
    if (std::isnan(a.data_as<float>()[i]) != std::isnan(b.data_as<float>()[i])) {
      return std::numeric_limits<double>::infinity();
    }
    if (std::isnan(a.data_as<float>()[i])) continue;
    diff = std::max(diff, static_cast<double>(std::fabs(a.data_as<float>()[i] - b.data_as<float>()[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b.data_as<float>()[i])));
  }
  return diff / scale;
}

}  // namespace eagle3::parity
