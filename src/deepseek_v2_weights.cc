#include "eagle3/deepseek_v2_weights.h"

#include <string>

namespace eagle3 {
namespace {

class WeightList {
 public:
  void Add(std::string name, Shape shape, TpSplit split, bool vocab_padded = false) {
    specs_.push_back(WeightSpec{std::move(name), shape, split, vocab_padded});
  }
  // gate_proj / up_proj column-parallel, down_proj row-parallel: one SiLU MLP of width `inter`.
  void AddMlp(const std::string& prefix, int64_t hidden, int64_t inter) {
    Add(prefix + "gate_proj.weight", Shape{inter, hidden}, TpSplit::kRows);
    Add(prefix + "up_proj.weight", Shape{inter, hidden}, TpSplit::kRows);
    Add(prefix + "down_proj.weight", Shape{hidden, inter}, TpSplit::kColumns);
  }
  std::vector<WeightSpec> Take() { return std::move(specs_); }

 private:
  std::vector<WeightSpec> specs_;
};

}  // namespace

ShardSpec WeightSpec::ForRank(int tp_size, int rank) const {
  ShardSpec spec;
  if (split == TpSplit::kReplicated) return spec;  // tp_size 1, rank 0: the whole tensor
  spec.dim = split == TpSplit::kRows ? 0 : 1;
  spec.tp_size = tp_size;
  spec.rank = rank;
  spec.pad_to_multiple = vocab_padded ? kVocabPadPerRank * tp_size : 1;
  return spec;
}

std::vector<WeightSpec> DeepseekV2Weights(const DeepseekV2Config& c) {
  const int64_t h = c.hidden_size;
  const int64_t heads = c.num_attention_heads;
  WeightList w;
  w.Add("model.embed_tokens.weight", Shape{c.vocab_size, h}, TpSplit::kRows, /*vocab_padded=*/true);
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    w.Add(p + "input_layernorm.weight", Shape{h}, TpSplit::kReplicated);
    w.Add(p + "post_attention_layernorm.weight", Shape{h}, TpSplit::kReplicated);

    const std::string a = p + "self_attn.";
    if (c.q_lora_rank.has_value()) {
      w.Add(a + "q_a_proj.weight", Shape{*c.q_lora_rank, h}, TpSplit::kReplicated);
      w.Add(a + "q_a_layernorm.weight", Shape{*c.q_lora_rank}, TpSplit::kReplicated);
      w.Add(a + "q_b_proj.weight", Shape{heads * c.qk_head_dim(), *c.q_lora_rank}, TpSplit::kRows);
    } else {
      w.Add(a + "q_proj.weight", Shape{heads * c.qk_head_dim(), h}, TpSplit::kRows);
    }
    w.Add(a + "kv_a_proj_with_mqa.weight", Shape{c.kv_lora_rank + c.qk_rope_head_dim, h},
          TpSplit::kReplicated);
    w.Add(a + "kv_a_layernorm.weight", Shape{c.kv_lora_rank}, TpSplit::kReplicated);
    w.Add(a + "kv_b_proj.weight", Shape{heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank},
          TpSplit::kRows);
    w.Add(a + "o_proj.weight", Shape{h, heads * c.v_head_dim}, TpSplit::kColumns);

    const std::string m = p + "mlp.";
    if (!c.IsMoeLayer(layer)) {
      w.AddMlp(m, h, c.intermediate_size);
      continue;
    }
    const int64_t experts = *c.n_routed_experts;
    w.Add(m + "gate.weight", Shape{experts, h}, TpSplit::kReplicated);
    if (c.topk_method == TopkMethod::kNoauxTc) {
      w.Add(m + "gate.e_score_correction_bias", Shape{experts}, TpSplit::kReplicated);
    }
    for (int64_t e = 0; e < experts; ++e) {
      w.AddMlp(m + "experts." + std::to_string(e) + ".", h, c.moe_intermediate_size);
    }
    if (c.n_shared_experts > 0) {
      w.AddMlp(m + "shared_experts.", h, c.moe_intermediate_size * c.n_shared_experts);
    }
  }
  w.Add("model.norm.weight", Shape{h}, TpSplit::kReplicated);
  if (!c.tie_word_embeddings) {
    w.Add("lm_head.weight", Shape{c.vocab_size, h}, TpSplit::kRows, /*vocab_padded=*/true);
  }
  return w.Take();
}

}  // namespace eagle3
