// Launcher of the device tiler behind CudaBackend::TileQuantizedCodes: row-major quantized codes
// rewritten in the warp-step tiles the quantized GEMV streams (eagle3/detail/quant_tiles.h). Raw
// pointers, stream last, cudaError_t out; callable from any C++ compiler.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace eagle3::cuda {

// Writes QuantTiledBytes(int4, n, k, col0) bytes at `tiles` (every byte; padding zeros) from the
// row-major codes of a [n, k] slice starting at global column col0: fp8 `codes` [n, ld_bytes] e4m3
// bytes, int4 `codes` [n, ld_bytes / 4] packed words given as bytes (ld_bytes a multiple of 4, word
// 0 of a row = the slice's first word, col0 a multiple of 8). ld_bytes >= the row's bytes (any
// when n == 1). Device memory, `tiles` not overlapping `codes`. n, k >= 1, col0 >= 0.
// cudaErrorInvalidValue for arguments outside this.
cudaError_t LaunchTileQuantizedCodes(bool int4, const uint8_t* codes, int64_t ld_bytes, int64_t n, int64_t k,
                                     int64_t col0, uint8_t* tiles, cudaStream_t stream);

}  // namespace eagle3::cuda
