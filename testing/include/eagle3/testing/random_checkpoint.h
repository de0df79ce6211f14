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
  DType dtype = DType::kBF16;  // f32, f16 or bf16
};

// Writes `config.json` (hub form) and the weights of DeepseekV2Weights(config) into `dir` (created if
// needed). Linear weights ~ N(0, 1/in_features), norm weights 1 + N(0, 0.1²), router correction bias
// ~ U(0, 0.1). Each tensor's values depend only on the seed and its name, not on the shard layout.
absl::Status WriteRandomDeepseekV2Checkpoint(const DeepseekV2Config& config, const std::string& dir,
                                             const RandomCheckpointOptions& options = {});

}  // namespace eagle3
