#include "eagle3/detail/quant_tiles.h"

#include <cstring>

namespace eagle3 {

void TileQuantizedCodes(bool int4, const uint8_t* codes, int64_t ld, int64_t n, int64_t k, int64_t col0,
                        uint8_t* out) {
  const int64_t shift = QuantTileShift(int4, col0);
  const int64_t steps = QuantTileSteps(int4, k, col0);
  const int64_t groups = (n + kQuantTileRows - 1) / kQuantTileRows;
  // A row's bytes: fp8 codes [0, k); int4 words [0, ceil(k / 8)), 4 bytes each.
  const int64_t row_bytes = int4 ? 4 * ((k + 7) / 8) : k;
  const int64_t row_stride = int4 ? 4 * ld : ld;
  for (int64_t group = 0; group < groups; ++group) {
    for (int64_t s = 0; s < steps; ++s) {
      uint8_t* tile = out + (group * steps + s) * kQuantTileBytes;
      for (int64_t lane = 0; lane < 32; ++lane) {
        const int64_t g = lane / 4, c = lane % 4;
        // The chunk's first byte in the row: fp8 column 64 s + 16 c - shift; int4 word
        // (128 s + 32 c - shift) / 8 (shift is a multiple of 8).
        const int64_t first = int4 ? 4 * ((128 * s + 32 * c - shift) / 8) : 64 * s + 16 * c - shift;
        for (int64_t h = 0; h < 2; ++h) {
          uint8_t* chunk = tile + 32 * lane + 16 * h;
          const int64_t row = kQuantTileRows * group + g + 8 * h;
          std::memset(chunk, 0, 16);
          if (row >= n) continue;
          const uint8_t* src = codes + row * row_stride;
          for (int64_t b = 0; b < 16; ++b) {
            const int64_t at = first + b;
            if (at >= 0 && at < row_bytes) chunk[b] = src[at];
          }
        }
      }
    }
  }
}

}  // namespace eagle3
