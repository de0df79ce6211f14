// Configuration of a DeepSeek-V2-family target (DeepSeek-V2, V2-Lite, V3, Kimi-K2) read from its
// Hugging Face `config.json`, in the hub form or the form transformers 5 saves.
//
// Kimi-K2.5 (`model_type` "kimi_k25", a multimodal wrapper) is read for its text backbone only: the
// language model's config is its `text_config` (a DeepSeek-V3 config, read exactly as a top-level
// one is, plus the generic attributes transformers 4 writes into nested configs), the
// `quantization_config` may sit in text_config and/or at the top level (equal when both), and
// `vision_config` is accepted unread: it configures the vision tower and projector, which eagle3
// does not run. Its checkpoint stores the language model under `language_model.` (tensor_prefix).
// Kimi-K2.6 ships in the same wrapper and format (LMDeploy's kimi_k25 config builder serves K2.5
// and K2.6 alike, copying a top-level-only quantization_config into text_config, which this reader
// accepts too); K2.6's own config.json has not been checked against this reader.
//
// Parsing is strict: every key is either understood, known to be harmless (architectures, dtype,
// initializer_range, ...), or refused. A key outside the allowlist fails with InvalidArgument
// naming it, because a silently ignored key can change the model's math. `quantization_config` is
// read in its two published forms, FP8 block-scaled and compressed-tensors INT4 (see
// quantization_config.h); other methods are refused with Unimplemented.
//
// Defaults, where a key may be absent:
//  - universal: num_key_value_heads = num_attention_heads, hidden_act = silu, attention_bias =
//  false,
//    tie_word_embeddings = false, moe_layer_freq = 1, num_nextn_predict_layers = 0, rope theta
//    10000;
//  - by model type (transformers' in-tree classes carry no such key): deepseek_v2 routes with
//    softmax + greedy, deepseek_v3 / kimi_k2 with sigmoid + noaux_tc;
//  - n_group / topk_group default to 1 (null allowed) for greedy routing and are required
//  otherwise.
// Keys whose defaults differ between DeepSeek's reference code and transformers are required:
// q_lora_rank (null = plain q_proj), n_routed_experts (null = dense model) and, for MoE models,
// moe_intermediate_size, num_experts_per_tok, n_shared_experts (null = 0), routed_scaling_factor,
// norm_topk_prob and first_k_dense_replace.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/export.h"
#include "eagle3/quantization_config.h"
#include "eagle3/rope_config.h"

namespace eagle3 {

enum class DeepseekModelType { kDeepseekV2, kDeepseekV3, kKimiK2 };

// Kimi-K2.5's multimodal config.json: its model_type, and the prefix its checkpoint puts before the
// language model's tensors ("language_model.model.layers.0...", "language_model.lm_head.weight").
inline constexpr std::string_view kKimiK25ModelType = "kimi_k25";
inline constexpr std::string_view kKimiK25TensorPrefix = "language_model.";
// Router score function. softmax pairs with greedy / group_limited_greedy, sigmoid with noaux_tc:
// DeepSeek's reference gates implement only those pairings, so the others are refused.
enum class ScoringFunc { kSoftmax, kSigmoid };
// Expert selection. kGroupLimitedGreedy: keep the topk_group groups with the highest max score.
// kNoauxTc: sigmoid scores plus e_score_correction_bias for selection only; group score = sum of
// the group's top-2 biased scores.
enum class TopkMethod { kGreedy, kGroupLimitedGreedy, kNoauxTc };

// The config.json spellings: "deepseek_v2", "sigmoid", "group_limited_greedy", ...
EAGLE3_API std::string_view DeepseekModelTypeName(DeepseekModelType type);
// The model type a config.json `model_type` spells; unset for any other name.
EAGLE3_API std::optional<DeepseekModelType> DeepseekModelTypeFromName(std::string_view name);
EAGLE3_API std::string_view ScoringFuncName(ScoringFunc func);
EAGLE3_API std::string_view TopkMethodName(TopkMethod method);

struct EAGLE3_API DeepseekV2Config {
  DeepseekModelType model_type = DeepseekModelType::kDeepseekV2;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // dense MLP layers
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // recorded only: MLA has one latent KV for all heads

  // MoE. n_routed_experts unset means a dense model: every layer uses the dense MLP.
  std::optional<int64_t> n_routed_experts;
  int64_t moe_intermediate_size = 0;  // per expert; shared experts use n_shared_experts times it
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  double routed_scaling_factor = 1.0;
  ScoringFunc scoring_func = ScoringFunc::kSoftmax;
  TopkMethod topk_method = TopkMethod::kGreedy;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = false;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;

  // MLA. q_lora_rank unset: q comes from a plain q_proj instead of q_a_proj -> norm -> q_b_proj.
  std::optional<int64_t> q_lora_rank;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  double rms_norm_eps = 0.0;
  int64_t max_position_embeddings = 0;
  RopeConfig rope;  // applied to the rope dims only, adjacent pairs (GPT-J style)
  bool tie_word_embeddings = false;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;    // `eos_token_id` may be an integer or a list
  int64_t num_nextn_predict_layers = 0;  // V3 MTP layers stored after the main layers (mtp_config.h)

  // How the Linear weights are stored (kUnquantized without quantization_config). The weight schema
  // (quantized_weights.h) derives each tensor's stored form from it.
  QuantizationConfig quantization;

  // Prefix of every language-model tensor name in the checkpoint: "" for the text-model form,
  // kKimiK25TensorPrefix for Kimi-K2.5's multimodal form, whose checkpoint also holds vision tensors
  // (skipped deliberately, see CheckNoUnknownTensors). The weight schema (DeepseekV2Weights) applies
  // it to every name it lists.
  std::string tensor_prefix;

  // Where the config was read from; used in messages of later checks.
  std::string source;

  // Parses config.json text. `source` names it in error messages (e.g. the file path).
  static absl::StatusOr<DeepseekV2Config> FromJson(std::string_view json_text,
                                                   std::string_view source);
  // Reads `path`: a config.json file or a model directory containing one.
  static absl::StatusOr<DeepseekV2Config> FromFile(const std::string& path);

  // qk_nope_head_dim + qk_rope_head_dim (192 for the real models).
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Width of one decode-time latent cache row: kv_lora_rank + qk_rope_head_dim (576 for the real
  // models).
  int64_t latent_cache_width() const { return kv_lora_rank + qk_rope_head_dim; }
  bool is_moe() const { return n_routed_experts.has_value(); }

  // Whether decoder layer `layer` (0-based) uses the MoE block rather than the dense MLP. As in
  // DeepSeek's reference code, SGLang and vLLM: n_routed_experts set, layer >=
  // first_k_dense_replace and layer % moe_layer_freq == 0. The MTP layers (indices
  // num_hidden_layers .. num_hidden_layers + num_nextn_predict_layers - 1) follow the same rule by
  // their checkpoint index, as vLLM builds them (SGLang and TensorRT-LLM make them MoE outright,
  // which agrees for every V3-family checkpoint). False for layers outside that range.
  bool IsMoeLayer(int64_t layer) const;

  // Attention softmax scale: qk_head_dim^-0.5 * m^2, m = YarnGetMscale(factor, mscale_all_dim) for
  // YaRN scaling (m = 1 otherwise or when mscale_all_dim is unset), as DeepSeek's reference
  // DeepseekV2Attention, SGLang and vLLM compute it. (transformers' in-tree DeepseekV2Attention
  // omits m^2; DeepseekV3Attention has it.)
  double SoftmaxScale() const;

  // Checks that tensor parallelism over `tp_size` ranks (1..64) splits the heads, the dense MLP and
  // the experts' intermediate dim evenly.
  absl::Status ValidateForTp(int tp_size) const;
};

}  // namespace eagle3
