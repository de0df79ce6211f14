#include "eagle3/philox.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace eagle3 {
namespace {

struct KnownAnswer {
  PhiloxCounter counter;
  PhiloxKey key;
  PhiloxCounter expected;
};

// Random123's kat_vectors, the three "philox4x32 10" lines (counter[4] key[2] -> output[4]).
constexpr KnownAnswer kKnownAnswers[] = {
    {{{0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u}},
     {{0x00000000u, 0x00000000u}},
     {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
    {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
     {{0xffffffffu, 0xffffffffu}},
     {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
    {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
     {{0xa4093822u, 0x299f31d0u}},
     {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
};

TEST(PhiloxTest, Random123KnownAnswers) {
  for (const KnownAnswer& kat : kKnownAnswers) {
    const PhiloxCounter out = Philox4x32x10(kat.counter, kat.key);
    for (int w = 0; w < 4; ++w) {
      EXPECT_EQ(out.v[w], kat.expected.v[w]) << "word " << w << " of counter " << std::hex << kat.counter.v[0];
    }
  }
}

TEST(PhiloxTest, UsableInConstantExpressions) {
  // constexpr evaluation is what a __host__ __device__ function gets on both sides.
  constexpr PhiloxCounter out = Philox4x32x10(kKnownAnswers[2].counter, kKnownAnswers[2].key);
  static_assert(out.v[0] == 0xd16cfe09u && out.v[3] == 0x24126ea1u);
  SUCCEED();
}

TEST(PhiloxTest, UniformIsHigh24BitsTimesTwoToMinus24) {
  EXPECT_EQ(PhiloxUniform(0u), 0.0f);
  EXPECT_EQ(PhiloxUniform(0x000000ffu), 0.0f);  // the low 8 bits are dropped
  EXPECT_EQ(PhiloxUniform(0x00000100u), 1.0f / 16777216.0f);
  EXPECT_EQ(PhiloxUniform(0x80000000u), 0.5f);
  EXPECT_EQ(PhiloxUniform(0xffffffffu), 1.0f - 1.0f / 16777216.0f);
  EXPECT_LT(PhiloxUniform(0xffffffffu), 1.0f);
  uint32_t x = 1;
  for (int i = 0; i < 4096; ++i, x = x * 2654435761u + 12345u) {
    EXPECT_EQ(PhiloxUniform(x), static_cast<float>(static_cast<double>(x >> 8) / 16777216.0));
  }
}

TEST(PhiloxTest, CoinAddressesKeyAndCounterAsDocumented) {
  const uint64_t seed = 0x0123456789abcdefull;
  const uint64_t offset = 0xfedcba9876543210ull;
  const PhiloxKey key{{0x89abcdefu, 0x01234567u}};
  const PhiloxCounter counter{{0x76543210u, 0xfedcba98u, 7u, 11u}};
  EXPECT_EQ(PhiloxCoin(seed, offset, 7, 11), PhiloxUniform(Philox4x32x10(counter, key).v[0]));
  // Every coordinate matters.
  const float base = PhiloxCoin(seed, offset, 7, 11);
  EXPECT_NE(PhiloxCoin(seed + 1, offset, 7, 11), base);
  EXPECT_NE(PhiloxCoin(seed, offset + 1, 7, 11), base);
  EXPECT_NE(PhiloxCoin(seed, offset, 8, 11), base);
  EXPECT_NE(PhiloxCoin(seed, offset, 7, 12), base);
}

TEST(PhiloxTest, CoinsLookUniform) {
  // Mean and a 16-bin histogram of 160k coins; loose bounds (5 sigma) that a broken mapping fails.
  constexpr int kBins = 16, kDraws = 160000;
  int counts[kBins] = {};
  double sum = 0.0;
  for (int i = 0; i < kDraws; ++i) {
    const float u = PhiloxCoin(42, 0, static_cast<uint32_t>(i % 97), static_cast<uint32_t>(i / 97));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    ++counts[static_cast<int>(u * kBins)];
  }
  EXPECT_NEAR(sum / kDraws, 0.5, 5 * 0.2887 / 400.0);
  for (int b = 0; b < kBins; ++b) EXPECT_NEAR(counts[b], kDraws / kBins, 5 * 97) << "bin " << b;
}

}  // namespace
}  // namespace eagle3
