// The int4 packing of compressed-tensors' "pack-quantized" format (Kimi-K2-Thinking / K2.5 routed
// experts), as neuralmagic/compressed-tensors defines it in
// src/compressed_tensors/compressors/quantized_compressors/pack_quantized.py (pack_to_int32 /
// unpack_from_int32, packed_dim = 1): along each row, value j of the row goes to word j / 8, bits
// [4 (j % 8), 4 (j % 8) + 4), i.e. the least significant nibble holds the first value; each nibble
// stores the signed value q in [-8, 7] as q + 8 (offset 1 << (num_bits - 1)); a row whose length is
// not a multiple of 8 is padded with zero nibbles, which unpacking drops (weight_shape gives the
// real length).
//
// eagle3/detail/: internal, no compatibility promise (the loader, the random checkpoint writers and
// later GPU kernels share it).
#pragma once

#include <cstdint>

#include "eagle3/detail/host_device.h"

namespace eagle3 {

inline constexpr int kInt4PerWord = 8;
// Stored nibble = value + kInt4Offset.
inline constexpr int kInt4Offset = 8;

// Words of a packed row of `n` values: ceil(n / 8).
EAGLE3_HOST_DEVICE constexpr int64_t Int4PackedWords(int64_t n) { return (n + kInt4PerWord - 1) / kInt4PerWord; }

// The signed value (-8..7) at `column` of a packed row.
EAGLE3_HOST_DEVICE inline int Int4At(const int32_t* row, int64_t column) {
  const uint32_t word = static_cast<uint32_t>(row[column / kInt4PerWord]);
  const uint32_t nibble = (word >> (4 * (column % kInt4PerWord))) & 0xfu;
  return static_cast<int>(nibble) - kInt4Offset;
}

// Packs `n` values, each in [-8, 7], into Int4PackedWords(n) words at `row`.
inline void PackInt4Row(const int8_t* values, int64_t n, int32_t* row) {
  for (int64_t w = 0; w < Int4PackedWords(n); ++w) {
    uint32_t word = 0;
    for (int k = 0; k < kInt4PerWord && w * kInt4PerWord + k < n; ++k) {
      const uint32_t nibble = static_cast<uint32_t>(values[w * kInt4PerWord + k] + kInt4Offset) & 0xfu;
      word |= nibble << (4 * k);
    }
    row[w] = static_cast<int32_t>(word);
  }
}

}  // namespace eagle3
