// Dynamic per-token-group FP8 quantization of activations (DeepSeek-V3's act_quant, the activation
// side of its W8A8 products): each row of a [m, k] activation is cut into 128-column groups, and each
// group gets its own f32 scale and e4m3 codes, computed on the fly. The W8A8 path of
// CudaBackend::QuantizedGemm (fp8_w8a8_gemm.h) runs it before the cuBLASLt FP8 product. Raw
// pointers, stream last, cudaError_t out; no allocation, no host synchronization (capturable);
// callable from any C++ compiler (no nvcc needed to include this header).
//
// For row r and group j (columns [128 j, min(128 j + 128, k))):
//   amax  = max |x[r][c]| over the group (f32; a bf16 x widened exactly)
//   scale = amax / 448 (f32 division, round to nearest even), or 1 where that is 0 (an all-zero
//           group, or one so small that the division underflows)
//   code  = e4m3(x[r][c] / scale): the f32 quotient rounded to nearest, ties to even, saturating to
//           +-448 (e4m3fn's largest finite value; no infinities), so x ~= e4m3 value * scale
// A group's largest element lands on +-448 exactly; the others keep 3 mantissa bits (relative
// rounding <= 2^-4) down to e4m3's subnormals (2^-9 steps times the scale). NaN inputs are outside
// the contract (the max skips them, the code is e4m3's NaN).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "fp8_w8a8_layout.h"

namespace eagle3::cuda {

// x:      [m, k], T = float, or uint16_t holding bf16 bit patterns; row stride ldx >= k (any when
//         m == 1), device, any alignment
// codes:  [m, k], e4m3 bytes, row stride ld_codes >= k (any when m == 1), device, no overlap with x
// scales: the scale of (row r, group j) at scales[j * scale_ld + r] (Fp8ActScaleIndex with
//         scale_ld = Fp8ActScaleLd(m): cuBLASLt's CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F layout, see
//         fp8_w8a8_layout.h), f32, device, scale_ld >= m
// programmatic: the kernel is launched as a programmatic dependent of the kernel before it on
// `stream` (programmatic_launch.cuh; CudaBackendOptions::programmatic_launch): it waits for the
// earlier kernels before it touches memory, so results are the same either way.
// m, k >= 0 (nothing to do when either is 0). Returns cudaErrorInvalidValue otherwise, or for a
// missing pointer.
template <typename T>
cudaError_t LaunchFp8ActQuant(const T* x, int64_t ldx, int64_t m, int64_t k, uint8_t* codes, int64_t ld_codes,
                              float* scales, int64_t scale_ld, bool programmatic, cudaStream_t stream);

}  // namespace eagle3::cuda
