#include "eagle3/testing/random_quantized_weights.h"

#include <cmath>
#include <random>
#include <vector>

#include "eagle3/detail/int4_packing.h"
#include "eagle3/half.h"
#include "eagle3/status.h"

namespace eagle3 {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

absl::StatusOr<RandomQuantizedWeight> RandomFp8(const WeightSpec& spec, const QuantizationConfig& q,
                                                std::mt19937_64& rng) {
  const int64_t out = spec.shape[0], in = spec.shape[1];
  EAGLE3_ASSIGN_OR_RETURN(Tensor codes, Tensor::Empty(DType::kF8E4M3, spec.shape));
  EAGLE3_ASSIGN_OR_RETURN(Tensor scales,
                          Tensor::Empty(DType::kF32, Shape{CeilDiv(out, q.block_out), CeilDiv(in, q.block_in)}));
  EAGLE3_ASSIGN_OR_RETURN(Tensor w, Tensor::Empty(DType::kF32, spec.shape));
  // Codes: exponent field 4..8 (magnitudes 2^-3 .. 3.75, RMS about 1.5), never the NaN pattern.
  std::uniform_int_distribution<int> exponent(4, 8), mantissa(0, 7), sign(0, 1);
  uint8_t* c = codes.data_as<uint8_t>();
  for (int64_t i = 0; i < codes.numel(); ++i) {
    c[i] = static_cast<uint8_t>((sign(rng) << 7) | (exponent(rng) << 3) | mantissa(rng));
  }
  std::uniform_real_distribution<float> spread(0.5f, 1.0f);
  const float base = 1.0f / (1.5f * std::sqrt(static_cast<float>(in)));
  float* s = scales.data_as<float>();
  for (int64_t i = 0; i < scales.numel(); ++i) s[i] = base * spread(rng);
  float* v = w.data_as<float>();
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t col = 0; col < in; ++col) {
      v[r * in + col] = F8E4M3ToFloat(c[r * in + col]) * s[(r / q.block_out) * scales.dim(1) + col / q.block_in];
    }
  }
  RandomQuantizedWeight result;
  result.stored.emplace_back(spec.name, std::move(codes));
  result.stored.emplace_back(Fp8ScaleName(spec.name), std::move(scales));
  result.dequantized = std::move(w);
  return result;
}

absl::StatusOr<RandomQuantizedWeight> RandomInt4(const WeightSpec& spec, const QuantizationConfig& q,
                                                 std::mt19937_64& rng) {
  const int64_t out = spec.shape[0], in = spec.shape[1];
  EAGLE3_ASSIGN_OR_RETURN(Tensor packed, Tensor::Empty(DType::kI32, Shape{out, Int4PackedWords(in)}));
  EAGLE3_ASSIGN_OR_RETURN(Tensor scales, Tensor::Empty(DType::kBF16, Shape{out, in / q.group_size}));
  EAGLE3_ASSIGN_OR_RETURN(Tensor shape, Tensor::Empty(DType::kI32, Shape{2}));
  EAGLE3_ASSIGN_OR_RETURN(Tensor w, Tensor::Empty(DType::kF32, spec.shape));
  shape.data_as<int32_t>()[0] = static_cast<int32_t>(out);
  shape.data_as<int32_t>()[1] = static_cast<int32_t>(in);
  std::uniform_int_distribution<int> value(-8, 7);
  std::uniform_real_distribution<float> spread(0.5f, 1.0f);
  // Uniform [-8, 7] has an RMS of about 4.6.
  const float base = 1.0f / (4.6f * std::sqrt(static_cast<float>(in)));
  uint16_t* s = scales.data_as<uint16_t>();
  for (int64_t i = 0; i < scales.numel(); ++i) s[i] = FloatToBf16(base * spread(rng));
  std::vector<int8_t> row(static_cast<size_t>(in));
  float* v = w.data_as<float>();
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t col = 0; col < in; ++col) {
      row[static_cast<size_t>(col)] = static_cast<int8_t>(value(rng));
      v[r * in + col] =
          static_cast<float>(row[static_cast<size_t>(col)]) * Bf16ToFloat(s[r * scales.dim(1) + col / q.group_size]);
    }
    PackInt4Row(row.data(), in, packed.data_as<int32_t>() + r * packed.dim(1));
  }
  RandomQuantizedWeight result;
  result.stored.emplace_back(Int4PackedName(spec.name), std::move(packed));
  result.stored.emplace_back(Int4ScaleName(spec.name), std::move(scales));
  result.stored.emplace_back(Int4ShapeName(spec.name), std::move(shape));
  result.dequantized = std::move(w);
  return result;
}

}  // namespace

QuantizationConfig DeepseekV3Fp8Quantization() {
  QuantizationConfig q;
  q.format = WeightFormat::kFp8Block;
  q.block_out = 128;
  q.block_in = 128;
  q.activation_scheme = "dynamic";
  return q;
}

QuantizationConfig KimiK2ThinkingInt4Quantization() {
  QuantizationConfig q;
  q.format = WeightFormat::kInt4Group;
  q.group_size = 32;
  q.ignore = {"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"};
  return q;
}

absl::StatusOr<RandomQuantizedWeight> RandomQuantizedWeightOf(const WeightSpec& spec, StoredForm form,
                                                              const QuantizationConfig& quantization, uint64_t seed) {
  std::mt19937_64 rng(seed);
  if (spec.shape.rank() != 2) {
    return absl::InvalidArgumentError("quantized weight '" + spec.name + "' must be 2-D, got " + spec.shape.ToString());
  }
  if (form == StoredForm::kFp8Block) return RandomFp8(spec, quantization, rng);
  if (form == StoredForm::kInt4Packed) {
    if (spec.shape[1] % quantization.group_size != 0) {
      return absl::InvalidArgumentError("quantized weight '" + spec.name + "' " + spec.shape.ToString() +
                                        ": group_size " + std::to_string(quantization.group_size) +
                                        " does not divide its input dim");
    }
    return RandomInt4(spec, quantization, rng);
  }
  return absl::InvalidArgumentError("weight '" + spec.name + "' is not stored quantized");
}

}  // namespace eagle3
