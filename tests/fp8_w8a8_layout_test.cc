// cuda/fp8_w8a8_layout.h: cuBLASLt's block-scale layouts (VEC128_32F outer-dimension-major,
// BLK128x128_32F K-major with K blocks padded to 4) and which weight slices the W8A8 path of
// CudaBackend::QuantizedGemm takes, at DeepSeek-V3's TP 8 shapes. Plain arithmetic: no device.
#include "fp8_w8a8_layout.h"

#include <cstdint>
#include <set>

#include "gtest/gtest.h"

namespace eagle3::cuda {
namespace {

TEST(Fp8W8A8LayoutTest, ActivationScalesAreOuterDimensionMajor) {
  const int64_t rows = 3, k = 300;  // 3 groups, the last partial
  EXPECT_EQ(Fp8W8A8KBlocks(k), 3);
  EXPECT_EQ(Fp8ActScaleLd(rows), 4);  // rows padded to 4
  EXPECT_EQ(Fp8ActScaleLd(16), 16);
  EXPECT_EQ(Fp8ActScaleLd(17), 20);
  EXPECT_EQ(Fp8ActScaleCount(rows, k), 12);
  EXPECT_EQ(Fp8ActScaleIndex(rows, 0, 0), 0);
  EXPECT_EQ(Fp8ActScaleIndex(rows, 1, 0), 1);  // the next row: the next scale
  EXPECT_EQ(Fp8ActScaleIndex(rows, 0, 1), 4);  // the next group: the padded row count further
  std::set<int64_t> seen;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < Fp8W8A8KBlocks(k); ++j) seen.insert(Fp8ActScaleIndex(rows, r, j));
  }
  EXPECT_EQ(seen.size(), 9u);
  EXPECT_EQ(*seen.rbegin(), 10);
}

TEST(Fp8W8A8LayoutTest, TakesRowCountsThatAreMultiplesOfFour) {
  for (const int64_t rows : {4, 8, 16, 20, 64, 1000, 2048}) EXPECT_TRUE(Fp8W8A8RowsTaken(rows)) << rows;
  for (const int64_t rows : {0, 1, 2, 3, 17, 63, 1001}) EXPECT_FALSE(Fp8W8A8RowsTaken(rows)) << rows;
}

TEST(Fp8W8A8LayoutTest, WeightScaleRowsArePaddedToFourBlocks) {
  EXPECT_EQ(Fp8WeightScaleLd(7168), 56);  // q_a, kv_a, gate_up: 56 blocks, already a multiple of 4
  EXPECT_EQ(Fp8WeightScaleLd(2048), 16);  // o_proj TP 8
  EXPECT_EQ(Fp8WeightScaleLd(1536), 12);  // q_b
  EXPECT_EQ(Fp8WeightScaleLd(2304), 20);  // dense down TP 8: 18 blocks
  EXPECT_EQ(Fp8WeightScaleLd(128), 4);
  EXPECT_EQ(Fp8WeightScaleLd(640), 8);
  EXPECT_EQ(Fp8WeightScaleIndex(2304, 0, 17), 17);
  EXPECT_EQ(Fp8WeightScaleIndex(2304, 1, 0), 20);
  EXPECT_EQ(Fp8WeightScaleCount(576, 7168), 5 * 56);  // kv_a: a half-used last block row
  EXPECT_EQ(Fp8WeightScaleCount(7168, 2304), 56 * 20);
}

Fp8W8A8Slice V3Slice(int64_t n, int64_t k, int64_t row0, int64_t col0) {
  return Fp8W8A8Slice{.n = n,
                      .k = k,
                      .row0 = row0,
                      .col0 = col0,
                      .block_rows = 128,
                      .block_cols = 128,
                      .codes = 0x10000,
                      .codes_ld = k};
}

TEST(Fp8W8A8LayoutTest, TakesSlicesOnBlockBoundaries) {
  EXPECT_TRUE(Fp8W8A8Takes(V3Slice(1536, 7168, 0, 0)));        // q_a
  EXPECT_TRUE(Fp8W8A8Takes(V3Slice(576, 7168, 0, 0)));         // kv_a
  EXPECT_TRUE(Fp8W8A8Takes(V3Slice(7168, 2048, 0, 2048)));     // o_proj, rank 1 of 8
  EXPECT_TRUE(Fp8W8A8Takes(V3Slice(4608, 7168, 4608, 0)));     // dense gate_up, rank 1 of 8
  EXPECT_TRUE(Fp8W8A8Takes(V3Slice(7168, 2304, 0, 2304)));     // dense down, rank 1 of 8
  EXPECT_FALSE(Fp8W8A8Takes(V3Slice(7168, 2048, 0, 2064)));    // column 2064: inside a block
  EXPECT_FALSE(Fp8W8A8Takes(V3Slice(512, 7168, 64, 0)));       // row 64: inside a block
  EXPECT_FALSE(Fp8W8A8Takes(V3Slice(512, 300, 0, 0)));         // K not a multiple of 128
  EXPECT_FALSE(Fp8W8A8Takes(V3Slice(200, 7168, 0, 0)));        // N not a multiple of 16
  Fp8W8A8Slice s = V3Slice(1536, 7168, 0, 0);
  s.block_rows = s.block_cols = 64;
  EXPECT_FALSE(Fp8W8A8Takes(s));
  s = V3Slice(1536, 7168, 0, 0);
  s.codes += 8;
  EXPECT_FALSE(Fp8W8A8Takes(s));
  s = V3Slice(1536, 7168, 0, 0);
  s.codes_ld = 7176;  // rows 8 bytes off 16-byte boundaries
  EXPECT_FALSE(Fp8W8A8Takes(s));
}

TEST(Fp8W8A8LayoutTest, ReadsCheckpointScalesInPlaceOnlyWhenTheyAreTheLayout) {
  const uintptr_t aligned = 0x20000;
  // q_a's whole grid: [12, 56] row-major, L4 = 56.
  EXPECT_TRUE(Fp8W8A8ScalesDirect(1536, 7168, aligned, 56, 56));
  // o_proj rank 1 of 8 in the whole grid [56, 128]: rows 128 apart, not L4 = 16.
  EXPECT_FALSE(Fp8W8A8ScalesDirect(7168, 2048, aligned + 16 * 4, 128, 112));
  // The same slice with only its own blocks [56, 16].
  EXPECT_TRUE(Fp8W8A8ScalesDirect(7168, 2048, aligned, 16, 16));
  // Dense down rank 1 with only its own blocks [56, 18]: L4 = 20 needs padding.
  EXPECT_FALSE(Fp8W8A8ScalesDirect(7168, 2304, aligned, 18, 18));
  // One block row: the row stride is unused, but cuBLASLt still reads L4 blocks of it.
  EXPECT_TRUE(Fp8W8A8ScalesDirect(128, 2304, aligned, 18, 20));
  EXPECT_FALSE(Fp8W8A8ScalesDirect(128, 2304, aligned, 18, 18));
  // Misaligned: the slice's first block 4 bytes into a 16-byte chunk.
  EXPECT_FALSE(Fp8W8A8ScalesDirect(1536, 7168, aligned + 4, 56, 56));
}

}  // namespace
}  // namespace eagle3::cuda
