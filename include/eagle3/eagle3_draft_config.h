// Configuration of an EAGLE-3 draft head (one Llama-style decoder layer) read from its
// `config.json`, as SpecForge, SGLang and vLLM write and read it.
//
// Accepted architectures: `LlamaForCausalLMEagle3` (SpecForge, SGLang) and `Eagle3LlamaForCausalLM`
// (vLLM's alias for the same model). EAGLE-1/2 heads and the `speculators` format are refused.
// Parsing is strict like DeepseekV2Config: unknown keys are refused, never ignored.
//
// Defaults (Llama's, as the engines apply them): target_hidden_size = hidden_size,
// draft_vocab_size = vocab_size, num_key_value_heads = num_attention_heads,
// head_dim = hidden_size / num_attention_heads, rope theta 10000, hidden_act silu,
// tie_word_embeddings false, variant flags false.
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
#include "eagle3/rope_config.h"

namespace eagle3 {

struct EAGLE3_API Eagle3DraftConfig {
  std::string architecture;  // as written in `architectures`
  std::string model_type;    // recorded only ("llama" usually; SpecForge's Kimi draft says kimi_k2)

  int64_t hidden_size = 0;         // H, the draft's width
  int64_t target_hidden_size = 0;  // Ht, width of each captured target hidden state
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;        // target vocabulary (embedding rows)
  int64_t draft_vocab_size = 0;  // lm_head rows; d2t maps them to target ids
  double rms_norm_eps = 0.0;
  int64_t max_position_embeddings = 0;
  RopeConfig rope;                // the draft's own RoPE (NeoX rotate-half), scaling included
  int64_t num_hidden_layers = 1;  // only 1 is supported
  bool tie_word_embeddings = false;

  // Target layers whose outputs feed `fc`, in concatenation order, from
  // `eagle_config.eagle_aux_hidden_state_layer_ids` or the top-level key of the same name.
  // Convention: id k = the output of target layer k (boundary k + 1), as SpecForge trains and
  // SGLang reads them. Unset: the tap's default boundaries apply. Range-checked against the target
  // by CheckDraftAgainstTarget.
  std::optional<std::vector<int>> aux_layer_ids;

  // Variant keys (top level or inside `eagle_config`; false when absent):
  // residual of the decoder layer is hidden_norm(g) instead of g.
  bool norm_before_residual = false;
  // one RMSNorm over the concatenated aux states [T, k*Ht] before fc.
  bool norm_before_fc = false;
  // a separate RMSNorm on each aux state [T, Ht] before concatenation (EAGLE 3.1).
  bool fc_norm = false;
  // the hidden fed back to the next draft step is norm(r) instead of the un-normalized r.
  bool norm_output = false;

  std::string source;  // where the config was read from, for messages

  static absl::StatusOr<Eagle3DraftConfig> FromJson(std::string_view json_text,
                                                    std::string_view source);
  // `path`: a config.json file or a directory containing one.
  static absl::StatusOr<Eagle3DraftConfig> FromFile(const std::string& path);

  // Number of captured target hidden states concatenated into fc's input (3 when unset).
  int64_t num_aux_layers() const {
    return aux_layer_ids.has_value() ? static_cast<int64_t>(aux_layer_ids->size()) : 3;
  }
  // Width of fc's input: num_aux_layers() * target_hidden_size.
  int64_t fc_input_width() const { return num_aux_layers() * target_hidden_size; }
};

// Checks a draft against the target it will run with: target_hidden_size equals the target's
// hidden_size, vocab sizes match, and every aux layer id is in [0, L-1] (output-of-layer
// convention).
EAGLE3_API absl::Status CheckDraftAgainstTarget(const Eagle3DraftConfig& draft,
                                                const DeepseekV2Config& target);

}  // namespace eagle3
