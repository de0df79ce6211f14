// Configuration of an MLA-architecture EAGLE-3 draft head (one DeepSeek-V3 decoder layer with MLA
// attention and a dense SiLU MLP over the fused taps; the Kimi-K2.5 / K2.6 drafts) read from its
// `config.json`, in the forms TorchSpec and NVIDIA ModelOpt write and vLLM and SGLang read
// (sources and the full format: docs/mla_drafts.md).
//
// Accepted architectures: `Eagle3DeepseekV2ForCausalLM` (TorchSpec, SGLang, vLLM, ModelOpt) and
// `Eagle3DeepseekV3ForCausalLM` (vLLM's alias for the same model). A Llama-style head is refused
// with a pointer to Eagle3DraftConfig. model_type must be one of deepseek_v2, deepseek_v3, kimi_k2:
// the engines choose the MLA path by it.
//
// Parsing is strict like DeepseekV2Config: every key is read, known to be inert, or refused.
// Known-inert keys: bookkeeping (dtype, versions, `_torchspec_version`), the generic attributes
// transformers 4 serialises (pretrained_config_keys.h), and the target's MoE / MTP keys that
// ModelOpt's Kimi-K2 template copies into the draft's config (n_routed_experts,
// first_k_dense_replace, num_nextn_predict_layers, ...): every engine builds the draft layer with a
// dense MLP whatever they say.
//
// Defaults: target_hidden_size = hidden_size, draft_vocab_size = vocab_size, num_key_value_heads =
// num_attention_heads (recorded only: MLA has one latent KV), rope theta 10000, hidden_act silu,
// tie_word_embeddings false, variant flags false. q_lora_rank is required (null = plain q_proj):
// vLLM and TorchSpec build q_proj when it is null, SGLang refuses that form, and DeepseekV2Config
// requires the key for the same reason.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/export.h"
#include "eagle3/mla_attention_config.h"
#include "eagle3/rope_config.h"

namespace eagle3 {

struct EAGLE3_API MlaDraftConfig {
  std::string architecture;  // as written in `architectures`
  DeepseekModelType model_type = DeepseekModelType::kKimiK2;

  int64_t hidden_size = 0;         // H, the draft's residual width
  int64_t target_hidden_size = 0;  // Ht, width of each captured target hidden state
  int64_t intermediate_size = 0;   // the dense MLP
  int64_t vocab_size = 0;          // target vocabulary (embedding rows)
  int64_t draft_vocab_size = 0;    // lm_head rows; d2t maps them to target ids
  // Whether the file states draft_vocab_size. Engines differ when it does not: SGLang then runs the
  // target's lm_head, vLLM the draft's lm_head.weight (docs/mla_drafts.md, open questions).
  bool draft_vocab_size_stated = false;

  // MLA (as in DeepseekV2Config).
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;     // recorded only
  std::optional<int64_t> q_lora_rank;  // unset: a plain q_proj over the 2H input
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  double rms_norm_eps = 0.0;
  int64_t max_position_embeddings = 0;
  RopeConfig rope;  // the draft's own RoPE (adjacent pairs on the rope dims), YaRN included
  int64_t num_hidden_layers = 1;  // only 1 is supported, as in every engine
  bool tie_word_embeddings = false;

  // Target layers whose outputs feed `fc`, in concatenation order, from
  // `eagle_config.eagle_aux_hidden_state_layer_ids` or the top-level key of the same name, as
  // written: the file does not say which layer-id convention they use (TorchSpec's vLLM export adds
  // 1 to the ids of kimi_k2 drafts; docs/mla_drafts.md), so the loader takes it explicitly.
  std::optional<std::vector<int>> aux_layer_ids;
  // `num_aux_hidden_states` (vLLM reads it before the ids): equal to the number of ids when both
  // are given.
  std::optional<int64_t> num_aux_hidden_states;

  // Variant keys (top level or inside eagle_config; false when absent), as for Eagle3DraftConfig:
  // residual of the layer is hidden_norm(g) instead of g (vLLM honours it; SGLang's MLA draft does
  // not read it).
  bool norm_before_residual = false;
  // one RMSNorm per aux state [T, Ht] before concatenation (EAGLE 3.1; SGLang's older spelling
  // `use_aux_norm` is read too and must agree).
  bool fc_norm = false;
  // the hidden fed back to the next draft step is norm(r) instead of r (EAGLE 3.1).
  bool norm_output = false;

  std::string source;  // where the config was read from, for messages

  static absl::StatusOr<MlaDraftConfig> FromJson(std::string_view json_text,
                                                 std::string_view source);
  // `path`: a config.json file or a directory containing one.
  static absl::StatusOr<MlaDraftConfig> FromFile(const std::string& path);

  // Number of captured target hidden states concatenated into fc's input: the ids' count, else
  // num_aux_hidden_states, else 3.
  int64_t num_aux_layers() const;
  // Width of fc's input: num_aux_layers() * target_hidden_size.
  int64_t fc_input_width() const { return num_aux_layers() * target_hidden_size; }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // One row of the draft's latent KV cache: kv_lora_rank + qk_rope_head_dim.
  int64_t latent_cache_width() const { return kv_lora_rank + qk_rope_head_dim; }
  // The draft layer's attention: input 2H ([input_layernorm(embed) | hidden_norm(hidden)],
  // embeddings first), output H.
  MlaAttentionConfig attention() const;
  // Checks that tensor parallelism over `tp_size` ranks (1..64) splits the heads and the MLP's
  // intermediate size evenly (the embedding and lm_head are padded, fc and the norms replicated).
  absl::Status ValidateForTp(int tp_size) const;
};

// Whether the config.json at `path` (the file or a directory holding one) names an MLA EAGLE-3
// architecture (Eagle3DeepseekV2ForCausalLM or Eagle3DeepseekV3ForCausalLM) as its one
// `architectures` entry: how the tools choose MlaDraftConfig over Eagle3DraftConfig. False for any
// other or a missing `architectures` (the chosen parser then names what is wrong); an error only
// when the file cannot be read or is not a JSON object.
EAGLE3_API absl::StatusOr<bool> NamesMlaDraftArchitecture(const std::string& path);

// Checks an MLA draft against the target it will run with, as for a Llama-style head:
// target_hidden_size equals the target's hidden_size, vocab sizes match, every aux layer id is in
// [0, L-1] (output-of-layer convention), and without ids the default three taps match
// num_aux_layers().
EAGLE3_API absl::Status CheckDraftAgainstTarget(const MlaDraftConfig& draft,
                                                const DeepseekV2Config& target);

}  // namespace eagle3
