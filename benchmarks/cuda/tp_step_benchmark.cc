// Whole target steps at tensor parallelism N over NCCL, one rank per GPU, each rank's step replayed
// from a CUDA graph with its collectives captured in it (the embedding's all-reduce, two per layer,
// the logits' all-gather): what decode_step_benchmark's one-GPU rank rows leave out (there the
// collectives are a model added by make_results.py). Needs 2+ GPUs; skips otherwise.
//
//   BM_TpDecodeStep/model/tp/batch/context       batch sequences x 1 new token after `context`
//   BM_TpVerifyStep/model/tp/batch/tokens/context batch sequences x a `tokens`-node draft tree (a
//                                                 complete 4-ary tree, tree mask, logits of every node)
//
//   model 0  DeepSeek-V2-Lite (27 layers, 16 heads: TP 2 or 8 on GPUs of any size)
//   model 1  DeepSeek-V2 (236B, bf16: ~59 GB of weights a rank at TP 8)
//   model 2  DeepSeek-V3 in its FP8 form (~85 GB a rank at TP 8: H200s)
//   model 3  Kimi-K2-Thinking / K2.5's language model in its INT4 form (~75 GB a rank at TP 8)
// The whole models (step_models.h, sparse checkpoints as decode_step_benchmark writes them: random
// embedding and routers, every other matrix zeros), which each rank shards as an engine's would.
// Models 2 and 3 keep their weights quantized; every model's latent cache is bf16.
//
// Timing: all ranks' graphs launch together (the host threads meet at a barrier first), kInner times
// back to back, between two CUDA events on rank 0's stream; the time of a step is that span over
// kInner (the collectives keep the ranks in step, so a host thread's lateness is paid once, not per
// step). Floors, per rank: the bytes and flops of its share of the step (StepCostOf over the
// rank-shaped config) at the measured copy and GEMM rates (floor_us), and the collectives' bus bytes
// at the NVLink rate (comm_floor_us: f32 partial sums of the hidden state for every all-reduce,
// ring bus bytes as nccl-tests counts them); small messages are latency-bound, far above that floor:
// collectives_benchmark times them at these sizes.
//
// EAGLE3_BENCH_TP=N: the ranks (2, 4 or 8; default every visible GPU, rounded down to one of those);
// EAGLE3_BENCH_MODELS ("0", "01", ...; default 0, and 1 at TP 8) as decode_step_benchmark.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/cuda_graph.h"
#include "eagle3/cuda/nccl_communicator.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/draft_tree.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "sparse_checkpoint.h"
#include "step_models.h"
#include "tp_ranks.h"

namespace eagle3::bench {
namespace {

// The whole models (step_models.h, split 1), checkpoints beside decode_step_benchmark's.
constexpr const char* kModelNames[] = {"v2lite-tp1", "v2-whole", "v3-fp8-whole", "k2-int4-whole"};
constexpr int64_t kMaxTreeTokens = 16;
constexpr int64_t kMaxContext = 4096;
constexpr int kInner = 5;  // graph replays between the two events of one timed iteration

// EAGLE3_BENCH_MODELS lists the models to run; unset: V2-Lite, and V2 at TP 8.
bool ModelWanted(int model) {
  const char* s = std::getenv("EAGLE3_BENCH_MODELS");
  if (s == nullptr || s[0] == '\0') return model == 0 || (model == 1 && BenchTpSize() == 8);
  return std::string(s).find(std::to_string(model)) != std::string::npos;
}

// The share of `c` one of `tp` ranks holds (heads, the dense and expert intermediate widths, the
// vocabulary), for its floor.
DeepseekV2Config RankShare(DeepseekV2Config c, int tp) {
  c.num_attention_heads /= tp;
  c.num_key_value_heads /= tp;
  c.intermediate_size /= tp;
  c.moe_intermediate_size /= tp;
  c.vocab_size /= tp;
  return c;
}

struct Rank {
  cuda::CudaBackend* backend = nullptr;
  std::unique_ptr<TargetModel> target;
  double device_bytes = 0;  // GPU memory the rank's model takes
};

struct Group {
  int model = -1;
  int tp = 0;
  DeepseekV2Config config;  // the whole model's
  StepElementBytes bytes;
  std::unique_ptr<TpRanks> devices;  // before `ranks`: their models go first
  std::vector<Rank> ranks;
  std::vector<std::vector<int32_t>> pages;
};

// One model's ranks in memory at a time (asking for another frees the current ones first).
absl::StatusOr<Group*> Get(int id, int tp) {
  static OneLoaded<Group> loaded;
  return loaded.Get(id * 16 + tp, [&]() -> absl::StatusOr<std::unique_ptr<Group>> {
    auto g = std::make_unique<Group>();
    g->model = id;
    g->tp = tp;
    const std::string json = StepModelConfig(id, 1);
    EAGLE3_ASSIGN_OR_RETURN(g->config, DeepseekV2Config::FromJson(json, kModelNames[id]));
    const std::string dir = BenchCheckpointRoot() + "/" + kModelNames[id] + "-sparse";
    EAGLE3_RETURN_IF_ERROR(EnsureSparseCheckpoint(dir, json, g->config));
    const auto start = std::chrono::steady_clock::now();
    EAGLE3_ASSIGN_OR_RETURN(g->devices, TpRanks::Create(tp));
    g->ranks.resize(static_cast<size_t>(tp));
    for (int r = 0; r < tp; ++r) g->ranks[r].backend = g->devices->backends[r];
    TargetModelOptions o;
    o.tp_size = tp;
    o.max_tokens_per_forward = kStepMaxBatch * kMaxTreeTokens;
    o.max_context_len = kMaxContext + kMaxTreeTokens + kStepPageSize;
    const int64_t pages_per_seq = (o.max_context_len + kStepPageSize - 1) / kStepPageSize;
    o.page_size = kStepPageSize;
    o.num_kv_pages = kStepMaxBatch * pages_per_seq;
    o.kv_cache_dtype = DType::kBF16;
    o.keep_quantized = StepModelQuantized(id);
    EAGLE3_RETURN_IF_ERROR(ForEachRank(tp, [&](int r) -> absl::Status {
      size_t free_before = 0, free_after = 0, total = 0;
      (void)cudaMemGetInfo(&free_before, &total);
      TargetModelOptions ro = o;
      ro.rank = r;
      EAGLE3_ASSIGN_OR_RETURN(g->ranks[r].target,
                              TargetModel::Create(dir, ro, g->devices->comms[r].get(), g->ranks[r].backend));
      (void)cudaMemGetInfo(&free_after, &total);
      g->ranks[r].device_bytes = static_cast<double>(free_before) - static_cast<double>(free_after);
      return absl::OkStatus();
    }));
    const TargetModel& t0 = *g->ranks[0].target;
    g->bytes = ElementBytesOf(g->config, t0.options().weight_dtype.value_or(Backend()->preferred_weight_dtype()),
                              t0.options().kv_cache_dtype.value_or(DType::kF32));
    g->pages = SequencePages(kStepMaxBatch, pages_per_seq);
    std::fprintf(stderr, "tp_step_benchmark: %s at TP %d: loaded (%.1f GB of GPU memory on rank 0) in %.1f s\n",
                 kModelNames[id], tp, g->ranks[0].device_bytes * 1e-9,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return g;
  });
}

// Times the step `inputs` (the same on every rank) replayed from each rank's graph; sets the
// counters. `rows`: logit rows of the step.
void TimeTpStep(benchmark::State& state, Group& g, std::span<const SequenceInput> inputs, int64_t rows,
                const StepCost& cost) {
  const int tp = g.tp;
  const int64_t vocab = g.config.vocab_size;
  std::vector<std::vector<float>> logits(static_cast<size_t>(tp),
                                         std::vector<float>(static_cast<size_t>(rows * vocab)));
  auto out = [&](int r) { return TensorView(logits[r].data(), DType::kF32, Shape{rows, vocab}); };
  std::vector<std::unique_ptr<cuda::CudaGraph>> graphs(static_cast<size_t>(tp));
  absl::Status st = ForEachRank(tp, [&](int r) -> absl::Status {
    TargetModel& m = *g.ranks[r].target;
    EAGLE3_RETURN_IF_ERROR(m.Forward(inputs, out(r)));  // eager warm-up
    EAGLE3_RETURN_IF_ERROR(m.Stage(inputs));
    const cudaStream_t stream = g.ranks[r].backend->stream();
    EAGLE3_ASSIGN_OR_RETURN(graphs[r], cuda::CudaGraph::Capture(stream, [&] { return m.Launch(); }));
    for (int i = 0; i < kWarmup; ++i) EAGLE3_RETURN_IF_ERROR(graphs[r]->Launch(stream));
    return m.Finish(out(r));
  });
  if (!Check(state, st, "warm-up and capture")) return;
  (void)cudaSetDevice(0);
  cudaEvent_t start = nullptr, stop = nullptr;
  (void)cudaEventCreate(&start);
  (void)cudaEventCreate(&stop);
  std::vector<double> times;
  for (auto _ : state) {
    std::barrier line(tp);
    st = ForEachRank(tp, [&](int r) -> absl::Status {
      TargetModel& m = *g.ranks[r].target;
      const cudaStream_t stream = g.ranks[r].backend->stream();
      EAGLE3_RETURN_IF_ERROR(m.Stage(inputs));
      line.arrive_and_wait();
      if (r == 0) (void)cudaEventRecord(start, stream);
      for (int i = 0; i < kInner; ++i) EAGLE3_RETURN_IF_ERROR(graphs[r]->Launch(stream));
      if (r == 0) (void)cudaEventRecord(stop, stream);
      return m.Finish(out(r));
    });
    if (!Check(state, st, "timed steps")) break;
    float ms = 0;
    (void)cudaEventElapsedTime(&ms, start, stop);
    const double t = static_cast<double>(ms) * 1e-3 / kInner;
    state.SetIterationTime(t);
    times.push_back(t);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  if (times.empty()) return;
  const double seconds = Median(times);
  ReportRoofline(state, seconds, cost.bytes, cost.flops);
  // Collectives of the step (replicated residual): the embedding's all-reduce and two per layer of
  // the f32 partial sums [tokens, hidden], and the all-gather of the f32 logits shards.
  const double tokens = static_cast<double>(rows);
  const double n = static_cast<double>(tp);
  const double reduce_bytes = tokens * static_cast<double>(g.config.hidden_size) * 4.0;
  const double reduces = 1.0 + 2.0 * static_cast<double>(g.config.num_hidden_layers);
  const double bus_bytes =
      reduces * reduce_bytes * 2.0 * (n - 1) / n + tokens * static_cast<double>(vocab) * 4.0 * (n - 1) / n;
  const double comm_floor = bus_bytes / kNvlinkBytesPerS;
  state.counters["tp"] = n;
  state.counters["collectives"] = reduces + 1;
  state.counters["comm_bus_bytes"] = bus_bytes;
  state.counters["comm_floor_us"] = comm_floor * 1e6;
  const double floor = state.counters["floor_us"] * 1e-6 + comm_floor;
  state.counters["floor_with_comm_us"] = floor * 1e6;
  state.counters["frac_with_comm"] = floor / seconds;
  state.counters["rank_device_gb"] = g.ranks[0].device_bytes * 1e-9;
  state.counters["layers"] = static_cast<double>(g.config.num_hidden_layers);
}

void BM_TpDecodeStep(benchmark::State& state) {
  const int model = static_cast<int>(state.range(0)), tp = static_cast<int>(state.range(1));
  const int64_t batch = state.range(2), context = state.range(3);
  if (tp < 2 || tp > DeviceCount()) return state.SkipWithError("needs a GPU per rank");
  auto got = Get(model, tp);
  if (!Check(state, got.status(), "setup")) return;
  Group& g = **got;
  const StepInputs step = DecodeStepInputs(batch, context, g.config.vocab_size, g.pages);
  TimeTpStep(state, g, step.inputs, batch, StepCostOf(RankShare(g.config, tp), g.bytes, batch, 1, context));
}

void BM_TpVerifyStep(benchmark::State& state) {
  const int model = static_cast<int>(state.range(0)), tp = static_cast<int>(state.range(1));
  const int64_t batch = state.range(2), n = state.range(3), context = state.range(4);
  if (tp < 2 || tp > DeviceCount()) return state.SkipWithError("needs a GPU per rank");
  auto got = Get(model, tp);
  if (!Check(state, got.status(), "setup")) return;
  Group& g = **got;
  auto step = VerifyStepInputs(batch, n, context, g.config.vocab_size, kStepTreeArity, g.pages);
  if (!Check(state, step.status(), "tree")) return;
  TimeTpStep(state, g, step->inputs, batch * n, StepCostOf(RankShare(g.config, tp), g.bytes, batch, n, context));
}

// Registration per model (decode, then verify), so each model is loaded once; graphs only (the
// collectives captured, as an engine replays its steps).
[[maybe_unused]] const bool registered = [] {
  const int tp = BenchTpSize();
  for (int model = 0; model < kStepModels; ++model) {
    if (!ModelWanted(model)) continue;
    auto* decode = benchmark::RegisterBenchmark("BM_TpDecodeStep", BM_TpDecodeStep)
                       ->ArgNames({"model", "tp", "batch", "context"});
    auto* verify = benchmark::RegisterBenchmark("BM_TpVerifyStep", BM_TpVerifyStep)
                       ->ArgNames({"model", "tp", "batch", "tokens", "context"});
    decode->ArgsProduct({{model}, {tp}, {1, 8, 32}, {1024, kMaxContext}});
    verify->ArgsProduct({{model}, {tp}, {1, 8}, {8, 16}, {kMaxContext}});
    StepTimed(decode);
    StepTimed(verify);
  }
  return true;
}();

}  // namespace
}  // namespace eagle3::bench

int main(int argc, char** argv) { return eagle3::bench::Main(argc, argv); }
