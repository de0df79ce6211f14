// The EAGLE-3 draft checkpoint schema (declared in draft_model.h): the one table the loader and the
// random-checkpoint generator read.
#include <string>
#include <vector>

#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/draft_model.h"

namespace eagle3 {

std::vector<WeightSpec> Eagle3DraftWeights(const Eagle3DraftConfig& c, std::string_view layer_prefix) {
  const int64_t h = c.hidden_size;
  const int64_t q_width = c.num_attention_heads * c.head_dim;
  const int64_t kv_width = c.num_key_value_heads * c.head_dim;
  const std::string p(layer_prefix);
  std::vector<WeightSpec> specs;
  auto add = [&](std::string name, Shape shape, TpSplit split = TpSplit::kReplicated, bool vocab = false) {
    specs.push_back(WeightSpec{std::move(name), shape, split, vocab});
  };
  add("fc.weight", Shape{h, c.fc_input_width()});
  if (c.norm_before_fc) add("input_norm.weight", Shape{c.fc_input_width()});
  if (c.fc_norm) {
    for (int64_t i = 0; i < c.num_aux_layers(); ++i) {
      add("fc_norm." + std::to_string(i) + ".weight", Shape{c.target_hidden_size});
    }
  }
  add(p + "input_layernorm.weight", Shape{h});
  add(p + "hidden_norm.weight", Shape{h});
  // q/k/v read [embedding | hidden], 2H wide.
  add(p + "self_attn.q_proj.weight", Shape{q_width, 2 * h}, TpSplit::kRows);
  add(p + "self_attn.k_proj.weight", Shape{kv_width, 2 * h}, TpSplit::kRows);
  add(p + "self_attn.v_proj.weight", Shape{kv_width, 2 * h}, TpSplit::kRows);
  add(p + "self_attn.o_proj.weight", Shape{h, q_width}, TpSplit::kColumns);
  add(p + "post_attention_layernorm.weight", Shape{h});
  AppendSiluMlpWeights(p + "mlp.", h, c.intermediate_size, specs);
  add("norm.weight", Shape{h});
  if (!c.tie_word_embeddings) add("lm_head.weight", Shape{c.draft_vocab_size, h}, TpSplit::kRows, true);
  return specs;
}

}  // namespace eagle3
