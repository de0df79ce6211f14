// Random-weight EAGLE-3 draft checkpoints for a given target, in SpecForge's layout, for tests, demos
// and benchmarks before a trained draft is at hand.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/dtype.h"
#include "eagle3/rope_config.h"

namespace eagle3 {

struct RandomDraftCheckpointOptions {
  uint64_t seed = 0;
  DType dtype = DType::kBF16;  // of the floating-point weights: f32, f16 or bf16

  // Draft shape. 0 = derived: hidden_size = the target's (required to share its embedding unless
  // write_embed_tokens), head_dim = hidden_size / num_attention_heads, intermediate_size =
  // 2 * hidden_size, draft_vocab_size = half the target vocabulary (rounded up).
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 8;
  int64_t num_key_value_heads = 8;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  int64_t draft_vocab_size = 0;
  int64_t max_position_embeddings = 4096;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;  // written as rope_theta + rope_scaling (with "rope_type", as SpecForge writes it)

  // eagle_aux_hidden_state_layer_ids (output-of-layer ids); empty = the key is left out, so the
  // default taps {2, L/2, L-3} apply (targets with L >= 7).
  std::vector<int> aux_layer_ids;

  // Variant keys, written to config.json when true; their tensors (input_norm.weight,
  // fc_norm.{i}.weight) are written with them.
  bool norm_before_residual = false;
  bool norm_before_fc = false;
  bool fc_norm = false;
  bool norm_output = false;

  // Set: the draft is an MLA EAGLE-3 head (mla_draft_config.h) with these MLA dims instead of the
  // Llama-style one; num_key_value_heads, head_dim and norm_before_fc do not apply, rope must be
  // unscaled.
  struct MlaShape {
    std::optional<int64_t> q_lora_rank = 16;  // unset: a plain q_proj
    int64_t kv_lora_rank = 32;
    int64_t qk_nope_head_dim = 16;
    int64_t qk_rope_head_dim = 8;
    int64_t v_head_dim = 16;
  };
  std::optional<MlaShape> mla;

  std::string layer_prefix = "midlayer.";  // or "layers.0."
  bool write_t2d = true;
  bool write_embed_tokens = false;  // the draft ships its own embedding

  // Each tensor's first kRandomDraftTileValues values drawn as below, then repeated (the same
  // distribution, periodic): a multi-gigabyte head (the SpecForge DeepSeek-V3 one: 2.9 GB in bf16)
  // is written in seconds instead of a minute of drawing every value, for benchmarks, whose timing
  // does not depend on the values. Off: every value drawn.
  bool tiled_values = false;

  // Multiplies the final norm's weights (`norm.weight`), so the draft's logits scale by it: above 1
  // its distributions are peaked like a confident trained draft's, and the trees it builds are deep
  // chains with low-scored siblings (benchmarks of tree shapes), instead of the flat fans of a head
  // with random weights.
  double final_norm_scale = 1.0;
};

inline constexpr int64_t kRandomDraftTileValues = int64_t{1} << 16;

// Writes `config.json` (architectures ["LlamaForCausalLMEagle3"], model_type "llama", vocab_size and
// target_hidden_size from `target`, draft_vocab_size, the variant keys, eagle_config with the aux
// layer ids) and `model.safetensors` into `dir` (created if needed): the tensors of
// Eagle3DraftWeights (see draft_model.h) — linear weights ~ N(0, 1/in_features), norm weights
// 1 + N(0, 0.1²), embedding N(0, 1) — plus `d2t` (i64 offsets of a random sorted subset of
// draft_vocab_size target ids) and `t2d` (bool [vocab], true exactly on that subset). Values depend
// only on the seed and each tensor's name. With options.mla the head is an MLA EAGLE-3 draft:
// architectures ["Eagle3DeepseekV2ForCausalLM"], model_type "kimi_k2", its MLA dims, and the tensors
// of MlaDraftWeights (mla_draft_weights.h) in place of Eagle3DraftWeights.
absl::Status WriteRandomEagle3DraftCheckpoint(const DeepseekV2Config& target, const std::string& dir,
                                              const RandomDraftCheckpointOptions& options = {});

}  // namespace eagle3
