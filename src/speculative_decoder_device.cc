// SpeculativeDecoder's product loop: prefill each prompt, then one SpeculativeStep per decode step
// for every unfinished sequence together.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <string>
#include <vector>

#include "decode_tally.h"
#include "eagle3/speculative_decoder.h"
#include "eagle3/speculative_step.h"
#include "eagle3/status.h"

namespace eagle3 {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

struct DeviceSequence {
  std::vector<int64_t> generated;
  std::vector<int32_t> target_pages, draft_pages;
  int64_t cache_len = 0;  // target KV rows = draft KV rows: every emitted token but `root`
  int64_t root = 0;
  int row = 0;            // its row of the step's root state
  bool done = false;
};

// The trees the schedule drafts (distinct, in order of first use) and, per row, the index of its
// tree among them or kNoDraftTokens. An empty schedule drafts `tree` at every batch size.
struct ScheduleTrees {
  std::vector<DraftTreeParams> trees;
  std::vector<int> row_tree;
};

ScheduleTrees ResolveSchedule(const DecodeOptions& options) {
  ScheduleTrees out;
  if (options.schedule.empty()) {
    out.trees = {options.tree};
    out.row_tree = {0};
    return out;
  }
  for (const SpeculationScheduleEntry& e : options.schedule) {
    if (!e.speculate) {
      out.row_tree.push_back(kNoDraftTokens);
      continue;
    }
    auto same = [&](const DraftTreeParams& t) {
      return t.topk == e.tree.topk && t.num_steps == e.tree.num_steps && t.num_draft_tokens == e.tree.num_draft_tokens;
    };
    const auto it = std::find_if(out.trees.begin(), out.trees.end(), same);
    out.row_tree.push_back(static_cast<int>(it - out.trees.begin()));
    if (it == out.trees.end()) out.trees.push_back(e.tree);
  }
  if (out.trees.empty()) out.trees = {options.tree};  // never drafted; sizes the unused buffers
  return out;
}

// The schedule row for `active` sequences: the first whose max_batch covers it, else the last.
size_t ScheduleRow(const DecodeOptions& options, int64_t active) {
  for (size_t i = 0; i < options.schedule.size(); ++i) {
    if (active <= options.schedule[i].max_batch) return i;
  }
  return options.schedule.empty() ? 0 : options.schedule.size() - 1;
}

// The pages of sequence b when `pages` are split evenly between `batch` sequences.
std::vector<int32_t> PageSlice(int64_t pages, int64_t batch, int64_t b) {
  const int64_t per_seq = pages / batch;
  std::vector<int32_t> out(static_cast<size_t>(per_seq));
  for (int64_t p = 0; p < per_seq; ++p) out[static_cast<size_t>(p)] = static_cast<int32_t>(b * per_seq + p);
  return out;
}

}  // namespace

std::vector<SpeculationScheduleEntry> SpeculateUpToBatch(const DraftTreeParams& tree, int max_speculative_batch) {
  SpeculationScheduleEntry on;
  on.max_batch = max_speculative_batch;
  on.tree = tree;
  SpeculationScheduleEntry off;
  off.max_batch = max_speculative_batch + 1;
  off.speculate = false;
  off.tree = tree;
  return {on, off};
}

absl::StatusOr<std::vector<std::vector<int64_t>>> SpeculativeDecoder::GenerateOnDevice(
    std::span<const std::vector<int64_t>> prompts, DecodeStats& st) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const int64_t batch = static_cast<int64_t>(prompts.size());
  if (batch == 0) return std::vector<std::vector<int64_t>>();
  if (options_.max_new_tokens < 1) {
    return absl::InvalidArgumentError("Generate: max_new_tokens must be >= 1, got " +
                                      std::to_string(options_.max_new_tokens));
  }
  for (size_t i = 0; i < options_.schedule.size(); ++i) {
    const double min_len = options_.schedule[i].min_accept_len;
    if (!std::isfinite(min_len) || min_len < 0) {
      return absl::InvalidArgumentError("Generate: schedule row " + Str(static_cast<int64_t>(i)) +
                                        ": min_accept_len must be finite and >= 0, got " + std::to_string(min_len));
    }
  }
  if (options_.acceptance_window < 1 || options_.acceptance_pause < 1) {
    return absl::InvalidArgumentError("Generate: acceptance_window and acceptance_pause must be >= 1, got " +
                                      Str(options_.acceptance_window) + " and " + Str(options_.acceptance_pause));
  }
  const ScheduleTrees schedule = ResolveSchedule(options_);
  if (step_ != nullptr && step_->options().max_batch >= batch) {
    step_->Reseed(options_.seed);
  } else {
    step_.reset();  // its buffers go before the new ones are allocated
    SpeculativeStepOptions so;
    so.max_batch = static_cast<int>(batch);
    so.trees = schedule.trees;
    so.sampling = options_.sampling;
    so.seed = options_.seed;
    so.launcher = options_.target_launcher;
    EAGLE3_ASSIGN_OR_RETURN(step_, SpeculativeStep::Create(target_, draft_, backend_, so));
  }
  SpeculativeStep* step = step_.get();
  const int64_t nodes = step->nodes_per_step();
  const TargetModelOptions& topt = target_->options();

  std::vector<DeviceSequence> seqs(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    DeviceSequence& s = seqs[static_cast<size_t>(b)];
    const int64_t prompt_len = static_cast<int64_t>(prompts[static_cast<size_t>(b)].size());
    if (prompt_len == 0) return absl::InvalidArgumentError("Generate: prompt " + Str(b) + " is empty");
    s.target_pages = PageSlice(topt.num_kv_pages, batch, b);
    const int64_t need = prompt_len + options_.max_new_tokens + nodes;
    const int64_t have = std::min(static_cast<int64_t>(s.target_pages.size()) * topt.page_size, topt.max_context_len);
    if (need > have) {
      return absl::OutOfRangeError("Generate: prompt " + Str(b) + " (" + Str(prompt_len) + " tokens) + max_new_tokens " +
                                   Str(options_.max_new_tokens) + " + " + Str(nodes) + " tree nodes need " + Str(need) +
                                   " KV slots; each of the " + Str(batch) + " sequences has " + Str(have));
    }
    if (draft_ != nullptr) {
      const DraftModelOptions& dopt = draft_->options();
      s.draft_pages = PageSlice(dopt.num_kv_pages, batch, b);
      const int64_t draft_need = prompt_len + options_.max_new_tokens + step->draft_slots_per_step();
      const int64_t draft_have =
          std::min(static_cast<int64_t>(s.draft_pages.size()) * dopt.page_size, dopt.max_context_len);
      if (draft_need > draft_have) {
        return absl::OutOfRangeError("Generate: prompt " + Str(b) + " (" + Str(prompt_len) +
                                     " tokens) + max_new_tokens " + Str(options_.max_new_tokens) + " + " +
                                     Str(step->draft_slots_per_step()) + " draft tree rows need " + Str(draft_need) +
                                     " draft KV slots; each of the " + Str(batch) + " sequences has " +
                                     Str(draft_have));
      }
    }
  }

  auto emit = [&](DeviceSequence& s, std::span<const int64_t> tokens) {
    s.done = EmitTokens(tokens, options_, s.generated, s.done, st);
  };

  for (int64_t b = 0; b < batch; ++b) {
    DeviceSequence& s = seqs[static_cast<size_t>(b)];
    const std::vector<int64_t>& prompt = prompts[static_cast<size_t>(b)];
    EAGLE3_ASSIGN_OR_RETURN(const int64_t first,
                            step->Prefill(static_cast<int>(b), prompt, s.target_pages, s.draft_pages));
    s.row = static_cast<int>(b);
    s.cache_len = static_cast<int64_t>(prompt.size());
    s.root = first;
    emit(s, std::span<const int64_t>(&first, 1));
  }
  const StepCounters prefill_counters = step->counters();
  // Prefill returns each first token on the host, so the host has already waited for the device.
  st.prefill_seconds = std::chrono::duration<double>(Clock::now() - start).count();

  const bool speculative = draft_ != nullptr;
  int max_steps = 0;
  for (const DraftTreeParams& t : schedule.trees) max_steps = std::max(max_steps, t.num_steps);
  AcceptanceTally tally(max_steps);
  std::vector<StepSequence> inputs;
  std::vector<int64_t> active;
  // The switch-off by acceptance: the last drafting steps' (tokens emitted, sequences), summed.
  std::deque<std::pair<int64_t, int64_t>> window;
  int64_t window_tokens = 0, window_seqs = 0;
  int pause_left = 0;
  std::vector<StepOutput> outputs;
  while (true) {
    if (options_.progress) options_.progress(st.generated_tokens, batch * options_.max_new_tokens);
    active.clear();
    inputs.clear();
    for (int64_t b = 0; b < batch; ++b) {
      const DeviceSequence& s = seqs[static_cast<size_t>(b)];
      if (s.done) continue;
      active.push_back(b);
      StepSequence in;
      in.row = s.row;
      in.root = s.root;
      in.cache_len = s.cache_len;
      in.target_pages = s.target_pages;
      in.draft_pages = s.draft_pages;
      inputs.push_back(in);
    }
    if (active.empty()) break;
    const size_t row = ScheduleRow(options_, static_cast<int64_t>(active.size()));
    int tree = speculative ? schedule.row_tree[row] : kNoDraftTokens;
    if (tree != kNoDraftTokens && pause_left > 0) {
      tree = kNoDraftTokens;
      pause_left -= 1;
    }
    EAGLE3_RETURN_IF_ERROR(step->Run(inputs, &outputs, tree));
    st.target_passes += 1;
    if (speculative) {
      // A drafting step's tree passes and catch-up, or the catch-up alone.
      st.draft_passes += tree == kNoDraftTokens ? 1 : schedule.trees[static_cast<size_t>(tree)].num_steps;
    }
    if (speculative && tree == kNoDraftTokens) st.undrafted_steps += 1;
    const double min_len = options_.schedule.empty() ? 0.0 : options_.schedule[row].min_accept_len;
    if (speculative && tree != kNoDraftTokens && min_len > 0) {
      int64_t emitted = 0;
      for (const StepOutput& o : outputs) emitted += static_cast<int64_t>(o.tokens.size());
      window.emplace_back(emitted, static_cast<int64_t>(outputs.size()));
      window_tokens += emitted;
      window_seqs += static_cast<int64_t>(outputs.size());
      if (static_cast<int>(window.size()) > options_.acceptance_window) {
        window_tokens -= window.front().first;
        window_seqs -= window.front().second;
        window.pop_front();
      }
      if (static_cast<int>(window.size()) == options_.acceptance_window &&
          static_cast<double>(window_tokens) < min_len * static_cast<double>(window_seqs)) {
        pause_left = options_.acceptance_pause;
        st.acceptance_pauses += 1;
        window.clear();
        window_tokens = window_seqs = 0;
      }
    }
    for (size_t i = 0; i < active.size(); ++i) {
      DeviceSequence& s = seqs[static_cast<size_t>(active[i])];
      const StepOutput& o = outputs[i];
      if (!speculative || tree != kNoDraftTokens) tally.Add(o.num_accepted, static_cast<int64_t>(o.tokens.size()), st);
      s.row = static_cast<int>(i);
      s.cache_len += static_cast<int64_t>(o.tokens.size());
      s.root = o.tokens.back();
      emit(s, o.tokens);
    }
  }

  tally.Finish(speculative, max_steps, st);
  const StepCounters& counters = step->counters();
  st.device_steps = counters.steps - prefill_counters.steps;
  st.host_syncs = counters.host_syncs - prefill_counters.host_syncs;
  st.device_to_host_bytes = counters.device_to_host_bytes - prefill_counters.device_to_host_bytes;
  st.total_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<std::vector<int64_t>> out;
  for (DeviceSequence& s : seqs) out.push_back(std::move(s.generated));
  return out;
}

}  // namespace eagle3
