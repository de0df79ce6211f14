// Host f32 tensors for the CPU tests of the quantized ops and weights: random and filled tensors,
// copies, and a bit-for-bit comparison.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>

#include "eagle3/tensor.h"
#include "gtest/gtest.h"

namespace eagle3 {

// Standard normal values from a seeded generator (the same tensor for the same seed).
inline Tensor RandomF32(const Shape& shape, uint32_t seed) {
  Tensor t = *Tensor::Empty(DType::kF32, shape);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng);
  return t;
}

inline Tensor Filled(const Shape& shape, float value) {
  Tensor t = *Tensor::Empty(DType::kF32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = value;
  return t;
}

inline Tensor Clone(const Tensor& t) {
  Tensor out = *Tensor::Empty(t.dtype(), t.shape());
  std::memcpy(out.data(), t.data(), t.nbytes());
  return out;
}

// The same shape and the same f32 bits, element by element (NaNs included).
inline void ExpectBitwiseEqual(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (int64_t i = 0; i < got.numel(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got.data_as<float>()[i]), std::bit_cast<uint32_t>(want.data_as<float>()[i]))
        << what << ": element " << i << " " << got.data_as<float>()[i] << " vs " << want.data_as<float>()[i];
  }
}

}  // namespace eagle3
