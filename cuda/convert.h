// Launchers for element-type conversion on the device. Raw pointers, stream last, cudaError_t out;
// no allocation; callable from any C++ compiler (no nvcc needed to include this header).
// Rounding matches the host conversion in eagle3/half.h: round to nearest, ties to even.
// programmatic: the kernel is launched as a programmatic dependent of the kernel before it on
// `stream` (programmatic_launch.cuh; CudaBackendOptions::programmatic_launch): it waits for the
// earlier kernels before it touches memory, so results are the same either way.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace eagle3::cuda {

// out[i] = float(in[i]).
// in:  [n], bf16 bit patterns, device
// out: [n], f32, device
cudaError_t LaunchBf16ToF32(const uint16_t* in, float* out, int64_t n, bool programmatic,
                            cudaStream_t stream);

// out[i] = bf16(in[i]) (NaN becomes a quiet NaN).
// in:  [n], f32, device
// out: [n], bf16 bit patterns, device
cudaError_t LaunchF32ToBf16(const float* in, uint16_t* out, int64_t n, bool programmatic,
                            cudaStream_t stream);

// out[r][c] = bf16(in[r][c]) for a row-strided matrix (a Gemm activation into bf16 scratch).
// in:  [rows, cols], f32, row stride ld_in >= cols (any when rows == 1), device
// out: [rows, cols], bf16 bit patterns, row stride ld_out >= cols, device, no overlap with in
cudaError_t LaunchF32ToBf16Rows(const float* in, int64_t ld_in, uint16_t* out, int64_t ld_out,
                                int64_t rows, int64_t cols, bool programmatic,
                                cudaStream_t stream);

// out[b][r][c] = bf16(in[b * batch_stride_in + r * ld_in + c]): a batch of row-strided matrices
// (BatchedGemm's activations, e.g. the heads of one row) into a contiguous bf16 copy.
// in:  [batch, rows, cols], f32, item stride batch_stride_in >= 0, row stride ld_in >= cols (any
//      when rows == 1), device
// out: [batch, rows, cols], bf16 bit patterns, contiguous, device, no overlap with in
cudaError_t LaunchF32ToBf16Batched(const float* in, int64_t batch_stride_in, int64_t ld_in,
                                   uint16_t* out, int64_t batch, int64_t rows, int64_t cols,
                                   bool programmatic, cudaStream_t stream);

}  // namespace eagle3::cuda
