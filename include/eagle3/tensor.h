// Owning, contiguous tensor. Move-only; memory comes from an Allocator that must outlive it.
#pragma once

#include "absl/status/statusor.h"
#include "eagle3/allocator.h"
#include "eagle3/export.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

class EAGLE3_API Tensor {
 public:
  static constexpr size_t kAlignment = 256;  // Enough for vectorized host and CUDA access.

  Tensor() = default;
  ~Tensor();
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  // Uninitialized storage. Fails with InvalidArgument on negative dims or byte-size overflow, and
  // with ResourceExhausted when the allocator cannot provide the memory.
  static absl::StatusOr<Tensor> Empty(DType dtype, const Shape& shape,
                                      Allocator& allocator = DefaultHostAllocator());
  // Zero-filled host tensor (the allocator must be a host allocator).
  static absl::StatusOr<Tensor> Zeros(DType dtype, const Shape& shape,
                                      Allocator& allocator = DefaultHostAllocator());

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT: a tensor is usable as its view.

  void* data() const { return view_.data(); }
  template <typename T>
  T* data_as() const {
    return view_.data_as<T>();
  }
  DType dtype() const { return view_.dtype(); }
  Device device() const { return view_.device(); }
  const Shape& shape() const { return view_.shape(); }
  int rank() const { return view_.rank(); }
  int64_t dim(int i) const { return view_.dim(i); }
  int64_t numel() const { return view_.numel(); }
  size_t nbytes() const { return view_.nbytes(); }
  bool empty() const { return view_.empty(); }

 private:
  void Release();

  TensorView view_;
  Allocator* allocator_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace eagle3
