#include "eagle3/speculative_decoder.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "decode_tally.h"
#include "eagle3/speculative_step.h"
#include "eagle3/status.h"

namespace eagle3 {
namespace {

// One target step: Forward, or Stage + the launcher's Launch + Finish.
absl::Status RunTarget(TargetModel& target, StepLauncher* launcher, std::span<const SequenceInput> batch,
                       const TensorView& logits, const HiddenStateTap* tap, const TensorView& aux) {
  if (launcher == nullptr) return target.Forward(batch, logits, tap, aux);
  EAGLE3_RETURN_IF_ERROR(target.Stage(batch, tap));
  EAGLE3_RETURN_IF_ERROR(launcher->Launch(target));
  return target.Finish(logits, aux);
}

using Clock = std::chrono::steady_clock;

constexpr int32_t kNoParent = -1;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Per-sequence loop state.
struct Sequence {
  std::vector<int64_t> prompt;
  std::vector<int64_t> generated;
  std::vector<int32_t> pages;
  int64_t cache_len = 0;    // target KV rows: every emitted token but `root`
  int64_t root = 0;         // the newest emitted token, next tree root
  bool done = false;
  std::vector<float> root_logits;  // drafter's distribution after `root`
};

}  // namespace

SpeculativeDecoder::SpeculativeDecoder(TargetModel* target, Drafter* drafter, const DecodeOptions& options)
    : target_(target), drafter_(drafter), options_(options) {}

SpeculativeDecoder::SpeculativeDecoder(TargetModel* target, DraftModel* draft, Backend* backend,
                                       const DecodeOptions& options)
    : target_(target), draft_(draft), backend_(backend), options_(options) {}

SpeculativeDecoder::~SpeculativeDecoder() = default;

absl::StatusOr<std::vector<std::vector<int64_t>>> SpeculativeDecoder::Generate(
    std::span<const std::vector<int64_t>> prompts, DecodeStats* stats) {
  DecodeStats local_stats;
  DecodeStats& st = stats != nullptr ? *stats : local_stats;
  st = DecodeStats();
  return backend_ != nullptr ? GenerateOnDevice(prompts, st) : GenerateOnHost(prompts, st);
}

absl::StatusOr<std::vector<std::vector<int64_t>>> SpeculativeDecoder::GenerateOnHost(
    std::span<const std::vector<int64_t>> prompts, DecodeStats& st) {
  const auto start = Clock::now();
  const TargetModelOptions& topt = target_->options();
  const int64_t vocab = target_->config().vocab_size;
  const int64_t batch = static_cast<int64_t>(prompts.size());
  if (batch == 0) return std::vector<std::vector<int64_t>>();
  if (options_.max_new_tokens < 1) {
    return absl::InvalidArgumentError("Generate: max_new_tokens must be >= 1, got " +
                                      std::to_string(options_.max_new_tokens));
  }
  const bool speculative = drafter_ != nullptr;
  const int tree_nodes = speculative ? options_.tree.num_draft_tokens : 1;
  if (speculative) EAGLE3_RETURN_IF_ERROR(options_.tree.Validate(drafter_->draft_vocab()));
  const HiddenStateTap* tap = speculative ? drafter_->tap() : nullptr;
  const int64_t tap_width = tap != nullptr ? tap->width() : 0;

  // Each sequence gets an equal slice of the target's page pool.
  const int64_t pages_per_seq = topt.num_kv_pages / batch;
  std::vector<Sequence> seqs(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    Sequence& s = seqs[static_cast<size_t>(b)];
    s.prompt = prompts[static_cast<size_t>(b)];
    if (s.prompt.empty()) return absl::InvalidArgumentError("Generate: prompt " + std::to_string(b) + " is empty");
    const int64_t need = static_cast<int64_t>(s.prompt.size()) + options_.max_new_tokens + tree_nodes;
    const int64_t have = std::min(pages_per_seq * topt.page_size, topt.max_context_len);
    if (need > have) {
      return absl::OutOfRangeError("Generate: prompt " + std::to_string(b) + " (" + std::to_string(s.prompt.size()) +
                                   " tokens) + max_new_tokens " + std::to_string(options_.max_new_tokens) + " + " +
                                   std::to_string(tree_nodes) + " tree nodes need " + std::to_string(need) +
                                   " KV slots; each of the " + std::to_string(batch) + " sequences has " +
                                   std::to_string(have));
    }
    for (int64_t p = 0; p < pages_per_seq; ++p) s.pages.push_back(static_cast<int32_t>(b * pages_per_seq + p));
    if (speculative) {
      s.root_logits.resize(static_cast<size_t>(drafter_->draft_vocab()));
      EAGLE3_RETURN_IF_ERROR(drafter_->Reset(static_cast<int>(b)));
    }
  }

  uint64_t verify_offset = 0;  // Philox counter base, advanced per verify call
  std::vector<float> logits, aux;
  auto emit = [&](Sequence& s, std::span<const int64_t> tokens) {
    s.done = EmitTokens(tokens, options_, s.generated, s.done, st);
  };
  // Root-only trees: the verifier then samples (or takes the argmax of) each row.
  auto sample_rows = [&](const std::vector<int64_t>& roots, const std::vector<float>& rows,
                         std::vector<int64_t>* out) -> absl::Status {
    std::vector<DraftTree> trees;
    std::vector<TensorView> views;
    for (size_t i = 0; i < roots.size(); ++i) {
      EAGLE3_ASSIGN_OR_RETURN(DraftTree t, DraftTree::FromParents(std::span<const int64_t>(&roots[i], 1),
                                                                  std::span<const int32_t>(&kNoParent, 1)));
      trees.push_back(std::move(t));
      views.emplace_back(const_cast<float*>(rows.data()) + i * vocab, DType::kF32, Shape{1, vocab});
    }
    EAGLE3_ASSIGN_OR_RETURN(auto results, TreeVerifier::Verify(trees, views, options_.sampling, options_.seed,
                                                               verify_offset++));
    out->clear();
    for (const VerifyResult& r : results) out->push_back(r.tokens.back());
    return absl::OkStatus();
  };

  // Prefill, one sequence at a time (a prompt may fill max_tokens_per_forward on its own).
  for (int64_t b = 0; b < batch; ++b) {
    Sequence& s = seqs[static_cast<size_t>(b)];
    const int64_t n = static_cast<int64_t>(s.prompt.size());
    SequenceInput in;
    in.tokens = s.prompt;
    in.page_table = s.pages;
    logits.assign(static_cast<size_t>(vocab), 0.0f);
    aux.assign(static_cast<size_t>(n * tap_width), 0.0f);
    auto t0 = Clock::now();
    EAGLE3_RETURN_IF_ERROR(RunTarget(*target_, options_.target_launcher, std::span<const SequenceInput>(&in, 1),
                                            TensorView(logits.data(), DType::kF32, Shape{1, vocab}), tap,
                                            tap != nullptr ? TensorView(aux.data(), DType::kF32, Shape{n, tap_width})
                                                           : TensorView()));
    st.target_seconds += Seconds(t0);
    s.cache_len = n;
    std::vector<int64_t> next;
    t0 = Clock::now();
    EAGLE3_RETURN_IF_ERROR(sample_rows({s.prompt.back()}, logits, &next));
    st.verify_seconds += Seconds(t0);
    s.root = next[0];
    emit(s, next);
    if (speculative && !s.done) {
      std::vector<int64_t> shifted(s.prompt.begin() + 1, s.prompt.end());
      shifted.push_back(s.root);
      t0 = Clock::now();
      EAGLE3_RETURN_IF_ERROR(drafter_->Extend(static_cast<int>(b), 0, shifted,
                                              TensorView(aux.data(), DType::kF32, Shape{n, tap_width}),
                                              TensorView(s.root_logits.data(), DType::kF32, Shape{drafter_->draft_vocab()})));
      st.draft_seconds += Seconds(t0);
      st.draft_passes += 1;
    }
  }

  // The prefill's outputs are on the host already (sampled and drafted from above).
  st.prefill_seconds = Seconds(start);

  AcceptanceTally tally(options_.tree.num_steps);
  while (true) {
    if (options_.progress) options_.progress(st.generated_tokens, batch * options_.max_new_tokens);
    std::vector<int64_t> active;
    for (int64_t b = 0; b < batch; ++b) {
      if (!seqs[static_cast<size_t>(b)].done) active.push_back(b);
    }
    if (active.empty()) break;

    // 1. Draft a tree per active sequence (a root-only tree without a drafter).
    std::vector<DraftTree> trees;
    for (int64_t b : active) {
      Sequence& s = seqs[static_cast<size_t>(b)];
      if (!speculative) {
        EAGLE3_ASSIGN_OR_RETURN(DraftTree t, DraftTree::FromParents(std::span<const int64_t>(&s.root, 1),
                                                                    std::span<const int32_t>(&kNoParent, 1)));
        trees.push_back(std::move(t));
        continue;
      }
      const auto t0 = Clock::now();
      DraftExpandFn expand = [&](std::span<const DraftCandidate> candidates, std::span<const int32_t> frontier,
                                 const TensorView& out) -> absl::Status {
        if (frontier.size() == 1 && frontier[0] == 0) {
          std::copy(s.root_logits.begin(), s.root_logits.end(), out.data_as<float>());
          return absl::OkStatus();
        }
        st.draft_passes += 1;
        return drafter_->Expand(static_cast<int>(b), candidates, frontier, out);
      };
      EAGLE3_ASSIGN_OR_RETURN(DraftTree t, BuildDraftTree(s.root, options_.tree, drafter_->draft_vocab(),
                                                          drafter_->d2t(), expand));
      st.draft_seconds += Seconds(t0);
      trees.push_back(std::move(t));
    }

    // 2. One tree-masked target forward over every active sequence, with taps.
    std::vector<SequenceInput> inputs(active.size());
    std::vector<std::vector<int64_t>> positions(active.size());
    std::vector<std::vector<uint8_t>> masks(active.size());
    int64_t rows = 0;
    for (size_t i = 0; i < active.size(); ++i) {
      const Sequence& s = seqs[static_cast<size_t>(active[i])];
      positions[i] = trees[i].Positions(s.cache_len);
      masks[i] = trees[i].DenseMask();
      inputs[i].tokens = trees[i].tokens;
      inputs[i].positions = positions[i];
      inputs[i].tree_mask = masks[i];
      inputs[i].page_table = s.pages;
      inputs[i].cache_len = s.cache_len;
      inputs[i].all_logits = true;
      rows += trees[i].size();
    }
    logits.assign(static_cast<size_t>(rows * vocab), 0.0f);
    aux.assign(static_cast<size_t>(rows * tap_width), 0.0f);
    auto t0 = Clock::now();
    EAGLE3_RETURN_IF_ERROR(RunTarget(*target_, options_.target_launcher, inputs, TensorView(logits.data(), DType::kF32, Shape{rows, vocab}), tap,
                                            tap != nullptr ? TensorView(aux.data(), DType::kF32, Shape{rows, tap_width})
                                                           : TensorView()));
    st.target_seconds += Seconds(t0);
    st.target_passes += 1;

    // 3. Verify.
    t0 = Clock::now();
    std::vector<TensorView> views;
    int64_t row = 0;
    for (const DraftTree& t : trees) {
      views.emplace_back(logits.data() + row * vocab, DType::kF32, Shape{t.size(), vocab});
      row += t.size();
    }
    EAGLE3_ASSIGN_OR_RETURN(auto results, TreeVerifier::Verify(trees, views, options_.sampling, options_.seed,
                                                               verify_offset++));
    st.verify_seconds += Seconds(t0);

    // 4. Commit the accepted path in the target and re-run it through the drafter.
    row = 0;
    for (size_t i = 0; i < active.size(); ++i) {
      Sequence& s = seqs[static_cast<size_t>(active[i])];
      const VerifyResult& r = results[i];
      std::vector<int64_t> accepted = {0};
      for (int32_t node : r.accepted_nodes) accepted.push_back(node);
      EAGLE3_RETURN_IF_ERROR(target_->CommitAccepted(s.pages, s.cache_len, accepted));
      tally.Add(r.num_accepted(), static_cast<int64_t>(r.tokens.size()), st);
      const int64_t first_position = s.cache_len;
      s.cache_len += static_cast<int64_t>(accepted.size());
      s.root = r.tokens.back();
      emit(s, r.tokens);
      if (speculative && !s.done) {
        std::vector<float> path_aux(accepted.size() * static_cast<size_t>(tap_width));
        for (size_t j = 0; j < accepted.size(); ++j) {
          std::copy_n(aux.begin() + (row + accepted[j]) * tap_width, tap_width, path_aux.begin() + j * tap_width);
        }
        t0 = Clock::now();
        EAGLE3_RETURN_IF_ERROR(drafter_->Extend(static_cast<int>(active[i]), first_position, r.tokens,
                                                TensorView(path_aux.data(), DType::kF32,
                                                           Shape{static_cast<int64_t>(accepted.size()), tap_width}),
                                                TensorView(s.root_logits.data(), DType::kF32,
                                                           Shape{drafter_->draft_vocab()})));
        st.draft_seconds += Seconds(t0);
        st.draft_passes += 1;
      }
      row += trees[i].size();
    }
  }

  tally.Finish(speculative, options_.tree.num_steps, st);
  st.total_seconds = Seconds(start);
  std::vector<std::vector<int64_t>> out;
  for (Sequence& s : seqs) out.push_back(std::move(s.generated));
  return out;
}

}  // namespace eagle3
