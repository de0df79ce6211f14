// Philox-4x32-10 counter-based random numbers (Salmon, Moraes, Dror, Shaw, "Parallel random numbers:
// as easy as 1, 2, 3", SC 2011), header-only so that host code and CUDA kernels draw bit-identical
// numbers from the same (key, counter). No abseil and no std:: containers: this header may be
// included from .cu files.
//
// A block maps a 128-bit counter and a 64-bit key to 128 random bits through 10 rounds of
//   (c0, c1, c2, c3) -> (hi(M1 * c2) ^ c1 ^ k0, lo(M1 * c2), hi(M0 * c0) ^ c3 ^ k1, lo(M0 * c0))
// with the key bumped by the Weyl constants (W0, W1) between rounds, exactly as the Random123
// reference philox4x32_R(10, ...) computes it; tests/philox_test.cc checks Random123's published
// known-answer vectors (kat_vectors: all zeros, all ones, the pi digits).
#pragma once

#include <cstdint>

#include "eagle3/detail/host_device.h"

namespace eagle3 {

struct PhiloxCounter {
  uint32_t v[4];
};
struct PhiloxKey {
  uint32_t v[2];
};

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;  // multiplier of words 0/1
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;  // multiplier of words 2/3
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // key bump, golden ratio
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // key bump, sqrt(3) - 1

EAGLE3_HOST_DEVICE constexpr PhiloxCounter PhiloxRound(PhiloxCounter c, PhiloxKey k) {
  const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c.v[0];
  const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c.v[2];
  const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  return PhiloxCounter{{hi1 ^ c.v[1] ^ k.v[0], lo1, hi0 ^ c.v[3] ^ k.v[1], lo0}};
}

// Philox-4x32 with 10 rounds: the 128 random bits of block `counter` under `key`.
EAGLE3_HOST_DEVICE constexpr PhiloxCounter Philox4x32x10(PhiloxCounter counter, PhiloxKey key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key.v[0] += kPhiloxW0;
      key.v[1] += kPhiloxW1;
    }
    counter = PhiloxRound(counter, key);
  }
  return counter;
}

// Uniform float in [0, 1) from one 32-bit word, bit-exactly: the 24 high bits times 2^-24, i.e.
// (x >> 8) * 2^-24. Every value is a multiple of 2^-24, exactly representable in float; the largest
// is 1 - 2^-24, the smallest 0.
EAGLE3_HOST_DEVICE constexpr float PhiloxUniform(uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

// One uniform coin addressed by (seed, offset, stream, index): key = (seed low 32 bits, seed high 32
// bits), counter = (offset low, offset high, stream, index); the coin is PhiloxUniform of word 0 of
// that block. Distinct (offset, stream, index) triples never share a block, so coins are
// independent without any generator state; a caller uses a fresh offset per call site / step.
EAGLE3_HOST_DEVICE constexpr float PhiloxCoin(uint64_t seed, uint64_t offset, uint32_t stream, uint32_t index) {
  const PhiloxKey key{{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
  const PhiloxCounter counter{
      {static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32), stream, index}};
  return PhiloxUniform(Philox4x32x10(counter, key).v[0]);
}

}  // namespace eagle3
