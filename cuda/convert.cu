// Element-type conversion kernels. No abseil here: nvcc must never see it.
#include <cuda_bf16.h>

#include "eagle3/cuda/convert.h"

namespace eagle3::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void Bf16ToF32Kernel(const uint16_t* __restrict__ in, float* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __uint_as_float(static_cast<uint32_t>(in[i]) << 16);
  }
}

__global__ void F32ToBf16Kernel(const float* __restrict__ in, uint16_t* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
  }
}

unsigned GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);  // grid-stride beyond this
}

}  // namespace

cudaError_t LaunchBf16ToF32(const uint16_t* in, float* out, int64_t n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && (in == nullptr || out == nullptr))) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  Bf16ToF32Kernel<<<GridFor(n), kThreads, 0, stream>>>(in, out, n);
  return cudaGetLastError();
}

cudaError_t LaunchF32ToBf16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && (in == nullptr || out == nullptr))) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  F32ToBf16Kernel<<<GridFor(n), kThreads, 0, stream>>>(in, out, n);
  return cudaGetLastError();
}

}  // namespace eagle3::cuda
