// Views into the 2-D step buffers of the model implementations (internal to src/).
#pragma once

#include <cstdint>

#include "eagle3/tensor_view.h"

namespace eagle3 {

// Rows [row, row + rows) of a buffer.
inline TensorView Rows(const TensorView& t, int64_t row, int64_t rows) { return t.Narrow(0, row, rows); }

// Sub-view of a 2-D buffer: rows [row, row + rows), columns [col, col + cols).
inline TensorView Block(const TensorView& t, int64_t row, int64_t rows, int64_t col, int64_t cols) {
  return t.Narrow(0, row, rows).Narrow(1, col, cols);
}

// A row-strided [rows, n * d] block seen as [rows, n, d].
inline TensorView Heads(const TensorView& t, int64_t n, int64_t d) {
  return TensorView(t.data(), t.dtype(), Shape{t.dim(0), n, d}, Shape{t.stride(0), d, 1}, t.device());
}

}  // namespace eagle3
