// SpeculativeDecoder: the reference composition of one decode loop (docs/architecture.md), written so that an
// engine can copy it: prefill, then repeat {draft tree -> tree-masked target forward with taps ->
// verify -> commit}. One object drives one TP rank; with tp > 1 every rank runs its own decoder on the
// same inputs (all decisions depend only on logits, which are identical on every rank).
//
// KV bookkeeping per sequence: the target cache holds every emitted token except the newest (the
// next tree root); the draft cache holds one row per target position p < target cache length
// (target hidden at p with the token at p + 1). Tree steps append draft rows beyond that and are
// dropped after verification; the accepted path is re-run through the draft from the target's
// hidden states, exactly as at prefill.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "eagle3/backend.h"
#include "eagle3/draft_model.h"
#include "eagle3/draft_tree.h"
#include "eagle3/export.h"
#include "eagle3/step_launcher.h"
#include "eagle3/target_model.h"
#include "eagle3/tree_verifier.h"

namespace eagle3 {

class SpeculativeStep;

// The draft side of the loop. Eagle3Drafter runs a DraftModel; tests plug in other drafters.
class EAGLE3_API Drafter {
 public:
  virtual ~Drafter() = default;
  virtual int64_t draft_vocab() const = 0;
  virtual std::span<const int64_t> d2t() const = 0;  // draft id -> target id offsets (empty: identity)
  // The target boundaries the drafter reads (nullptr: none).
  virtual const HiddenStateTap* tap() const = 0;

  // Starts sequence `seq` over again (a new prompt).
  virtual absl::Status Reset(int seq) = 0;
  // Appends committed rows after a target pass: row i pairs aux[i] (the tapped target states at
  // position first_position + i) with tokens[i] (the token at first_position + i + 1). Writes the
  // drafter's logits for the token after the last row into root_logits ([draft_vocab], f32, host).
  //   aux: [n, tap()->width()], f32, host
  virtual absl::Status Extend(int seq, int64_t first_position, std::span<const int64_t> tokens,
                              const TensorView& aux, const TensorView& root_logits) = 0;
  // One tree step for `seq` (see DraftExpandFn); the root's expansion uses the logits of the last
  // Extend. Tree rows are dropped by the next Extend.
  virtual absl::Status Expand(int seq, std::span<const DraftCandidate> candidates,
                              std::span<const int32_t> frontier, const TensorView& logits) = 0;
};

// One row of a speculation schedule: while at most `max_batch` sequences are active, decode steps
// draft `tree`, or nothing when `speculate` is false (plain decoding through the same step, with
// the draft kept in sync so that drafting can resume when the batch shrinks).
struct SpeculationScheduleEntry {
  int max_batch = 1;
  bool speculate = true;
  DraftTreeParams tree;
  // Switch-off by measured acceptance (0 = never): while this row drafts and the mean accepted
  // length (bonus token included, over every sequence) of the last DecodeOptions::acceptance_window
  // drafting steps is below min_accept_len, the next acceptance_pause steps draft nothing; drafting
  // then resumes and is measured afresh. Where speculation stops paying depends on the model, the
  // tree and the batch (docs/speculative_step.md lists break-even lengths measured on an H200).
  double min_accept_len = 0;
};

// A two-row schedule: `tree` while at most `max_speculative_batch` sequences are active, nothing
// drafted above (the draft kept in sync).
EAGLE3_API std::vector<SpeculationScheduleEntry> SpeculateUpToBatch(const DraftTreeParams& tree,
                                                                   int max_speculative_batch);

struct DecodeOptions {
  int max_new_tokens = 64;
  std::vector<int64_t> eos_token_ids;  // stop after emitting one of these
  DraftTreeParams tree;                // topk 1 = chain
  // The device step's schedule by the number of active sequences: the first row whose max_batch
  // covers it, else the last row. Empty: every step drafts `tree`. The host reference loop ignores
  // it (always `tree`).
  std::vector<SpeculationScheduleEntry> schedule;
  // The switch-off by acceptance of schedule rows with min_accept_len > 0: the drafting steps it
  // averages over, and the steps it then drafts nothing.
  int acceptance_window = 8;
  int acceptance_pause = 32;
  SamplingParams sampling;             // temperature 0 = greedy
  uint64_t seed = 0;
  // Called after every decode step with the tokens generated so far over all sequences and the
  // most there can be (for progress display); may be empty.
  std::function<void(int64_t generated, int64_t limit)> progress;
  // How steps are enqueued: null runs them eagerly; a cuda::GraphStepLauncher replays CUDA graphs
  // (of target steps in the host reference loop, of whole speculative steps on the device step).
  // Must outlive Generate.
  StepLauncher* target_launcher = nullptr;
};

struct DecodeStats {
  int64_t generated_tokens = 0;
  int64_t target_passes = 0;   // forwards of the target after prefill
  int64_t draft_passes = 0;    // drafter Extend + Expand calls
  // Per verify pass of a sequence: tokens emitted (accepted + the bonus).
  double mean_accepted_length = 0;
  // acceptance_by_depth[d] = fraction of verify passes that accepted at least d + 1 drafted tokens.
  std::vector<double> acceptance_by_depth;
  std::vector<int64_t> accepted_histogram;  // [a] = verify passes that accepted a drafted tokens
  // Host-side phase times of the reference loop (the device step runs its phases as one unit and
  // reports only total_seconds and prefill_seconds).
  double target_seconds = 0, draft_seconds = 0, verify_seconds = 0, total_seconds = 0;
  // Wall time, on the host, from the start of Generate until every prompt is prefilled and has its
  // first token (argument checks and step setup included); total_seconds - prefill_seconds is the
  // decode part. Both loops read the clock where the host already waits for the prefills' first
  // tokens, so measuring it adds no synchronization (host_syncs is unchanged).
  double prefill_seconds = 0;
  // Device step only: its decode steps (prefills excluded), the host synchronizations and the bytes
  // copied to the host over those steps.
  int64_t device_steps = 0, host_syncs = 0, device_to_host_bytes = 0;
  // Device steps that drafted nothing (a schedule row with speculate false); they count as target
  // passes but not as verify passes of the acceptance figures.
  int64_t undrafted_steps = 0;
  // Times the switch-off by acceptance paused drafting (its steps count in undrafted_steps).
  int64_t acceptance_pauses = 0;
  double tokens_per_second() const { return total_seconds > 0 ? generated_tokens / total_seconds : 0; }
};

class EAGLE3_API SpeculativeDecoder {
 public:
  // The host reference loop over any Drafter: trees built and verified on the host one sequence at
  // a time, logits and taps brought to the host every step. `drafter` null: plain decoding. Both
  // must outlive the decoder. The target's page pool is split evenly between sequences.
  SpeculativeDecoder(TargetModel* target, Drafter* drafter, const DecodeOptions& options);
  // The product loop: every decode step is one SpeculativeStep (eagle3/speculative_step.h) on
  // `backend`, the device the models run on; `draft` null: plain decoding through the same step.
  // The target's and the draft's page pools are split evenly between sequences.
  SpeculativeDecoder(TargetModel* target, DraftModel* draft, Backend* backend, const DecodeOptions& options);
  ~SpeculativeDecoder();

  // Generates for every prompt (a batch decoded together) and returns the generated ids only.
  absl::StatusOr<std::vector<std::vector<int64_t>>> Generate(std::span<const std::vector<int64_t>> prompts,
                                                             DecodeStats* stats = nullptr);

 private:
  absl::StatusOr<std::vector<std::vector<int64_t>>> GenerateOnHost(std::span<const std::vector<int64_t>> prompts,
                                                                   DecodeStats& stats);
  absl::StatusOr<std::vector<std::vector<int64_t>>> GenerateOnDevice(std::span<const std::vector<int64_t>> prompts,
                                                                     DecodeStats& stats);

  TargetModel* target_;
  Drafter* drafter_ = nullptr;
  DraftModel* draft_ = nullptr;
  Backend* backend_ = nullptr;  // set: the device step
  DecodeOptions options_;
  // The device step, kept between Generate calls (its buffers and captured graphs are reused) while
  // batches fit its max_batch.
  std::unique_ptr<SpeculativeStep> step_;
};

}  // namespace eagle3
