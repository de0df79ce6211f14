// Copies between host and device tensors (eagle3::cuda target).
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "eagle3/export.h"
#include "eagle3/tensor_view.h"

namespace eagle3::cuda {

// Copies `src` to `dst` (same dtype and shape, both contiguous; any host/device combination),
// asynchronously on `stream`. Host memory that is not pinned makes the copy synchronous, as CUDA does.
EAGLE3_API absl::Status CopyTensor(const TensorView& src, const TensorView& dst, cudaStream_t stream);

}  // namespace eagle3::cuda
