// Launchers that dequantize weight-only quantized weights into bf16 (the products with many
// activation rows, where CudaBackend::QuantizedGemm runs the bf16 cuBLASLt product on a dequantized
// copy in scratch). Raw pointers, stream last, cudaError_t out; no allocation, no host
// synchronization (capturable); callable from any C++ compiler (no nvcc needed to include this
// header).
//
// Each weight is computed in fp32 exactly as the host reference computes it
// (eagle3/quantized_weight_view.h: DequantizeWeight) and rounded once to bf16 (round to nearest,
// ties to even): the bf16 weights ReadWeightShard(..., DType::kBF16) loads. Scale blocks are
// indexed from the scale pointer, so a caller whose scale tensor starts at global block (R, C)
// passes row0 - R * block_rows and col0 - C * block_cols.
//
// programmatic: the kernel is launched as a programmatic dependent of the kernel before it on
// `stream` (programmatic_launch.cuh; CudaBackendOptions::programmatic_launch): it waits for the
// earlier kernels before it touches memory, so results are the same either way.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace eagle3::cuda {

// Codes in warp-step tiles (eagle3/detail/quant_tiles.h) instead of row-major: `ld` is then unused,
// and the tiles are those of the slice's k columns from GLOBAL column global_col0 (int4: a multiple
// of 8, with shift 0). Default: row-major codes.
struct DequantTiles {
  bool tiled = false;
  int64_t global_col0 = 0;
};

// out[r][c] = bf16(e4m3(codes[r][c]) * scale_inv[(row0 + r) / block_rows][(col0 + c) / block_cols])
// for r < n, c < k. e4m3's NaN codes (0x7f, 0xff) give NaN, as on the host.
// codes:     [n, k] e4m3 bytes, row stride ld >= k (any when n == 1), device, any alignment
// scale_inv: [>= (row0 + n - 1) / block_rows + 1, >= (col0 + k - 1) / block_cols + 1], f32, row
//            stride scale_ld, device
// out:       [n, k], bf16 bit patterns, row stride ld_out >= k (any when n == 1), device, no overlap
//            with the inputs
// n, k >= 0 (nothing to do when either is 0), row0 >= 0, col0 >= 0, block_rows >= 1,
// block_cols >= 1. Returns cudaErrorInvalidValue otherwise, or for a missing pointer.
cudaError_t LaunchFp8BlockDequant(const uint8_t* codes, int64_t ld, const float* scale_inv, int64_t scale_ld,
                                  int64_t row0, int64_t col0, int64_t block_rows, int64_t block_cols,
                                  uint16_t* out, int64_t ld_out, int64_t n, int64_t k, bool programmatic,
                                  cudaStream_t stream, const DequantTiles& tiles = {});

// out[r][c] = bf16(q * scale[r][(col0 + c) / group_size]) for r < n, c < k, where q is value
// shift + c of packed row r (eagle3/detail/int4_packing.h: Int4At).
// packed: [n, >= ceil((shift + k) / 8)] int32, row stride ld (words), device, any alignment
// scale:  [n, >= (col0 + k - 1) / group_size + 1], bf16 bit patterns, row stride scale_ld, device
// out:    [n, k], bf16 bit patterns, row stride ld_out >= k (any when n == 1), device, no overlap
//         with the inputs
// n, k >= 0, 0 <= shift < 8, col0 >= 0, group_size >= 1. Returns cudaErrorInvalidValue otherwise, or
// for a missing pointer.
cudaError_t LaunchInt4GroupDequant(const int32_t* packed, int64_t ld, int shift, const uint16_t* scale,
                                   int64_t scale_ld, int64_t col0, int64_t group_size, uint16_t* out,
                                   int64_t ld_out, int64_t n, int64_t k, bool programmatic,
                                   cudaStream_t stream, const DequantTiles& tiles = {});

}  // namespace eagle3::cuda
