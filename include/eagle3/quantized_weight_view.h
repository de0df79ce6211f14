// A weight-only quantized weight matrix as it lies in a backend's memory: the stored codes and the
// scales of one tensor-parallel slice, kept in the checkpoint's form (QuantizationConfig's
// kFp8Block / kInt4Group) instead of being dequantized at load. Backend::QuantizedGemm multiplies
// by it; eagle3/detail/quantized_weights.h reads it from a checkpoint.
//
// The slice is rows [row0, row0 + n) and columns [col0, col0 + k) of the global weight [N, K]. Scale
// blocks are indexed by GLOBAL position (as the checkpoint stores them), so a slice that starts
// inside a block or a group uses that block's scale. The scale tensor need not hold the whole
// global grid: scales[i][j] is the scale of global block (scale_row0 + i, scale_col0 + j), which
// lets a loader keep only the blocks its slice touches. Element (r, c) of the slice dequantizes to
//   w[r][c] = q(r, c) * scales[(row0 + r) / block_rows - scale_row0][(col0 + c) / block_cols - scale_col0]
// with q(r, c) the stored value:
//  - kFp8Block: the e4m3 value of codes[r][c] (F8E4M3ToFloat, eagle3/half.h).
//  - kInt4Group: value (col0 % 8) + c of packed row r (Int4At, eagle3/detail/int4_packing.h): word 0
//    of row r is global word col0 / 8 of global row row0 + r. One scale row per weight row
//    (block_rows = 1, block_cols = group_size).
// The product is taken in fp32 (DequantizeWeight below is the reference).
//
// Codes are laid out row-major (kRowMajor, the checkpoint's order), or in the warp-step tiles of
// CudaBackend's quantized GEMV (kWarpTiles, eagle3/detail/quant_tiles.h: each kernel step's 16 rows
// x 64 bytes contiguous), which HBM streams faster; Backend::TileQuantizedCodes writes them, and
// only the ops that say so read them (Backend::QuantizedMoeExperts; CpuBackend's ops through
// DequantizeWeight). q(r, c) is the same value in either layout.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "eagle3/export.h"
#include "eagle3/quantization_config.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

enum class QuantCodesLayout : uint8_t {
  kRowMajor = 0,
  kWarpTiles = 1,
};

struct EAGLE3_API QuantizedWeightView {
  WeightFormat format = WeightFormat::kUnquantized;
  // kRowMajor:
  //   kFp8Block: [n, >= k] f8e4m3 (only the first k columns are read).
  //   kInt4Group: [n, >= Int4PackedWords(col0 % 8 + k)] i32 packed words.
  //   Row-strided (stride(1) == 1, stride(0) >= dim(1)).
  // kWarpTiles: WarpTiledCodesShape(*this), contiguous: QuantTiledBytes(int4, n, k, col0) bytes
  //   (f8e4m3, or i32 words for kInt4Group, whose col0 is then a multiple of 8).
  // On the device of the op that reads it.
  TensorView codes;
  QuantCodesLayout layout = QuantCodesLayout::kRowMajor;
  int64_t tiled_rows = 0;  // kWarpTiles: n (the tiles pad it to whole 16-row groups); else unused
  // [>= rows of blocks touched, >= columns of blocks touched] (see the file comment), row-strided,
  // codes' device. kFp8Block: f32 (the checkpoint's weight_scale_inv). kInt4Group: bf16 (the hub
  // form) or f32 (a backend may take only bf16: CudaBackend does).
  TensorView scales;
  int64_t k = 0;     // columns of the slice (the K of the product), >= 0
  int64_t row0 = 0;  // global row of slice row 0, >= 0
  int64_t col0 = 0;  // global column of slice column 0, >= 0
  int64_t scale_row0 = 0;  // global block row of scales row 0, <= row0 / block_rows
  int64_t scale_col0 = 0;  // global block column of scales column 0, <= col0 / block_cols
  int64_t block_rows = 0;  // kFp8Block: weight_block_size[0]; kInt4Group: 1
  int64_t block_cols = 0;  // kFp8Block: weight_block_size[1]; kInt4Group: group_size

  // Rows of the slice (the N of the product).
  int64_t rows() const {
    if (layout == QuantCodesLayout::kWarpTiles) return tiled_rows;
    return codes.rank() == 2 ? codes.dim(0) : 0;
  }
  bool warp_tiled() const { return layout == QuantCodesLayout::kWarpTiles; }

  // OK when the fields are consistent: a quantized format, codes and scales 2-D, row-strided, of
  // the format's dtypes and on one device, k / row0 / col0 >= 0, block sizes >= 1 (block_rows 1 for
  // kInt4Group), codes wide enough for k (kWarpTiles: exactly the tiles' shape, contiguous,
  // tiled_rows >= 0, int4 col0 % 8 == 0), and scales holding every block the slice touches.
  // Otherwise InvalidArgument "<op>: w.codes ..." / "<op>: w.scales ..." naming the field, what was
  // expected and what it holds. Device placement against a backend is the op's check.
  absl::Status Check(std::string_view op) const;
};

// The codes shape of the warp-tiled form of a [w.rows(), w.k] slice starting at column w.col0:
// [QuantTiledBytes / 1024, 1024] for kFp8Block, [QuantTiledBytes / 1024, 256] (i32) for kInt4Group.
EAGLE3_API Shape WarpTiledCodesShape(const QuantizedWeightView& w);

// `w` (row-major) described over `tiles`, its codes in warp tiles (Backend::TileQuantizedCodes
// writes them): layout kWarpTiles, tiled_rows = w.rows(), the scales and indices unchanged.
EAGLE3_API QuantizedWeightView WithWarpTiledCodes(const QuantizedWeightView& w, const TensorView& tiles);

// The f32 weights `w` describes (the file comment's rule), on the host: the reference every backend's
// QuantizedGemm and the checkpoint loader's dequantization follow.
//   w: Check()ed, on the host      out: [w.rows(), w.k], f32, row-strided, host
// InvalidArgument (naming "DequantizeWeight" and the tensor) for a view that fails Check, a device
// view, or a wrong `out`.
EAGLE3_API absl::Status DequantizeWeight(const QuantizedWeightView& w, const TensorView& out);

}  // namespace eagle3
