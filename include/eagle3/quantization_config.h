// How a DeepSeek-V2-family target's Linear weights are stored: the `quantization_config` of its
// config.json, in the two forms the published checkpoints use.
//
//  - FP8 block-scaled (DeepSeek-V3 / R1 / V3.1, Kimi-K2-Instruct): `{"quant_method": "fp8", "fmt":
//    "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}` (V3.1 adds
//    `"scale_fmt": "ue8m0"`). Every nn.Linear of DeepSeek's reference model but lm_head is stored
//    as `X.weight` F8_E4M3 [out, in] with `X.weight_scale_inv` [ceil(out/bo), ceil(in/bi)]; the
//    embedding, norms, the router and its correction bias are not (deepseek-ai/DeepSeek-V3,
//    inference/model.py: `Linear` allocates the scale only for 1-byte weights, `head` is created in
//    the default dtype, `Gate` holds plain parameters; inference/fp8_cast_bf16.py dequantizes
//    exactly the weights that have a `_scale_inv`).
//  - INT4 weight-only, compressed-tensors `"format": "pack-quantized"` (Kimi-K2-Thinking, K2.5):
//    one config group targeting Linear, weights `{"num_bits": 4, "type": "int", "symmetric": true,
//    "strategy": "group", "group_size": 32}`, plus an `ignore` list of module names or `re:`
//    regexes (Kimi-K2-Thinking: ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
//    "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"], so only the routed experts are quantized). Each
//    quantized `X` is stored as `X.weight_packed` I32 [out, ceil(in/8)], `X.weight_scale`
//    [out, in/group_size] and `X.weight_shape` I32 [2].
//
// Parsing (DeepseekV2Config::FromJson) is strict like the rest of config.json: every key is read or
// known to be harmless; other methods (awq, gptq, bitsandbytes, modelopt / NVFP4, mxfp4, ...),
// formats and settings that change the stored bytes are refused by name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eagle3/export.h"

namespace eagle3 {

enum class WeightFormat : uint8_t {
  kUnquantized,  // no quantization_config: every tensor is a plain f32 / f16 / bf16 tensor
  kFp8Block,     // quant_method "fp8": e4m3 weights with one f32 scale per bo x bi block
  kInt4Group,    // quant_method "compressed-tensors", pack-quantized int4, one scale per group
};

// "unquantized", "fp8-block", "int4-group".
EAGLE3_API std::string_view WeightFormatName(WeightFormat format);

struct EAGLE3_API QuantizationConfig {
  WeightFormat format = WeightFormat::kUnquantized;

  // kFp8Block: weight_block_size [rows of out, columns of in] (128 x 128 in every published
  // checkpoint). activation_scheme ("dynamic") and scale_fmt ("ue8m0" or unset) describe how
  // DeepSeek's kernels quantize activations; eagle3's reference keeps activations unquantized, as
  // transformers does, so they are recorded only.
  int64_t block_out = 0;
  int64_t block_in = 0;
  std::string activation_scheme;
  std::optional<std::string> scale_fmt;

  // kInt4Group: consecutive input columns sharing one scale, and the modules left unquantized:
  // exact module names ("lm_head") or "re:<pattern>" regexes that match a prefix of the name, as
  // compressed-tensors' utils/match.py (_match_name: re.match) reads them.
  int64_t group_size = 0;
  std::vector<std::string> ignore;

  bool quantized() const { return format != WeightFormat::kUnquantized; }
  // One line for messages and `eagle3-inspect`: "fp8-block e4m3, 128x128 blocks" / "int4-group
  // symmetric, group 32 (compressed-tensors pack-quantized), 4 modules ignored" / "unquantized".
  std::string Describe() const;

  friend bool operator==(const QuantizationConfig&, const QuantizationConfig&) = default;
};

}  // namespace eagle3
