// SpeculativeStep: one EAGLE-3 speculative decode step for a batch of sequences, kept on the backend's
// device (docs/speculative_step.md).
//
// A step, for B sequences with the tree shape k = topk, S = num_steps, N = num_draft_tokens:
//   1. tree build pass 0 on each sequence's root logits (the draft's distribution after its newest
//      token), then S - 1 batched draft forwards over the k frontier rows of every sequence, each
//      followed by a tree build pass (Backend::TreeBuildStep), then Backend::TreeBuildFinalize;
//   2. one tree-masked target forward over the B x N nodes with the draft's taps;
//   3. Backend::TreeVerify (greedy or lossless sampling), whose accepted counts and tokens are the
//      step's only device -> host transfer;
//   4. the commit of each accepted path's target KV rows (TargetModel::CommitAcceptedOnDevice);
//   5. the draft's catch-up: one draft forward over N rows per sequence pairing the tapped target
//      states of the accepted path (gathered on the device) with the emitted tokens, which writes
//      the path's draft KV rows and leaves the next step's root logits and hidden on the device.
// Logits, taps and hidden states never visit the host. The host stages only what it already knows
// (positions, cache slots, page tables, the roots) in one upload, and waits once, for the results.
// Without a draft, a step is plain decoding through the same code: a root-only tree (N = 1) whose
// verification samples (or takes the argmax of) the target's logits.
//
// KV bookkeeping per sequence (the caller's): the target cache holds every emitted token but the
// newest (`root`), cache_len rows; the draft cache holds one row per target position p < cache_len
// (target hidden at p with the token at p + 1). A step writes tree rows past both lengths; after it
// both lengths grow by the sequence's emitted count.
//
// Not thread-safe; one object per TP rank (every rank runs the same steps on the same inputs).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/draft_model.h"
#include "eagle3/draft_tree.h"
#include "eagle3/export.h"
#include "eagle3/step_launcher.h"
#include "eagle3/target_model.h"
#include "eagle3/tree_verifier.h"

namespace eagle3 {

// Run's tree argument for a step that drafts nothing: plain decoding of the roots through the same
// step, with the draft's catch-up over each emitted token, so that drafting can resume at any step.
inline constexpr int kNoDraftTokens = -1;

struct SpeculativeStepOptions {
  int max_batch = 8;       // sequences per step (rows of the root state)
  // The trees a step may draft (topk 1 = chain); Run's `tree` picks one by index (or
  // kNoDraftTokens). Buffers are sized for the largest. Unused without a draft.
  std::vector<DraftTreeParams> trees = {DraftTreeParams()};
  SamplingParams sampling;  // temperature 0 = greedy
  uint64_t seed = 0;       // Philox key; each Prefill / Run draws the next counter base
  // How a step's device work is enqueued: null = eagerly; a cuda::GraphStepLauncher captures the
  // whole step (draft passes, tree build, verify forward, verification, commit, catch-up) in one
  // CUDA graph per batch size and replays it (StepLauncher::LaunchWork). Prefill runs eagerly. Must
  // outlive the step.
  StepLauncher* launcher = nullptr;
};

// One sequence of a step.
struct StepSequence {
  // Its row in the previous Run (its index there) or the row its Prefill wrote; in this Run it
  // becomes its index in the span. Rows of the previous step that are not listed are dropped.
  int row = 0;
  int64_t root = 0;       // the newest emitted token: the tree's root
  int64_t cache_len = 0;  // target KV rows = draft KV rows: every emitted token but `root`
  std::span<const int32_t> target_pages;  // covers cache_len + N slots
  std::span<const int32_t> draft_pages;   // covers cache_len + max(N, (S - 1) k) slots
};

// What one sequence emitted in a step.
struct StepOutput {
  int num_accepted = 0;         // drafted tokens accepted
  std::vector<int64_t> tokens;  // the accepted tokens, then the bonus / correction token
};

// Per-object counters since Create.
struct StepCounters {
  int64_t steps = 0;              // Run calls that completed
  int64_t host_syncs = 0;         // Backend::Synchronize calls made by Run
  int64_t device_to_host_bytes = 0;  // bytes Run copied to the host
};

class EAGLE3_API SpeculativeStep {
 public:
  // `draft` may be null (plain decoding). Both models must run on `backend` and outlive the step;
  // all buffers are allocated here. InvalidArgument when the tree does not fit the models'
  // max_tokens_per_forward (B * N target rows, B * max(N, k) draft rows), kTreeMaxTopk-style
  // backend limits (TreeBuildWorkspaceBytes 0), or options out of range.
  static absl::StatusOr<std::unique_ptr<SpeculativeStep>> Create(TargetModel* target, DraftModel* draft,
                                                                 Backend* backend,
                                                                 const SpeculativeStepOptions& options);
  ~SpeculativeStep();

  const SpeculativeStepOptions& options() const;
  // Tree nodes per sequence of the largest step (the largest num_draft_tokens, or 1 without a
  // draft): the target KV slots a step may write past cache_len.
  int nodes_per_step() const;
  // Draft KV slots a step may need past cache_len: the largest max(N, (S - 1) k) over the trees (1
  // for a step drafting nothing), or 0 without a draft.
  int64_t draft_slots_per_step() const;

  // Starts a sequence at `row` (< max_batch): the prompt through the target (cache_len 0), the first
  // token sampled on the device from the last row's logits (a root-only tree), and, with a draft,
  // the draft's rows over the prompt, which leave the root state at `row`. Synchronizes once;
  // returns the first token. Afterwards cache_len = prompt.size() and root = the returned token.
  absl::StatusOr<int64_t> Prefill(int row, std::span<const int64_t> prompt, std::span<const int32_t> target_pages,
                                  std::span<const int32_t> draft_pages);

  // One step for `seqs` (1 <= size <= max_batch; rows distinct) drafting options().trees[tree] (or
  // nothing, with kNoDraftTokens; without a draft every step drafts nothing). Fills `out` (one
  // entry per sequence). Everything the host knows is checked before anything is enqueued (InvalidArgument /
  // OutOfRange naming the sequence); data errors found on the device (NaN logits, ...) are
  // InvalidArgument naming the sequence, after the step. Exactly one Synchronize.
  absl::Status Run(std::span<const StepSequence> seqs, std::vector<StepOutput>* out, int tree = 0);

  const StepCounters& counters() const;

  // Restarts the Philox counter at 0 under `seed`: later Prefill / Run calls draw the coins a step
  // created with options.seed = seed would (a decode loop reusing one step, and its captured
  // graphs, for a new generation with a new seed).
  void Reseed(uint64_t seed);

 private:
  friend struct SpeculativeStepTesting;  // benchmark hooks (src/speculative_step_testing.h)
  struct Impl;
  explicit SpeculativeStep(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace eagle3
