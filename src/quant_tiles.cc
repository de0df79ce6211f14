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
    // Runs contiguous in both layouts (QuantTileChunkByte): fp8 a lane's 16-byte chunk, int4 one
    // 4-byte word (int4 rows and the shift are whole words): copy run by run.
    const int64_t run = int4 ? 4 : 16;
    for (int64_t b = 0; b < row_bytes;) {
      const int64_t at = QuantTileOffset(int4, steps, shift, row, b);
      const int64_t in_run = (b + (int4 ? shift / 2 : shift)) % run;
      const int64_t len = std::min<int64_t>(run - in_run, row_bytes - b);
      std::memcpy(out + at, src + b, static_cast<size_t>(len));
      b += len;
    }
  }
}

}  // namespace eagle3
