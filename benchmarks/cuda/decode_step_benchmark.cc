// Whole target steps of four models, eager vs replayed from a CUDA graph, timed with CUDA events around
// the step's device work (TargetModel::Launch or the graph launch; the GPU idles wherever the host is
// slow to enqueue, so host overhead counts) and, separately, the whole step as an engine calls it
// (Stage + launch + Finish, host wall clock):
//
//   model 0  DeepSeek-V2-Lite at TP 1 (all 27 layers)
//   model 1  one TP = 8 rank of DeepSeek-V2 (236B, all 60 layers) as a TP 1 model of the rank's
//            shapes: 16 of the 128 heads, the dense MLP at 12288 / 8, every routed and shared expert
//            at moe_intermediate_size 1536 / 8 = 192 (DeepSeek shards each expert's intermediate over
//            the ranks), the vocabulary shard of 102400 / 8 rows for the embedding and lm_head. The
//            rank's compute and memory traffic are exactly this model's; its collectives (the
//            embedding and 2 per layer all-reduces, the logits all-gather) are not in these figures:
//            make_results.py adds them from BM_AllReduce / BM_AllGather, labeled as a model.
//
//   model 2  one TP = 8 rank of DeepSeek-V3 in its published FP8 form (e4m3 weights with 128 x 128
//            block scales, every Linear but lm_head; 61 layers, 3 dense), the rank's shapes as for
//            model 1: 16 of 128 heads, dense MLP 18432 / 8, experts 2048 / 8, vocabulary 129280 / 8
//   model 3  one TP = 8 rank of Kimi-K2-Thinking / K2.5's language model in its published INT4 form
//            (routed experts only, group 32; attention, shared experts, the dense layer and lm_head
//            bf16; 61 layers, 1 dense, 384 experts): 8 of 64 heads, experts 2048 / 8, vocabulary
//            163840 / 8
//            Models 2 and 3 keep their quantized weights quantized in GPU memory (the CUDA default)
//            and store their latent caches in bf16 (an f32 cache of 61 layers at these capacities
//            would not fit beside the weights). Rows report the GPU memory the loaded model takes
//            (model_device_gb: weights, caches at the benchmark's capacities, workspaces).
//
//   BM_DecodeStep/model/batch/context/graph   batch sequences x 1 new token after `context` cached
//   BM_VerifyStep/model/batch/tokens/context/graph
//                                             batch sequences x a `tokens`-node draft tree (a complete
//                                             4-ary tree, tree mask, logits of every node) after
//                                             `context` cached tokens: the target's verify forward
//                                             (runs before 2026-12-01c had no context argument: they
//                                             ran at MaxContext(), see make_results.py)
//
// Weights: a sparse checkpoint (written once to $EAGLE3_BENCH_CKPT_DIR/<model>, default
// /tmp/eagle3-bench-ckpt): the embedding and each MoE router are N(0, 0.02²) bf16, norms are 1, every
// other matrix is a file hole (zeros; the file takes well under a gigabyte on disk whatever its size).
// Timing does not depend on the values of a GEMM's or an attention's operands; the random embedding
// and routers make the routing realistic (the residual stream is the embedding, every token routes
// to its own experts). EAGLE3_BENCH_MODELS=0, =1, =23 ... runs the models listed (unset: 0 and 1); EAGLE3_BENCH_KV_CACHE=bf16
// stores the latent caches in bf16 (make_results.py keys the rows by cache_bits).
//
// Floor: the bytes a step must read at the measured copy rate — attention weights of every layer, the
// dense MLP, per MoE layer the router (bf16 with bf16 weights, as FeedForwardBlock keeps a bf16
// checkpoint's router since 2026-12-04; f32 with f32 weights), the shared experts and the routed
// experts touched (estimated as E (1 - (1 - k/E)^tokens), the expected count under uniform
// routing: the benchmark does not read the routing), lm_head, the latent KV rows — or its flops (2
// per weight per token, plus the attention's q·k and p·v) at the measured GEMM rate, whichever is
// larger. Element sizes are the model's: weights in the backend's storage dtype (bf16 on CUDA) or
// their quantized size (FP8: 1 byte plus its block's f32 scale share; INT4: half a byte plus a bf16
// scale per 32), the cache in its dtype.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>


#include "bench_util.h"
#include "sparse_checkpoint.h"
#include "step_models.h"
#include "eagle3/cuda/cuda_graph.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/draft_tree.h"
#include "eagle3/half.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"

namespace eagle3::bench {
namespace {

constexpr const char* kModelNames[] = {"v2lite-tp1", "v2-tp8-rank", "v3-fp8-tp8-rank", "k2-int4-tp8-rank"};
// Models 1-3: the hub configs with the widths of one TP = 8 rank (step_models.h).
constexpr int kRankSplit = 8;
constexpr int kNumModels = kStepModels;
bool Quantized(int model) { return StepModelQuantized(model); }

constexpr int64_t kPageSize = kStepPageSize;
constexpr int64_t kMaxBatch = kStepMaxBatch;
constexpr int64_t kMaxTreeTokens = 64;
constexpr int kTreeArity = kStepTreeArity;
int64_t MaxContext() { return Quick() ? 1024 : 4096; }

// EAGLE3_BENCH_KV_CACHE=bf16: the models' latent caches in bf16 (TargetModelOptions::kv_cache_dtype;
// the bf16 tensor-core latent kernel); unset or f32: f32 caches. Rows report cache_elem_bytes.
bool KvCacheBf16() {
  const char* s = std::getenv("EAGLE3_BENCH_KV_CACHE");
  return s != nullptr && std::string(s) == "bf16";
}

// EAGLE3_BENCH_STACK_ATTENTION_INPUTS=0: q_a and kv_a as two products
// (TargetModelOptions::stack_attention_inputs), for A/B runs.
bool StackAttentionInputs() {
  const char* s = std::getenv("EAGLE3_BENCH_STACK_ATTENTION_INPUTS");
  return s == nullptr || std::string(s) != "0";
}

// EAGLE3_BENCH_PREFETCH=1: the weight prefetch on (TargetModelOptions::prefetch_weights), for A/B runs.
bool PrefetchWeights() {
  const char* s = std::getenv("EAGLE3_BENCH_PREFETCH");
  return s != nullptr && std::string(s) == "1";
}

// EAGLE3_BENCH_MODELS lists the models to run ("0", "23", ...); unset: models 0 and 1 (the quantized
// ranks take ~85 / ~75 GB and a minute or more to load: asked for by name).
bool ModelWanted(int model) {
  const char* s = std::getenv("EAGLE3_BENCH_MODELS");
  if (s == nullptr || s[0] == '\0') return model < 2;
  return std::string(s).find(std::to_string(model)) != std::string::npos;
}

// EAGLE3_BENCH_EAGER=1: the quantized ranks' decode rows eager too (graph:0), as a profiler's target:
// every kernel of an eager step is its own launch inside the "eagle3_step" NVTX range.
bool EagerQuantizedRows() {
  const char* s = std::getenv("EAGLE3_BENCH_EAGER");
  return s != nullptr && std::string(s) == "1";
}

std::string CheckpointDir(int model) { return BenchCheckpointRoot() + "/" + kModelNames[model] + "-sparse"; }

struct Model {
  int id = -1;
  DeepseekV2Config config;
  std::unique_ptr<TargetModel> target;
  std::vector<std::vector<int32_t>> pages;
  StepElementBytes bytes;   // per element streamed (step_models.h)
  double device_bytes = 0;  // GPU memory the loaded model takes (weights, caches, workspaces)
};

// What one step of model `m` must read and compute (step_models.h).
StepCost Cost(const Model& m, int64_t batch, int64_t tokens_per_seq, int64_t context) {
  return StepCostOf(m.config, m.bytes, batch, tokens_per_seq, context);
}

// One model in memory at a time (the V2 rank alone is ~60 GB in bf16): asking for another frees the
// current one first. Each model holds kMaxBatch sequences of up to MaxContext() cached tokens with no
// prefill: TargetModel::Create zeroes the cache, which is what a prefill through these checkpoints
// writes (their kv_a projection is a hole), and a step reads the first `context` rows of its pages.
absl::StatusOr<Model*> Get(int id) {
  static OneLoaded<Model> loaded;
  return loaded.Get(id, [&]() -> absl::StatusOr<std::unique_ptr<Model>> {
    auto m = std::make_unique<Model>();
    m->id = id;
    const std::string json = StepModelConfig(id, kRankSplit);
    EAGLE3_ASSIGN_OR_RETURN(m->config, DeepseekV2Config::FromJson(json, kModelNames[id]));
    const std::string dir = CheckpointDir(id);
    EAGLE3_RETURN_IF_ERROR(EnsureSparseCheckpoint(dir, json, m->config));
    const auto start = std::chrono::steady_clock::now();
    TargetModelOptions o;
    o.max_tokens_per_forward = kMaxBatch * kMaxTreeTokens;  // the largest verify step
    o.max_context_len = MaxContext() + kMaxTreeTokens + kPageSize;
    const int64_t pages_per_seq = (o.max_context_len + kPageSize - 1) / kPageSize;
    o.page_size = kPageSize;
    o.num_kv_pages = kMaxBatch * pages_per_seq;
    if (KvCacheBf16() || Quantized(id)) o.kv_cache_dtype = DType::kBF16;
    if (Quantized(id)) o.keep_quantized = true;
    o.stack_attention_inputs = StackAttentionInputs();
    o.prefetch_weights = PrefetchWeights();
    size_t free_before = 0, free_after = 0, total = 0;
    (void)cudaMemGetInfo(&free_before, &total);
    EAGLE3_ASSIGN_OR_RETURN(m->target, TargetModel::Create(dir, o, nullptr, Backend()));
    (void)cudaMemGetInfo(&free_after, &total);
    m->device_bytes = static_cast<double>(free_before) - static_cast<double>(free_after);
    m->bytes = ElementBytesOf(m->config, m->target->options().weight_dtype.value_or(Backend()->preferred_weight_dtype()),
                              m->target->options().kv_cache_dtype.value_or(DType::kF32));
    m->pages = SequencePages(kMaxBatch, pages_per_seq);
    std::fprintf(stderr, "decode_step_benchmark: %s: loaded (%.1f GB of GPU memory; weights %.0f B, experts %.3f B, "
                 "cache %.0f B per element, %lld x %lld cached tokens) in %.1f s\n", kModelNames[id],
                 m->device_bytes * 1e-9, m->bytes.weight, m->bytes.expert, m->bytes.cache,
                 static_cast<long long>(kMaxBatch), static_cast<long long>(MaxContext()),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    const WeightLoadStats& ls = m->target->load_stats();
    std::fprintf(stderr, "decode_step_benchmark: %s: weights: %lld tensors (%lld in warp tiles), %.1f GB read on "
                 "the host; checks %.1f s, host reads %.1f s, device allocations and copies %.1f s (upload ring %zu "
                 "MiB, weight arena %zu MiB), all weights %.1f s\n",
                 kModelNames[id], static_cast<long long>(ls.tensors), static_cast<long long>(ls.tiled_tensors),
                 static_cast<double>(ls.host_bytes) * 1e-9,
                 ls.check_seconds, ls.read_seconds, ls.device_seconds, Backend()->options().upload_ring_bytes >> 20,
                 Backend()->options().weight_arena_chunk_bytes >> 20, ls.total_seconds);
    return m;
  });
}

// Times the staged step `inputs` eager or from a graph and sets the counters.
void TimeStep(benchmark::State& state, Model& m, std::span<const SequenceInput> inputs, bool graph,
              const TensorView& out, const StepCost& cost) {
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
    // TimeOnce brackets the launch in the NVTX range "eagle3_step" (bench_util.h): a profiler
    // picks one step's kernels out of the load and warm-up with it.
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
  ReportRoofline(state, Median(device), cost.bytes, cost.flops);
  state.counters["step_wall_us"] = Median(wall) * 1e6;
  state.counters["layers"] = static_cast<double>(m.config.num_hidden_layers);
  state.counters["weight_elem_bytes"] = m.bytes.weight;
  state.counters["cache_elem_bytes"] = m.bytes.cache;
  state.counters["expert_elem_bytes"] = m.bytes.expert;
  state.counters["model_device_gb"] = m.device_bytes * 1e-9;
}

void BM_DecodeStep(benchmark::State& state) {
  if (Backend() == nullptr) return state.SkipWithError("no CUDA device");
  const int model = static_cast<int>(state.range(0));
  const int64_t batch = state.range(1), context = state.range(2);
  const bool graph = state.range(3) != 0;
  auto got = Get(model);
  if (!Check(state, got.status(), "setup")) return;
  Model& m = **got;
  if (batch > kMaxBatch || context > MaxContext()) return state.SkipWithError("shape beyond the shared model");
  const StepInputs step = DecodeStepInputs(batch, context, m.config.vocab_size, m.pages);
  std::vector<float> logits(static_cast<size_t>(batch * m.config.vocab_size));
  TimeStep(state, m, step.inputs, graph, TensorView(logits.data(), DType::kF32, Shape{batch, m.config.vocab_size}),
           Cost(m, batch, 1, context));
}

void BM_VerifyStep(benchmark::State& state) {
  if (Backend() == nullptr) return state.SkipWithError("no CUDA device");
  const int model = static_cast<int>(state.range(0));
  const int64_t batch = state.range(1), n = state.range(2), context = state.range(3);
  const bool graph = state.range(4) != 0;
  auto got = Get(model);
  if (!Check(state, got.status(), "setup")) return;
  Model& m = **got;
  if (batch > kMaxBatch || n > kMaxTreeTokens || context > MaxContext()) {
    return state.SkipWithError("shape beyond the shared model");
  }
  auto step = VerifyStepInputs(batch, n, context, m.config.vocab_size, kTreeArity, m.pages);
  if (!Check(state, step.status(), "tree")) return;
  std::vector<float> logits(static_cast<size_t>(batch * n * m.config.vocab_size));
  TimeStep(state, m, step->inputs, graph, TensorView(logits.data(), DType::kF32, Shape{batch * n, m.config.vocab_size}),
           Cost(m, batch, n, context));
}

// Registration per model (decode, then verify), so each model is loaded once.
[[maybe_unused]] const bool registered = [] {
  for (int model = 0; model < kNumModels; ++model) {
    if (!ModelWanted(model)) continue;
    auto* decode = benchmark::RegisterBenchmark("BM_DecodeStep", BM_DecodeStep)
                       ->ArgNames({"model", "batch", "context", "graph"});
    auto* verify = benchmark::RegisterBenchmark("BM_VerifyStep", BM_VerifyStep)
                       ->ArgNames({"model", "batch", "tokens", "context", "graph"});
    // Verify from a graph only (an engine's verify step is the graphed one; eager vs graph is shown
    // by the decode rows), at the largest context (the modeled end-to-end table's vanilla step).
    if (Quantized(model)) {
      // Decode and the 8- / 16-token verify steps that speculation runs at these ranks.
      decode->ArgsProduct({{model}, {1, 8, 32}, {1024, MaxContext()}, {1}});
      if (EagerQuantizedRows()) decode->ArgsProduct({{model}, {1}, {1024}, {0}});
      verify->ArgsProduct({{model}, {1, 8}, {8, 16}, {MaxContext()}, {1}});
    } else if (Quick()) {
      decode->ArgsProduct({{model}, {1, 32}, {1024}, {0, 1}});
      verify->ArgsProduct({{model}, {1, 32}, {16, 64}, {MaxContext()}, {1}});
    } else {
      decode->ArgsProduct({{model}, {1, 8, 32}, {1024, 4096}, {0, 1}});
      verify->ArgsProduct({{model}, {1, 8, 32}, {8, 16, 32, 64}, {MaxContext()}, {1}});
    }
    StepTimed(decode);
    StepTimed(verify);
  }
  return true;
}();

}  // namespace
}  // namespace eagle3::bench

int main(int argc, char** argv) { return eagle3::bench::Main(argc, argv); }
