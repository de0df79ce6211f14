#include "zero_fill.h"

#include "eagle3/status.h"

namespace eagle3 {

absl::Status ZeroFill(Backend& backend, const Tensor& t) {
  if (t.numel() == 0) return absl::OkStatus();
  const int64_t width = t.dim(t.rank() - 1);
  EAGLE3_ASSIGN_OR_RETURN(Tensor host_zero, Tensor::Zeros(t.dtype(), Shape{width}));
  EAGLE3_ASSIGN_OR_RETURN(Tensor zero, Tensor::Empty(t.dtype(), Shape{width}, backend.allocator()));
  EAGLE3_RETURN_IF_ERROR(backend.Copy(host_zero, zero));
  Shape strides = t.shape();  // the same rank: 0 on every leading dim, 1 on the last
  for (int d = 0; d < strides.rank(); ++d) strides[d] = d + 1 == strides.rank() ? 1 : 0;
  const TensorView rows(zero.data(), t.dtype(), t.shape(), strides, t.device());
  EAGLE3_RETURN_IF_ERROR(backend.Copy(rows, t));
  return backend.Synchronize();  // `zero` is freed on return
}

}  // namespace eagle3
