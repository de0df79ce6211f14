#include "eagle3/tensor.h"

#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "eagle3/status.h"

namespace eagle3 {

Tensor::~Tensor() { Release(); }

Tensor::Tensor(Tensor&& other) noexcept
    : view_(other.view_), allocator_(other.allocator_), capacity_(other.capacity_) {
  other.view_ = TensorView();
  other.allocator_ = nullptr;
  other.capacity_ = 0;
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    Release();
    view_ = std::exchange(other.view_, TensorView());
    allocator_ = std::exchange(other.allocator_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

void Tensor::Release() {
  if (allocator_ != nullptr && view_.data() != nullptr) allocator_->Deallocate(view_.data(), capacity_);
  view_ = TensorView();
  allocator_ = nullptr;
  capacity_ = 0;
}

absl::StatusOr<Tensor> Tensor::Empty(DType dtype, const Shape& shape, Allocator& allocator) {
  uint64_t bytes = DTypeSize(dtype);
  for (int i = 0; i < shape.rank(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError("tensor shape " + shape.ToString() + " has negative dim " +
                                        std::to_string(i));
    }
    if (shape[i] != 0 &&
        bytes > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(shape[i])) {
      return absl::InvalidArgumentError("tensor shape " + shape.ToString() + " of " +
                                        std::string(DTypeName(dtype)) + " overflows 64-bit size");
    }
    bytes *= static_cast<uint64_t>(shape[i]);
  }
  EAGLE3_ASSIGN_OR_RETURN(void* ptr, allocator.Allocate(bytes, kAlignment));
  Tensor t;
  t.view_ = TensorView(ptr, dtype, shape, allocator.device());
  t.allocator_ = &allocator;
  t.capacity_ = bytes;
  return t;
}

absl::StatusOr<Tensor> Tensor::Zeros(DType dtype, const Shape& shape, Allocator& allocator) {
  if (!allocator.device().is_cpu()) {
    return absl::InvalidArgumentError("Tensor::Zeros needs a host allocator, got " +
                                      allocator.device().ToString());
  }
  EAGLE3_ASSIGN_OR_RETURN(Tensor t, Empty(dtype, shape, allocator));
  std::memset(t.data(), 0, t.nbytes());
  return t;
}

}  // namespace eagle3
