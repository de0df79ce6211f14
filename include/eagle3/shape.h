// Fixed-capacity tensor shape: no heap allocation, so views can be built inside a decode step.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "eagle3/export.h"

namespace eagle3 {

class EAGLE3_API Shape {
 public:
  static constexpr int kMaxRank = 6;

  Shape() = default;
  // Callers guarantee dims.size() <= kMaxRank (checked by `FromSpan` for untrusted input).
  Shape(std::initializer_list<int64_t> dims);

  // Returns false (leaving *out untouched) when dims has more than kMaxRank entries.
  static bool FromSpan(std::span<const int64_t> dims, Shape* out);

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  std::span<const int64_t> dims() const { return {dims_.data(), static_cast<size_t>(rank_)}; }

  // Product of the dims; 1 for rank 0.
  int64_t numel() const;

  std::string ToString() const;  // "[2, 3]"

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i) {
      if (a.dims_[i] != b.dims_[i]) return false;
    }
    return true;
  }

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

}  // namespace eagle3
