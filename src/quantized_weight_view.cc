#include "eagle3/quantized_weight_view.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "eagle3/detail/int4_packing.h"
#include "eagle3/detail/quant_tiles.h"
#include "eagle3/half.h"
#include "eagle3/status.h"

namespace eagle3 {
namespace {

absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

template <typename... Args>
absl::Status Invalid(std::string_view op, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(Sv(op), ": ", args...));
}

// 2-D, non-negative dims, unit stride along dim 1, row stride >= the row length, data present.
absl::Status CheckRowStrided(std::string_view op, const char* name, const TensorView& t) {
  if (t.rank() != 2) return Invalid(op, name, " must be 2-D, got ", t.ToString());
  if (t.dim(0) < 0 || t.dim(1) < 0 || t.stride(0) < 0 || t.stride(1) < 0) {
    return Invalid(op, name, " ", t.ToString(), " has a negative dim or stride (strides ", t.strides().ToString(),
                   ")");
  }
  if (t.dim(1) > 1 && t.stride(1) != 1) {
    return Invalid(op, name, " ", t.ToString(), " needs unit stride along dim 1, got strides ",
                   t.strides().ToString());
  }
  if (t.dim(0) > 1 && t.stride(0) < t.dim(1)) {
    return Invalid(op, name, " ", t.ToString(), " has row stride ", t.stride(0), " < its row length ", t.dim(1));
  }
  if (t.data() == nullptr && t.numel() > 0) return Invalid(op, name, " ", t.ToString(), " has no data");
  return absl::OkStatus();
}

// Packed words of a row that hold values [col0 % 8, col0 % 8 + k).
int64_t Int4Words(int64_t col0, int64_t k) { return k == 0 ? 0 : Int4PackedWords(col0 % kInt4PerWord + k); }

// Scale (i, j) of a checked view's scales, as f32.
float ScaleAt(const TensorView& scales, int64_t i, int64_t j) {
  const int64_t offset = i * scales.stride(0) + j;
  return scales.dtype() == DType::kF32 ? scales.data_as<const float>()[offset]
                                       : Bf16ToFloat(scales.data_as<const uint16_t>()[offset]);
}

}  // namespace

absl::Status QuantizedWeightView::Check(std::string_view op) const {
  if (format != WeightFormat::kFp8Block && format != WeightFormat::kInt4Group) {
    return Invalid(op, "w.format is ", Sv(WeightFormatName(format)), "; expected fp8-block or int4-group");
  }
  const bool fp8 = format == WeightFormat::kFp8Block;
  EAGLE3_RETURN_IF_ERROR(CheckRowStrided(op, "w.codes", codes));
  EAGLE3_RETURN_IF_ERROR(CheckRowStrided(op, "w.scales", scales));
  if (codes.dtype() != (fp8 ? DType::kF8E4M3 : DType::kI32)) {
    return Invalid(op, "w.codes ", codes.ToString(), " must be ",
                   fp8 ? "f8_e4m3 (the e4m3 codes)" : "i32 (the packed int4 words)", " for ",
                   Sv(WeightFormatName(format)), " weights");
  }
  const bool scale_ok = scales.dtype() == DType::kF32 || (!fp8 && scales.dtype() == DType::kBF16);
  if (!scale_ok) {
    return Invalid(op, "w.scales ", scales.ToString(), " must be ", fp8 ? "f32" : "bf16 or f32", " for ",
                   Sv(WeightFormatName(format)), " weights");
  }
  if (scales.device() != codes.device()) {
    return Invalid(op, "w.scales ", scales.ToString(), " must be on the device of w.codes ", codes.ToString());
  }
  if (k < 0 || row0 < 0 || col0 < 0 || scale_row0 < 0 || scale_col0 < 0) {
    return Invalid(op, "w.k ", k, ", w.row0 ", row0, ", w.col0 ", col0, ", w.scale_row0 ", scale_row0,
                   " and w.scale_col0 ", scale_col0, " must be >= 0");
  }
  // Global indices stay far from int64 overflow (a weight dim is < 2^40 in any real model).
  constexpr int64_t kMaxIndex = int64_t{1} << 48;
  if (k > kMaxIndex || row0 > kMaxIndex || col0 > kMaxIndex || codes.dim(0) > kMaxIndex) {
    return Invalid(op, "w.k ", k, ", w.row0 ", row0, ", w.col0 ", col0, " and the rows of w.codes ",
                   codes.ToString(), " must be <= 2^48");
  }
  if (block_rows < 1 || block_cols < 1) {
    return Invalid(op, "w.block_rows ", block_rows, " and w.block_cols ", block_cols, " must be >= 1");
  }
  if (!fp8 && block_rows != 1) {
    return Invalid(op, "w.block_rows is ", block_rows,
                   "; int4-group weights have one scale row per weight row (block_rows 1)");
  }
  if (layout != QuantCodesLayout::kRowMajor && layout != QuantCodesLayout::kWarpTiles) {
    return Invalid(op, "w.layout is ", static_cast<int>(layout), "; expected kRowMajor (0) or kWarpTiles (1)");
  }
  if (warp_tiled()) {
    if (tiled_rows < 0 || tiled_rows > kMaxIndex) {
      return Invalid(op, "w.tiled_rows ", tiled_rows, " must be in [0, 2^48] for warp-tiled codes");
    }
    // Zero for k == 0 on the step grid (an empty slice has no tiles): nothing can overflow then.
    const int64_t tile_bytes = QuantTileSteps(!fp8, k, col0) * kQuantTileBytes;
    if (tile_bytes > 0 &&
        (tiled_rows + kQuantTileRows - 1) / kQuantTileRows > std::numeric_limits<int64_t>::max() / tile_bytes) {
      return Invalid(op, "w.tiled_rows ", tiled_rows, " and w.k ", k, " make more warp-tile bytes than int64 holds");
    }
    if (!fp8 && col0 % kInt4PerWord != 0) {
      return Invalid(op, "w.col0 ", col0, " must be a multiple of ", kInt4PerWord,
                     " (a whole packed word) for warp-tiled int4 codes");
    }
    const Shape want = WarpTiledCodesShape(*this);
    if (codes.shape() != want || (codes.dim(0) > 1 && codes.stride(0) != codes.dim(1))) {
      return Invalid(op, "w.codes ", codes.ToString(), " (strides ", codes.strides().ToString(),
                     ") must be the contiguous warp tiles of a [", tiled_rows, ", ", k, "] slice from column ", col0,
                     ": ", want.ToString());
    }
  }
  const int64_t width = warp_tiled() ? 0 : fp8 ? k : Int4Words(col0, k);
  if (codes.dim(1) < width) {
    return Invalid(op, "w.codes ", codes.ToString(), " has ", codes.dim(1), " columns; w.k ", k,
                   fp8 ? "" : absl::StrCat(" from w.col0 % 8 = ", col0 % kInt4PerWord), " needs ", width);
  }
  const int64_t n = rows();
  if (n == 0 || k == 0) return absl::OkStatus();
  const int64_t first_row = row0 / block_rows, end_row = (row0 + n - 1) / block_rows + 1;
  const int64_t first_col = col0 / block_cols, end_col = (col0 + k - 1) / block_cols + 1;
  if (first_row < scale_row0 || end_row > scale_row0 + scales.dim(0) || first_col < scale_col0 ||
      end_col > scale_col0 + scales.dim(1)) {
    return Invalid(op, "w.scales ", scales.ToString(), " holds global scale blocks [", scale_row0, ", ",
                   scale_row0 + scales.dim(0), ") x [", scale_col0, ", ", scale_col0 + scales.dim(1),
                   "), but rows [", row0, ", ", row0 + n, ") and columns [", col0, ", ", col0 + k, ") of ",
                   block_rows, " x ", block_cols, " blocks need [", first_row, ", ", end_row, ") x [", first_col,
                   ", ", end_col, ")");
  }
  return absl::OkStatus();
}

Shape WarpTiledCodesShape(const QuantizedWeightView& w) {
  const bool int4 = w.format == WeightFormat::kInt4Group;
  const int64_t n = std::max<int64_t>(0, w.rows()), k = std::max<int64_t>(0, w.k);
  const int64_t tiles =
      n == 0 || k == 0 ? 0 : QuantTiledBytes(int4, n, k, std::max<int64_t>(0, w.col0)) / kQuantTileBytes;
  return Shape{tiles, int4 ? kQuantTileBytes / 4 : kQuantTileBytes};
}

QuantizedWeightView WithWarpTiledCodes(const QuantizedWeightView& w, const TensorView& tiles) {
  QuantizedWeightView tiled = w;
  tiled.tiled_rows = w.rows();
  tiled.layout = QuantCodesLayout::kWarpTiles;
  tiled.codes = tiles;
  return tiled;
}

absl::Status DequantizeWeight(const QuantizedWeightView& w, const TensorView& out) {
  constexpr std::string_view kOp = "DequantizeWeight";
  EAGLE3_RETURN_IF_ERROR(w.Check(kOp));
  if (!w.codes.device().is_cpu()) return Invalid(kOp, "w.codes ", w.codes.ToString(), " must be host memory");
  EAGLE3_RETURN_IF_ERROR(CheckRowStrided(kOp, "out", out));
  if (out.dtype() != DType::kF32 || !out.device().is_cpu() || out.dim(0) != w.rows() || out.dim(1) != w.k) {
    return Invalid(kOp, "out ", out.ToString(), " must be f32[", w.rows(), ", ", w.k, "] on the host");
  }
  const bool fp8 = w.format == WeightFormat::kFp8Block;
  const int64_t shift = fp8 ? 0 : w.col0 % kInt4PerWord;  // int4: value index of column 0 in word 0
  // Warp-tiled codes: each row is gathered into row-major order first.
  const int64_t row_bytes = fp8 ? w.k : 4 * Int4Words(w.col0, w.k);
  const int64_t tile_steps = QuantTileSteps(!fp8, w.k, w.col0), tile_shift = QuantTileShift(!fp8, w.col0);
  std::vector<char> gathered(w.warp_tiled() ? static_cast<size_t>(row_bytes) : 0);
  for (int64_t r = 0; r < w.rows(); ++r) {
    const int64_t scale_row = (w.row0 + r) / w.block_rows - w.scale_row0;
    const char* codes = nullptr;
    if (w.warp_tiled()) {
      const auto* tiles = static_cast<const char*>(w.codes.data());
      for (int64_t b = 0; b < row_bytes; ++b) gathered[b] = tiles[QuantTileOffset(!fp8, tile_steps, tile_shift, r, b)];
      codes = gathered.data();
    } else {
      codes = static_cast<const char*>(w.codes.data()) +
              r * w.codes.stride(0) * static_cast<int64_t>(DTypeSize(w.codes.dtype()));
    }
    float* o = out.data_as<float>() + r * out.stride(0);
    // One scale per run of columns within a block: the division happens once per block.
    for (int64_t c = 0; c < w.k;) {
      const int64_t block = (w.col0 + c) / w.block_cols;
      const int64_t end = std::min(w.k, (block + 1) * w.block_cols - w.col0);
      const float s = ScaleAt(w.scales, scale_row, block - w.scale_col0);
      if (fp8) {
        const auto* q = reinterpret_cast<const uint8_t*>(codes);
        for (; c < end; ++c) o[c] = F8E4M3ToFloat(q[c]) * s;
      } else {
        const auto* q = reinterpret_cast<const int32_t*>(codes);
        for (; c < end; ++c) o[c] = static_cast<float>(Int4At(q, shift + c)) * s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace eagle3
