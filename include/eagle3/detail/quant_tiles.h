// The warp-step tiled layout of quantized weight codes: the order in which the CUDA backend's
// quantized GEMV (cuda/quant_gemv_kernels.cu) consumes them, so that each warp step of the kernel
// reads one contiguous 1 KiB block instead of 64-byte pieces of 16 rows a row stride apart (HBM
// serves the contiguous block faster: benchmarks/NOTES.md, "fourteenth session").
//
// Geometry (the kernel's): a slice [n, k] of a global matrix, starting at global column col0, is
// read in steps of 64 bytes per row (fp8: 64 codes; int4: 128 values, 16 packed words), the first
// step starting `shift` columns before the slice's column 0 (fp8: col0 % 128; int4: col0 % 32) and
// the steps covering whole 128-column units (QuantTileSteps). Lane c (0..3) of a step takes its 16
// bytes of the step: fp8 columns [64 s + 16 c - shift, + 16) of the slice, the step's bytes 16 c ..
// 16 c + 15; int4 the step's packed words c, c + 4, c + 8 and c + 12 (word i of step s: columns
// [128 s + 8 i - shift, + 8) of the slice), so that word j of every lane lies in the step's 32-column
// group j and each of the kernel's products stays within one scale group; zero outside the slice's
// row (the bytes the kernel's row-major edge paths read, so that a tiled product has the row-major
// one's bits).
//
// Layout: rows in groups of 16 (the last one padded with zero rows), each group's steps in order,
// one 1 KiB tile per (group, step) at byte ((group * steps) + step) * 1024; within a tile, lane l =
// 4 g + c (g = 0..7) holds 32 bytes at 32 l: row 16 group + g's chunk c, then row 16 group + g + 8's
// (QuantTileChunkByte: where a chunk's bytes come from in the step).
// Scales are not tiled.
//
// eagle3/detail/: internal, no compatibility promise. Plain C++ (the kernels include it).
#pragma once

#include <cstdint>

#include "eagle3/detail/host_device.h"

namespace eagle3 {

inline constexpr int64_t kQuantTileRows = 16;
inline constexpr int64_t kQuantTileBytes = 1024;
inline constexpr int64_t kQuantTileStepBytes = 64;  // bytes of one row in one step, both formats

// Columns of the first step before the slice's column 0.
EAGLE3_HOST_DEVICE constexpr int64_t QuantTileShift(bool int4, int64_t col0) { return int4 ? col0 % 32 : col0 % 128; }

// Steps per row: whole 128-column units covering shift + k columns (fp8: 2 steps a unit; int4: 1).
EAGLE3_HOST_DEVICE constexpr int64_t QuantTileSteps(bool int4, int64_t k, int64_t col0) {
  return (QuantTileShift(int4, col0) + k + 127) / 128 * (int4 ? 1 : 2);
}

// Bytes of the tiled codes of a [n, k] slice starting at global column col0.
EAGLE3_HOST_DEVICE constexpr int64_t QuantTiledBytes(bool int4, int64_t n, int64_t k, int64_t col0) {
  return (n + kQuantTileRows - 1) / kQuantTileRows * QuantTileSteps(int4, k, col0) * kQuantTileBytes;
}

// Byte i (0..15) of lane c's chunk of a step: its byte among the row's 64 bytes of the step. fp8:
// the lane's 16 contiguous bytes; int4: words c, c + 4, c + 8, c + 12 of the step, 4 bytes each.
EAGLE3_HOST_DEVICE constexpr int64_t QuantTileChunkByte(bool int4, int64_t c, int64_t i) {
  return int4 ? 4 * (c + 4 * (i / 4)) + i % 4 : 16 * c + i;
}

// Where byte `byte` of row `row`'s row-major codes lands in the tiles (the one authority on the
// layout: the host tiler, the device tiler and the host dequantization call it): fp8 byte = column
// of the slice; int4 byte = 4 x packed word of the slice's row + byte of the word. steps =
// QuantTileSteps(int4, k, col0), shift = QuantTileShift(int4, col0). 0 <= byte < the row's bytes.
EAGLE3_HOST_DEVICE constexpr int64_t QuantTileOffset(bool int4, int64_t steps, int64_t shift, int64_t row,
                                                     int64_t byte) {
  // The byte's place in the row's stream of 64-byte steps (int4: 2 values a byte, shift a multiple
  // of 8 values).
  const int64_t at = byte + (int4 ? shift / 2 : shift);
  const int64_t step = at / kQuantTileStepBytes, in_step = at % kQuantTileStepBytes;
  // The inverse of QuantTileChunkByte: the lane c and chunk byte i that take the step's byte.
  const int64_t c = int4 ? (in_step / 4) % 4 : in_step / 16;
  const int64_t i = int4 ? 4 * (in_step / 16) + in_step % 4 : in_step % 16;
  return ((row / kQuantTileRows) * steps + step) * kQuantTileBytes + 32 * (4 * (row % 8) + c) +
         16 * ((row % kQuantTileRows) / 8) + i;
}

// Writes the tiled layout of row-major codes: fp8 `codes` are [n, ld] bytes (ld >= k); int4 `codes`
// are [n, ld] int32 words (ld >= ceil(k / 8)), given as bytes. `out` holds QuantTiledBytes(int4, n,
// k, col0) bytes; every byte is written (padding as zeros). n, k >= 1, col0 >= 0 (int4: a multiple
// of 8).
void TileQuantizedCodes(bool int4, const uint8_t* codes, int64_t ld, int64_t n, int64_t k, int64_t col0,
                        uint8_t* out);

}  // namespace eagle3
