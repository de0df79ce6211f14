// Writes a DeepseekV2Config as a hub-form `config.json` (rope_theta + rope_scaling, and a
// quantization_config in DeepSeek-V3's FP8 or Kimi-K2-Thinking's compressed-tensors form when the
// config is quantized), the form DeepSeek's and Moonshot's published checkpoints use.
// A config with tensor_prefix kKimiK25TensorPrefix is written in Kimi-K2.5's multimodal form: that
// text config nested as `text_config`, with a small `vision_config`.
// DeepseekV2Config::FromJson reads it back to an equal config.
#pragma once

#include <string>

#include "eagle3/deepseek_v2_config.h"

namespace eagle3 {

// Pretty-printed JSON text (2-space indent).
std::string DeepseekV2ConfigToHubJson(const DeepseekV2Config& config);

}  // namespace eagle3
