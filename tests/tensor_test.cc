#include "eagle3/tensor.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "eagle3/half.h"
#include "eagle3/tensor_convert.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

TEST(DTypeTest, SafetensorsNamesRoundTrip) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64, DType::kBool,
                  DType::kU8, DType::kF8E4M3}) {
    auto parsed = ParseSafetensorsDType(SafetensorsDTypeName(d));
    ASSERT_TRUE(parsed.has_value()) << DTypeName(d);
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_FALSE(ParseSafetensorsDType("F64").has_value());
  EXPECT_FALSE(ParseSafetensorsDType("bf16").has_value());  // case matters in safetensors
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
}

TEST(TensorViewTest, StridesNarrowAndContiguity) {
  std::vector<float> data(24);
  TensorView v(data.data(), DType::kF32, Shape{2, 3, 4});
  EXPECT_EQ(v.stride(0), 12);
  EXPECT_EQ(v.stride(1), 4);
  EXPECT_EQ(v.stride(2), 1);
  EXPECT_TRUE(v.is_contiguous());
  TensorView cols = v.Narrow(2, 1, 2);
  EXPECT_EQ(cols.data(), data.data() + 1);
  EXPECT_EQ(cols.shape(), (Shape{2, 3, 2}));
  EXPECT_FALSE(cols.is_contiguous());
  TensorView rows = v.Narrow(0, 1, 1);
  EXPECT_EQ(rows.data(), data.data() + 12);
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(v.ToString(), "f32[2, 3, 4] cpu");
}

TEST(ShapeTest, FromSpanRefusesTooManyDims) {
  std::vector<int64_t> dims(Shape::kMaxRank + 1, 1);
  Shape s{7};
  EXPECT_FALSE(Shape::FromSpan(dims, &s));
  EXPECT_EQ(s, Shape{7});
  dims.pop_back();
  EXPECT_TRUE(Shape::FromSpan(dims, &s));
  EXPECT_EQ(s.rank(), Shape::kMaxRank);
  EXPECT_EQ(Shape{}.numel(), 1);
}

TEST(TensorTest, EmptyZerosAndMove) {
  auto t = Tensor::Zeros(DType::kBF16, Shape{3, 5});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->nbytes(), 30u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data()) % Tensor::kAlignment, 0u);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(t->data_as<uint16_t>()[i], 0);
  void* ptr = t->data();
  Tensor moved = std::move(*t);
  EXPECT_EQ(moved.data(), ptr);
  EXPECT_TRUE(t->empty());
  auto zero = Tensor::Empty(DType::kF32, Shape{0, 4});
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->numel(), 0);
}

TEST(TensorTest, RejectsNegativeAndOverflowingShapes) {
  auto neg = Tensor::Empty(DType::kF32, Shape{2, -1});
  EXPECT_EQ(neg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(neg.status().message().find("negative dim 1"), std::string::npos) << neg.status();
  const int64_t big = int64_t{1} << 40;
  auto huge = Tensor::Empty(DType::kF32, Shape{big, big});
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("overflows"), std::string::npos) << huge.status();
  auto too_much = Tensor::Empty(DType::kU8, Shape{int64_t{1} << 62});
  EXPECT_EQ(too_much.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(HalfTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(FloatToBf16(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even): rounds up.
  EXPECT_EQ(FloatToBf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(bits));
    if (!std::isnan(f)) EXPECT_EQ(FloatToBf16(f), bits);
  }
}

TEST(HalfTest, F16AllValuesRoundTripAndRounding) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float f = F16ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(f))));
    } else {
      EXPECT_EQ(FloatToF16(f), bits) << "bits " << bits;
    }
  }
  EXPECT_EQ(F16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(F16ToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(FloatToF16(65504.0f), 0x7bff);               // max finite
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00);               // halfway to 2^16 rounds to inf
  EXPECT_EQ(FloatToF16(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -25)), 0x0000);   // halfway to smallest subnormal: even (0)
  EXPECT_EQ(FloatToF16(std::ldexp(3.0f, -25)), 0x0002);   // 1.5 ulp: ties to even (2)
  EXPECT_EQ(FloatToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie: even
}

TEST(HalfTest, F8E4M3Values) {
  EXPECT_EQ(F8E4M3ToFloat(0x38), 1.0f);
  EXPECT_EQ(F8E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(F8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(F8E4M3ToFloat(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(F8E4M3ToFloat(0x7f)));
}

TEST(ConvertTensorTest, FloatsAndIntegers) {
  std::vector<float> src = {1.0f, -0.5f, 3.140625f, 65504.0f};
  std::vector<uint16_t> bf(4);
  std::vector<float> back(4);
  TensorView s(src.data(), DType::kF32, Shape{2, 2});
  TensorView b(bf.data(), DType::kBF16, Shape{2, 2});
  TensorView r(back.data(), DType::kF32, Shape{2, 2});
  ASSERT_TRUE(ConvertTensor(s, b).ok());
  ASSERT_TRUE(ConvertTensor(b, r).ok());
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -0.5f);
  EXPECT_EQ(back[2], 3.140625f);
  EXPECT_EQ(back[3], 65536.0f);  // bf16 has 8 bits of mantissa

  std::vector<int64_t> big = {1, int64_t{1} << 40};
  std::vector<int32_t> small(2);
  absl::Status st = ConvertTensor(TensorView(big.data(), DType::kI64, Shape{2}),
                                  TensorView(small.data(), DType::kI32, Shape{2}));
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("element 1"), std::string::npos) << st;

  absl::Status mismatch = ConvertTensor(s, TensorView(bf.data(), DType::kBF16, Shape{4}));
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.message().find("f32[2, 2]"), std::string::npos) << mismatch;
  absl::Status unsupported = ConvertTensor(s, TensorView(small.data(), DType::kI32, Shape{2, 2}));
  EXPECT_EQ(unsupported.code(), absl::StatusCode::kUnimplemented);
}

// Every float pair converts element by element as the scalar conversions of half.h do, over values
// that round, overflow, underflow, are NaN, infinite or signed zeros, and over lengths that leave a
// tail after any vector width.
TEST(ConvertTensorTest, EveryFloatPairMatchesTheScalarConversions) {
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.5f, 3.140625f, 65504.0f, 65520.0f, 1e-8f, -6e-5f, 1e30f,
                               std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min()};
  for (int i = 0; i < 256; ++i) values.push_back(F8E4M3ToFloat(static_cast<uint8_t>(i)) * 1.0009765625f);
  const int64_t n = static_cast<int64_t>(values.size());  // 270: no vector width divides it
  std::vector<uint8_t> f8(static_cast<size_t>(n));
  std::vector<uint16_t> f16(static_cast<size_t>(n)), bf16(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    f8[i] = static_cast<uint8_t>(i % 256);
    f16[i] = FloatToF16(values[i]);
    bf16[i] = FloatToBf16(values[i]);
  }
  struct Source {
    DType dtype;
    const void* data;
    float (*load)(const void*, int64_t);
  };
  const Source sources[] = {
      {DType::kF32, values.data(), [](const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }},
      {DType::kF16, f16.data(),
       [](const void* p, int64_t i) { return F16ToFloat(static_cast<const uint16_t*>(p)[i]); }},
      {DType::kBF16, bf16.data(),
       [](const void* p, int64_t i) { return Bf16ToFloat(static_cast<const uint16_t*>(p)[i]); }},
      {DType::kF8E4M3, f8.data(),
       [](const void* p, int64_t i) { return F8E4M3ToFloat(static_cast<const uint8_t*>(p)[i]); }},
  };
  for (const Source& src : sources) {
    for (DType dst : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(std::string(DTypeName(src.dtype)) + " -> " + std::string(DTypeName(dst)));
      std::vector<uint32_t> got(static_cast<size_t>(n));
      ASSERT_TRUE(ConvertTensor(TensorView(const_cast<void*>(src.data), src.dtype, Shape{n}),
                                TensorView(got.data(), dst, Shape{n}))
                      .ok());
      for (int64_t i = 0; i < n; ++i) {
        const float v = src.load(src.data, i);
        if (dst == DType::kF32) {
          ASSERT_EQ(got[i], std::bit_cast<uint32_t>(v)) << i;
        } else {
          const uint16_t want = dst == DType::kF16 ? FloatToF16(v) : FloatToBf16(v);
          ASSERT_EQ(reinterpret_cast<const uint16_t*>(got.data())[i], want) << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace eagle3
