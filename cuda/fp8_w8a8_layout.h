// The scale layouts of cuBLASLt's block-scaled FP8 product and which weight slices the W8A8 path of
// CudaBackend::QuantizedGemm takes (fp8_w8a8_gemm.h): plain integer arithmetic, no CUDA, so the CPU
// tests check it (tests/fp8_w8a8_layout_test.cc).
//
// The layouts (cuBLAS documentation, "Scaling factors layouts" for 1D 128-element and 128x128 2D
// block scaling of FP8: https://docs.nvidia.com/cuda/cublas/#scaling-factors-layouts; as PyTorch
// passes them to cuBLASLt: pytorch/pytorch aten/src/ATen/native/cuda/ScaledBlas.cpp
// is_blockwise_1x128_scaling / is_blockwise_128x128_scaling, and the L4 padding of pull request
// #166752 "Fix DeepSeek scaling tensor handling", test/test_scaled_matmul_cuda.py
// _pad_128x128_scales). cuBLASLt takes no leading dimension for a scale tensor: it derives it from
// the matrix shape, so these are exact, not minimums.
//  - CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, an operand of `rows` rows (the non-K dimension) and K
//    columns: one f32 scale per row per 128 columns, "outer-dimension-major": the scale of row r,
//    column group j at j * L + r, L = rows rounded up to 4 (PyTorch: shape [rows, ceil(K / 128)],
//    strides [1, rows], rows a multiple of 16; the padding: Fp8ActScaleLd).
//  - CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, an operand of `rows` rows and K columns: one f32
//    scale per 128 x 128 block, K-major with the K extent padded to a multiple of 4 blocks (16
//    bytes): the scale of block (i, j) at i * L4 + j, L4 = round_up(ceil(K / 128), 4) (PyTorch:
//    [L4, ceil(rows / 128)], strides [1, L4]). A checkpoint's weight_scale_inv [ceil(N / 128),
//    ceil(K / 128)] row-major is this layout exactly when its row stride is L4 (V3's K = 7168: 56
//    blocks); a column slice of it (o_proj, down under tensor parallelism) is not, and is copied.
#pragma once

#include <cstdint>

namespace eagle3::cuda {

// Rows and columns of a scale block of both operands.
inline constexpr int64_t kFp8W8A8Block = 128;

constexpr int64_t Fp8W8A8KBlocks(int64_t k) { return (k + kFp8W8A8Block - 1) / kFp8W8A8Block; }

// Activation row counts the W8A8 path takes: multiples of 4. cuBLASLt's heuristic offers no
// block-scaled FP8 kernel for other counts (PyTorch passes multiples of 16 only), and QuantizedGemm
// then runs the weight-only paths: deciding it here keeps a call's path, and so its numerics, a
// function of its row count alone (tests/gpu/cuda_fp8_w8a8_test.cc runs 1 and 17 rows).
constexpr bool Fp8W8A8RowsTaken(int64_t rows) { return rows > 0 && rows % 4 == 0; }

// VEC128_32F: the distance between column groups: the rows, padded to a multiple of 4 (16 bytes)
// as BLK128x128's K blocks are (the row count itself wherever Fp8W8A8RowsTaken holds).
constexpr int64_t Fp8ActScaleLd(int64_t rows) { return (rows + 3) / 4 * 4; }
// VEC128_32F: the scale of row r (< rows), column group j (< Fp8W8A8KBlocks(k)).
constexpr int64_t Fp8ActScaleIndex(int64_t rows, int64_t r, int64_t j) { return j * Fp8ActScaleLd(rows) + r; }
// Scales of a [rows, k] operand, padding included.
constexpr int64_t Fp8ActScaleCount(int64_t rows, int64_t k) { return Fp8W8A8KBlocks(k) * Fp8ActScaleLd(rows); }

// BLK128x128_32F: the distance between block rows (L4).
constexpr int64_t Fp8WeightScaleLd(int64_t k) { return (Fp8W8A8KBlocks(k) + 3) / 4 * 4; }
// The scale of block (i, j) of a [rows, k] operand.
constexpr int64_t Fp8WeightScaleIndex(int64_t k, int64_t i, int64_t j) { return i * Fp8WeightScaleLd(k) + j; }
// Scales of a [rows, k] operand, padding included.
constexpr int64_t Fp8WeightScaleCount(int64_t rows, int64_t k) {
  return (rows + kFp8W8A8Block - 1) / kFp8W8A8Block * Fp8WeightScaleLd(k);
}

// A [n, k] slice of a 128 x 128 block-scaled e4m3 weight as the W8A8 path sees it: where it starts
// in the global matrix, its codes' address and row stride (bytes), and its block sizes.
struct Fp8W8A8Slice {
  int64_t n = 0, k = 0;
  int64_t row0 = 0, col0 = 0;
  int64_t block_rows = 0, block_cols = 0;
  uintptr_t codes = 0;
  int64_t codes_ld = 0;
};

// Whether the W8A8 path takes the slice: 128 x 128 blocks; the slice starting on a block boundary in
// both dimensions (cuBLASLt's blocks start at the operand's first row and column, so a slice that
// starts inside a block has no layout there); K a multiple of 128 (no partial last group, which
// neither PyTorch nor DeepSeek's kernels pass) and N a multiple of 16 (PyTorch's requirement on
// the FP8 operands); codes 16-byte aligned with 16-byte row strides (cuBLASLt's FP8 kernels load
// 16 bytes at a time). The rest of what cuBLASLt takes is its heuristic's answer (fp8_w8a8_gemm.h).
constexpr bool Fp8W8A8Takes(const Fp8W8A8Slice& s) {
  return s.n > 0 && s.k > 0 && s.block_rows == kFp8W8A8Block && s.block_cols == kFp8W8A8Block &&
         s.row0 % kFp8W8A8Block == 0 && s.col0 % kFp8W8A8Block == 0 && s.k % kFp8W8A8Block == 0 && s.n % 16 == 0 &&
         s.codes % 16 == 0 && (s.n == 1 || s.codes_ld % 16 == 0);
}

// Whether a scale tensor already is the BLK128x128_32F layout of a [n, k] slice's blocks, read in
// place: `first` the address of the slice's first block, `ld` the tensor's row stride and `cols` how
// many blocks each row holds from `first` on (f32 elements). It is when it is 16-byte aligned, its
// rows lie L4 apart (or there is one block row) and every row holds L4 blocks, so that what
// cuBLASLt reads lies inside the tensor; the padding blocks past the slice's K are then further
// blocks of the checkpoint's rows, finite values the product never uses.
constexpr bool Fp8W8A8ScalesDirect(int64_t n, int64_t k, uintptr_t first, int64_t ld, int64_t cols) {
  const int64_t l4 = Fp8WeightScaleLd(k);
  return first % 16 == 0 && cols >= l4 && (n <= kFp8W8A8Block || ld == l4);
}

}  // namespace eagle3::cuda
