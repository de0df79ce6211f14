#include "zero_fill.h"

#include <vector>

#include "eagle3/status.h"

namespace eagle3 {

absl::Status ZeroFill(Backend& backend, const Tensor& t) {
  if (t.numel() == 0) return absl::OkStatus();
  const int64_t width = t.dim(t.rank() - 1);
  EAGLE3_ASSIGN_OR_RETURN(Tensor host_zero, Tensor::Zeros(t.dtype(), Shape{width}));
  EAGLE3_ASSIGN_OR_RETURN(Tensor zero, Tensor::Empty(t.dtype(), Shape{width}, backend.allocator()));
  EAGLE3_RETURN_IF_ERROR(backend.Copy(host_zero, zero));
  std::vector<int64_t> strides(static_cast<size_t>(t.rank()), 0);
  strides.back() = 1;
  Shape stride_shape;
  if (!Shape::FromSpan(strides, &stride_shape)) {
    return absl::InvalidArgumentError("ZeroFill: " + t.view().ToString() + " has more dims than a Shape holds");
  }
  const TensorView rows(zero.data(), t.dtype(), t.shape(), stride_shape, t.device());
  EAGLE3_RETURN_IF_ERROR(backend.Copy(rows, t));
  return backend.Synchronize();  // `zero` is freed on return
}

}  // namespace eagle3
