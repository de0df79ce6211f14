#include "eagle3/detail/quant_tiles.h"

#include <algorithm>
#include <cstring>

namespace eagle3 {

void TileQuantizedCodes(bool int4, const uint8_t* codes, int64_t ld, int64_t n, int64_t k, int64_t col0,
                        uint8_t* out) {
  const int64_t shift = QuantTileShift(int4, col0);
  const int64_t steps = QuantTileSteps(int4, k, col0);
  // Padding (rows past n, bytes before the slice's column 0 and past its last) stays zero.
  std::memset(out, 0, static_cast<size_t>(QuantTiledBytes(int4, n, k, col0)));
  // A row's bytes: fp8 codes [0, k); int4 words [0, ceil(k / 8)), 4 bytes each.
  const int64_t row_bytes = int4 ? 4 * ((k + 7) / 8) : k;
  const int64_t row_stride = int4 ? 4 * ld : ld;
  for (int64_t row = 0; row < n; ++row) {
    const uint8_t* src = codes + row * row_stride;
    // A step's 16-byte chunk is contiguous in both layouts: copy chunk by chunk.
    for (int64_t b = 0; b < row_bytes;) {
      const int64_t at = QuantTileOffset(int4, steps, shift, row, b);
      const int64_t in_chunk = (b + (int4 ? shift / 2 : shift)) % 16;
      const int64_t len = std::min<int64_t>(16 - in_chunk, row_bytes - b);
      std::memcpy(out + at, src + b, static_cast<size_t>(len));
      b += len;
    }
  }
}

}  // namespace eagle3
