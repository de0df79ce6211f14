// cuda/latent_wgmma_layout.h: the shared-memory layout and the wgmma descriptors of the warpgroup
// latent kernel. An emulation of how the tensor cores read an operand through a descriptor (the
// canonical 128-byte-swizzled layouts, K-major and MN-major, of the PTX ISA's "Shared Memory Matrix
// Layout"; CUTLASS's make_gmma_desc states the same) reads every element of every instruction the
// kernel issues, and each must be the element the kernel's staging put there. Plain arithmetic: no
// device. What this cannot check (the register fragments, the instructions' semantics) the gpu
// suite does against the CPU reference.
#include "latent_wgmma_layout.h"
#include "latent_wgmma_pair_layout.h"

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace eagle3::cuda {
namespace {

struct Fields {
  uint32_t start, lbo, sbo, mode;
};

Fields Decode(uint64_t desc) {
  return {static_cast<uint32_t>(desc & 0x3fffu) << 4, static_cast<uint32_t>((desc >> 16) & 0x3fffu) << 4,
          static_cast<uint32_t>((desc >> 32) & 0x3fffu) << 4, static_cast<uint32_t>(desc >> 62)};
}

// The shared-window byte address the tensor cores read for element (mn, k) of a 16-bit operand
// (mn < M or N, k < 16) described by `desc` with the 128-byte swizzle: the canonical layout's
// address, then bits 4-6 XORed with bits 7-9.
//  K-major:  ((8, m), (8, 2)) : ((128 B, SBO), (2 B, 16 B))
//  MN-major: ((8, 8, m), (8, k)) : ((2 B, 16 B, LBO), (128 B, SBO))
uint32_t TensorCoreAddress(uint64_t desc, bool mn_major, uint32_t mn, uint32_t k) {
  const Fields f = Decode(desc);
  uint32_t address;
  if (!mn_major) {
    address = f.start + (mn % 8) * 128 + (mn / 8) * f.sbo + (k % 8) * 2 + (k / 8) * 16;
  } else {
    address = f.start + (mn % 8) * 2 + (mn / 8 % 8) * 16 + (mn / 64) * f.lbo + (k % 8) * 128 + (k / 8) * f.sbo;
  }
  return address ^ (((address >> 7) & 7u) << 4);
}

// Shared-window bases the block's dynamic shared memory may start at: 1024-byte aligned (the
// kernel's requirement), the first one 0.
const std::vector<uint32_t> kBases = {0, 1024, 7 * 1024};

TEST(LatentWgmmaLayoutTest, DescriptorFieldsRoundTrip) {
  const uint64_t desc = WgmmaDescriptor(0x12340, 8192, 1024);
  const Fields f = Decode(desc);
  EXPECT_EQ(f.start, 0x12340u);
  EXPECT_EQ(f.lbo, 8192u);
  EXPECT_EQ(f.sbo, 1024u);
  EXPECT_EQ(f.mode, 1u);  // 128-byte swizzle
  EXPECT_EQ((desc >> 46) & 0x7u, 0u);  // base offset 0: panels start on the swizzle's period
  EXPECT_EQ(Decode(WgmmaDescriptor(0x40000 + 0x100, 16, 1024)).start, 0x100u);  // 18 address bits
}

// The kernel builds each operand's descriptor once and advances it by each instruction's offset.
TEST(LatentWgmmaLayoutTest, AdvancedDescriptorsEqualBuiltOnes) {
  for (uint32_t start = 0; start + kWgmmaLaunchSharedBytes <= (1u << 18); start += 4096) {
    for (uint32_t offset = 0; offset < kWgmmaLaunchSharedBytes; offset += 16) {
      for (const auto& [lbo, sbo] :
           {std::pair{kWgmmaKMajorLbo, kWgmmaKMajorSbo}, std::pair{kWgmmaMnMajorLbo, kWgmmaMnMajorSbo}}) {
        ASSERT_EQ(WgmmaDescriptorAdvance(WgmmaDescriptor(start, lbo, sbo), offset),
                  WgmmaDescriptor(start + offset, lbo, sbo))
            << "start " << start << " offset " << offset;
      }
    }
  }
}

TEST(LatentWgmmaLayoutTest, OperandLayoutIsABijection) {
  std::vector<int> seen(kWgmmaOperandBytes / 2, 0);
  for (uint32_t row = 0; row < 64; ++row) {
    for (uint32_t dim = 0; dim < kWgmmaDim; ++dim) {
      const uint32_t offset = WgmmaOperandOffset(row, dim);
      ASSERT_EQ(offset % 2, 0u);
      ASSERT_LT(offset, kWgmmaOperandBytes);
      ++seen[offset / 2];
    }
  }
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "bf16 slot " << i;
}

// The copies: a 16-byte piece lands where its 8 elements belong, and a lane's pieces j, j + 8, ...
// (one per panel) sit kWgmmaPanelBytes apart, as the kernel's copy loop steps them.
TEST(LatentWgmmaLayoutTest, CopiedPiecesHoldTheirElements) {
  for (uint32_t row = 0; row < 64; ++row) {
    for (uint32_t piece = 0; piece < kWgmmaDim / 8; ++piece) {
      EXPECT_EQ(WgmmaPieceOffset(row, piece) % 16, 0u);
      for (uint32_t e = 0; e < 8; ++e) {
        ASSERT_EQ(WgmmaPieceOffset(row, piece) + 2 * e, WgmmaOperandOffset(row, 8 * piece + e));
      }
    }
    for (uint32_t lane = 0; lane < 8; ++lane) {
      for (uint32_t j = 0; j < kWgmmaDim / kWgmmaPanelWidth; ++j) {
        ASSERT_EQ(WgmmaPieceOffset(row, lane + 8 * j), WgmmaPieceOffset(row, lane) + j * kWgmmaPanelBytes);
      }
    }
  }
}

// Scores, warpgroup `half`, k-step i: A = the queries (row m, dims 16 i + k), B = the chunk's key
// 32 half + n (dims 16 i + k), both K-major.
TEST(LatentWgmmaLayoutTest, ScoreProductsReadTheirElements) {
  for (const uint32_t base : kBases) {
    const uint32_t q = base + kWgmmaQueryOffset;
    for (int stage = 0; stage < kWgmmaStages; ++stage) {
      const uint32_t keys = base + kWgmmaStageOffset + stage * kWgmmaOperandBytes;
      for (int i = 0; i < kWgmmaScoreSteps; ++i) {
        const uint64_t a = WgmmaDescriptor(q + WgmmaScoreAStart(i), kWgmmaKMajorLbo, kWgmmaKMajorSbo);
        for (uint32_t m = 0; m < 64; ++m) {
          for (uint32_t k = 0; k < 16; ++k) {
            ASSERT_EQ(TensorCoreAddress(a, false, m, k), q + WgmmaOperandOffset(m, 16 * i + k))
                << "A, i " << i << " m " << m << " k " << k;
          }
        }
        for (int half = 0; half < 2; ++half) {
          const uint64_t b = WgmmaDescriptor(keys + WgmmaScoreBStart(half, i), kWgmmaKMajorLbo, kWgmmaKMajorSbo);
          for (uint32_t n = 0; n < kWgmmaHalfKeys; ++n) {
            for (uint32_t k = 0; k < 16; ++k) {
              ASSERT_EQ(TensorCoreAddress(b, false, n, k),
                        keys + WgmmaOperandOffset(kWgmmaHalfKeys * half + n, 16 * i + k))
                  << "B, half " << half << " i " << i << " n " << n << " k " << k;
            }
          }
        }
      }
    }
  }
}

// The value products' B of k-step j, both warpgroups' halves, from a stage at `keys`: key 16 j + k,
// value dim 256 half + n, MN-major.
void ExpectValueBReads(uint32_t keys, int j) {
  for (int half = 0; half < 2; ++half) {
    const uint64_t b = WgmmaDescriptor(keys + WgmmaValueBStart(half, j), kWgmmaMnMajorLbo, kWgmmaMnMajorSbo);
    for (uint32_t n = 0; n < kWgmmaHalfColumns; ++n) {
      for (uint32_t k = 0; k < 16; ++k) {
        ASSERT_EQ(TensorCoreAddress(b, true, n, k), keys + WgmmaOperandOffset(16 * j + k, kWgmmaHalfColumns * half + n))
            << "keys at " << keys << " half " << half << " j " << j << " n " << n << " k " << k;
      }
    }
  }
}

// Values, warpgroup `half`, k-step j: A = the probabilities (row m, key 16 j + k), K-major; B = the
// chunk's key 16 j + k, value dim 256 half + n, MN-major.
TEST(LatentWgmmaLayoutTest, ValueProductsReadTheirElements) {
  for (const uint32_t base : kBases) {
    const uint32_t probs = base + kWgmmaProbOffset;
    for (int j = 0; j < kWgmmaValueSteps; ++j) {
      const uint64_t a = WgmmaDescriptor(probs + WgmmaValueAStart(j), kWgmmaKMajorLbo, kWgmmaKMajorSbo);
      for (uint32_t m = 0; m < 64; ++m) {
        for (uint32_t k = 0; k < 16; ++k) {
          ASSERT_EQ(TensorCoreAddress(a, false, m, k), probs + WgmmaPanelOffset(m, 16 * j + k));
        }
      }
      for (int stage = 0; stage < kWgmmaStages; ++stage) {
        ExpectValueBReads(base + kWgmmaStageOffset + stage * kWgmmaOperandBytes, j);
      }
    }
  }
}

// The probabilities are written as bf16 pairs (keys 2 c, 2 c + 1): adjacent. A key no row allows
// has its 512 value dims zeroed as 64 16-byte pieces (piece / 8 the panel, piece % 8 the 16 bytes
// of its row): exactly its value elements.
TEST(LatentWgmmaLayoutTest, PairsAndZeroedValuesCoverTheirElements) {
  for (uint32_t row = 0; row < 64; ++row) {
    for (uint32_t key = 0; key < kWgmmaChunk; key += 2) {
      ASSERT_EQ(WgmmaPanelOffset(row, key) + 2, WgmmaPanelOffset(row, key + 1));
      ASSERT_EQ(WgmmaPanelOffset(row, key) % 4, 0u);
    }
  }
  for (uint32_t key = 0; key < kWgmmaChunk; ++key) {
    std::set<uint32_t> zeroed, values;
    for (uint32_t piece = 0; piece < 64; ++piece) {
      const uint32_t piece_start = (piece / 8) * kWgmmaPanelBytes + key * kWgmmaRowBytes + (piece % 8) * 16;
      for (uint32_t b = 0; b < 16; b += 2) zeroed.insert(piece_start + b);
    }
    for (uint32_t dim = 0; dim < kWgmmaValueDim; ++dim) values.insert(WgmmaOperandOffset(key, dim));
    EXPECT_EQ(zeroed, values) << "key " << key;
  }
}

TEST(LatentWgmmaLayoutTest, SharedMemoryRegionsDoNotOverlap) {
  EXPECT_EQ(kWgmmaQueryOffset + kWgmmaOperandBytes, kWgmmaStageOffset);
  EXPECT_EQ(kWgmmaStageOffset + kWgmmaStages * kWgmmaOperandBytes, kWgmmaProbOffset);
  EXPECT_EQ(kWgmmaProbOffset + kWgmmaPanelBytes, kWgmmaHalfMaxOffset);
  EXPECT_EQ(kWgmmaAllowOffset % 8, 0u);
  EXPECT_EQ(kWgmmaUsedOffset % 8, 0u);
  EXPECT_LE(kWgmmaLaunchSharedBytes, 227u * 1024);
  EXPECT_GE(kWgmmaLaunchSharedBytes - kWgmmaSharedBytes, 1024u - 16);  // any 16-byte-aligned base
}

// The paired-chunk kernel: each stage's nine panels are refilled by exactly one warpgroup, and a
// warpgroup refills a panel only where it reads that panel last (its value half of either stage;
// the RoPE panel of its own stage, which only its scores read).
TEST(LatentWgmmaLayoutTest, PairRefillsEveryPanelOnce) {
  for (int stage = 0; stage < 2; ++stage) {
    for (int panel = 0; panel < kWgmmaDim / kWgmmaPanelWidth; ++panel) {
      const int by =
          static_cast<int>(WgmmaPairRefills(0, stage, panel)) + static_cast<int>(WgmmaPairRefills(1, stage, panel));
      EXPECT_EQ(by, 1) << "stage " << stage << " panel " << panel;
      for (int half = 0; half < 2; ++half) {
        if (!WgmmaPairRefills(half, stage, panel)) continue;
        const bool reads_values = panel < kWgmmaValueDim / kWgmmaPanelWidth && panel / 4 == half;
        EXPECT_TRUE(reads_values || stage == half) << "stage " << stage << " panel " << panel;
      }
    }
  }
}

// The paired-chunk kernel's products at its own offsets. Scores of a whole chunk (N = 64 keys):
// A = the staged queries (dims 0-511; the RoPE dims come from registers), B = key n of either
// stage over all 576 dims. Values: A = either warpgroup's stored probabilities, B = dims 256 half +
// n of either stage.
TEST(LatentWgmmaLayoutTest, PairProductsReadTheirElements) {
  for (const uint32_t base : kBases) {
    const uint32_t q = base + kWgmmaPairQueryOffset;
    for (int i = 0; i < kWgmmaPairStagedScoreSteps; ++i) {
      const uint64_t a = WgmmaDescriptor(q + WgmmaScoreAStart(i), kWgmmaKMajorLbo, kWgmmaKMajorSbo);
      for (uint32_t m = 0; m < 64; ++m) {
        for (uint32_t k = 0; k < 16; ++k) {
          ASSERT_EQ(TensorCoreAddress(a, false, m, k), q + WgmmaOperandOffset(m, 16 * i + k)) << "A, i " << i;
          ASSERT_LT(WgmmaOperandOffset(m, 16 * i + k), kWgmmaPairStageOffset - kWgmmaPairQueryOffset);
        }
      }
    }
    for (int stage = 0; stage < 2; ++stage) {
      const uint32_t keys = base + kWgmmaPairStageOffset + stage * kWgmmaOperandBytes;
      for (int i = 0; i < kWgmmaScoreSteps; ++i) {
        const uint64_t b = WgmmaDescriptor(keys + WgmmaScoreBStart(0, i), kWgmmaKMajorLbo, kWgmmaKMajorSbo);
        for (uint32_t n = 0; n < kWgmmaChunk; ++n) {
          for (uint32_t k = 0; k < 16; ++k) {
            ASSERT_EQ(TensorCoreAddress(b, false, n, k), keys + WgmmaOperandOffset(n, 16 * i + k))
                << "B, stage " << stage << " i " << i << " n " << n << " k " << k;
          }
        }
      }
      for (int j = 0; j < kWgmmaValueSteps; ++j) ExpectValueBReads(keys, j);
    }
    for (int owner = 0; owner < 2; ++owner) {
      const uint32_t probs = base + kWgmmaPairProbOffset + owner * kWgmmaPanelBytes;
      for (int j = 0; j < kWgmmaValueSteps; ++j) {
        const uint64_t a = WgmmaDescriptor(probs + WgmmaValueAStart(j), kWgmmaKMajorLbo, kWgmmaKMajorSbo);
        for (uint32_t m = 0; m < 64; ++m) {
          for (uint32_t k = 0; k < 16; ++k) {
            ASSERT_EQ(TensorCoreAddress(a, false, m, k), probs + WgmmaPanelOffset(m, 16 * j + k));
          }
        }
      }
    }
  }
}

TEST(LatentWgmmaLayoutTest, PairSharedMemoryRegionsDoNotOverlap) {
  EXPECT_EQ(kWgmmaPairQueryOffset + kWgmmaPairStagedQueryPanels * kWgmmaPanelBytes, kWgmmaPairStageOffset);
  EXPECT_EQ(kWgmmaPairStageOffset + 2 * kWgmmaOperandBytes, kWgmmaPairProbOffset);
  EXPECT_EQ(kWgmmaPairProbOffset + 2 * kWgmmaPanelBytes, kWgmmaPairMaxOffset);
  EXPECT_EQ(kWgmmaPairAllowOffset % 8, 0u);
  EXPECT_EQ(kWgmmaPairBarrierOffset % 8, 0u);  // mbarriers are 8-byte aligned
  EXPECT_LE(kWgmmaPairLaunchSharedBytes, kWgmmaLaunchSharedBytes);  // launched with the plan's bytes
  EXPECT_EQ(kWgmmaPairStagedScoreSteps + kWgmmaPairRegisterScoreSteps, kWgmmaScoreSteps);
}

}  // namespace
}  // namespace eagle3::cuda
