// The tensors of one MLA attention block (MlaAttentionConfig): the one description the target's
// decoder layers, DeepSeek-V3's MTP layer and an MLA EAGLE-3 draft layer all take their attention
// tensors from, so their names, shapes and tensor-parallel splits cannot drift apart.
#pragma once

#include <string_view>
#include <vector>

#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/export.h"
#include "eagle3/mla_attention_config.h"

namespace eagle3 {

// Under `prefix` ("model.layers.3.self_attn.", "layers.0.self_attn.", "midlayer.self_attn."), with
// I = attention.input_width (H for a target or MTP layer, 2H for an EAGLE-3 draft layer), in the order
// the loaders take them:
//   q_a_proj.weight [q_lora_rank, I] replicated, q_a_layernorm.weight [q_lora_rank] replicated,
//   q_b_proj.weight [heads * (nope + rope), q_lora_rank] rows (by heads)
//     or, when q_lora_rank is unset, q_proj.weight [heads * (nope + rope), I] rows (by heads);
//   kv_a_proj_with_mqa.weight [kv_lora_rank + rope, I] replicated (the latent row every rank caches),
//   kv_a_layernorm.weight [kv_lora_rank] replicated,
//   kv_b_proj.weight [heads * (nope + v), kv_lora_rank] rows (by heads),
//   o_proj.weight [output_width, heads * v] columns (row-parallel: each rank's heads, summed after).
// Splitting only by heads is what lets every rank hold whole heads (ValidateForTp checks heads % tp).
EAGLE3_API std::vector<WeightSpec> MlaAttentionWeights(const MlaAttentionConfig& attention,
                                                       std::string_view prefix);

}  // namespace eagle3
