// Shared by the quantized-checkpoint tests: a tiny DeepSeek-V3-style MoE whose shapes exercise the
// block and group indexing, and the random quantized checkpoints written from it.
#pragma once

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "eagle3/deepseek_v2_config.h"
#include "eagle3/quantization_config.h"
#include "eagle3/testing/random_checkpoint.h"
#include "eagle3/testing/random_quantized_weights.h"
#include "gtest/gtest.h"

namespace eagle3 {

// Every Linear input dim (64, 96, 128, kv_lora_rank 32) is a multiple of the int4 group 32; q_b has
// 8 x 24 = 192 output rows and o_proj 128 input columns, so TP slices of 24 rows / 16 columns start
// inside a 128 x 128 FP8 block; the experts' down_proj has 96 input columns, so TP8 slices of 12
// start inside an int32 word and an int4 group. Vocab 1000 is padded to 1024 at TP8.
inline constexpr char kQuantTestConfig[] = R"({
  "model_type": "deepseek_v3", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
  "moe_intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 8,
  "num_key_value_heads": 8, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
  "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 4,
  "topk_group": 2, "norm_topk_prob": true, "first_k_dense_replace": 1, "moe_layer_freq": 1,
  "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
  "v_head_dim": 16, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "rope_theta": 10000,
  "rope_scaling": null, "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1
})";

// gtest prints test parameters through this (instead of their bytes).
inline void PrintTo(const QuantizationConfig& q, std::ostream* os) { *os << q.Describe(); }

inline DeepseekV2Config QuantTestConfig(const QuantizationConfig& quantization) {
  auto config = DeepseekV2Config::FromJson(kQuantTestConfig, "quant test config");
  EXPECT_TRUE(config.ok()) << config.status();
  DeepseekV2Config c = config.ok() ? *config : DeepseekV2Config{};
  c.quantization = quantization;
  return c;
}

// Writes a random checkpoint of `config` into `dir` (one file, so tests can rewrite it) and, into
// `dequantized_dir`, the same model unquantized with the quantized weights as their f32 values.
inline void WriteQuantTestCheckpoint(const DeepseekV2Config& config, const std::string& dir,
                                     const std::string& dequantized_dir) {
  RandomCheckpointOptions options;
  options.seed = 11;
  options.num_shards = 1;
  options.dequantized_dir = dequantized_dir;
  const absl::Status status = WriteRandomDeepseekV2Checkpoint(config, dir, options);
  ASSERT_TRUE(status.ok()) << status;
}

// The quantization configs the slice and load tests run: the two hub forms, FP8 with small odd
// blocks (general block sizes; slices cross many), and INT4 of every Linear (lm_head's padded
// vocab rows included).
inline std::vector<std::pair<std::string, QuantizationConfig>> TestQuantizations() {
  QuantizationConfig odd = DeepseekV3Fp8Quantization();
  odd.block_out = 24;
  odd.block_in = 40;
  QuantizationConfig all_int4 = KimiK2ThinkingInt4Quantization();
  all_int4.ignore.clear();
  return {{"fp8_128", DeepseekV3Fp8Quantization()},
          {"fp8_24x40", odd},
          {"int4_k2", KimiK2ThinkingInt4Quantization()},
          {"int4_all", all_int4}};
}

}  // namespace eagle3
