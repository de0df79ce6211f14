#include "eagle3/tensor_view.h"

namespace eagle3 {

Shape ContiguousStrides(const Shape& shape) {
  Shape strides = shape;
  int64_t stride = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

TensorView::TensorView(void* data, DType dtype, const Shape& shape, Device device)
    : data_(data), dtype_(dtype), device_(device), shape_(shape), strides_(ContiguousStrides(shape)) {}

TensorView::TensorView(void* data, DType dtype, const Shape& shape, const Shape& strides,
                       Device device)
    : data_(data), dtype_(dtype), device_(device), shape_(shape), strides_(strides) {}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int i = rank() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

TensorView TensorView::Narrow(int dim, int64_t start, int64_t length) const {
  TensorView out = *this;
  out.data_ = static_cast<char*>(data_) +
              static_cast<ptrdiff_t>(start * strides_[dim]) * static_cast<ptrdiff_t>(DTypeSize(dtype_));
  out.shape_[dim] = length;
  return out;
}

TensorView TensorView::Reshape(const Shape& shape) const {
  return TensorView(data_, dtype_, shape, device_);
}

std::string TensorView::ToString() const {
  return std::string(DTypeName(dtype_)) + shape_.ToString() + " " + device_.ToString();
}

}  // namespace eagle3
