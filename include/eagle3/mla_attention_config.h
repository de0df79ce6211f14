// MlaAttentionConfig: the shapes and constants of one multi-head latent attention (MLA) block, the
// one description the target's decoder layers, DeepSeek-V3's MTP layer and an MLA EAGLE-3 draft
// layer all reduce to (docs/mla_drafts.md). The three differ only in what they feed the block: a
// target or MTP layer projects its H-wide normalized residual, an EAGLE-3 draft layer the 2H-wide
// [input_layernorm(embed) | hidden_norm(hidden)] row; input_width says which.
//
// The math the description parameterizes (DeepSeek-V2's MLA, docs/semantics.md):
//   q      = q_b(q_a_layernorm(q_a(x)))   or q_proj(x) when q_lora_rank is unset
//            [T, heads * (nope + rope)]
//   c|k_pe = kv_a_proj_with_mqa(x)        [T, kv_lora_rank + rope]: the latent cache row
//   k_nope|v = kv_b(kv_a_layernorm(c))     [T, heads * (nope + v)]
//   RoPE on the rope dims of q and k_pe only, adjacent pairs, with `rope` (YaRN included)
//   softmax scale (nope + rope)^-0.5 * m^2 (SoftmaxScale)
//   out    = o_proj(attention)             [T, output_width]
// Every RMSNorm inside uses rms_norm_eps.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/export.h"
#include "eagle3/rope_config.h"

namespace eagle3 {

struct EAGLE3_API MlaAttentionConfig {
  int64_t input_width = 0;   // columns of x: H (target, MTP) or 2H (EAGLE-3 draft)
  int64_t output_width = 0;  // o_proj's output: the residual width H
  int64_t num_heads = 0;
  std::optional<int64_t> q_lora_rank;  // unset: a plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  double rms_norm_eps = 0.0;
  RopeConfig rope;

  // The attention of every decoder layer of `target` (its MTP layers included): input and output
  // width hidden_size.
  static MlaAttentionConfig ForTarget(const DeepseekV2Config& target);

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Width of one decode-time latent cache row: kv_lora_rank + qk_rope_head_dim.
  int64_t latent_cache_width() const { return kv_lora_rank + qk_rope_head_dim; }
  // qk_head_dim^-0.5 * m^2 (see MlaSoftmaxScale).
  double SoftmaxScale() const;
  // InvalidArgument naming `source` when SoftmaxScale() is not a finite positive number: absurd
  // YaRN magnitudes would otherwise turn every attention into inf/NaN.
  absl::Status ValidateSoftmaxScale(std::string_view source) const;
  // Heads split evenly over `tp_size` ranks (1..64): the one constraint tensor parallelism puts on
  // the block (q_a and kv_a are replicated; q_b / q_proj and kv_b split by heads, o_proj by
  // columns). `source` names the config in the message.
  absl::Status ValidateForTp(int tp_size, std::string_view source) const;

  friend bool operator==(const MlaAttentionConfig&, const MlaAttentionConfig&) = default;
};

// The MLA softmax scale: qk_head_dim^-0.5 * m^2 with m = YarnGetMscale(factor, mscale_all_dim) for
// YaRN scaling and 1 otherwise, as DeepSeek's reference attention, SGLang, vLLM and TensorRT-LLM
// compute it for the target and for MLA drafts alike.
EAGLE3_API double MlaSoftmaxScale(int64_t qk_head_dim, const RopeConfig& rope);

}  // namespace eagle3
