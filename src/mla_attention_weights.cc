#include "eagle3/mla_attention_weights.h"

#include <string>

namespace eagle3 {

std::vector<WeightSpec> MlaAttentionWeights(const MlaAttentionConfig& a, std::string_view prefix) {
  const std::string p(prefix);
  const int64_t in = a.input_width;
  const int64_t heads = a.num_heads;
  std::vector<WeightSpec> specs;
  auto add = [&](const char* name, Shape shape, TpSplit split) {
    specs.push_back(WeightSpec{p + name, shape, split, /*vocab_padded=*/false});
  };
  if (a.q_lora_rank.has_value()) {
    add("q_a_proj.weight", Shape{*a.q_lora_rank, in}, TpSplit::kReplicated);
    add("q_a_layernorm.weight", Shape{*a.q_lora_rank}, TpSplit::kReplicated);
    add("q_b_proj.weight", Shape{heads * a.qk_head_dim(), *a.q_lora_rank}, TpSplit::kRows);
  } else {
    add("q_proj.weight", Shape{heads * a.qk_head_dim(), in}, TpSplit::kRows);
  }
  add("kv_a_proj_with_mqa.weight", Shape{a.latent_cache_width(), in}, TpSplit::kReplicated);
  add("kv_a_layernorm.weight", Shape{a.kv_lora_rank}, TpSplit::kReplicated);
  add("kv_b_proj.weight", Shape{heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank},
      TpSplit::kRows);
  add("o_proj.weight", Shape{a.output_width, heads * a.v_head_dim}, TpSplit::kColumns);
  return specs;
}

}  // namespace eagle3
