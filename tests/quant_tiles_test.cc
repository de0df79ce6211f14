// The warp-step tiled layout of quantized codes (eagle3/detail/quant_tiles.h), checked element by
// element against its definition written out independently here: where each row's byte lands,
// the zero padding (rows past n, columns before the slice's column 0 and past k), fp8 and int4
// slices starting inside a 128-column unit or a 32-column group, rows strided past k, and sizes.
#include "eagle3/detail/quant_tiles.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace eagle3 {
namespace {

// Random row-major codes of a [n, ld] matrix (bytes; int4: ld words of 4 bytes), every byte
// non-zero so that a misplaced padding zero shows.
std::vector<uint8_t> RandomCodes(int64_t n, int64_t ld_bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(1, 255);
  std::vector<uint8_t> codes(static_cast<size_t>(n * ld_bytes));
  for (uint8_t& b : codes) b = static_cast<uint8_t>(byte(rng));
  return codes;
}

// The tiled byte at (row r, byte b of the row's stream of steps): the stream holds, per step s,
// 64 bytes: fp8 columns 64 s - shift .. 64 s + 63 - shift; int4 words (128 s - shift) / 8 .. + 15,
// lane c taking words c, c + 4, c + 8 and c + 12.
struct Case {
  bool int4;
  int64_t n, k, col0, ld;  // ld: bytes (fp8) or words (int4) between rows
};

void Check(const Case& cs) {
  SCOPED_TRACE(testing::Message() << (cs.int4 ? "int4" : "fp8") << " n " << cs.n << " k " << cs.k << " col0 "
                                  << cs.col0 << " ld " << cs.ld);
  const int64_t ld_bytes = cs.int4 ? 4 * cs.ld : cs.ld;
  const std::vector<uint8_t> codes = RandomCodes(cs.n, ld_bytes, static_cast<uint32_t>(cs.n * 31 + cs.k));
  const int64_t bytes = QuantTiledBytes(cs.int4, cs.n, cs.k, cs.col0);
  std::vector<uint8_t> tiled(static_cast<size_t>(bytes), 0xee);
  TileQuantizedCodes(cs.int4, codes.data(), cs.ld, cs.n, cs.k, cs.col0, tiled.data());

  const int64_t shift = cs.int4 ? cs.col0 % 32 : cs.col0 % 128;
  const int64_t units = (shift + cs.k + 127) / 128;
  const int64_t steps = cs.int4 ? units : 2 * units;
  ASSERT_EQ(QuantTileSteps(cs.int4, cs.k, cs.col0), steps);
  ASSERT_EQ(bytes, (cs.n + 15) / 16 * steps * 1024);
  const int64_t row_bytes = cs.int4 ? 4 * ((cs.k + 7) / 8) : cs.k;
  for (int64_t r = 0; r < (cs.n + 15) / 16 * 16; ++r) {
    for (int64_t s = 0; s < steps; ++s) {
      for (int64_t i = 0; i < 64; ++i) {  // byte i of row r's step s
        // Its lane c and byte within the lane's chunk: fp8 chunk i / 16, byte i % 16; int4 word i / 4
        // of the step goes to lane (i / 4) % 4 as that lane's word i / 16.
        const int64_t c = cs.int4 ? (i / 4) % 4 : i / 16;
        const int64_t in_chunk = cs.int4 ? 4 * (i / 16) + i % 4 : i % 16;
        ASSERT_EQ(QuantTileChunkByte(cs.int4, c, in_chunk), i);
        // Where the definition puts it: the tile of (r / 16, s), lane 4 (r % 8) + c, half (r % 16) / 8.
        const int64_t at = ((r / 16) * steps + s) * 1024 + 32 * (4 * (r % 8) + c) + 16 * ((r % 16) / 8) + in_chunk;
        const int64_t src = cs.int4 ? 4 * ((128 * s - shift) / 8) + i : 64 * s - shift + i;
        const uint8_t want = r < cs.n && src >= 0 && src < row_bytes ? codes[r * ld_bytes + src] : 0;
        ASSERT_EQ(tiled[at], want) << "row " << r << " step " << s << " byte " << i;
      }
    }
  }
}

TEST(QuantTilesTest, Fp8AlignedSlice) { Check({false, 32, 256, 0, 256}); }
TEST(QuantTilesTest, Fp8PartialRowsAndColumns) { Check({false, 37, 200, 0, 208}); }
TEST(QuantTilesTest, Fp8SliceInsideAUnit) { Check({false, 20, 300, 48, 304}); }
TEST(QuantTilesTest, Int4AlignedSlice) { Check({true, 16, 256, 0, 32}); }
TEST(QuantTilesTest, Int4SliceInsideAGroup) { Check({true, 23, 100, 8, 16}); }
TEST(QuantTilesTest, Int4OddWidthStridedRows) { Check({true, 9, 35, 24, 8}); }

TEST(QuantTilesTest, SizesOfTheRealRankShapes) {
  // A V3 FP8 routed expert's gate at TP 8 (256 x 7168): 16 groups x 112 steps of 1 KiB, the very
  // bytes of the row-major codes; K2.5 INT4 (256 x 7168 values): 56 steps, half of them.
  EXPECT_EQ(QuantTiledBytes(false, 256, 7168, 0), 256 * 7168);
  EXPECT_EQ(QuantTiledBytes(true, 256, 7168, 0), 256 * 7168 / 2);
  // The down product (7168 x 256): whole units, no padding.
  EXPECT_EQ(QuantTiledBytes(false, 7168, 256, 0), 7168 * 256);
}

}  // namespace
}  // namespace eagle3
