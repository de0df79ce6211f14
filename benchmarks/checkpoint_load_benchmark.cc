// Loading time of the quantized TP8 ranks, per tensor: a Kimi-K2 INT4 and a DeepSeek-V3 FP8
// checkpoint at the real widths (hidden 7168, moe_intermediate 2048), cut to two layers (one dense
// MLP, one MoE) and `kExperts` routed experts, written once as sparse files (sparse_checkpoint.h;
// every matrix a hole, as on the GPU host). Each model is read two ways:
//  - tp8: rank 0 of 8 of the full widths, as an engine loads a real checkpoint (the routed experts'
//    down_proj and its scales are column slices of [7168, 2048]);
//  - tp1: the per-rank widths (moe_intermediate 256, ...) at TP 1, the form decode_step_benchmark
//    loads on the GPU host (down_proj [7168, 256], whole rows of a column-split weight).
// Benchmarks (<threads>: CheckpointReadOptions::threads, 1 or 0 = the default; the label names the
// count):
//   BM_ExpertReads/<model>/<form>/<split>/<cold>/<threads>: ReadQuantizedShard of every routed expert weight of
//     the MoE layer whose split is rows (gate_proj, up_proj) or columns (down_proj). Counters:
//     per_tensor (seconds of wall time per tensor) and floor_us (the bytes a tensor's read returns,
//     copied at the rate large preads of the warm file reach, measured in the same run). cold 1
//     evicts the file from the page cache before each pass (posix_fadvise DONTNEED), so the pass
//     reads, and for a sparse file zero-fills, every page anew.
//   BM_ExpertLoads/<model>/<form>/<split>/<threads>: the same weights through LoadLinearWeight on the CPU
//     backend, kept quantized (what TargetModel::Create runs per weight: the read, the INT4 scales'
//     bf16 check and conversion); warm; the same counters.
//   BM_TargetCreate/<model>/<form>/<threads>: TargetModel::Create on the CPU backend, weights kept quantized;
//     counters from TargetModel::load_stats() (seconds) and ms_per_tensor = read_s / tensors.
// Every benchmark also counts cores: the process's CPU time over the wall time of its loop, which
// says whether the read threads had cores to run on (on a shared machine they may not).
// model: 0 = k2-int4, 1 = v3-fp8. form: 0 = tp8, 1 = tp1. split: 0 = rows, 1 = columns.
// Checkpoints go to $EAGLE3_BENCH_CKPT_DIR (default /tmp/eagle3-bench-ckpt): sparse files of a few
// gigabytes, next to nothing on disk.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "eagle3/checkpoint.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/in_process_group.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "linear_weight.h"
#include "sparse_checkpoint.h"

namespace eagle3::bench {
namespace {

constexpr int64_t kExperts = 32;

// Published config.json fields of Kimi-K2-Thinking (compressed-tensors INT4) and DeepSeek-V3 (FP8):
// those they share, then each one's own. Config() adds the cut layer and expert counts and the
// widths that TP splits.
constexpr const char* kSharedFields = R"("architectures": ["DeepseekV3ForCausalLM"], "hidden_act": "silu",
 "hidden_size": 7168, "kv_lora_rank": 512, "moe_layer_freq": 1, "n_shared_experts": 1, "norm_topk_prob": true,
 "num_experts_per_tok": 8, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
 "rms_norm_eps": 1e-06, "scoring_func": "sigmoid", "tie_word_embeddings": false, "topk_method": "noaux_tc",
 "v_head_dim": 128)";
constexpr const char* kK2Fields = R"("model_type": "kimi_k2", "max_position_embeddings": 262144, "n_group": 1,
 "topk_group": 1, "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0,
 "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"}, "rope_theta": 50000.0,
 "routed_scaling_factor": 2.827,
 "quantization_config": {"config_groups": {"group_0": {"input_activations": null, "output_activations": null,
 "targets": ["Linear"], "weights": {"actorder": null, "block_structure": null, "dynamic": false,
 "group_size": 32, "num_bits": 4, "observer": "minmax", "observer_kwargs": {}, "strategy": "group",
 "symmetric": true, "type": "int"}}}, "format": "pack-quantized", "ignore": ["lm_head",
 "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
 "kv_cache_scheme": null, "quant_method": "compressed-tensors", "quantization_status": "compressed"})";
constexpr const char* kV3Fields = R"("model_type": "deepseek_v3", "max_position_embeddings": 163840, "n_group": 8,
 "topk_group": 4, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
 "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"}, "rope_theta": 10000,
 "routed_scaling_factor": 2.5,
 "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
 "weight_block_size": [128, 128]})";

constexpr const char* kModelNames[] = {"k2-int4", "v3-fp8"};
constexpr const char* kFormNames[] = {"tp8", "tp1"};
constexpr int kTpOfForm[] = {8, 1};

// The config.json of `model` in `form`: tp8 the full widths, tp1 a TP 8 rank's widths.
std::string Config(int model, int form) {
  const int64_t div = form == 0 ? 1 : 8;
  const int64_t heads = (model == 0 ? 64 : 128) / div;
  const int64_t vocab = (model == 0 ? 163840 : 129280) / div;
  return "{" + std::string(kSharedFields) + ", " + (model == 0 ? kK2Fields : kV3Fields) +
         ", \"num_hidden_layers\": 2, \"first_k_dense_replace\": 1, \"n_routed_experts\": " +
         std::to_string(kExperts) + ", \"num_attention_heads\": " + std::to_string(heads) +
         ", \"num_key_value_heads\": " + std::to_string(heads) +
         ", \"intermediate_size\": " + std::to_string(18432 / div) +
         ", \"moe_intermediate_size\": " + std::to_string(2048 / div) + ", \"vocab_size\": " + std::to_string(vocab) +
         "}";
}

struct Model {
  DeepseekV2Config config;
  std::string dir;
  std::vector<WeightSpec> specs;
  std::vector<StoredForm> forms;
};

// The checkpoint of `model` in `form`, written on first use.
absl::StatusOr<Model*> Get(int model, int form) {
  static std::map<int, std::unique_ptr<Model>> models;
  std::unique_ptr<Model>& m = models[model * 2 + form];
  if (m != nullptr) return m.get();
  auto loaded = std::make_unique<Model>();
  const std::string json = Config(model, form);
  EAGLE3_ASSIGN_OR_RETURN(loaded->config, DeepseekV2Config::FromJson(json, kModelNames[model]));
  loaded->dir = BenchCheckpointRoot() + "/load-" + kModelNames[model] + "-" + kFormNames[form] + "-sparse";
  loaded->specs = DeepseekV2Weights(loaded->config);
  loaded->forms = StoredForms(loaded->config, loaded->specs);
  EAGLE3_RETURN_IF_ERROR(WriteSparseCheckpoint(
      loaded->dir, json, SparseTensorsOf(loaded->config, loaded->specs, [](const std::string&) { return false; })));
  m = std::move(loaded);
  return m.get();
}

// Bytes per second that 1 MiB preads of the checkpoint's first 256 MiB reach once they are in the
// page cache: the copy a read cannot avoid.
double PageCacheBytesPerSecond(const Model& m) {
  constexpr size_t kChunk = size_t{1} << 20, kSpan = size_t{256} << 20;
  const int fd = ::open((m.dir + "/model.safetensors").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  std::vector<char> buffer(kChunk);
  double seconds = 0;
  size_t bytes = 0;
  for (int pass = 0; pass < 2; ++pass) {  // the first fills the page cache
    const auto start = std::chrono::steady_clock::now();
    bytes = 0;
    for (size_t offset = 0; offset < kSpan; offset += kChunk) {
      const ssize_t got = ::pread(fd, buffer.data(), kChunk, static_cast<off_t>(offset));
      if (got <= 0) break;
      bytes += static_cast<size_t>(got);
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  ::close(fd);
  return seconds > 0 ? static_cast<double>(bytes) / seconds : 0;
}

// The process's CPU time (every thread's) over the wall time since construction.
class CoreUse {
 public:
  CoreUse() : wall_(std::chrono::steady_clock::now()), cpu_(CpuSeconds()) {}
  double Cores() const {
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_).count();
    return wall > 0 ? (CpuSeconds() - cpu_) / wall : 0;
  }

 private:
  static double CpuSeconds() {
    struct rusage usage = {};
    ::getrusage(RUSAGE_SELF, &usage);
    auto seconds = [](const struct timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * t.tv_usec; };
    return seconds(usage.ru_utime) + seconds(usage.ru_stime);
  }

  std::chrono::steady_clock::time_point wall_;
  double cpu_;
};

// Drops the checkpoint's pages from the page cache (clean pages only, which these are).
void Evict(const Model& m) {
  const int fd = ::open((m.dir + "/model.safetensors").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// The routed expert weights of the MoE layer split by rows (gate_proj, up_proj) or columns
// (down_proj): positions in m.specs.
std::vector<size_t> ExpertWeights(const Model& m, bool columns) {
  std::vector<size_t> picked;
  for (size_t i = 0; i < m.specs.size(); ++i) {
    const WeightSpec& s = m.specs[i];
    if (m.forms[i] != StoredForm::kPlain && s.name.find(".mlp.experts.") != std::string::npos &&
        (s.split == TpSplit::kColumns) == columns) {
      picked.push_back(i);
    }
  }
  return picked;
}

// Runs `load(m, checkpoint, spec, form, shard)` (returning the bytes it read, or an error) on each
// picked weight per iteration, through a Checkpoint of m opened with `threads` read threads;
// counters as described at the top.
template <typename Load>
void TimeExpertWeights(benchmark::State& state, bool cold, int threads, Load load) {
  const int model = static_cast<int>(state.range(0)), form = static_cast<int>(state.range(1));
  const bool columns = state.range(2) != 0;
  absl::StatusOr<Model*> got = Get(model, form);
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint =
      got.ok() ? Checkpoint::Open((*got)->dir, {.threads = threads}) : got.status();
  if (!checkpoint.ok()) {
    state.SkipWithError(std::string(checkpoint.status().message()).c_str());
    return;
  }
  const Model& m = **got;
  const std::vector<size_t> picked = ExpertWeights(m, columns);
  const double copy_rate = PageCacheBytesPerSecond(m);
  int64_t tensors = 0, bytes = 0;
  const CoreUse cores;
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      Evict(m);
      state.ResumeTiming();
    }
    for (size_t i : picked) {
      const WeightSpec& s = m.specs[i];
      absl::StatusOr<size_t> read = load(m, **checkpoint, s, m.forms[i], s.ForRank(kTpOfForm[form], 0));
      if (!read.ok()) {
        state.SkipWithError(std::string(read.status().message()).c_str());
        return;
      }
      bytes += static_cast<int64_t>(*read);
    }
    tensors += static_cast<int64_t>(picked.size());
  }
  state.SetBytesProcessed(bytes);
  state.SetLabel(std::string(kModelNames[model]) + " " + kFormNames[form] + (columns ? " columns" : " rows") +
                 (cold ? " cold" : " warm") + " threads " + std::to_string((*checkpoint)->read_threads()));
  state.counters["per_tensor"] =
      benchmark::Counter(static_cast<double>(tensors), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  if (tensors > 0 && copy_rate > 0) {
    state.counters["floor_us"] = 1e6 * static_cast<double>(bytes) / static_cast<double>(tensors) / copy_rate;
  }
  state.counters["cores"] = cores.Cores();
}

void BM_ExpertReads(benchmark::State& state) {
  TimeExpertWeights(state, state.range(3) != 0, static_cast<int>(state.range(4)),
                    [](const Model& m, const Checkpoint& checkpoint, const WeightSpec& s, StoredForm form,
                       const ShardSpec& shard) -> absl::StatusOr<size_t> {
                      EAGLE3_ASSIGN_OR_RETURN(QuantizedShard read, ReadQuantizedShard(checkpoint, s, form,
                                                                                      m.config.quantization, shard));
                      benchmark::DoNotOptimize(read.codes.data());
                      return read.codes.nbytes() + read.scales.nbytes();
                    });
}

void BM_ExpertLoads(benchmark::State& state) {
  cpu::CpuBackend backend;
  LinearWeightLoad options;
  options.keep_quantized = true;
  TimeExpertWeights(state, /*cold=*/false, static_cast<int>(state.range(3)),
                    [&](const Model& m, const Checkpoint& checkpoint, const WeightSpec& s, StoredForm form,
                        const ShardSpec& shard) -> absl::StatusOr<size_t> {
                      EAGLE3_ASSIGN_OR_RETURN(LinearWeight w, LoadLinearWeight(backend, checkpoint, s, form,
                                                                               m.config.quantization, shard, options));
                      return w.bytes();
                    });
}

void BM_TargetCreate(benchmark::State& state) {
  const int model = static_cast<int>(state.range(0)), form = static_cast<int>(state.range(1));
  absl::StatusOr<Model*> got = Get(model, form);
  if (!got.ok()) {
    state.SkipWithError(std::string(got.status().message()).c_str());
    return;
  }
  const Model& m = **got;
  const int tp = kTpOfForm[form];
  cpu::CpuBackend backend;
  // Create runs no collective; the group only gives the options a communicator of the right size.
  absl::StatusOr<std::shared_ptr<InProcessGroup>> group = InProcessGroup::Create(tp);
  absl::StatusOr<std::unique_ptr<Communicator>> comm = group.ok() ? (*group)->Rank(0) : group.status();
  if (!comm.ok()) {
    state.SkipWithError(std::string(comm.status().message()).c_str());
    return;
  }
  TargetModelOptions o;
  o.tp_size = tp;
  o.max_tokens_per_forward = 16;
  o.max_context_len = 256;
  o.num_kv_pages = 8;
  o.keep_quantized = true;
  o.read_threads = static_cast<int>(state.range(2));
  WeightLoadStats sum;
  const CoreUse cores;
  for (auto _ : state) {
    absl::StatusOr<std::unique_ptr<TargetModel>> target =
        TargetModel::Create(m.dir, o, tp > 1 ? comm->get() : nullptr, &backend);
    if (!target.ok()) {
      state.SkipWithError(std::string(target.status().message()).c_str());
      return;
    }
    const WeightLoadStats& s = (*target)->load_stats();
    sum.tensors += s.tensors;
    sum.check_seconds += s.check_seconds;
    sum.read_seconds += s.read_seconds;
    sum.total_seconds += s.total_seconds;
  }
  const double n = static_cast<double>(state.iterations());
  state.SetLabel(std::string(kModelNames[model]) + " " + kFormNames[form] + " threads " +
                 std::to_string(o.read_threads == 0 ? DefaultCheckpointReadThreads() : o.read_threads));
  state.counters["tensors"] = static_cast<double>(sum.tensors) / n;
  state.counters["check_s"] = sum.check_seconds / n;
  state.counters["read_s"] = sum.read_seconds / n;
  state.counters["total_s"] = sum.total_seconds / n;
  state.counters["ms_per_tensor"] = sum.tensors > 0 ? 1e3 * sum.read_seconds / static_cast<double>(sum.tensors) : 0;
  state.counters["cores"] = cores.Cores();
}

BENCHMARK(BM_ExpertReads)
    ->ArgNames({"model", "form", "split", "cold", "threads"})
    ->ArgsProduct({{0, 1}, {0, 1}, {0, 1}, {0, 1}, {1, 0}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ExpertLoads)
    ->ArgNames({"model", "form", "split", "threads"})
    ->ArgsProduct({{0, 1}, {0, 1}, {0, 1}, {1, 0}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TargetCreate)
    ->ArgNames({"model", "form", "threads"})
    ->ArgsProduct({{0, 1}, {0, 1}, {1, 0}})
    ->UseRealTime()
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace eagle3::bench

BENCHMARK_MAIN();
