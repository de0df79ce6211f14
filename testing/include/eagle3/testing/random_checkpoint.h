// Random-weight DeepSeek-V2-family checkpoints in the hub layout, for demos, tests and benchmarks
// before real weights are at hand.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/dtype.h"

namespace eagle3 {

struct RandomCheckpointOptions {
  uint64_t seed = 0;
  // 1: a single model.safetensors; more: model-0000i-of-0000n.safetensors + index, tensors assigned
  // in order with about equal bytes per shard.
  int num_shards = 2;
  DType dtype = DType::kBF16;  // f32, f16 or bf16, of the unquantized tensors
  // Set: also writes into this directory the same model unquantized — config.json without its
  // quantization_config, every quantized weight as the f32 values it dequantizes to, the other
  // tensors as in `dir` — the reference a quantized checkpoint's load must equal.
  std::string dequantized_dir;
  // Also writes the MTP modules of a config with num_nextn_predict_layers > 0 as DeepSeek-V3's hub
  // checkpoint stores them after the main layers: every tensor of MtpWeights (mtp_weights.h) in its
  // stored form, and per module the copies of the shared embedding and head (MtpSharedCopyWeights)
  // holding the target's values. InvalidArgument for a config without MTP modules.
  bool write_mtp = false;
};

// Writes `config.json` (hub form) and the weights of DeepseekV2Weights(config) into `dir` (created if
// needed). Linear weights ~ N(0, 1/in_features), norm weights 1 + N(0, 0.1²), router correction bias
// ~ U(0, 0.1). Each tensor's values depend only on the seed and its name, not on the shard layout.
// When config.quantization is set (e.g. DeepseekV3Fp8Quantization(), KimiK2ThinkingInt4Quantization()
// of random_quantized_weights.h), the weights it quantizes are written in its hub form (codes or
// packed values with their scales, RandomQuantizedWeightOf) and config.json carries it. With
// config.tensor_prefix kKimiK25TensorPrefix the checkpoint is in Kimi-K2.5's multimodal form: that
// config.json, every language-model tensor under the prefix with the values of the plain form, and
// a few vision-tower and projector tensors.
absl::Status WriteRandomDeepseekV2Checkpoint(const DeepseekV2Config& config, const std::string& dir,
                                             const RandomCheckpointOptions& options = {});

}  // namespace eagle3
