// Zeroing a model-owned device buffer (a KV cache) with the backend's own Copy: no fill op needed.
#pragma once

#include "absl/status/status.h"
#include "eagle3/backend.h"
#include "eagle3/tensor.h"

namespace eagle3 {

// Sets every element of `t` to zero: one zero row of its last dim is uploaded, then broadcast over
// the leading dims by one Copy (zero strides), and the backend is synchronized before the row is
// freed.
//   t: contiguous, rank >= 1, f32 or bf16 (any dtype Copy moves), on `backend`'s device
absl::Status ZeroFill(Backend& backend, const Tensor& t);

}  // namespace eagle3
