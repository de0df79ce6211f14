// The device tiler (quant_tile_ops.h): one thread per 16-byte chunk of the tiles, so that the
// writes are whole coalesced 16-byte stores. An fp8 chunk's source bytes, contiguous in its row, are
// one 16-byte load where they lie on a 16-byte boundary inside the row (every hub checkpoint's
// slices: rows padded to 16 bytes, col0 a multiple of 16), else a byte loop (edges, shifts); an int4
// chunk is four words of its row, 16 bytes apart (eagle3/detail/quant_tiles.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "eagle3/detail/quant_tiles.h"
#include "quant_tile_ops.h"

namespace eagle3::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void TileQuantizedCodesKernel(bool int4, const uint8_t* __restrict__ codes, int64_t ld_bytes, int64_t n,
                                         int64_t row_bytes, int64_t steps, int64_t shift_bytes, int64_t chunks,
                                         uint8_t* __restrict__ tiles) {
  for (int64_t q = blockIdx.x * int64_t{kThreads} + threadIdx.x; q < chunks;
       q += int64_t{gridDim.x} * kThreads) {
    // Chunk q is 16-byte piece `within` of tile `tile`: lane within / 2, half within % 2
    // (quant_tiles.h's layout: lane l's 32 bytes at 32 l, row g's chunk then row g + 8's).
    const int64_t tile = q / (kQuantTileBytes / 16), within = q % (kQuantTileBytes / 16);
    const int64_t lane = within / 2, half = within % 2;
    const int64_t group = tile / steps, step = tile % steps;
    const int64_t row = kQuantTileRows * group + lane / 4 + 8 * half;
    const int64_t step_byte = kQuantTileStepBytes * step - shift_bytes;
    const int64_t first = step_byte + QuantTileChunkByte(int4, lane % 4, 0);
    uint4 value = make_uint4(0, 0, 0, 0);
    if (row < n) {
      const uint8_t* src = codes + row * ld_bytes;
      if (int4) {
        // Words c, c + 4, c + 8, c + 12 of the step (QuantTileChunkByte), 16 bytes apart; the row's
        // words are 4-byte aligned (ld_bytes and the shift whole words).
        uint32_t words[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t at = step_byte + QuantTileChunkByte(true, lane % 4, 4 * j);
          words[j] = at >= 0 && at + 4 <= row_bytes ? *reinterpret_cast<const uint32_t*>(src + at) : 0u;
        }
        value = make_uint4(words[0], words[1], words[2], words[3]);
      } else if (first >= 0 && first + 16 <= row_bytes && (reinterpret_cast<uintptr_t>(src + first) % 16) == 0) {
        value = *reinterpret_cast<const uint4*>(src + first);
      } else {
        uint8_t bytes[16];
#pragma unroll
        for (int b = 0; b < 16; ++b) {
          const int64_t at = first + b;
          bytes[b] = at >= 0 && at < row_bytes ? src[at] : 0;
        }
        value = make_uint4(bytes[0] | bytes[1] << 8 | bytes[2] << 16 | static_cast<uint32_t>(bytes[3]) << 24,
                           bytes[4] | bytes[5] << 8 | bytes[6] << 16 | static_cast<uint32_t>(bytes[7]) << 24,
                           bytes[8] | bytes[9] << 8 | bytes[10] << 16 | static_cast<uint32_t>(bytes[11]) << 24,
                           bytes[12] | bytes[13] << 8 | bytes[14] << 16 | static_cast<uint32_t>(bytes[15]) << 24);
      }
    }
    *reinterpret_cast<uint4*>(tiles + 16 * q) = value;
  }
}

}  // namespace

cudaError_t LaunchTileQuantizedCodes(bool int4, const uint8_t* codes, int64_t ld_bytes, int64_t n, int64_t k,
                                     int64_t col0, uint8_t* tiles, cudaStream_t stream) {
  if (codes == nullptr || tiles == nullptr || n < 1 || k < 1 || col0 < 0 || (int4 && col0 % 8 != 0) ||
      reinterpret_cast<uintptr_t>(tiles) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t row_bytes = int4 ? 4 * ((k + 7) / 8) : k;
  if ((n > 1 && ld_bytes < row_bytes) || (int4 && ld_bytes % 4 != 0)) return cudaErrorInvalidValue;
  const int64_t shift = QuantTileShift(int4, col0);
  const int64_t chunks = QuantTiledBytes(int4, n, k, col0) / 16;
  const int64_t blocks = (chunks + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65536 * 16 ? blocks : 65536 * 16);
  TileQuantizedCodesKernel<<<grid, kThreads, 0, stream>>>(int4, codes, ld_bytes, n, row_bytes,
                                                          QuantTileSteps(int4, k, col0), int4 ? shift / 2 : shift,
                                                          chunks, tiles);
  return cudaGetLastError();
}

}  // namespace eagle3::cuda
