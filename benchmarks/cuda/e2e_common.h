// What the end-to-end speculative benchmarks share (e2e_benchmark at TP 1, tp_e2e_benchmark at TP
// N over NCCL): the DeepSeek-V2-Lite-shaped pair and its prompts, the step shapes, a batch of
// sequences stepped through SpeculativeStep, and synthetic acceptance (src/synthetic_acceptance.h)
// installed on a step. e2e_benchmark.cc's top comment says what is measured and why.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "e2e_kernels.h"
#include "eagle3/backend.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/draft_model.h"
#include "eagle3/draft_tree.h"
#include "eagle3/speculative_step.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "eagle3/tensor.h"
#include "eagle3/testing/random_draft_checkpoint.h"
#include "speculative_step_testing.h"
#include "synthetic_acceptance.h"

namespace eagle3::bench {

inline constexpr int64_t kE2ePrompt = 512;
inline constexpr int64_t kE2ePageSize = 64;
inline constexpr int64_t kE2eMaxBatch = 32;
inline constexpr int64_t kE2eMaxContext = 1024;
inline constexpr int64_t kE2ePagesPerSeq = kE2eMaxContext / kE2ePageSize;
inline constexpr int kE2eWarmupSteps = 3;
inline constexpr int kE2ePlainSteps = 32;  // timed per repetition
inline constexpr int kE2eSpecSteps = 16;
// Greedy tokens of the reference continuation: enough for the speculative warm-up and timed steps
// at the longest path (5 tokens per step) and the deepest look-ahead.
inline constexpr int64_t kE2eReferenceSteps = (kE2eWarmupSteps + kE2eSpecSteps) * 5 + 8;
inline constexpr uint64_t kE2eSyntheticSeed = 1234;

// The drafted trees: 0 topk 4, 3 steps, 8 nodes (the library's default); 1 a chain of 4 tokens.
inline const std::vector<DraftTreeParams>& E2eTrees() {
  static const std::vector<DraftTreeParams> trees = {{4, 3, 8}, {1, 4, 5}};
  return trees;
}

// The EAGLE-3 head of the V2-Lite-shaped pair, written once into `dir`: hidden 2048, 16 heads of 128
// (kv_heads KV heads: 4 at TP 1, as many as the ranks at TP N, which shard them), MLP 6144, draft
// vocabulary 32000, random bf16 weights whose final norm is scaled by 64 (peaked distributions, deep
// trees, as a trained head's).
inline absl::Status EnsureE2eDraft(const std::string& dir, const DeepseekV2Config& target, int64_t kv_heads) {
  if (std::filesystem::exists(dir + "/complete")) return absl::OkStatus();
  RandomDraftCheckpointOptions o;
  o.seed = 3;
  o.dtype = DType::kBF16;
  o.hidden_size = 2048;
  o.num_attention_heads = 16;
  o.num_key_value_heads = kv_heads;
  o.head_dim = 128;
  o.intermediate_size = 6144;
  o.draft_vocab_size = 32000;
  o.max_position_embeddings = 4096;
  // Every value drawn: a tiled lm_head repeats its rows, and the ties flatten the distributions.
  o.final_norm_scale = 64.0;
  EAGLE3_RETURN_IF_ERROR(WriteRandomEagle3DraftCheckpoint(target, dir, o));
  std::ofstream(dir + "/complete") << "ok\n";
  return absl::OkStatus();
}

// kE2eMaxBatch prompts of kE2ePrompt random tokens (the same for every rank and run).
inline std::vector<std::vector<int64_t>> E2ePrompts(int64_t vocab) {
  std::mt19937_64 rng(17);
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t b = 0; b < kE2eMaxBatch; ++b) {
    std::vector<int64_t> prompt(static_cast<size_t>(kE2ePrompt));
    for (int64_t& t : prompt) t = token(rng);
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

// The target's and the draft's capacities for these runs (sequence b on pages b * kE2ePagesPerSeq
// onward in both caches).
template <typename Options>
Options E2eModelOptions(Options o) {
  o.max_tokens_per_forward = kE2ePrompt;  // >= kE2eMaxBatch x the largest tree (8 nodes)
  o.max_context_len = kE2eMaxContext;
  o.page_size = kE2ePageSize;
  o.num_kv_pages = kE2eMaxBatch * kE2ePagesPerSeq;
  return o;
}

// The sequences of a batch after their prefill; Step appends a step's tokens.
struct E2eBatch {
  std::vector<std::vector<int64_t>> tokens;  // prompt, then every emitted token
  std::vector<StepSequence> seqs;
  std::vector<StepOutput> out;

  absl::Status Prefill(SpeculativeStep& step, const std::vector<std::vector<int32_t>>& pages,
                       const std::vector<std::vector<int64_t>>& prompts, int64_t batch) {
    tokens.assign(static_cast<size_t>(batch), {});
    for (int64_t b = 0; b < batch; ++b) {
      const auto& p = pages[static_cast<size_t>(b)];
      EAGLE3_ASSIGN_OR_RETURN(int64_t first, step.Prefill(static_cast<int>(b), prompts[static_cast<size_t>(b)], p, p));
      tokens[static_cast<size_t>(b)] = prompts[static_cast<size_t>(b)];
      tokens[static_cast<size_t>(b)].push_back(first);
    }
    return absl::OkStatus();
  }
  // One step; returns the tokens the batch emitted.
  absl::StatusOr<int64_t> Step(SpeculativeStep& step, const std::vector<std::vector<int32_t>>& pages, int tree) {
    seqs.resize(tokens.size());
    for (size_t b = 0; b < tokens.size(); ++b) {
      seqs[b] = StepSequence{static_cast<int>(b), tokens[b].back(), static_cast<int64_t>(tokens[b].size()) - 1,
                             pages[b], pages[b]};
    }
    EAGLE3_RETURN_IF_ERROR(step.Run(seqs, &out, tree));
    int64_t emitted = 0;
    for (size_t b = 0; b < tokens.size(); ++b) {
      tokens[b].insert(tokens[b].end(), out[b].tokens.begin(), out[b].tokens.end());
      emitted += static_cast<int64_t>(out[b].tokens.size());
    }
    return emitted;
  }
};

// A SpeculativeStep over the pair (without a draft: plain decoding) for batches up to `batch`.
inline absl::StatusOr<std::unique_ptr<SpeculativeStep>> MakeE2eStep(TargetModel* target, DraftModel* draft,
                                                                    eagle3::Backend* backend, int64_t batch,
                                                                    StepLauncher* launcher) {
  SpeculativeStepOptions o;
  o.max_batch = static_cast<int>(batch);
  o.trees = E2eTrees();
  o.launcher = launcher;
  return SpeculativeStep::Create(target, draft, backend, o);
}

// Synthetic acceptance on a step: its device inputs (the reference continuation and the draw
// counter, on the step's backend) and the rewriter that reads them, installed by Install. The
// object must outlive every step it was installed on (captured steps read its buffers).
class SyntheticAcceptance {
 public:
  // reference: each sequence's plain greedy tokens (prompt included), at least reference_len each.
  static absl::StatusOr<std::unique_ptr<SyntheticAcceptance>> Create(eagle3::Backend* backend,
                                                                     const std::vector<std::vector<int64_t>>& reference,
                                                                     int64_t batch, int64_t reference_len) {
    auto s = std::unique_ptr<SyntheticAcceptance>(new SyntheticAcceptance);
    EAGLE3_ASSIGN_OR_RETURN(s->reference_,
                            Tensor::Empty(DType::kI64, Shape{batch, reference_len}, backend->allocator()));
    EAGLE3_ASSIGN_OR_RETURN(s->counter_, Tensor::Empty(DType::kI64, Shape{1}, backend->allocator()));
    if (cudaMemset(s->counter_.data(), 0, 8) != cudaSuccess) return absl::InternalError("zeroing the draw counter");
    std::vector<int64_t> host;
    for (int64_t b = 0; b < batch; ++b) {
      const auto& r = reference[static_cast<size_t>(b)];
      host.insert(host.end(), r.begin(), r.begin() + reference_len);
    }
    if (cudaMemcpy(s->reference_.data(), host.data(), host.size() * 8, cudaMemcpyHostToDevice) != cudaSuccess) {
      return absl::InternalError("copying the reference");
    }
    s->reference_len_ = reference_len;
    return s;
  }

  // Rewrites each drafted tree of `step` so that its mean accepted length (bonus included) is
  // `mean_accepted` for trees of `shape`.
  void Install(SpeculativeStep& step, cudaStream_t stream, double mean_accepted, const DraftTreeParams& shape,
               int64_t vocab) {
    const double alpha = SyntheticAlphaFor(mean_accepted, shape.num_steps);
    SpeculativeStepTesting::SetDraftRewriter(step, [this, stream, alpha, shape, vocab](const DraftedTrees& t) {
      const cudaError_t e = LaunchSyntheticRewrite(
          t.tokens.data_as<int64_t>(), t.parents.data_as<int32_t>(), t.positions.data_as<int64_t>(),
          static_cast<int>(t.batch), static_cast<int>(t.nodes), reference_.data_as<int64_t>(), reference_len_,
          kE2eSyntheticSeed, reinterpret_cast<unsigned long long*>(counter_.data()), alpha, shape.num_steps, vocab,
          stream);
      return e == cudaSuccess ? absl::OkStatus() : absl::InternalError(cudaGetErrorString(e));
    });
  }

 private:
  SyntheticAcceptance() = default;
  Tensor reference_, counter_;
  int64_t reference_len_ = 0;
};

// Emitted tokens of `got` that differ from `want`'s at the same place (or lie beyond it).
inline int64_t E2eMismatches(const std::vector<std::vector<int64_t>>& got,
                             const std::vector<std::vector<int64_t>>& want) {
  int64_t mismatches = 0;
  for (size_t s = 0; s < got.size(); ++s) {
    for (size_t i = 0; i < got[s].size(); ++i) mismatches += i >= want[s].size() || got[s][i] != want[s][i];
  }
  return mismatches;
}

}  // namespace eagle3::bench
