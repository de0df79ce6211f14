// Element-type conversion kernels. No abseil here: nvcc must never see it.
#include <cuda_bf16.h>

#include "convert.h"
#include "programmatic_launch.cuh"

namespace eagle3::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void Bf16ToF32Kernel(const uint16_t* __restrict__ in, float* __restrict__ out, int64_t n) {
  PdlEnter();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __uint_as_float(static_cast<uint32_t>(in[i]) << 16);
  }
}

__global__ void F32ToBf16Kernel(const float* __restrict__ in, uint16_t* __restrict__ out, int64_t n) {
  PdlEnter();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
  }
}

// One grid-stride pass over batch * rows * cols elements (flat index i = (b * rows + r) * cols + c);
// the output is contiguous per item: out[(b * rows + r) * ld_out + c] with ld_out >= cols.
__global__ void F32ToBf16RowsKernel(const float* __restrict__ in, int64_t batch_stride_in,
                                    int64_t ld_in, uint16_t* __restrict__ out, int64_t ld_out,
                                    int64_t batch, int64_t rows, int64_t cols) {
  PdlEnter();
  const int64_t n = batch * rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / cols;  // b * rows + r
    const int64_t c = i - row * cols;
    const int64_t b = row / rows;
    const int64_t r = row - b * rows;
    out[row * ld_out + c] =
        __bfloat16_as_ushort(__float2bfloat16_rn(in[b * batch_stride_in + r * ld_in + c]));
  }
}

unsigned GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);  // grid-stride beyond this
}

}  // namespace

cudaError_t LaunchBf16ToF32(const uint16_t* in, float* out, int64_t n, bool programmatic,
                            cudaStream_t stream) {
  if (n < 0 || (n > 0 && (in == nullptr || out == nullptr))) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return LaunchKernel(programmatic, Bf16ToF32Kernel, dim3(GridFor(n)), dim3(kThreads), 0, stream, in,
                      out, n);
}

cudaError_t LaunchF32ToBf16(const float* in, uint16_t* out, int64_t n, bool programmatic,
                            cudaStream_t stream) {
  if (n < 0 || (n > 0 && (in == nullptr || out == nullptr))) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return LaunchKernel(programmatic, F32ToBf16Kernel, dim3(GridFor(n)), dim3(kThreads), 0, stream, in,
                      out, n);
}

cudaError_t LaunchF32ToBf16Rows(const float* in, int64_t ld_in, uint16_t* out, int64_t ld_out,
                                int64_t rows, int64_t cols, bool programmatic, cudaStream_t stream) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (in == nullptr || out == nullptr || (rows > 1 && (ld_in < cols || ld_out < cols))) {
    return cudaErrorInvalidValue;
  }
  if (rows == 1 || (ld_in == cols && ld_out == cols)) {
    return LaunchF32ToBf16(in, out, rows * cols, programmatic, stream);
  }
  const int64_t n = rows * cols;
  return LaunchKernel(programmatic, F32ToBf16RowsKernel, dim3(GridFor(n)), dim3(kThreads), 0, stream,
                      in, 0, ld_in, out, ld_out, 1, rows, cols);
}

cudaError_t LaunchF32ToBf16Batched(const float* in, int64_t batch_stride_in, int64_t ld_in,
                                   uint16_t* out, int64_t batch, int64_t rows, int64_t cols,
                                   bool programmatic, cudaStream_t stream) {
  if (batch < 0 || rows < 0 || cols < 0 || batch_stride_in < 0 || ld_in < 0) {
    return cudaErrorInvalidValue;
  }
  if (batch == 0 || rows == 0 || cols == 0) return cudaSuccess;
  if (in == nullptr || out == nullptr || (rows > 1 && ld_in < cols)) return cudaErrorInvalidValue;
  const int64_t n = batch * rows * cols;
  return LaunchKernel(programmatic, F32ToBf16RowsKernel, dim3(GridFor(n)), dim3(kThreads), 0, stream,
                      in, batch_stride_in, ld_in, out, cols, batch, rows, cols);
}

}  // namespace eagle3::cuda
