// The DeepSeek-family targets of the whole-step benchmarks (decode_step_benchmark,
// tp_step_benchmark) and what one step of them must read and compute.
//
// Configs: each model's hub config.json (auto_map and training-only keys left out), whole (split 1:
// the model a TP = N run shards itself) or with the widths one rank of TP = split holds
// (num_attention_heads and num_key_value_heads, intermediate_size, moe_intermediate_size and
// vocab_size divided by split; bos / eos ids, beyond a vocabulary shard, left out at any split):
// decode_step_benchmark loads the rank-shaped model of TP = 8 on one GPU, tp_step_benchmark the
// whole one over N GPUs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "eagle3/deepseek_v2_config.h"
#include "eagle3/draft_tree.h"
#include "eagle3/dtype.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "sparse_checkpoint.h"

namespace eagle3::bench {

// `tmpl` with each "@HEADS@", "@INTER@", "@MOE@", "@VOCAB@" replaced by heads, inter, moe, vocab
// divided by split.
inline std::string ShapedConfig(std::string tmpl, int split, int64_t heads, int64_t inter, int64_t moe,
                                int64_t vocab) {
  auto put = [&](const std::string& key, int64_t value) {
    for (size_t at = tmpl.find(key); at != std::string::npos; at = tmpl.find(key)) {
      tmpl.replace(at, key.size(), std::to_string(value / split));
    }
  };
  put("@HEADS@", heads);
  put("@INTER@", inter);
  put("@MOE@", moe);
  put("@VOCAB@", vocab);
  return tmpl;
}

// DeepSeek-V2 (236B), bf16.
inline std::string V2Config(int split) {
  return ShapedConfig(R"({"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
 "first_k_dense_replace": 1, "hidden_act": "silu",
 "hidden_size": 5120, "intermediate_size": @INTER@, "kv_lora_rank": 512, "max_position_embeddings": 163840,
 "moe_intermediate_size": @MOE@, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 160,
 "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": @HEADS@, "num_experts_per_tok": 6,
 "num_hidden_layers": 60, "num_key_value_heads": @HEADS@, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
 "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1,
 "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
 "type": "yarn"}, "rope_theta": 10000, "routed_scaling_factor": 16.0, "scoring_func": "softmax",
 "tie_word_embeddings": false, "topk_group": 3, "topk_method": "group_limited_greedy", "v_head_dim": 128,
 "vocab_size": @VOCAB@})",
                      split, 128, 12288, 1536, 102400);
}

// DeepSeek-V3 in its published FP8 form (quantization_config as published).
inline std::string V3Fp8Config(int split) {
  return ShapedConfig(R"({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
 "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": @INTER@,
 "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": @MOE@, "moe_layer_freq": 1,
 "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
 "num_attention_heads": @HEADS@, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": @HEADS@,
 "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
 "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
 "original_max_position_embeddings": 4096, "type": "yarn"}, "rope_theta": 10000,
 "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": false, "topk_group": 4,
 "topk_method": "noaux_tc", "v_head_dim": 128, "vocab_size": @VOCAB@,
 "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
 "weight_block_size": [128, 128]}})",
                      split, 128, 18432, 2048, 129280);
}

// Kimi-K2-Thinking's language model (K2.5 shares it) in its published INT4 form (compressed-tensors
// quantization_config as published: routed experts only).
inline std::string K2Int4Config(int split) {
  return ShapedConfig(R"({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
 "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": @INTER@,
 "kv_lora_rank": 512, "max_position_embeddings": 262144, "moe_intermediate_size": @MOE@, "moe_layer_freq": 1,
 "n_group": 1, "n_routed_experts": 384, "n_shared_experts": 1, "norm_topk_prob": true,
 "num_attention_heads": @HEADS@, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": @HEADS@,
 "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
 "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
 "original_max_position_embeddings": 4096, "type": "yarn"}, "rope_theta": 50000.0,
 "routed_scaling_factor": 2.827, "scoring_func": "sigmoid", "tie_word_embeddings": false, "topk_group": 1,
 "topk_method": "noaux_tc", "v_head_dim": 128, "vocab_size": @VOCAB@,
 "quantization_config": {"config_groups": {"group_0": {"input_activations": null, "output_activations": null,
 "targets": ["Linear"], "weights": {"actorder": null, "block_structure": null, "dynamic": false,
 "group_size": 32, "num_bits": 4, "observer": "minmax", "observer_kwargs": {}, "strategy": "group",
 "symmetric": true, "type": "int"}}}, "format": "pack-quantized", "ignore": ["lm_head",
 "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
 "kv_cache_scheme": null, "quant_method": "compressed-tensors", "quantization_status": "compressed"}})",
                      split, 64, 18432, 2048, 163840);
}

// The models, by the id both benchmarks use: 0 DeepSeek-V2-Lite (whole at any split: the one-GPU
// benchmark runs it at TP 1), 1 DeepSeek-V2, 2 DeepSeek-V3 FP8, 3 Kimi-K2 INT4.
inline constexpr int kStepModels = 4;
inline std::string StepModelConfig(int model, int split) {
  switch (model) {
    case 0:
      return kV2LiteConfig;
    case 1:
      return V2Config(split);
    case 2:
      return V3Fp8Config(split);
    default:
      return K2Int4Config(split);
  }
}
// The models whose weights stay quantized in GPU memory (and whose caches are bf16) to fit.
inline bool StepModelQuantized(int model) { return model >= 2; }

// The step shapes both benchmarks share: pages of 64 tokens, up to 32 sequences, 4-ary draft trees.
inline constexpr int64_t kStepPageSize = 64;
inline constexpr int64_t kStepMaxBatch = 32;
inline constexpr int kStepTreeArity = 4;

// Bytes per weight element streamed from memory for a Linear stored in `format`: FP8 one byte plus
// its 128 x 128 block's f32 scale share; INT4 half a byte plus a bf16 scale per group of 32.
inline double QuantBytes(const QuantizationConfig& q, double dense) {
  switch (q.format) {
    case WeightFormat::kFp8Block:
      return 1.0 + 4.0 / static_cast<double>(q.block_out * q.block_in);
    case WeightFormat::kInt4Group:
      return 0.5 + 2.0 / static_cast<double>(q.group_size);
    default:
      return dense;
  }
}

inline double ElementBytes(DType t) { return t == DType::kBF16 || t == DType::kF16 ? 2.0 : 4.0; }

// Bytes per element a loaded model streams: its storage dtype's, the latent cache's, and per
// element of the attention projections, the dense and shared MLPs and the routed experts (the
// storage dtype's, or the quantized size where the checkpoint stores them quantized).
struct StepElementBytes {
  double weight = 2, cache = 4;
  double attention = 2, mlp = 2, expert = 2;
};

// The element sizes of a model of `config` stored in `weight_dtype` with a `cache_dtype` cache: FP8
// quantizes every Linear but lm_head; the INT4 form only the routed experts (its ignore list).
inline StepElementBytes ElementBytesOf(const DeepseekV2Config& config, DType weight_dtype, DType cache_dtype) {
  StepElementBytes b;
  b.weight = ElementBytes(weight_dtype);
  b.cache = ElementBytes(cache_dtype);
  const QuantizationConfig& q = config.quantization;
  b.expert = QuantBytes(q, b.weight);
  b.attention = b.mlp = q.format == WeightFormat::kFp8Block ? b.expert : b.weight;
  return b;
}

// What one target step over `tokens_per_seq` new tokens in each of `batch` sequences (after
// `context` cached tokens) must read and compute on a model (or one rank's share: the rank-shaped
// config) of `c`. Bytes: the attention weights of every layer, the dense MLP, per MoE layer the
// router (bf16 with bf16 weights, as FeedForwardBlock keeps a bf16 checkpoint's router; f32 with f32
// weights), the shared experts and the routed experts touched (estimated as E (1 - (1 -
// k/E)^tokens), the expected count under uniform routing), lm_head, the latent KV rows. Flops: 2 per
// weight per token (its own experts: k + shared), plus the attention's q·k and p·v.
struct StepCost {
  double bytes = 0;
  double flops = 0;
};
inline StepCost StepCostOf(const DeepseekV2Config& c, const StepElementBytes& e, int64_t batch,
                           int64_t tokens_per_seq, int64_t context) {
  const double h = static_cast<double>(c.hidden_size);
  const double heads = static_cast<double>(c.num_attention_heads);
  const double q_rank = static_cast<double>(c.q_lora_rank.value_or(0));
  const double q_heads = heads * c.qk_head_dim();
  const double q = c.q_lora_rank.has_value() ? h * q_rank + q_rank * q_heads : h * q_heads;
  const double attention = q + h * c.latent_cache_width() +
                           static_cast<double>(c.kv_lora_rank) * heads * (c.qk_nope_head_dim + c.v_head_dim) +
                           heads * c.v_head_dim * h;
  const double expert = 3.0 * h * static_cast<double>(c.moe_intermediate_size);
  const double experts = static_cast<double>(*c.n_routed_experts);
  const double tokens = static_cast<double>(batch * tokens_per_seq);
  const double touched = experts * (1.0 - std::pow(1.0 - c.num_experts_per_tok / experts, tokens));
  const double dense = 3.0 * h * static_cast<double>(c.intermediate_size);
  const int64_t layers = c.num_hidden_layers;
  const int64_t dense_layers = std::min<int64_t>(c.first_k_dense_replace, layers);
  const int64_t moe_layers = layers - dense_layers;
  const double lm_head = static_cast<double>(c.vocab_size) * h;
  // kv_b stays dense (W_UK / W_UV are its per-head slices) in every form.
  const double kv_b = static_cast<double>(c.kv_lora_rank) * heads * (c.qk_nope_head_dim + c.v_head_dim);
  const double streamed = layers * (e.attention * (attention - kv_b) + e.weight * kv_b) +
                          e.mlp * (dense_layers * dense + moe_layers * c.n_shared_experts * expert) +
                          e.expert * moe_layers * touched * expert + e.weight * lm_head;
  const double router = moe_layers * h * experts;
  const double router_bytes = e.weight == 2 ? 2.0 : 4.0;
  const double kv_rows = static_cast<double>(batch) * (context + tokens_per_seq) * layers;
  StepCost cost;
  cost.bytes = streamed + router_bytes * router + e.cache * kv_rows * c.latent_cache_width();
  const double per_token = 2.0 * (layers * attention + dense_layers * dense + lm_head +
                                  moe_layers * (c.num_experts_per_tok + c.n_shared_experts) * expert + router);
  const double attention_flops = 2.0 * heads * (c.latent_cache_width() + c.kv_lora_rank) * layers *
                                 static_cast<double>(batch) * tokens_per_seq * (context + tokens_per_seq);
  cost.flops = tokens * per_token + attention_flops;
  return cost;
}

// One loaded model (of type T) in memory at a time, the models being large: Get(key, load) returns
// the current one if it has `key`, else frees it first and calls load(); a failed load is remembered
// per key and returned again without a second try.
template <typename T>
class OneLoaded {
 public:
  absl::StatusOr<T*> Get(int key, const std::function<absl::StatusOr<std::unique_ptr<T>>()>& load) {
    if (current_ != nullptr && key_ == key) return current_.get();
    if (const auto it = failed_.find(key); it != failed_.end()) return it->second;
    current_.reset();
    absl::StatusOr<std::unique_ptr<T>> loaded = load();
    if (!loaded.ok()) {
      failed_.emplace(key, loaded.status());
      return loaded.status();
    }
    current_ = std::move(*loaded);
    key_ = key;
    return current_.get();
  }

 private:
  std::unique_ptr<T> current_;
  int key_ = -1;
  std::map<int, absl::Status> failed_;
};

// The inputs of one benchmarked step and the storage their spans point into (moving the struct
// keeps them valid: vectors move their buffers).
struct StepInputs {
  std::vector<int64_t> tokens, positions;
  std::vector<uint8_t> mask;
  std::vector<SequenceInput> inputs;
};

// Decode: each of `batch` sequences (pages[b]) decodes one token at position `context` (the same
// slot each time the step runs).
inline StepInputs DecodeStepInputs(int64_t batch, int64_t context, int64_t vocab,
                                   const std::vector<std::vector<int32_t>>& pages) {
  StepInputs s;
  s.tokens.resize(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    s.tokens[b] = (31 * b + 5) % vocab;
    s.inputs.push_back(SequenceInput{std::span<const int64_t>(&s.tokens[b], 1), {}, pages[b], context, {}, false});
  }
  return s;
}

// Verify: each of `batch` sequences runs a complete `arity`-ary draft tree of n nodes (node i's
// parent is (i - 1) / arity: the shape of an EAGLE-2 tree) after `context` cached tokens, with its
// tree mask and the logits of every node.
inline absl::StatusOr<StepInputs> VerifyStepInputs(int64_t batch, int64_t n, int64_t context, int64_t vocab,
                                                   int arity, const std::vector<std::vector<int32_t>>& pages) {
  StepInputs s;
  s.tokens.resize(static_cast<size_t>(n));
  std::vector<int32_t> parents(static_cast<size_t>(n), -1);
  for (int64_t i = 0; i < n; ++i) {
    s.tokens[i] = (131 * i + 7) % vocab;
    if (i > 0) parents[i] = static_cast<int32_t>((i - 1) / arity);
  }
  EAGLE3_ASSIGN_OR_RETURN(DraftTree tree, DraftTree::FromParents(s.tokens, parents));
  s.positions = tree.Positions(context);
  s.mask = tree.DenseMask();
  for (int64_t b = 0; b < batch; ++b) {
    s.inputs.push_back(SequenceInput{s.tokens, s.positions, pages[b], context, s.mask, true});
  }
  return s;
}

}  // namespace eagle3::bench
