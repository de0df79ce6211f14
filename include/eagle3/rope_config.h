// Rotary position embedding description shared by the target (DeepSeek) and draft (EAGLE-3)
// configs.
//
// Read from either config form (parsers: DeepseekV2Config, Eagle3DraftConfig):
//  - hub form: top-level `rope_theta` plus `rope_scaling` (`type` or `rope_type`; null = none);
//  - transformers-5 form: `rope_parameters` holding `rope_type`, `rope_theta` and the scaling keys.
// When both forms are present every value they both state must agree, or parsing fails.
// Refused: `dynamic`, `longrope` and other types eagle3 does not implement (Unimplemented), unknown
// types (InvalidArgument), keys that do not apply to the type, and YaRN/llama3 scaling without
// `original_max_position_embeddings` (transformers falls back to max_position_embeddings,
// DeepSeek's reference code to 4096 and vLLM/SGLang require the key: with no agreed default, eagle3
// requires it).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "eagle3/export.h"

namespace eagle3 {

struct RopeScaling {
  enum class Type { kNone, kLinear, kYarn, kLlama3 };

  Type type = Type::kNone;
  double factor = 1.0;  // > 0; 1 when type is kNone
  // Training context the scaling extends; 0 when the type does not use it (kNone, kLinear).
  int64_t original_max_position_embeddings = 0;
  // YaRN (defaults are transformers' and DeepSeek's).
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;  // 0 = unset: no softmax-scale correction (YarnGetMscale(s, 0) = 1)
  // llama3: frequency band edges, in wavelengths relative to the original context.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // Explicit YaRN attention factor; when unset, implementations derive it from factor/mscale.
  std::optional<double> attention_factor;

  friend bool operator==(const RopeScaling&, const RopeScaling&) = default;
};

struct RopeConfig {
  double theta = 10000.0;  // base; > 0
  RopeScaling scaling;

  friend bool operator==(const RopeConfig&, const RopeConfig&) = default;
};

// "none", "linear", "yarn", "llama3".
EAGLE3_API std::string_view RopeScalingTypeName(RopeScaling::Type type);

// YaRN magnitude correction: 0.1 * mscale * ln(scale) + 1 for scale > 1, else 1
// (DeepSeek's `yarn_get_mscale`).
EAGLE3_API double YarnGetMscale(double scale, double mscale);

}  // namespace eagle3
