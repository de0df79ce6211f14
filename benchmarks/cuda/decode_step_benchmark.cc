// One target decode step of DeepSeek-V2-Lite at TP 1 (all 27 layers by default), eager vs replayed
// from a CUDA graph, timed with CUDA events around the step's device work (TargetModel::Launch or
// the graph launch; the GPU idles wherever the host is slow to enqueue, so host overhead counts) and,
// separately, the whole step as an engine calls it (Stage + launch + Finish, host wall clock).
//
//   BM_DecodeStep/batch/context/graph   batch sequences x 1 new token after `context` cached tokens
//
// Weights are random: one 1 Mi-value N(0, 0.02²) bf16 block tiled into every tensor of a hub
// checkpoint written once to $EAGLE3_BENCH_CKPT_DIR/v2lite-L<layers> (about 31 GB for all 27
// layers; EAGLE3_BENCH_LAYERS=N writes and times the first N layers instead). The model stores f32
// (4 bytes per weight): the floor counts the weights a step must read — attention of every layer,
// the dense MLP, per MoE layer the router, the 2 shared experts and the routed experts touched
// (estimated as 64 (1 - (1 - 6/64)^batch), the expected count under uniform routing: the benchmark
// does not read the routing), lm_head — plus the latent KV rows, at the measured copy rate.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "eagle3/cuda/cuda_graph.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/half.h"
#include "eagle3/safetensors_writer.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"

namespace eagle3::bench {
namespace {

// DeepSeek-V2-Lite-Chat's hub config.json (auto_map and training-only keys left out);
// num_hidden_layers is filled in.
constexpr const char* kV2LiteConfig = R"({"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
 "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu",
 "hidden_size": 2048, "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
 "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
 "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": 16, "num_experts_per_tok": 6,
 "num_hidden_layers": LAYERS, "num_key_value_heads": 16, "q_lora_rank": null, "qk_nope_head_dim": 128,
 "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1,
 "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
 "type": "yarn"}, "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
 "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy", "v_head_dim": 128,
 "vocab_size": 102400})";

constexpr int64_t kPageSize = 64;

int Layers() {
  const char* s = std::getenv("EAGLE3_BENCH_LAYERS");
  const int n = s != nullptr ? std::atoi(s) : 0;
  return n >= 2 && n <= 27 ? n : 27;
}

std::string ConfigJson() {
  std::string json = kV2LiteConfig;
  json.replace(json.find("LAYERS"), 6, std::to_string(Layers()));
  return json;
}

std::string CheckpointDir() {
  const char* dir = std::getenv("EAGLE3_BENCH_CKPT_DIR");
  const std::string root = dir != nullptr && dir[0] != '\0' ? dir : "/tmp/eagle3-bench-ckpt";
  return root + "/v2lite-L" + std::to_string(Layers());
}

// Writes the checkpoint once (a `complete` marker makes later runs reuse it): every tensor of the
// schema views the same tiled random block, so the host holds one embedding's worth of memory.
absl::Status EnsureCheckpoint(const std::string& dir, const DeepseekV2Config& config) {
  if (std::filesystem::exists(dir + "/complete")) return absl::OkStatus();
  const auto start = std::chrono::steady_clock::now();
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << ConfigJson();
  const std::vector<WeightSpec> specs = DeepseekV2Weights(config);
  int64_t largest = 0;
  for (const WeightSpec& s : specs) largest = std::max(largest, s.shape.numel());
  std::vector<uint16_t> block(size_t{1} << 20);
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  for (uint16_t& v : block) v = FloatToBf16(dist(rng));
  std::vector<uint16_t> data(static_cast<size_t>(largest));
  for (size_t i = 0; i < data.size(); i += block.size()) {
    std::copy_n(block.begin(), std::min(block.size(), data.size() - i), data.begin() + static_cast<std::ptrdiff_t>(i));
  }
  std::vector<NamedTensor> tensors;
  for (const WeightSpec& s : specs) tensors.push_back({s.name, TensorView(data.data(), DType::kBF16, s.shape)});
  EAGLE3_RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", tensors));
  std::ofstream(dir + "/complete") << "ok\n";
  std::fprintf(stderr, "decode_step_benchmark: wrote %s in %.1f s\n", dir.c_str(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return absl::OkStatus();
}

// Bytes one decode step of `batch` sequences at `context` cached tokens must read (f32 weights).
double StepBytes(const DeepseekV2Config& c, int64_t batch, int64_t context) {
  const double h = static_cast<double>(c.hidden_size);
  const double heads = static_cast<double>(c.num_attention_heads);
  const double attention = h * heads * c.qk_head_dim() + h * c.latent_cache_width() +
                           static_cast<double>(c.kv_lora_rank) * heads * (c.qk_nope_head_dim + c.v_head_dim) +
                           heads * c.v_head_dim * h;
  const double expert = 3.0 * h * static_cast<double>(c.moe_intermediate_size);
  const double experts = static_cast<double>(*c.n_routed_experts);
  const double touched = experts * (1.0 - std::pow(1.0 - c.num_experts_per_tok / experts, static_cast<double>(batch)));
  const double moe_layer = h * experts + c.n_shared_experts * expert + touched * expert;
  const double dense = 3.0 * h * static_cast<double>(c.intermediate_size);
  const int64_t layers = c.num_hidden_layers;
  const int64_t dense_layers = std::min<int64_t>(c.first_k_dense_replace, layers);
  const double weights = layers * attention + dense_layers * dense + (layers - dense_layers) * moe_layer +
                         static_cast<double>(c.vocab_size) * h;
  const double kv = static_cast<double>(batch) * (context + 1) * c.latent_cache_width() * layers;
  return 4.0 * (weights + kv);
}

struct Model {
  DeepseekV2Config config;
  std::unique_ptr<TargetModel> target;
  std::vector<std::vector<int32_t>> pages;
};

constexpr int64_t kMaxBatch = 32;
int64_t MaxContext() { return Quick() ? 1024 : 4096; }

// One model for every shape (loading the f32 weights takes a while): kMaxBatch sequences, each
// prefilled once to MaxContext() tokens; a step at a shorter context reads only its first rows.
absl::StatusOr<Model*> Shared() {
  static absl::StatusOr<std::unique_ptr<Model>> shared = []() -> absl::StatusOr<std::unique_ptr<Model>> {
    auto m = std::make_unique<Model>();
    EAGLE3_ASSIGN_OR_RETURN(m->config, DeepseekV2Config::FromJson(ConfigJson(), "DeepSeek-V2-Lite config"));
    const std::string dir = CheckpointDir();
    EAGLE3_RETURN_IF_ERROR(EnsureCheckpoint(dir, m->config));
    const auto start = std::chrono::steady_clock::now();
    TargetModelOptions o;
    o.max_tokens_per_forward = 512;
    o.max_context_len = MaxContext() + kPageSize;
    const int64_t pages_per_seq = (o.max_context_len + kPageSize - 1) / kPageSize;
    o.page_size = kPageSize;
    o.num_kv_pages = kMaxBatch * pages_per_seq;
    EAGLE3_ASSIGN_OR_RETURN(m->target, TargetModel::Create(dir, o, nullptr, Backend()));
    for (int64_t b = 0; b < kMaxBatch; ++b) {
      std::vector<int32_t> p(static_cast<size_t>(pages_per_seq));
      for (int64_t i = 0; i < pages_per_seq; ++i) p[i] = static_cast<int32_t>(b * pages_per_seq + i);
      m->pages.push_back(std::move(p));
    }
    // Prefill in chunks of 512 tokens (the per-sequence extend path).
    std::vector<float> logits(static_cast<size_t>(m->config.vocab_size));
    for (int64_t b = 0; b < kMaxBatch; ++b) {
      for (int64_t done = 0; done < MaxContext();) {
        const int64_t n = std::min<int64_t>(512, MaxContext() - done);
        std::vector<int64_t> tokens(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) tokens[i] = (7919 * (done + i) + 104729 * b) % m->config.vocab_size;
        const SequenceInput in{tokens, {}, m->pages[b], done, {}, false};
        EAGLE3_RETURN_IF_ERROR(m->target->Forward(std::span<const SequenceInput>(&in, 1),
                                                  TensorView(logits.data(), DType::kF32, Shape{1, m->config.vocab_size})));
        done += n;
      }
    }
    std::fprintf(stderr, "decode_step_benchmark: loaded %d layers and prefilled %lld x %lld tokens in %.1f s\n",
                 static_cast<int>(m->config.num_hidden_layers), static_cast<long long>(kMaxBatch),
                 static_cast<long long>(MaxContext()),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return m;
  }();
  if (!shared.ok()) return shared.status();
  return shared->get();
}

void BM_DecodeStep(benchmark::State& state) {
  if (Backend() == nullptr) return state.SkipWithError("no CUDA device");
  const int64_t batch = state.range(0), context = state.range(1);
  const bool graph = state.range(2) != 0;
  auto shared = Shared();
  if (!Check(state, shared.status(), "setup")) return;
  Model& m = **shared;
  if (batch > kMaxBatch || context > MaxContext()) return state.SkipWithError("shape beyond the shared model");
  // The step: every sequence decodes one token at position `context` (the same slot each time).
  std::vector<int64_t> tokens(static_cast<size_t>(batch));
  std::vector<SequenceInput> inputs;
  for (int64_t b = 0; b < batch; ++b) {
    tokens[b] = (31 * b + 5) % m.config.vocab_size;
    inputs.push_back(SequenceInput{std::span<const int64_t>(&tokens[b], 1), {}, m.pages[b], context, {}, false});
  }
  std::vector<float> logits(static_cast<size_t>(batch * m.config.vocab_size));
  const TensorView out(logits.data(), DType::kF32, Shape{batch, m.config.vocab_size});
  if (!Check(state, m.target->Forward(inputs, out), "eager warm-up step")) return;
  if (!Check(state, m.target->Stage(inputs), "stage")) return;
  std::unique_ptr<cuda::CudaGraph> captured;
  if (graph) {
    auto g = cuda::CudaGraph::Capture(Backend()->stream(), [&] { return m.target->Launch(); });
    if (!Check(state, g.status(), "capture")) return;
    captured = std::move(*g);
  }
  auto launch = [&] { (void)(graph ? captured->Launch(Backend()->stream()) : m.target->Launch()); };
  for (int i = 0; i < kWarmup; ++i) launch();
  if (!Check(state, m.target->Finish(out), "finish")) return;
  std::vector<double> device, wall;
  for (auto _ : state) {
    if (!Check(state, m.target->Stage(inputs), "stage")) return;
    const double t = TimeOnce(Backend()->stream(), launch);
    if (!Check(state, m.target->Finish(out), "finish")) return;
    state.SetIterationTime(t);
    device.push_back(t);
    // The whole step as an engine runs it, host wall clock.
    const auto start = std::chrono::steady_clock::now();
    (void)m.target->Stage(inputs);
    launch();
    (void)m.target->Finish(out);
    wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  ReportRoofline(state, Median(device), StepBytes(m.config, batch, context), 0.0);
  state.counters["step_wall_us"] = Median(wall) * 1e6;
  state.counters["layers"] = static_cast<double>(m.config.num_hidden_layers);
}

void StepArgs(benchmark::internal::Benchmark* b) {
  if (Quick()) {
    b->ArgsProduct({{1, 32}, {1024}, {0, 1}});
  } else {
    b->ArgsProduct({{1, 8, 32}, {1024, 4096}, {0, 1}});  // MaxContext() is 4096 here
  }
}
BENCHMARK(BM_DecodeStep)->ArgNames({"batch", "context", "graph"})->Apply(StepArgs)->Apply(Timed);

}  // namespace
}  // namespace eagle3::bench

int main(int argc, char** argv) { return eagle3::bench::Main(argc, argv); }
