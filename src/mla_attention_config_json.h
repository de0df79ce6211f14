// Reading an MLA block's keys from a config.json object: the one parser of them the target's config
// and an MLA draft's config share (their files write the same keys with the same meaning).
// Private: only .cc files include it.
#pragma once

#include "absl/status/status.h"
#include "eagle3/mla_attention_config.h"
#include "json_fields.h"

namespace eagle3 {

// q_lora_rank (required; null for a plain q_proj), kv_lora_rank, qk_nope_head_dim,
// qk_rope_head_dim (even: rotation works on pairs of dims) and v_head_dim into `mla`; the other
// fields are left as they are.
absl::Status ParseMlaKeys(const json_fields::Object& root, MlaAttentionConfig& mla);

// The keys ParseMlaKeys reads, into a config that spells them as fields of its own
// (DeepseekV2Config, MlaDraftConfig).
template <typename Config>
void CopyMlaKeys(const MlaAttentionConfig& mla, Config& config) {
  config.q_lora_rank = mla.q_lora_rank;
  config.kv_lora_rank = mla.kv_lora_rank;
  config.qk_nope_head_dim = mla.qk_nope_head_dim;
  config.qk_rope_head_dim = mla.qk_rope_head_dim;
  config.v_head_dim = mla.v_head_dim;
}

// The keys transformers writes as copies of MLA dims: head_dim (= qk_rope_head_dim) and
// qk_head_dim (= qk_nope_head_dim + qk_rope_head_dim), refused when they disagree with `mla`.
absl::Status CheckMlaCopiedKeys(const json_fields::Object& root, const MlaAttentionConfig& mla);

}  // namespace eagle3
