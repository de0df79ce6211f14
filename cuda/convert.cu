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

// One grid-stride pass over rows * cols elements (flat index i = r * cols + c).
__global__ void F32ToBf16RowsKernel(const float* __restrict__ in, int64_t ld_in,
                                    uint16_t* __restrict__ out, int64_t ld_out, int64_t rows,
                                    int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols;
    const int64_t c = i - r * cols;
    out[r * ld_out + c] = __bfloat16_as_ushort(__float2bfloat16_rn(in[r * ld_in + c]));
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

cudaError_t LaunchF32ToBf16Rows(const float* in, int64_t ld_in, uint16_t* out, int64_t ld_out,
                                int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (in == nullptr || out == nullptr || (rows > 1 && (ld_in < cols || ld_out < cols))) {
    return cudaErrorInvalidValue;
  }
  if (rows == 1 || (ld_in == cols && ld_out == cols)) {
    return LaunchF32ToBf16(in, out, rows * cols, stream);
  }
  const int64_t n = rows * cols;
  F32ToBf16RowsKernel<<<GridFor(n), kThreads, 0, stream>>>(in, ld_in, out, ld_out, rows, cols);
  return cudaGetLastError();
}

}  // namespace eagle3::cuda
