// Non-owning view of a strided tensor: pointer, shape, strides (in elements), dtype and device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "eagle3/device.h"
#include "eagle3/dtype.h"
#include "eagle3/export.h"
#include "eagle3/shape.h"

namespace eagle3 {

class EAGLE3_API TensorView {
 public:
  TensorView() = default;
  // Contiguous (row-major) view.
  TensorView(void* data, DType dtype, const Shape& shape, Device device = Device::Cpu());
  // Strided view; `strides` are in elements and must have the rank of `shape`.
  TensorView(void* data, DType dtype, const Shape& shape, const Shape& strides, Device device);

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t stride(int i) const { return strides_[i]; }
  int64_t numel() const { return shape_.numel(); }
  // Bytes spanned by the elements of a contiguous view (numel * element size).
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  bool empty() const { return data_ == nullptr; }
  bool is_contiguous() const;

  // Sub-range [start, start + length) along `dim`; same strides. Caller checks bounds.
  TensorView Narrow(int dim, int64_t start, int64_t length) const;
  // Same data with a new contiguous shape of equal numel; caller checks contiguity and numel.
  TensorView Reshape(const Shape& shape) const;

  // "bf16[4, 8] cpu" — for error messages.
  std::string ToString() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_ = Device::Cpu();
  Shape shape_;
  Shape strides_;
};

// Row-major strides (in elements) of a shape.
EAGLE3_API Shape ContiguousStrides(const Shape& shape);

}  // namespace eagle3
