// MtpConfig: the multi-token-prediction (MTP) modules a DeepSeek-V3-family checkpoint carries after
// its decoder layers, as a drafter reads them from the target's config (docs/mla_drafts.md).
//
// `num_nextn_predict_layers` modules are stored under the layer indices that follow the main
// layers: module k is `model.layers.{num_hidden_layers + k}.*` (DeepSeek-V3's README_WEIGHTS.md:
// 61 layers and one module, index 61), each an embedding norm `enorm`, a hidden norm `hnorm`, the
// projection `eh_proj` [H, 2H], one full decoder layer (MLA attention, and the MLP the layer index
// selects: MoE for V3) and `shared_head.norm`; the embedding and the output head are the target's.
// A module reads the target's final hidden state (after model.norm) and the embedding of the next
// token:
//   h' = eh_proj(concat(enorm(embed(token_{p+1})), hnorm(h_p)))       embeddings first, [T, 2H]
//   r  = decoder_layer(h');   logits = lm_head(shared_head.norm(r))
// Engines draft k tokens by running the modules cyclically (ModuleForStep), feeding each step the
// previous step's shared_head.norm(r).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/export.h"

namespace eagle3 {

struct EAGLE3_API MtpConfig {
  int64_t num_modules = 0;  // num_nextn_predict_layers (1 in DeepSeek-V3 / R1)
  int64_t first_layer = 0;  // checkpoint layer index of module 0: num_hidden_layers
  // Per module: whether its decoder layer's MLP is the MoE block (DeepseekV2Config::IsMoeLayer of
  // its layer index; true for V3).
  std::vector<bool> module_is_moe;
  std::string tensor_prefix;  // the target's (DeepseekV2Config::tensor_prefix)
  std::string source;         // the target config's

  // The MTP modules of `target`. InvalidArgument when it has none (num_nextn_predict_layers 0 or
  // absent: DeepSeek-V2, Kimi-K2 / K2.5), naming the file and the key; Unimplemented for a
  // deepseek_v2 model that states some (MTP exists only in the V3 family).
  static absl::StatusOr<MtpConfig> FromTarget(const DeepseekV2Config& target);

  // Checkpoint layer index of module `module` in [0, num_modules).
  int64_t LayerIndex(int64_t module) const { return first_layer + module; }
  // The module draft step `step` >= 0 runs: the modules in turn, cyclically, as vLLM
  // (spec_step_idx % num_nextn_predict_layers) and TensorRT-LLM (layer index modulo the
  // checkpoint's modules) repeat them; with V3's single module every step runs module 0.
  int64_t ModuleForStep(int64_t step) const { return step % num_modules; }
  // "model.layers.<index>." with the target's tensor prefix: the start of every tensor name of
  // module `module` ("model.layers.61.eh_proj.weight",
  // "model.layers.61.self_attn.q_a_proj.weight").
  std::string LayerPrefix(int64_t module) const;
};

}  // namespace eagle3
