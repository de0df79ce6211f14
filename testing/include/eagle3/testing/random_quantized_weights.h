// Random quantized weights in the hub formats (DeepSeek-V3 FP8 block-scaled, Kimi-K2-Thinking INT4
// pack-quantized), each with the f32 weight it dequantizes to, for the random checkpoint writer
// (random_checkpoint.h) and the tests of quantized loading.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/quantization_config.h"
#include "eagle3/tensor.h"

namespace eagle3 {

// DeepSeek-V3's (and Kimi-K2-Instruct's) quantization_config: fp8 e4m3, dynamic activations,
// 128 x 128 weight blocks.
QuantizationConfig DeepseekV3Fp8Quantization();
// Kimi-K2-Thinking's: compressed-tensors pack-quantized int4, group 32, only the routed experts
// quantized (ignore: lm_head, self_attn, shared_experts, the dense MLP's projections).
QuantizationConfig KimiK2ThinkingInt4Quantization();

struct RandomQuantizedWeight {
  std::vector<std::pair<std::string, Tensor>> stored;  // named as the checkpoint stores them
  Tensor dequantized;                                  // f32 [out, in], what the stored tensors mean
};

// The stored tensors of `spec` in `form` (kFp8Block or kInt4Packed) under `quantization`, with
// values depending only on `seed` and the spec's name. The dequantized weight has about the
// N(0, 1/in) spread of the unquantized writer's: fp8 codes of magnitude 2^-3 .. 3.75 (never NaN)
// with one f32 scale per block, int4 values uniform in [-8, 7] with one bf16 scale per group.
absl::StatusOr<RandomQuantizedWeight> RandomQuantizedWeightOf(const WeightSpec& spec, StoredForm form,
                                                              const QuantizationConfig& quantization, uint64_t seed);

}  // namespace eagle3
