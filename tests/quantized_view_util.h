// Shared by the QuantizedGemm tests (cpu and gpu): a random quantized weight matrix in a hub form
// (RandomQuantizedWeightOf, with the f32 weights it dequantizes to) and QuantizedWeightViews of
// tensor-parallel-style slices of it, their scales either the whole global grid or only the blocks
// the slice touches.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>

#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/detail/int4_packing.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/quantization_config.h"
#include "eagle3/quantized_weight_view.h"
#include "eagle3/tensor.h"
#include "eagle3/tensor_convert.h"
#include "eagle3/testing/random_quantized_weights.h"
#include "gtest/gtest.h"

namespace eagle3 {

struct QuantizedMatrix {
  QuantizationConfig quantization;
  Tensor codes;        // kFp8Block: [N, K] f8e4m3; kInt4Group: [N, ceil(K / 8)] i32
  Tensor scales;       // kFp8Block: [ceil(N / bo), ceil(K / bi)] f32; kInt4Group: [N, K / group] bf16
  Tensor dequantized;  // [N, K] f32
};

// A random [n, k] weight stored as `quantization` says (k a multiple of the int4 group).
inline QuantizedMatrix RandomQuantizedMatrix(const QuantizationConfig& quantization, int64_t n, int64_t k,
                                             uint64_t seed) {
  const bool fp8 = quantization.format == WeightFormat::kFp8Block;
  const WeightSpec spec{"w.weight", Shape{n, k}};
  auto w = RandomQuantizedWeightOf(spec, fp8 ? StoredForm::kFp8Block : StoredForm::kInt4Packed, quantization, seed);
  EXPECT_TRUE(w.ok()) << w.status();
  QuantizedMatrix m;
  m.quantization = quantization;
  if (!w.ok()) return m;
  for (auto& [name, tensor] : w->stored) {
    if (name == spec.name || name == Int4PackedName(spec.name)) m.codes = std::move(tensor);
    if (name == Fp8ScaleName(spec.name) || name == Int4ScaleName(spec.name)) m.scales = std::move(tensor);
  }
  m.dequantized = std::move(w->dequantized);
  return m;
}

// The same scales in f32 (exact: bf16 values).
inline Tensor F32Copy(const Tensor& t) {
  Tensor out = *Tensor::Empty(DType::kF32, t.shape());
  EXPECT_TRUE(ConvertTensor(t, out).ok());
  return out;
}

// Rows [row0, row0 + rows) and columns [col0, col0 + cols) of the global matrix.
struct Slice {
  int64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
  bool tight_scales = false;  // scales: only the blocks the slice touches (else the whole grid)
};

inline std::ostream& operator<<(std::ostream& os, const Slice& s) {
  return os << "rows [" << s.row0 << ", +" << s.rows << ") cols [" << s.col0 << ", +" << s.cols << ")"
            << (s.tight_scales ? " tight scales" : " whole scale grid");
}

// The view of slice `s` of a matrix stored as `quantization` whose whole codes and scales are
// `codes` and `scales` (host or device memory).
inline QuantizedWeightView SliceView(const QuantizationConfig& quantization, const TensorView& codes,
                                     const TensorView& scales, const Slice& s) {
  QuantizedWeightView w;
  w.format = quantization.format;
  w.k = s.cols;
  w.row0 = s.row0;
  w.col0 = s.col0;
  if (quantization.format == WeightFormat::kFp8Block) {
    w.block_rows = quantization.block_out;
    w.block_cols = quantization.block_in;
    w.codes = codes.Narrow(0, s.row0, s.rows).Narrow(1, s.col0, s.cols);
  } else {
    w.block_rows = 1;
    w.block_cols = quantization.group_size;
    w.codes = codes.Narrow(0, s.row0, s.rows)
                  .Narrow(1, s.col0 / kInt4PerWord, Int4PackedWords(s.col0 % kInt4PerWord + s.cols));
  }
  w.scales = scales;
  if (s.tight_scales) {
    w.scale_row0 = s.row0 / w.block_rows;
    w.scale_col0 = s.col0 / w.block_cols;
    const int64_t end_row = (s.row0 + s.rows - 1) / w.block_rows + 1;
    const int64_t end_col = (s.col0 + s.cols - 1) / w.block_cols + 1;
    w.scales = scales.Narrow(0, w.scale_row0, end_row - w.scale_row0).Narrow(1, w.scale_col0, end_col - w.scale_col0);
  }
  return w;
}

// A contiguous f32 copy of slice `s` of the dequantized matrix.
inline Tensor DequantizedSlice(const QuantizedMatrix& m, const Slice& s) {
  Tensor out = *Tensor::Empty(DType::kF32, Shape{s.rows, s.cols});
  const float* from = m.dequantized.data_as<float>();
  const int64_t k = m.dequantized.dim(1);
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t c = 0; c < s.cols; ++c) out.data_as<float>()[r * s.cols + c] = from[(s.row0 + r) * k + s.col0 + c];
  }
  return out;
}

}  // namespace eagle3
