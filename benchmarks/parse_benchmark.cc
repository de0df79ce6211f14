// Parse time of untrusted JSON against its size, up to the caps: a safetensors header of N
// zero-size tensors (the input that made a callback parser quadratic), an index of N weight_map
// entries, and a config.json carrying an N-element array. Time per item should stay flat as N
// grows (linear total time); benchmark's BigO fit reports the complexity.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>

#include "eagle3/checkpoint.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/safetensors.h"

namespace eagle3 {
namespace {

std::string ZeroSizeHeader(int64_t n) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  for (int64_t i = 0; i < n; ++i) {
    header += ",\"model.layers." + std::to_string(i) +
              R"(.weight":{"dtype":"BF16","shape":[0,7168],"data_offsets":[0,0]})";
  }
  return header + "}";
}

std::string Index(int64_t n) {
  std::string index = R"({"metadata":{"total_size":0},"weight_map":{)";
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0) index += ',';
    index += "\"model.layers." + std::to_string(i) + ".w\":\"model-00001-of-00163.safetensors\"";
  }
  return index + "}}";
}

std::string Config(int64_t n) {
  std::string config = R"({
    "model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 64,
    "intermediate_size": 128, "moe_intermediate_size": 16, "num_hidden_layers": 3,
    "num_attention_heads": 8, "num_key_value_heads": 8, "n_routed_experts": 8,
    "n_shared_experts": 1, "num_experts_per_tok": 2, "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 4, "topk_group": 2,
    "norm_topk_prob": true, "first_k_dense_replace": 1, "moe_layer_freq": 1, "q_lora_rank": null,
    "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "rope_theta": 10000,
    "rope_scaling": null, "tie_word_embeddings": true, "eos_token_id": [)";
  for (int64_t i = 0; i < n; ++i) config += (i > 0 ? "," : "") + std::to_string(i);
  return config + "]}";
}

// Runs `parse` on `text` per iteration; items = N, bytes = the text size.
template <typename Parse>
void Run(benchmark::State& state, const std::string& text, Parse parse) {
  for (auto _ : state) {
    const absl::Status status = parse(text);
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).substr(0, 200).c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(text.size()));
  state.SetComplexityN(state.range(0));
  state.counters["MB"] = static_cast<double>(text.size()) / 1e6;
}

void BM_SafetensorsHeader(benchmark::State& state) {
  Run(state, ZeroSizeHeader(state.range(0)), [](const std::string& text) {
    return ParseSafetensorsHeader(text, 0, "bench.safetensors").status();
  });
}
BENCHMARK(BM_SafetensorsHeader)
    ->RangeMultiplier(4)
    ->Range(1 << 10, 1 << 20)  // up to kMaxSafetensorsTensors
    ->Unit(benchmark::kMillisecond)
    ->Complexity(benchmark::oN);

void BM_IndexJson(benchmark::State& state) {
  Run(state, Index(state.range(0)), [](const std::string& text) {
    return ParseSafetensorsIndex(text, "model.safetensors.index.json").status();
  });
}
BENCHMARK(BM_IndexJson)
    ->RangeMultiplier(4)
    ->Range(1 << 10, 1 << 20)  // up to kMaxSafetensorsIndexTensors
    ->Unit(benchmark::kMillisecond)
    ->Complexity(benchmark::oN);

void BM_ConfigJson(benchmark::State& state) {
  Run(state, Config(state.range(0)), [](const std::string& text) {
    return DeepseekV2Config::FromJson(text, "config.json").status();
  });
}
BENCHMARK(BM_ConfigJson)
    ->RangeMultiplier(4)
    ->Range(1 << 8, 1 << 14)
    ->Arg(65000)  // near the 65536-value cap of a config
    ->Unit(benchmark::kMicrosecond)
    ->Complexity(benchmark::oN);

}  // namespace
}  // namespace eagle3

BENCHMARK_MAIN();
