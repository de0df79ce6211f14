// Parameters of DeepSeek MoE routing, as the MoeRoute op takes them (docs/semantics.md).
#pragma once

#include "eagle3/deepseek_v2_config.h"

namespace eagle3 {

struct MoeRoutingParams {
  // kSoftmax pairs with kGreedy / kGroupLimitedGreedy (V2), kSigmoid with kNoauxTc (V3, K2).
  ScoringFunc scoring_func = ScoringFunc::kSoftmax;
  TopkMethod topk_method = TopkMethod::kGreedy;
  int top_k = 1;
  int n_group = 1;
  int topk_group = 1;
  // V2: normalize (top_k > 1 and norm_topk_prob) XOR scale by routed_scaling_factor.
  // V3/K2: normalize when norm_topk_prob, then always scale.
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;

  static MoeRoutingParams FromConfig(const DeepseekV2Config& config) {
    MoeRoutingParams p;
    p.scoring_func = config.scoring_func;
    p.topk_method = config.topk_method;
    p.top_k = static_cast<int>(config.num_experts_per_tok);
    p.n_group = static_cast<int>(config.n_group);
    p.topk_group = static_cast<int>(config.topk_group);
    p.norm_topk_prob = config.norm_topk_prob;
    p.routed_scaling_factor = static_cast<float>(config.routed_scaling_factor);
    return p;
  }
};

}  // namespace eagle3
