// Scalar bf16 / f16 <-> f32 conversion on the host (round to nearest even; NaN stays NaN).
#pragma once

#include <bit>
#include <cstdint>

#include "eagle3/export.h"

namespace eagle3 {

inline float Bf16ToFloat(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

inline uint16_t FloatToBf16(float value) {
  uint32_t u = std::bit_cast<uint32_t>(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even; overflows to inf correctly
  return static_cast<uint16_t>(u >> 16);
}

EAGLE3_API float F16ToFloat(uint16_t bits);
EAGLE3_API uint16_t FloatToF16(float value);

// OCP float8 e4m3fn (no infinities; 0x7f / 0xff are NaN; max finite 448).
EAGLE3_API float F8E4M3ToFloat(uint8_t bits);

}  // namespace eagle3
