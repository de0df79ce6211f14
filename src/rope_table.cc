#include "eagle3/rope_table.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "absl/strings/str_cat.h"
#include "eagle3/status.h"

namespace eagle3 {
namespace {

using Type = RopeScaling::Type;

template <typename... Args>
absl::Status Invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat("RoPE table: ", args...));
}

bool Positive(double v) { return v > 0 && std::isfinite(v); }

absl::Status CheckParams(const RopeConfig& rope, int64_t rope_dim) {
  const RopeScaling& s = rope.scaling;
  if (rope_dim < 2 || rope_dim % 2 != 0) {
    return Invalid("rope_dim must be even and >= 2, got ", rope_dim);
  }
  if (!Positive(rope.theta)) return Invalid("theta must be finite and > 0, got ", rope.theta);
  if (s.type == Type::kNone) return absl::OkStatus();
  const std::string type(RopeScalingTypeName(s.type));
  if (!Positive(s.factor)) return Invalid(type, " factor must be finite and > 0, got ", s.factor);
  if (s.type == Type::kLinear) return absl::OkStatus();
  if (s.original_max_position_embeddings <= 0) {
    return Invalid(type, " original_max_position_embeddings must be > 0, got ",
                   s.original_max_position_embeddings);
  }
  if (s.type == Type::kYarn) {
    if (!Positive(s.beta_fast) || !Positive(s.beta_slow)) {
      return Invalid("yarn beta_fast ", s.beta_fast, " and beta_slow ", s.beta_slow,
                     " must be finite and > 0");
    }
    if (!std::isfinite(s.mscale) || !std::isfinite(s.mscale_all_dim)) {
      return Invalid("yarn mscale ", s.mscale, " and mscale_all_dim ", s.mscale_all_dim,
                     " must be finite");
    }
    if (s.attention_factor.has_value() && !Positive(*s.attention_factor)) {
      return Invalid("yarn attention_factor must be finite and > 0, got ", *s.attention_factor);
    }
    if (!Positive(RopeAttentionFactor(rope))) {
      return Invalid("yarn attention factor YarnGetMscale(", s.factor, ", ", s.mscale,
                     ") / YarnGetMscale(", s.factor, ", ", s.mscale_all_dim,
                     ") = ", RopeAttentionFactor(rope), " must be finite and > 0");
    }
  }
  if (s.type == Type::kLlama3) {
    if (!Positive(s.low_freq_factor) || !Positive(s.high_freq_factor) ||
        s.low_freq_factor == s.high_freq_factor) {
      return Invalid("llama3 low_freq_factor ", s.low_freq_factor, " and high_freq_factor ",
                     s.high_freq_factor, " must be finite, > 0 and distinct");
    }
  }
  return absl::OkStatus();
}

// YaRN's "dimension index at which a frequency completes `rotations` turns over the original
// context" (DeepSeek's yarn_find_correction_dim).
double YarnCorrectionDim(double rotations, int64_t rope_dim, double theta, double original) {
  return static_cast<double>(rope_dim) * std::log(original / (rotations * 2 * std::numbers::pi)) /
         (2 * std::log(theta));
}

}  // namespace

absl::StatusOr<std::vector<double>> RopeInvFreq(const RopeConfig& rope, int64_t rope_dim) {
  EAGLE3_RETURN_IF_ERROR(CheckParams(rope, rope_dim));
  const RopeScaling& s = rope.scaling;
  const int64_t half = rope_dim / 2;
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] =
        std::pow(rope.theta, -2.0 * static_cast<double>(i) / static_cast<double>(rope_dim));
  }
  switch (s.type) {
    case Type::kNone:
      break;
    case Type::kLinear:
      for (double& f : inv_freq) f /= s.factor;
      break;
    case Type::kYarn: {
      const double original = static_cast<double>(s.original_max_position_embeddings);
      // floor/ceil then clamp, as the reference does; note the upper clamp is rope_dim - 1 although
      // the ramp runs over rope_dim / 2 pairs (kept: it is what the models were trained with).
      const double low =
          std::max(std::floor(YarnCorrectionDim(s.beta_fast, rope_dim, rope.theta, original)), 0.0);
      double high =
          std::min(std::ceil(YarnCorrectionDim(s.beta_slow, rope_dim, rope.theta, original)),
                   static_cast<double>(rope_dim - 1));
      if (low == high) high += 0.001;  // the reference's guard against a zero-width ramp
      for (int64_t i = 0; i < half; ++i) {
        // ramp 0: keep the original frequency (extrapolation); 1: divide by factor (interpolation).
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        inv_freq[i] = inv_freq[i] / s.factor * ramp + inv_freq[i] * (1.0 - ramp);
      }
      break;
    }
    case Type::kLlama3: {
      const double original = static_cast<double>(s.original_max_position_embeddings);
      const double low_freq_wavelen = original / s.low_freq_factor;
      const double high_freq_wavelen = original / s.high_freq_factor;
      for (double& f : inv_freq) {
        const double wavelen = 2 * std::numbers::pi / f;
        if (wavelen > low_freq_wavelen) {
          f /= s.factor;
        } else if (wavelen >= high_freq_wavelen) {
          const double smooth =
              (original / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
          f = (1.0 - smooth) * f / s.factor + smooth * f;
        }
      }
      break;
    }
  }
  return inv_freq;
}

double RopeAttentionFactor(const RopeConfig& rope) {
  const RopeScaling& s = rope.scaling;
  if (s.type != Type::kYarn) return 1.0;
  if (s.attention_factor.has_value()) return *s.attention_factor;
  return YarnGetMscale(s.factor, s.mscale) / YarnGetMscale(s.factor, s.mscale_all_dim);
}

absl::Status FillRopeCosSin(const RopeConfig& rope, int64_t rope_dim, const TensorView& out) {
  EAGLE3_ASSIGN_OR_RETURN(const std::vector<double> inv_freq, RopeInvFreq(rope, rope_dim));
  if (out.dtype() != DType::kF32 || !out.device().is_cpu() || out.rank() != 2 ||
      out.dim(1) != rope_dim || out.dim(0) < 0 || (out.dim(1) > 1 && out.stride(1) != 1) ||
      (out.dim(0) > 1 && out.stride(0) < rope_dim)) {
    return Invalid("out ", out.ToString(), " strides ", out.strides().ToString(),
                   " must be a row-strided f32 host matrix [P, rope_dim = ", rope_dim, "]");
  }
  if (out.data() == nullptr && out.numel() > 0)
    return Invalid("out ", out.ToString(), " has no data");
  const double factor = RopeAttentionFactor(rope);
  const int64_t half = rope_dim / 2;
  for (int64_t p = 0; p < out.dim(0); ++p) {
    float* row = out.data_as<float>() + p * out.stride(0);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * inv_freq[i];
      row[i] = static_cast<float>(std::cos(angle) * factor);
      row[half + i] = static_cast<float>(std::sin(angle) * factor);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> MakeRopeCosSin(const RopeConfig& rope, int64_t rope_dim,
                                      int64_t num_positions, Allocator& allocator) {
  EAGLE3_RETURN_IF_ERROR(CheckParams(rope, rope_dim));
  if (!allocator.device().is_cpu()) {
    return Invalid("the allocator must hand out host memory, got one for ",
                   allocator.device().ToString());
  }
  if (num_positions < 0) return Invalid("num_positions must be >= 0, got ", num_positions);
  EAGLE3_ASSIGN_OR_RETURN(Tensor table,
                          Tensor::Empty(DType::kF32, Shape{num_positions, rope_dim}, allocator));
  EAGLE3_RETURN_IF_ERROR(FillRopeCosSin(rope, rope_dim, table.view()));
  return table;
}

}  // namespace eagle3
