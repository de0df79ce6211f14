// Element-type conversion between host tensors.
#pragma once

#include "absl/status/status.h"
#include "eagle3/export.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

// Copies `src` into `dst`, converting the element type. Both: host, contiguous, same shape.
// Supported: any of {f32, f16, bf16} to any of them (f8_e4m3 as source too), i32 <-> i64, and
// same-dtype copies of every dtype. Errors name the dtypes and shapes.
EAGLE3_API absl::Status ConvertTensor(const TensorView& src, const TensorView& dst);

}  // namespace eagle3
