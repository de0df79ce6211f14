#include "eagle3/cuda/tensor_copy.h"

#include <string>

#include "cuda_status.h"

namespace eagle3::cuda {

absl::Status CopyTensor(const TensorView& src, const TensorView& dst, cudaStream_t stream) {
  if (src.dtype() != dst.dtype() || !(src.shape() == dst.shape())) {
    return absl::InvalidArgumentError("CopyTensor needs equal dtype and shape: from " + src.ToString() +
                                      " to " + dst.ToString());
  }
  if (!src.is_contiguous() || !dst.is_contiguous()) {
    return absl::InvalidArgumentError("CopyTensor needs contiguous tensors: from " + src.ToString() +
                                      " to " + dst.ToString());
  }
  if (src.nbytes() == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault, stream),
                    "cudaMemcpyAsync from " + src.ToString() + " to " + dst.ToString());
}

}  // namespace eagle3::cuda
