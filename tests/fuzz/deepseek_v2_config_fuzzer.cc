// Feeds arbitrary bytes as a target config.json. Besides the sanitizers' checks (no UB on huge
// numbers, deep nesting, odd types), an accepted config must satisfy the invariants its users rely
// on: positive sizes, a finite positive softmax scale, consistent MoE routing parameters.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "eagle3/deepseek_v2_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto config = eagle3::DeepseekV2Config::FromJson(text, "fuzz");
  if (!config.ok()) {
    if (config.status().message().empty()) __builtin_trap();  // every error must explain itself
    return 0;
  }
  const eagle3::DeepseekV2Config& c = *config;
  if (c.hidden_size <= 0 || c.num_attention_heads <= 0 || c.num_hidden_layers <= 0 ||
      c.qk_head_dim() <= 0 || c.latent_cache_width() <= c.kv_lora_rank) {
    __builtin_trap();
  }
  const double scale = c.SoftmaxScale();
  if (!std::isfinite(scale) || !(scale > 0)) __builtin_trap();
  if (c.is_moe() && (c.num_experts_per_tok > *c.n_routed_experts || c.topk_group > c.n_group ||
                     *c.n_routed_experts % c.n_group != 0 || c.moe_layer_freq < 1)) {
    __builtin_trap();
  }
  for (int tp : {0, 1, 2, 8, 64, 65}) {
    const auto status = c.ValidateForTp(tp);
    if (!status.ok() && status.message().empty()) __builtin_trap();
  }
  int64_t moe_layers = 0;
  for (int64_t layer = -1; layer <= c.num_hidden_layers && layer < 4096; ++layer) {
    moe_layers += c.IsMoeLayer(layer) ? 1 : 0;
  }
  if (!c.is_moe() && moe_layers != 0) __builtin_trap();
  return 0;
}
