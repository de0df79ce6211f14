// Shared-memory layout and wgmma matrix descriptors of the warpgroup latent kernel
// (latent_wgmma_kernels.cu): plain integer arithmetic, no CUDA, so the CPU tests check it
// (tests/latent_wgmma_layout_test.cc emulates how the tensor cores read a descriptor and compares
// every element the kernel's instructions read with where its staging put that element).
//
// The rules (PTX ISA, "Asynchronous Warpgroup Level Matrix Shared Memory Layout" and "Matrix
// Descriptor Format"; CUTLASS states the same canonical layouts in cute/atom/mma_traits_sm90_gmma.hpp,
// make_gmma_desc):
//  - A descriptor holds the operand's start address, a leading and a stride byte offset (LBO, SBO),
//    each >> 4 in 14 bits (bits 0-13, 16-29, 32-45), and the swizzle mode in bits 62-63 (1: 128-byte).
//  - 128-byte swizzle: within each 1024-byte-aligned block of eight 128-byte rows, the 16-byte piece
//    at address bits 4-6 is XORed with the row, address bits 7-9. The tensor cores apply it to the
//    address they compute, so a start address may advance inside a row (32 bytes per k-step of 16
//    bf16) as long as every panel starts 1024-byte aligned.
//  - K-major (A, and B of the score product): rows of 64 bf16 = 128 bytes along K, eight rows an
//    atom, atoms along M / N SBO bytes apart (1024 here); LBO unused (K of one instruction, 16, lies
//    within one 64-wide row).
//  - MN-major (B of the value product, the `trans-b` form): rows of 64 bf16 along N, eight rows
//    along K an atom; LBO is the distance between 64-wide panels along N, SBO between groups of 8
//    along K.
//
// Every operand here is a set of panels of [64 rows][64 bf16] with the swizzle above: a staged key
// chunk (64 keys x 576 dims: nine panels, dims 64 i .. 64 i + 63 in panel i), the queries (64 rows x
// 576, the same), the probabilities (64 rows x 64 keys: one panel). The key chunk serves both
// products: K-major B of the scores (N = keys) and MN-major B of the values (N = the first 512 dims).
#pragma once

#include <cstdint>

#include "eagle3/detail/host_device.h"

namespace eagle3::cuda {

inline constexpr int kWgmmaRows = 64;        // query rows per block: wgmma's M
inline constexpr int kWgmmaChunk = 64;       // keys per staged chunk
inline constexpr int kWgmmaDim = 576;        // key dims: the 512-wide compressed KV + 64 RoPE dims
inline constexpr int kWgmmaValueDim = 512;   // value dims: the first 512 of a key row
inline constexpr int kWgmmaPanelWidth = 64;  // bf16 per 128-byte swizzled row
inline constexpr int kWgmmaKStep = 16;       // K of one bf16 instruction
inline constexpr int kWgmmaScoreSteps = kWgmmaDim / kWgmmaKStep;      // 36
inline constexpr int kWgmmaValueSteps = kWgmmaChunk / kWgmmaKStep;    // 4
inline constexpr int kWgmmaHalfKeys = kWgmmaChunk / 2;                // N of a warpgroup's scores
inline constexpr int kWgmmaHalfColumns = kWgmmaValueDim / 2;          // N of a warpgroup's values
inline constexpr uint32_t kWgmmaRowBytes = 128;
inline constexpr uint32_t kWgmmaAtomBytes = 8 * kWgmmaRowBytes;       // the swizzle's period
inline constexpr uint32_t kWgmmaPanelBytes = 64 * kWgmmaRowBytes;     // one [64][64] panel
inline constexpr uint32_t kWgmmaOperandBytes = (kWgmmaDim / kWgmmaPanelWidth) * kWgmmaPanelBytes;

static_assert(kWgmmaDim % kWgmmaPanelWidth == 0 && kWgmmaValueDim % kWgmmaPanelWidth == 0, "whole panels");
static_assert(kWgmmaHalfColumns == 256 && kWgmmaHalfKeys == 32, "the instruction shapes the kernel uses");

// Byte offset of element (row, col) of a [64][64] bf16 panel (row < 64, col < 64), swizzled.
EAGLE3_HOST_DEVICE constexpr uint32_t WgmmaPanelOffset(uint32_t row, uint32_t col) {
  return row * kWgmmaRowBytes + (((col / 8) ^ (row % 8)) * 16) + (col % 8) * 2;
}

// Byte offset of element (row, dim) of a 64 x 576 operand (queries or a staged key chunk).
EAGLE3_HOST_DEVICE constexpr uint32_t WgmmaOperandOffset(uint32_t row, uint32_t dim) {
  return (dim / kWgmmaPanelWidth) * kWgmmaPanelBytes + WgmmaPanelOffset(row, dim % kWgmmaPanelWidth);
}

// Byte offset of the 16-byte piece `piece` (dims 8 piece .. + 7) of row `row` of an operand.
EAGLE3_HOST_DEVICE constexpr uint32_t WgmmaPieceOffset(uint32_t row, uint32_t piece) {
  return WgmmaOperandOffset(row, 8 * piece);
}

// A shared-memory matrix descriptor, 128-byte swizzle. `address`: the operand's start in the
// shared window; lbo / sbo in bytes (multiples of 16).
EAGLE3_HOST_DEVICE constexpr uint64_t WgmmaDescriptor(uint32_t address, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((address & 0x3ffffu) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3fffu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3fffu) << 32) | (uint64_t{1} << 62);
}

// The descriptor of an operand starting `bytes` further (a multiple of 16): the start field plus
// bytes / 16. Exact while the new start stays within the 18-bit shared window (no carry out of the
// field); tests/latent_wgmma_layout_test.cc checks it against WgmmaDescriptor.
EAGLE3_HOST_DEVICE constexpr uint64_t WgmmaDescriptorAdvance(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

// K-major operands: eight rows an atom, atoms 1024 bytes apart; LBO unused (16 bytes by convention).
inline constexpr uint32_t kWgmmaKMajorLbo = 16;
inline constexpr uint32_t kWgmmaKMajorSbo = kWgmmaAtomBytes;
// The MN-major value operand: 64-column panels kWgmmaPanelBytes apart, 8-key groups 1024 bytes.
inline constexpr uint32_t kWgmmaMnMajorLbo = kWgmmaPanelBytes;
inline constexpr uint32_t kWgmmaMnMajorSbo = kWgmmaAtomBytes;

// Start offsets, relative to each operand's base, of the kernel's instructions:
// the scores' A (queries, K-major) for k-step i (dims 16 i .. + 15);
EAGLE3_HOST_DEVICE constexpr uint32_t WgmmaScoreAStart(int i) {
  return static_cast<uint32_t>(i / 4) * kWgmmaPanelBytes + static_cast<uint32_t>(i % 4) * 32;
}
// the scores' B (the chunk's keys 32 half .. + 31 as N, K-major) for k-step i;
EAGLE3_HOST_DEVICE constexpr uint32_t WgmmaScoreBStart(int half, int i) {
  return WgmmaScoreAStart(i) + static_cast<uint32_t>(half * kWgmmaHalfKeys) * kWgmmaRowBytes;
}
// the values' A (probabilities, K-major over the chunk's keys) for k-step j (keys 16 j .. + 15);
EAGLE3_HOST_DEVICE constexpr uint32_t WgmmaValueAStart(int j) { return static_cast<uint32_t>(j) * 32; }
// the values' B (the chunk's rows, dims 256 half .. + 255 as N, MN-major) for k-step j.
EAGLE3_HOST_DEVICE constexpr uint32_t WgmmaValueBStart(int half, int j) {
  return static_cast<uint32_t>(half * (kWgmmaHalfColumns / kWgmmaPanelWidth)) * kWgmmaPanelBytes +
         static_cast<uint32_t>(j * kWgmmaKStep) * kWgmmaRowBytes;
}

// The block's shared memory, byte offsets from the first 1024-byte boundary of its dynamic shared
// memory: the queries, two key-chunk stages, the probabilities, then small per-row and per-token
// arrays.
inline constexpr uint32_t kWgmmaQueryOffset = 0;
inline constexpr uint32_t kWgmmaStageOffset = kWgmmaOperandBytes;
inline constexpr int kWgmmaStages = 2;
inline constexpr uint32_t kWgmmaProbOffset = kWgmmaStageOffset + kWgmmaStages * kWgmmaOperandBytes;
inline constexpr uint32_t kWgmmaHalfMaxOffset = kWgmmaProbOffset + kWgmmaPanelBytes;        // f32 [2][64]
inline constexpr uint32_t kWgmmaAllowOffset = kWgmmaHalfMaxOffset + 2 * kWgmmaRows * 4;     // u64 [2][64]
inline constexpr uint32_t kWgmmaUsedOffset = kWgmmaAllowOffset + 2 * kWgmmaRows * 8;        // u64 [2][8]
inline constexpr uint32_t kWgmmaSharedBytes = kWgmmaUsedOffset + 2 * 8 * 8;

// The dynamic shared memory a block is launched with: the layout and room to start it on a 1024-byte
// boundary whatever the base's alignment (16 bytes at least).
inline constexpr uint32_t kWgmmaSharedSlack = kWgmmaAtomBytes - 16;
inline constexpr uint32_t kWgmmaLaunchSharedBytes = kWgmmaSharedBytes + kWgmmaSharedSlack;

static_assert(kWgmmaLaunchSharedBytes <= 227 * 1024, "sm_90's opt-in shared memory per block");
static_assert(kWgmmaStageOffset % kWgmmaAtomBytes == 0 && kWgmmaProbOffset % kWgmmaAtomBytes == 0,
              "every panel starts on the swizzle's period");

}  // namespace eagle3::cuda
