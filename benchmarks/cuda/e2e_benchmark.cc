// End-to-end speculative decoding at the DeepSeek-V2-Lite shape (TP 1, all 27 layers), plain vs
// speculative, through SpeculativeStep as eagle3-decode runs it (one CUDA graph per step, one host
// synchronization per step), with synthetic acceptance (src/synthetic_acceptance.h): the real
// EAGLE-3 head drafts every tree, then each tree's best path is rewritten to the target's own greedy
// continuation for a number of tokens drawn to give the chosen mean accepted length, so every kernel
// runs on its real shapes while the acceptance is fixed.
//
//   BM_Plain/batch/draft              plain decoding: SpeculativeStep without a draft (draft 0), or
//                                     with the draft kept in sync by steps that draft nothing (1:
//                                     what a schedule's off rows cost; speedup = BM_Plain/batch/0's
//                                     us_per_token over this row's)
//   BM_Speculative/batch/tree/accept  drafting trees[tree] (0: topk 4, 3 steps, 8 nodes, the
//                                     library's default; 1: a chain of 4 drafted tokens) with the
//                                     synthetic mean accepted length accept / 10 (bonus included)
//
// Each Google Benchmark iteration is one step (Run) timed with CUDA events from before its host
// staging to its results on the host; a repetition prefills `batch` prompts of kPrompt random
// tokens, runs warm-up steps (the first runs eagerly, the second is captured), then the timed steps.
// Counters: us = one step; us_per_token = a sequence's time per emitted token; tok/s = the batch's
// tokens per second; on BM_Plain also decode_us (below) and step_over_decode = us / decode_us; on
// BM_Speculative also accept_len (measured, bonus included), speedup (the
// BM_Plain us_per_token of the same batch over this row's), and beside it the bound of the issue:
// verify_us and decode_us (the target's tree-masked verify forward over batch x nodes with taps, and
// its one-token decode forward, each alone from a CUDA graph at the same context), step_over_verify
// = us / verify_us (the overhead around the target), bound = accept_len x decode_us / verify_us.
// mismatches counts emitted tokens that differ from plain greedy decoding (must be 0).
//
// Weights: the sparse V2-Lite checkpoint (sparse_checkpoint.h) with a random lm_head (the greedy
// continuation of a token is then a function of the token: the final hidden state is its
// embedding), and an EAGLE-3 head of hidden 2048, 16 heads / 4 KV heads of 128, MLP 6144, draft
// vocabulary 32000, taps {2, 13, 24}, random weights (bf16) whose final norm is scaled by 64 so that
// its distributions are peaked like a trained head's and its trees have the depth a good head
// drafts. EAGLE3_BENCH_KV_CACHE=bf16 stores the target's latent cache in bf16.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "bench_util.h"
#include "e2e_common.h"
#include "eagle3/cuda/cuda_graph.h"
#include "eagle3/cuda/graph_step_launcher.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/draft_model.h"
#include "eagle3/draft_tree.h"
#include "eagle3/speculative_step.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "sparse_checkpoint.h"

namespace eagle3::bench {
namespace {

constexpr int64_t kPrompt = kE2ePrompt;
constexpr int64_t kMaxBatch = kE2eMaxBatch;
constexpr int kWarmupSteps = kE2eWarmupSteps;
constexpr int kPlainSteps = kE2ePlainSteps;
constexpr int kSpecSteps = kE2eSpecSteps;
constexpr int64_t kReferenceSteps = kE2eReferenceSteps;
const std::vector<DraftTreeParams>& Trees() { return E2eTrees(); }

bool KvCacheBf16() {
  const char* s = std::getenv("EAGLE3_BENCH_KV_CACHE");
  return s != nullptr && std::string(s) == "bf16";
}

struct Models {
  DeepseekV2Config config;
  std::unique_ptr<TargetModel> target;
  std::unique_ptr<DraftModel> draft;
  std::vector<std::vector<int32_t>> pages;  // per sequence: the same page ids in both caches
  std::vector<std::vector<int64_t>> prompts;
  absl::Status status;
};

Models& Get() {
  static Models m = [] {
    Models m;
    const auto start = std::chrono::steady_clock::now();
    auto load = [&]() -> absl::Status {
      EAGLE3_ASSIGN_OR_RETURN(m.config, DeepseekV2Config::FromJson(kV2LiteConfig, "DeepSeek-V2-Lite config"));
      const std::string target_dir = BenchCheckpointRoot() + "/v2lite-tp1-sparse-lm";
      const std::string draft_dir = BenchCheckpointRoot() + "/v2lite-eagle3";
      EAGLE3_RETURN_IF_ERROR(EnsureSparseCheckpoint(target_dir, kV2LiteConfig, m.config, /*random_lm_head=*/true));
      EAGLE3_RETURN_IF_ERROR(EnsureE2eDraft(draft_dir, m.config, /*kv_heads=*/4));
      TargetModelOptions t = E2eModelOptions(TargetModelOptions{});
      if (KvCacheBf16()) t.kv_cache_dtype = DType::kBF16;
      EAGLE3_ASSIGN_OR_RETURN(m.target, TargetModel::Create(target_dir, t, nullptr, Backend()));
      const DraftModelOptions d = E2eModelOptions(DraftModelOptions{});
      EAGLE3_ASSIGN_OR_RETURN(m.draft, DraftModel::Create(draft_dir, target_dir, d, nullptr, Backend()));
      m.pages = SequencePages(kMaxBatch, kE2ePagesPerSeq);
      m.prompts = E2ePrompts(m.config.vocab_size);
      return absl::OkStatus();
    };
    m.status = load();
    std::fprintf(stderr, "e2e_benchmark: models %s in %.1f s\n", m.status.ok() ? "loaded" : "failed",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return m;
  }();
  return m;
}

// What the timed steps of one repetition took and emitted.
struct TimedRun {
  double seconds = 0;
  int64_t tokens = 0, steps = 0;
};

// Prefills `b`, runs the warm-up steps, then one timed step per Google Benchmark iteration (CUDA
// events from before its host staging to its results on the host). False (the benchmark skipped
// with the error) on a failed step.
bool RunTimedSteps(benchmark::State& state, SpeculativeStep& step, Models& m, int64_t batch, int tree, E2eBatch& b,
                   TimedRun* run) {
  if (!Check(state, b.Prefill(step, m.pages, m.prompts, batch), "prefill")) return false;
  for (int i = 0; i < kWarmupSteps; ++i) {
    if (!Check(state, b.Step(step, m.pages, tree).status(), "warm-up step")) return false;
  }
  for (auto _ : state) {
    absl::StatusOr<int64_t> emitted = 0;
    const double t = TimeOnce(Backend()->stream(), [&] { emitted = b.Step(step, m.pages, tree); });
    if (!Check(state, emitted.status(), "step")) return false;
    state.SetIterationTime(t);
    run->seconds += t;
    run->tokens += *emitted;
    run->steps += 1;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<SpeculativeStep>> MakeStep(Models& m, bool with_draft, int64_t batch,
                                                          cuda::GraphStepLauncher* launcher) {
  return MakeE2eStep(m.target.get(), with_draft ? m.draft.get() : nullptr, Backend(), batch, launcher);
}

// Plain greedy decoding of the batch's prompts, kReferenceSteps tokens each, once per batch size: the
// continuation synthetic acceptance drafts, and what speculative decoding must emit.
absl::StatusOr<const std::vector<std::vector<int64_t>>*> Reference(Models& m, int64_t batch) {
  static std::map<int64_t, std::vector<std::vector<int64_t>>> cache;
  auto it = cache.find(batch);
  if (it != cache.end()) return &it->second;
  cuda::GraphStepLauncher launcher(Backend()->stream());
  EAGLE3_ASSIGN_OR_RETURN(auto step, MakeStep(m, false, batch, &launcher));
  E2eBatch b;
  EAGLE3_RETURN_IF_ERROR(b.Prefill(*step, m.pages, m.prompts, batch));
  for (int64_t s = 0; s < kReferenceSteps; ++s) EAGLE3_RETURN_IF_ERROR(b.Step(*step, m.pages, kNoDraftTokens).status());
  return &(cache[batch] = std::move(b.tokens));
}

// BM_Plain's us_per_token of each repetition, by batch size.
std::map<int64_t, std::vector<double>>& PlainUsPerToken() {
  static std::map<int64_t, std::vector<double>> plain;
  return plain;
}

// The target forward alone (tree-masked over `nodes` per sequence with the draft's taps, or one
// token per sequence when nodes is 1), staged once, captured in a CUDA graph, median of replays.
absl::StatusOr<double> TargetForwardSeconds(Models& m, int64_t batch, int64_t nodes, int64_t context) {
  // A chain of depth 3 from the root, then the rest under the root: the shape a peaked head's trees
  // have; every sequence's tokens drawn at random (each sequence, and a tree's rejected nodes, route
  // to their own experts).
  std::vector<int32_t> parents(static_cast<size_t>(nodes), -1);
  for (int64_t i = 1; i < nodes; ++i) parents[static_cast<size_t>(i)] = i <= 3 ? static_cast<int32_t>(i - 1) : 0;
  std::mt19937_64 rng(static_cast<uint64_t>(batch * 131 + nodes));
  std::uniform_int_distribution<int64_t> token(0, m.config.vocab_size - 1);
  std::vector<std::vector<int64_t>> tokens(static_cast<size_t>(batch), std::vector<int64_t>(static_cast<size_t>(nodes)));
  for (auto& seq : tokens) {
    for (int64_t& t : seq) t = token(rng);
  }
  EAGLE3_ASSIGN_OR_RETURN(DraftTree tree, DraftTree::FromParents(tokens[0], parents));
  const std::vector<int64_t> positions = tree.Positions(context);
  const std::vector<uint8_t> mask = nodes > 1 ? tree.DenseMask() : std::vector<uint8_t>();
  std::vector<SequenceInput> inputs;
  for (int64_t b = 0; b < batch; ++b) {
    inputs.push_back(SequenceInput{tokens[static_cast<size_t>(b)], positions, m.pages[static_cast<size_t>(b)], context,
                                   mask, nodes > 1});
  }
  const int64_t rows = nodes > 1 ? batch * nodes : batch;
  EAGLE3_ASSIGN_OR_RETURN(Tensor logits, Tensor::Empty(DType::kF32, Shape{rows, m.config.vocab_size},
                                                       Backend()->allocator()));
  TargetStepIO io;
  io.logits = logits.view();
  Tensor aux;
  const HiddenStateTap* tap = nullptr;
  if (nodes > 1) {
    tap = &m.draft->tap();
    EAGLE3_ASSIGN_OR_RETURN(aux, Tensor::Empty(DType::kF32, Shape{rows, tap->width()}, Backend()->allocator()));
    io.aux = aux.view();
  }
  EAGLE3_RETURN_IF_ERROR(m.target->Stage(inputs, tap, io));
  EAGLE3_RETURN_IF_ERROR(m.target->Launch());  // eager first: sizes the backend's scratch
  EAGLE3_RETURN_IF_ERROR(m.target->Stage(inputs, tap, io));
  EAGLE3_ASSIGN_OR_RETURN(auto graph, cuda::CudaGraph::Capture(Backend()->stream(), [&] { return m.target->Launch(); }));
  const double seconds = TimeMedian(Backend()->stream(), 20, 3, [&] { (void)graph->Launch(Backend()->stream()); });
  EAGLE3_RETURN_IF_ERROR(m.target->Finish(TensorView()));
  return seconds;
}

void BM_Plain(benchmark::State& state) {
  if (Backend() == nullptr) return state.SkipWithError("no CUDA device");
  const int64_t batch = state.range(0);
  const bool with_draft = state.range(1) != 0;
  Models& m = Get();
  if (!Check(state, m.status, "setup")) return;
  cuda::GraphStepLauncher launcher(Backend()->stream());
  auto step = MakeStep(m, with_draft, batch, &launcher);
  if (!Check(state, step.status(), "SpeculativeStep::Create")) return;
  E2eBatch b;
  TimedRun run;
  if (!RunTimedSteps(state, **step, m, batch, kNoDraftTokens, b, &run)) return;
  const double seconds = run.seconds;
  const int64_t tokens = run.tokens;
  const double us_per_token = seconds * 1e6 * static_cast<double>(batch) / static_cast<double>(tokens);
  if (!with_draft) PlainUsPerToken()[batch].push_back(us_per_token);
  auto plain = PlainUsPerToken().find(batch);
  if (with_draft && plain != PlainUsPerToken().end()) state.counters["speedup"] = Median(plain->second) / us_per_token;
  auto decode = TargetForwardSeconds(m, batch, 1, kPrompt + 1 + kWarmupSteps + kPlainSteps / 2);
  if (!Check(state, decode.status(), "decode forward alone")) return;
  state.counters["decode_us"] = *decode * 1e6;
  state.counters["step_over_decode"] = seconds / static_cast<double>(kPlainSteps) / *decode;
  state.counters["us_per_token"] = us_per_token;
  state.counters["tok/s"] = static_cast<double>(tokens) / seconds;
  state.counters["batch"] = static_cast<double>(batch);
}

void BM_Speculative(benchmark::State& state) {
  if (Backend() == nullptr) return state.SkipWithError("no CUDA device");
  const int64_t batch = state.range(0);
  const int tree = static_cast<int>(state.range(1));
  const double mean_accepted = static_cast<double>(state.range(2)) / 10.0;
  Models& m = Get();
  if (!Check(state, m.status, "setup")) return;
  const DraftTreeParams& shape = Trees()[static_cast<size_t>(tree)];
  auto reference = Reference(m, batch);
  if (!Check(state, reference.status(), "reference run")) return;
  const int64_t reference_len = kPrompt + 1 + kReferenceSteps;

  // The target forwards alone, at the context the timed steps reach halfway.
  const int64_t context = kPrompt + 1 + 2 * kSpecSteps;
  auto verify = TargetForwardSeconds(m, batch, shape.num_draft_tokens, context);
  if (!Check(state, verify.status(), "verify forward alone")) return;
  auto decode = TargetForwardSeconds(m, batch, 1, context);
  if (!Check(state, decode.status(), "decode forward alone")) return;

  // The reference and the draw counter on the device, where the captured rewrite reads them.
  auto synthetic = SyntheticAcceptance::Create(Backend(), **reference, batch, reference_len);
  if (!Check(state, synthetic.status(), "synthetic acceptance")) return;

  cuda::GraphStepLauncher launcher(Backend()->stream());
  auto step = MakeStep(m, true, batch, &launcher);
  if (!Check(state, step.status(), "SpeculativeStep::Create")) return;
  (*synthetic)->Install(**step, Backend()->stream(), mean_accepted, shape, m.config.vocab_size);
  E2eBatch b;
  TimedRun run;
  if (!RunTimedSteps(state, **step, m, batch, tree, b, &run)) return;
  const double seconds = run.seconds;
  const int64_t tokens = run.tokens, steps = run.steps;
  const int64_t mismatches = E2eMismatches(b.tokens, **reference);
  const double us_per_token = seconds * 1e6 * static_cast<double>(batch) / static_cast<double>(tokens);
  const double accept_len = static_cast<double>(tokens) / static_cast<double>(steps * batch);
  const double step_us = seconds * 1e6 / static_cast<double>(steps);
  state.counters["us_per_token"] = us_per_token;
  state.counters["tok/s"] = static_cast<double>(tokens) / seconds;
  state.counters["accept_len"] = accept_len;
  state.counters["verify_us"] = *verify * 1e6;
  state.counters["decode_us"] = *decode * 1e6;
  state.counters["step_over_verify"] = step_us / (*verify * 1e6);
  state.counters["bound"] = accept_len * *decode / *verify;
  auto plain = PlainUsPerToken().find(batch);
  if (plain != PlainUsPerToken().end()) state.counters["speedup"] = Median(plain->second) / us_per_token;
  state.counters["mismatches"] = static_cast<double>(mismatches);
  state.counters["batch"] = static_cast<double>(batch);
  state.counters["nodes"] = static_cast<double>(shape.num_draft_tokens);
}

void Settings(benchmark::internal::Benchmark* b, int steps) {
  b->UseManualTime()->Iterations(steps)->Repetitions(3)->ReportAggregatesOnly(true)->Unit(benchmark::kMicrosecond);
}

// Per batch size: plain first (its us_per_token is the speedups' denominator), then speculative.
[[maybe_unused]] const bool registered = [] {
  for (const int64_t batch : {1, 8, 32}) {
    auto* plain =
        benchmark::RegisterBenchmark("BM_Plain", BM_Plain)->ArgNames({"batch", "draft"})->ArgsProduct({{batch}, {0, 1}});
    Settings(plain, kPlainSteps);
    auto* spec = benchmark::RegisterBenchmark("BM_Speculative", BM_Speculative)
                     ->ArgNames({"batch", "tree", "accept"})
                     ->ArgsProduct({{batch}, {0, 1}, {24, 35}});
    Settings(spec, kSpecSteps);
  }
  return true;
}();

}  // namespace
}  // namespace eagle3::bench

int main(int argc, char** argv) { return eagle3::bench::Main(argc, argv); }
