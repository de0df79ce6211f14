// GPU tests of device tensors, copies and conversion kernels; skipped where no CUDA device is visible.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "convert.h"
#include "eagle3/cuda/device_allocator.h"
#include "eagle3/cuda/tensor_copy.h"
#include "eagle3/half.h"
#include "eagle3/tensor.h"
#include "gtest/gtest.h"

namespace eagle3::cuda {
namespace {

class CudaTensorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaTensorTest, DeviceTensorRoundTrip) {
  DeviceAllocator allocator(0);
  auto device = Tensor::Empty(DType::kI32, Shape{7, 9}, allocator);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_TRUE(device->device().is_cuda());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(device->data()) % 256, 0u);
  std::vector<int32_t> host(63), back(63, -1);
  for (int i = 0; i < 63; ++i) host[i] = i * 7 - 100;
  TensorView h(host.data(), DType::kI32, Shape{7, 9});
  TensorView b(back.data(), DType::kI32, Shape{7, 9});
  ASSERT_TRUE(CopyTensor(h, *device, nullptr).ok());
  ASSERT_TRUE(CopyTensor(*device, b, nullptr).ok());
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_EQ(host, back);
  auto mismatch = CopyTensor(h, TensorView(back.data(), DType::kI32, Shape{63}), nullptr);
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaTensorTest, BadOrdinalAndOutOfMemoryAreStatuses) {
  DeviceAllocator missing(CudaDeviceCount());
  auto bad = Tensor::Empty(DType::kF32, Shape{4}, missing);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("does not exist"), std::string::npos) << bad.status();
  DeviceAllocator allocator(0);
  auto huge = Tensor::Empty(DType::kU8, Shape{int64_t{1} << 50}, allocator);  // 1 PiB
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  // The failure is reported once, as that Status: a later launch must not see it as its own error.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Allocating and freeing make the allocator's device current only for the call: every (current,
// allocator) pair of visible devices leaves the caller's device current, and the memory is on the
// allocator's device. With one device it is current already (nothing is switched).
TEST_F(CudaTensorTest, AllocationKeepsTheCallersCurrentDevice) {
  const int count = CudaDeviceCount();
  for (int current = 0; current < count; ++current) {
    for (int target = 0; target < count; ++target) {
      SCOPED_TRACE("current cuda:" + std::to_string(current) + ", allocating on cuda:" + std::to_string(target));
      ASSERT_EQ(cudaSetDevice(current), cudaSuccess);
      DeviceAllocator allocator(target);
      int now = -1;
      {
        auto t = Tensor::Empty(DType::kF32, Shape{16}, allocator);
        ASSERT_TRUE(t.ok()) << t.status();
        ASSERT_EQ(cudaGetDevice(&now), cudaSuccess);
        EXPECT_EQ(now, current) << "after allocating";
        cudaPointerAttributes attributes{};
        ASSERT_EQ(cudaPointerGetAttributes(&attributes, t->data()), cudaSuccess);
        EXPECT_EQ(attributes.device, target);
      }
      ASSERT_EQ(cudaGetDevice(&now), cudaSuccess);
      EXPECT_EQ(now, current) << "after freeing";
    }
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

// CPU ≡ CUDA: every bf16 bit pattern widens identically, and f32 -> bf16 rounds like the host.
TEST_F(CudaTensorTest, ConversionKernelsMatchHost) {
  const int64_t n = 1 << 16;
  std::vector<uint16_t> patterns(n);
  for (int64_t i = 0; i < n; ++i) patterns[i] = static_cast<uint16_t>(i);
  std::vector<float> floats(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 100.0f);
  for (auto& f : floats) f = dist(rng);
  floats[0] = 1.0f + 1.0f / 256;  // ties
  floats[1] = 1.0f + 3.0f / 256;
  floats[2] = 3.4e38f;            // rounds to inf

  DeviceAllocator allocator(0);
  auto d_bits = Tensor::Empty(DType::kBF16, Shape{n}, allocator);
  auto d_f32 = Tensor::Empty(DType::kF32, Shape{n}, allocator);
  ASSERT_TRUE(d_bits.ok() && d_f32.ok());

  ASSERT_TRUE(CopyTensor(TensorView(patterns.data(), DType::kBF16, Shape{n}), *d_bits, nullptr).ok());
  ASSERT_EQ(LaunchBf16ToF32(d_bits->data_as<uint16_t>(), d_f32->data_as<float>(), n,
                            /*programmatic=*/true, nullptr),
            cudaSuccess);
  std::vector<float> widened(n);
  ASSERT_TRUE(CopyTensor(*d_f32, TensorView(widened.data(), DType::kF32, Shape{n}), nullptr).ok());
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  for (int64_t i = 0; i < n; ++i) {
    const float expected = Bf16ToFloat(patterns[i]);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(widened[i])) << i;
    } else {
      ASSERT_EQ(widened[i], expected) << i;
    }
  }

  ASSERT_TRUE(CopyTensor(TensorView(floats.data(), DType::kF32, Shape{n}), *d_f32, nullptr).ok());
  ASSERT_EQ(LaunchF32ToBf16(d_f32->data_as<float>(), d_bits->data_as<uint16_t>(), n,
                            /*programmatic=*/true, nullptr),
            cudaSuccess);
  std::vector<uint16_t> narrowed(n);
  ASSERT_TRUE(CopyTensor(*d_bits, TensorView(narrowed.data(), DType::kBF16, Shape{n}), nullptr).ok());
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(narrowed[i], FloatToBf16(floats[i])) << floats[i];

  EXPECT_EQ(LaunchBf16ToF32(nullptr, d_f32->data_as<float>(), 4, true, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchF32ToBf16(d_f32->data_as<float>(), d_bits->data_as<uint16_t>(), -1, true, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace eagle3::cuda
