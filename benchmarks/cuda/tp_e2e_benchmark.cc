// End-to-end speculative decoding at TP N over NCCL, one rank per GPU (N = EAGLE3_BENCH_TP, else
// every visible GPU: 8, 4 or 2; skipped with fewer than 2): e2e_benchmark's DeepSeek-V2-Lite-shaped
// pair, prompts and method (SpeculativeStep, one CUDA graph per step, one host synchronization per
// step, synthetic acceptance: e2e_benchmark.cc's top comment), every rank running its own
// SpeculativeStep over its shard of both models in its own host thread, as `eagle3-decode --tp N
// --comm nccl` does. The draft has 8 KV heads here (4 in e2e_benchmark) so that 8 ranks can shard
// it: compare speedups within this binary's rows.
//
//   BM_TpPlain/tp/batch                    plain decoding: SpeculativeStep without a draft
//   BM_TpSpeculative/tp/batch/tree/accept  drafting E2eTrees()[tree] with the synthetic mean
//                                          accepted length accept / 10 (bonus included)
//
// Each Google Benchmark iteration is one step: the ranks' threads meet at a barrier, then each runs
// its step; rank 0's is timed with CUDA events on its stream from before its host staging to its
// results on the host (the collectives keep the ranks in step, so the slowest rank's time shows).
// Counters: us = one step; us_per_token; tok/s; on BM_TpSpeculative accept_len, speedup (BM_TpPlain's
// us_per_token of the same batch over this row's), mismatches (rank 0's emitted tokens against plain
// greedy decoding: must be 0) and ranks_disagree (sequences where a rank emitted other tokens than
// rank 0: must be 0).
#include <benchmark/benchmark.h>

#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "e2e_common.h"
#include "eagle3/cuda/graph_step_launcher.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/draft_model.h"
#include "eagle3/speculative_step.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "sparse_checkpoint.h"
#include "tp_ranks.h"

namespace eagle3::bench {
namespace {

// Both models on every rank, loaded once per process.
struct Pair {
  DeepseekV2Config config;
  std::unique_ptr<TpRanks> devices;  // before the models: they go first
  std::vector<std::unique_ptr<TargetModel>> targets;
  std::vector<std::unique_ptr<DraftModel>> drafts;
  std::vector<std::vector<int32_t>> pages;
  std::vector<std::vector<int64_t>> prompts;
  absl::Status status;
};

Pair& Get(int tp) {
  static Pair p = [tp] {
    Pair p;
    const auto start = std::chrono::steady_clock::now();
    auto load = [&]() -> absl::Status {
      EAGLE3_ASSIGN_OR_RETURN(p.config, DeepseekV2Config::FromJson(kV2LiteConfig, "DeepSeek-V2-Lite config"));
      const std::string target_dir = BenchCheckpointRoot() + "/v2lite-tp1-sparse-lm";
      const std::string draft_dir = BenchCheckpointRoot() + "/v2lite-eagle3-kv8";
      EAGLE3_RETURN_IF_ERROR(EnsureSparseCheckpoint(target_dir, kV2LiteConfig, p.config, /*random_lm_head=*/true));
      EAGLE3_RETURN_IF_ERROR(EnsureE2eDraft(draft_dir, p.config, /*kv_heads=*/8));
      EAGLE3_ASSIGN_OR_RETURN(p.devices, TpRanks::Create(tp));
      p.targets.resize(static_cast<size_t>(tp));
      p.drafts.resize(static_cast<size_t>(tp));
      EAGLE3_RETURN_IF_ERROR(ForEachRank(tp, [&](int r) -> absl::Status {
        TargetModelOptions t = E2eModelOptions(TargetModelOptions{});
        t.tp_size = tp;
        t.rank = r;
        t.kv_cache_dtype = DType::kBF16;
        DraftModelOptions d = E2eModelOptions(DraftModelOptions{});
        d.tp_size = tp;
        d.rank = r;
        Communicator* comm = p.devices->comms[r].get();
        cuda::CudaBackend* backend = p.devices->backends[r];
        EAGLE3_ASSIGN_OR_RETURN(p.targets[r], TargetModel::Create(target_dir, t, comm, backend));
        EAGLE3_ASSIGN_OR_RETURN(p.drafts[r], DraftModel::Create(draft_dir, target_dir, d, comm, backend));
        return absl::OkStatus();
      }));
      p.pages = SequencePages(kE2eMaxBatch, kE2ePagesPerSeq);
      p.prompts = E2ePrompts(p.config.vocab_size);
      return absl::OkStatus();
    };
    p.status = tp >= 2 ? load() : absl::FailedPreconditionError("needs a GPU per rank, 2 or more");
    std::fprintf(stderr, "tp_e2e_benchmark: models at TP %d %s in %.1f s\n", tp, p.status.ok() ? "loaded" : "failed",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return p;
  }();
  return p;
}

// One rank's side of a run: its step, the launcher that captures it, synthetic acceptance, and the
// batch it advances.
struct RankRun {
  std::unique_ptr<SyntheticAcceptance> synthetic;  // first: outlives the step whose graphs read it
  std::unique_ptr<cuda::GraphStepLauncher> launcher;
  std::unique_ptr<SpeculativeStep> step;
  E2eBatch batch;
};

// Every rank's run, freed in the rank's own thread (its device current, as when it was made).
struct Runs {
  std::vector<RankRun> ranks;
  ~Runs() {
    (void)ForEachRank(static_cast<int>(ranks.size()), [&](int r) {
      ranks[r] = RankRun{};
      return absl::OkStatus();
    });
  }
};

// Every rank's step over the pair (without a draft: plain).
absl::Status MakeRuns(Pair& p, bool with_draft, int64_t batch, Runs* out) {
  const int tp = p.devices->tp;
  std::vector<RankRun>& runs = out->ranks;
  runs.resize(static_cast<size_t>(tp));
  return ForEachRank(tp, [&](int r) -> absl::Status {
    cuda::CudaBackend* backend = p.devices->backends[r];
    runs[r].launcher = std::make_unique<cuda::GraphStepLauncher>(backend->stream());
    EAGLE3_ASSIGN_OR_RETURN(runs[r].step, MakeE2eStep(p.targets[r].get(), with_draft ? p.drafts[r].get() : nullptr,
                                                      backend, batch, runs[r].launcher.get()));
    return absl::OkStatus();
  });
}

absl::Status PrefillAll(Pair& p, std::vector<RankRun>& runs, int64_t batch) {
  return ForEachRank(static_cast<int>(runs.size()), [&](int r) {
    return runs[r].batch.Prefill(*runs[r].step, p.pages, p.prompts, batch);
  });
}

// `steps` untimed steps of every rank.
absl::Status StepAll(Pair& p, std::vector<RankRun>& runs, int tree, int64_t steps) {
  return ForEachRank(static_cast<int>(runs.size()), [&](int r) -> absl::Status {
    for (int64_t s = 0; s < steps; ++s) {
      EAGLE3_RETURN_IF_ERROR(runs[r].batch.Step(*runs[r].step, p.pages, tree).status());
    }
    return absl::OkStatus();
  });
}

// Plain greedy decoding of the batch's prompts, kE2eReferenceSteps tokens each, once per batch size
// (rank 0's; every rank's must equal it).
absl::StatusOr<const std::vector<std::vector<int64_t>>*> Reference(Pair& p, int64_t batch) {
  static std::map<int64_t, std::vector<std::vector<int64_t>>> cache;
  auto it = cache.find(batch);
  if (it != cache.end()) return &it->second;
  Runs made;
  EAGLE3_RETURN_IF_ERROR(MakeRuns(p, false, batch, &made));
  std::vector<RankRun>& runs = made.ranks;
  EAGLE3_RETURN_IF_ERROR(PrefillAll(p, runs, batch));
  EAGLE3_RETURN_IF_ERROR(StepAll(p, runs, kNoDraftTokens, kE2eReferenceSteps));
  for (size_t r = 1; r < runs.size(); ++r) {
    if (runs[r].batch.tokens != runs[0].batch.tokens) {
      return absl::InternalError("plain decoding: rank " + std::to_string(r) + " emitted other tokens than rank 0");
    }
  }
  return &(cache[batch] = std::move(runs[0].batch.tokens));
}

// BM_TpPlain's us_per_token of each repetition, by batch size.
std::map<int64_t, std::vector<double>>& PlainUsPerToken() {
  static std::map<int64_t, std::vector<double>> plain;
  return plain;
}

struct TimedRun {
  double seconds = 0;
  int64_t tokens = 0, steps = 0;
};

// Prefills every rank, runs the warm-up steps (the first eager, the second captured), then one
// timed step per Google Benchmark iteration. False (the benchmark skipped with the error) on a
// failed step.
bool RunTimedSteps(benchmark::State& state, Pair& p, std::vector<RankRun>& runs, int64_t batch, int tree,
                   TimedRun* run) {
  if (!Check(state, PrefillAll(p, runs, batch), "prefill")) return false;
  if (!Check(state, StepAll(p, runs, tree, kE2eWarmupSteps), "warm-up steps")) return false;
  const int tp = static_cast<int>(runs.size());
  for (auto _ : state) {
    std::barrier line(tp);
    double t = 0;
    int64_t emitted = 0;
    const absl::Status st = ForEachRank(tp, [&](int r) -> absl::Status {
      line.arrive_and_wait();
      if (r != 0) return runs[r].batch.Step(*runs[r].step, p.pages, tree).status();
      absl::StatusOr<int64_t> e = 0;
      t = TimeOnce(p.devices->backends[0]->stream(), [&] { e = runs[0].batch.Step(*runs[0].step, p.pages, tree); });
      EAGLE3_RETURN_IF_ERROR(e.status());
      emitted = *e;
      return absl::OkStatus();
    });
    if (!Check(state, st, "step")) return false;
    state.SetIterationTime(t);
    run->seconds += t;
    run->tokens += emitted;
    run->steps += 1;
  }
  return true;
}

// Sequences where some rank emitted other tokens than rank 0.
int64_t RanksDisagree(const std::vector<RankRun>& runs) {
  int64_t differ = 0;
  for (size_t s = 0; s < runs[0].batch.tokens.size(); ++s) {
    for (size_t r = 1; r < runs.size(); ++r) {
      if (runs[r].batch.tokens[s] != runs[0].batch.tokens[s]) {
        ++differ;
        break;
      }
    }
  }
  return differ;
}

void BM_TpPlain(benchmark::State& state) {
  const int tp = static_cast<int>(state.range(0));
  const int64_t batch = state.range(1);
  Pair& p = Get(tp);
  if (!Check(state, p.status, "setup")) return;
  Runs made;
  if (!Check(state, MakeRuns(p, false, batch, &made), "SpeculativeStep::Create")) return;
  std::vector<RankRun>* runs = &made.ranks;
  TimedRun run;
  if (!RunTimedSteps(state, p, *runs, batch, kNoDraftTokens, &run)) return;
  const double us_per_token = run.seconds * 1e6 * static_cast<double>(batch) / static_cast<double>(run.tokens);
  PlainUsPerToken()[batch].push_back(us_per_token);
  state.counters["us"] = run.seconds * 1e6 / static_cast<double>(run.steps);
  state.counters["us_per_token"] = us_per_token;
  state.counters["tok/s"] = static_cast<double>(run.tokens) / run.seconds;
  state.counters["ranks_disagree"] = static_cast<double>(RanksDisagree(*runs));
  state.counters["tp"] = tp;
  state.counters["batch"] = static_cast<double>(batch);
}

void BM_TpSpeculative(benchmark::State& state) {
  const int tp = static_cast<int>(state.range(0));
  const int64_t batch = state.range(1);
  const int tree = static_cast<int>(state.range(2));
  const double mean_accepted = static_cast<double>(state.range(3)) / 10.0;
  Pair& p = Get(tp);
  if (!Check(state, p.status, "setup")) return;
  const DraftTreeParams& shape = E2eTrees()[static_cast<size_t>(tree)];
  auto reference = Reference(p, batch);
  if (!Check(state, reference.status(), "reference run")) return;
  const int64_t reference_len = kE2ePrompt + 1 + kE2eReferenceSteps;
  Runs made;
  if (!Check(state, MakeRuns(p, true, batch, &made), "SpeculativeStep::Create")) return;
  std::vector<RankRun>* runs = &made.ranks;
  // Each rank's rewrite reads its own copy of the reference; the ranks draft the same trees (their
  // draft logits are equal bit for bit), so they rewrite them alike.
  const absl::Status installed = ForEachRank(tp, [&](int r) -> absl::Status {
    cuda::CudaBackend* backend = p.devices->backends[r];
    EAGLE3_ASSIGN_OR_RETURN((*runs)[r].synthetic,
                            SyntheticAcceptance::Create(backend, **reference, batch, reference_len));
    (*runs)[r].synthetic->Install(*(*runs)[r].step, backend->stream(), mean_accepted, shape, p.config.vocab_size);
    return absl::OkStatus();
  });
  if (!Check(state, installed, "synthetic acceptance")) return;
  TimedRun run;
  if (!RunTimedSteps(state, p, *runs, batch, tree, &run)) return;
  const double us_per_token = run.seconds * 1e6 * static_cast<double>(batch) / static_cast<double>(run.tokens);
  state.counters["us"] = run.seconds * 1e6 / static_cast<double>(run.steps);
  state.counters["us_per_token"] = us_per_token;
  state.counters["tok/s"] = static_cast<double>(run.tokens) / run.seconds;
  state.counters["accept_len"] = static_cast<double>(run.tokens) / static_cast<double>(run.steps * batch);
  auto plain = PlainUsPerToken().find(batch);
  if (plain != PlainUsPerToken().end()) state.counters["speedup"] = Median(plain->second) / us_per_token;
  state.counters["mismatches"] = static_cast<double>(E2eMismatches((*runs)[0].batch.tokens, **reference));
  state.counters["ranks_disagree"] = static_cast<double>(RanksDisagree(*runs));
  state.counters["tp"] = tp;
  state.counters["batch"] = static_cast<double>(batch);
  state.counters["nodes"] = static_cast<double>(shape.num_draft_tokens);
}

void Settings(benchmark::internal::Benchmark* b, int steps) {
  b->UseManualTime()->Iterations(steps)->Repetitions(3)->ReportAggregatesOnly(true)->Unit(benchmark::kMicrosecond);
}

// Per batch size: plain first (its us_per_token is the speedups' denominator), then speculative.
[[maybe_unused]] const bool registered = [] {
  const int tp = BenchTpSize();
  for (const int64_t batch : {1, 8}) {
    auto* plain = benchmark::RegisterBenchmark("BM_TpPlain", BM_TpPlain)->ArgNames({"tp", "batch"})->Args({tp, batch});
    Settings(plain, kE2ePlainSteps);
    auto* spec = benchmark::RegisterBenchmark("BM_TpSpeculative", BM_TpSpeculative)
                     ->ArgNames({"tp", "batch", "tree", "accept"})
                     ->ArgsProduct({{tp}, {batch}, {0}, {24, 35}});
    Settings(spec, kE2eSpecSteps);
  }
  return true;
}();

}  // namespace
}  // namespace eagle3::bench

int main(int argc, char** argv) { return eagle3::bench::Main(argc, argv); }
