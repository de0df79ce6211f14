// Feeds arbitrary bytes as an EAGLE-3 draft config.json, then checks accepted drafts against a
// fixed DeepSeek-V3-shaped target. Accepted drafts must have positive widths and, when the check
// passes, only aux ids that name real target layers.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "eagle3/deepseek_v2_config.h"
#include "eagle3/eagle3_draft_config.h"

namespace {

const eagle3::DeepseekV2Config& Target() {
  static const eagle3::DeepseekV2Config* const target = [] {
    constexpr std::string_view kTarget = R"({
      "model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168,
      "intermediate_size": 18432, "num_hidden_layers": 61, "num_attention_heads": 128,
      "n_routed_experts": 256, "moe_intermediate_size": 2048, "n_shared_experts": 1,
      "num_experts_per_tok": 8, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
      "first_k_dense_replace": 3, "n_group": 8, "topk_group": 4, "q_lora_rank": 1536,
      "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
      "rms_norm_eps": 1e-06, "max_position_embeddings": 163840, "rope_theta": 10000})";
    auto parsed = eagle3::DeepseekV2Config::FromJson(kTarget, "target");
    if (!parsed.ok()) __builtin_trap();
    return new eagle3::DeepseekV2Config(*std::move(parsed));
  }();
  return *target;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto draft = eagle3::Eagle3DraftConfig::FromJson(text, "fuzz");
  if (!draft.ok()) {
    if (draft.status().message().empty()) __builtin_trap();  // every error must explain itself
    return 0;
  }
  const eagle3::Eagle3DraftConfig& d = *draft;
  if (d.hidden_size <= 0 || d.head_dim <= 0 || d.num_hidden_layers != 1 ||
      d.draft_vocab_size > d.vocab_size || d.fc_input_width() <= 0) {
    __builtin_trap();
  }
  const auto status = eagle3::CheckDraftAgainstTarget(d, Target());
  if (!status.ok()) {
    if (status.message().empty()) __builtin_trap();
    return 0;
  }
  if (d.aux_layer_ids.has_value()) {
    for (int id : *d.aux_layer_ids) {
      if (id < 0 || id >= Target().num_hidden_layers) __builtin_trap();
    }
  }
  return 0;
}
