#include "eagle3/shape.h"

namespace eagle3 {

Shape::Shape(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) {
    if (rank_ == kMaxRank) break;
    dims_[rank_++] = d;
  }
}

bool Shape::FromSpan(std::span<const int64_t> dims, Shape* out) {
  if (dims.size() > static_cast<size_t>(kMaxRank)) return false;
  Shape shape;
  for (int64_t d : dims) shape.dims_[shape.rank_++] = d;
  *out = shape;
  return true;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

std::string Shape::ToString() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + "]";
}

}  // namespace eagle3
