// Speculative greedy ≡ plain greedy (docs/semantics.md), the check the CPU and GPU model tests share.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "eagle3/backend.h"
#include "eagle3/draft_model.h"
#include "eagle3/eagle3_drafter.h"
#include "eagle3/speculative_decoder.h"
#include "eagle3/target_model.h"
#include "gtest/gtest.h"

namespace eagle3 {

// What ExpectSpeculativeGreedyEqualsPlain ran: the plain output, and the stats of the chain and of
// the tree run (in that order) of the device step.
struct SpeculativeGreedyRuns {
  std::vector<std::vector<int64_t>> plain;
  std::vector<DecodeStats> stats;
};

// A batch of three prompts of different lengths, and plain greedy decoding of 16 new tokens each.
// Ids are taken modulo `vocab` (the target's vocabulary): unchanged in every golden vocabulary of at
// least 300 ids, and still distinct prompts in v3_mtp's 130.
inline std::vector<std::vector<int64_t>> SpeculativeGreedyPrompts(int64_t vocab = 300) {
  std::vector<std::vector<int64_t>> prompts = {{5, 17, 99, 3, 42, 8, 1}, {7, 7, 299}, {11, 23}};
  for (auto& prompt : prompts) {
    for (int64_t& token : prompt) token %= vocab;
  }
  return prompts;
}
inline DecodeOptions SpeculativeGreedyOptions() {
  DecodeOptions options;
  options.max_new_tokens = 16;
  return options;
}

// The logits `target` gives after `prompt` followed by `generated[0, n)`: one sequence prefilled in
// chunks of max_tokens_per_forward over the first pages of the cache (overwriting whatever a decoder
// left there).
inline std::vector<float> LogitsAfter(TargetModel* target, const std::vector<int64_t>& prompt,
                                      const std::vector<int64_t>& generated, size_t n) {
  std::vector<int64_t> tokens = prompt;
  tokens.insert(tokens.end(), generated.begin(), generated.begin() + static_cast<std::ptrdiff_t>(n));
  const int64_t len = static_cast<int64_t>(tokens.size()), page = target->options().page_size;
  std::vector<int32_t> pages(static_cast<size_t>((len + page - 1) / page));
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<int32_t>(i);
  const int64_t vocab = target->config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(vocab));
  const int64_t chunk = target->options().max_tokens_per_forward;
  for (int64_t start = 0; start < len; start += chunk) {
    const int64_t n_new = std::min(chunk, len - start);
    SequenceInput in;
    in.tokens = std::span<const int64_t>(tokens.data() + start, static_cast<size_t>(n_new));
    in.page_table = pages;
    in.cache_len = start;
    const absl::Status status = target->Forward(std::span<const SequenceInput>(&in, 1),
                                                TensorView(logits.data(), DType::kF32, Shape{1, vocab}));
    EXPECT_TRUE(status.ok()) << status;
    if (!status.ok()) return {};
  }
  return logits;
}

// Speculative greedy equals plain greedy up to near-ties (docs/semantics.md): a verify forward over
// several tokens and a decode forward over one need not add in the same order, so where two logits
// lie within rounding of each other the two runs may pick different tokens, and from there differ.
// Each sequence of `got` must equal `reference` up to its first difference, and there the two
// tokens' logits (`target` re-run on the prefix) may differ by at most `tie_tolerance` x the largest
// |logit|. `tie_tolerance` 0 asks for equality. Every near-tie met is printed.
inline void ExpectGreedyEqualUpToNearTies(TargetModel* target, const std::vector<std::vector<int64_t>>& prompts,
                                          const std::vector<std::vector<int64_t>>& got,
                                          const std::vector<std::vector<int64_t>>& reference, double tie_tolerance,
                                          const std::string& label) {
  ASSERT_EQ(got.size(), reference.size()) << label;
  if (tie_tolerance <= 0.0) {
    EXPECT_EQ(got, reference) << label;
    return;
  }
  for (size_t s = 0; s < got.size(); ++s) {
    ASSERT_EQ(got[s].size(), reference[s].size()) << label << ", sequence " << s;
    const auto diff = std::mismatch(got[s].begin(), got[s].end(), reference[s].begin());
    if (diff.first == got[s].end()) continue;
    const size_t at = static_cast<size_t>(diff.first - got[s].begin());
    const std::vector<float> logits = LogitsAfter(target, prompts[s], reference[s], at);
    ASSERT_FALSE(logits.empty()) << label;
    float largest = 0.0f;
    for (const float v : logits) largest = std::max(largest, std::fabs(v));
    const int64_t a = reference[s][at], b = got[s][at];
    const double gap = std::fabs(static_cast<double>(logits[static_cast<size_t>(a)]) - logits[static_cast<size_t>(b)]);
    std::printf("  %s: sequence %zu differs from plain greedy at token %zu (%lld vs %lld): logits %.6g vs %.6g, "
                "gap %.3g of the largest |logit| %.4g\n",
                label.c_str(), s, at, static_cast<long long>(b), static_cast<long long>(a),
                logits[static_cast<size_t>(b)], logits[static_cast<size_t>(a)], gap / largest, largest);
    EXPECT_LE(gap, tie_tolerance * largest)
        << label << ": sequence " << s << " differs from plain greedy at token " << at << " (" << b << " for " << a
        << ") where the two logits are not a near-tie; got " << ::testing::PrintToString(got[s]) << ", plain "
        << ::testing::PrintToString(reference[s]);
  }
}

// Decodes SpeculativeGreedyPrompts() with SpeculativeGreedyOptions() and `target` alone (the host
// reference loop, and the device step without a draft), then with drafts from `draft` (any kind) as a
// chain (topk 1, 4 steps, 5 tokens) and as a tree (topk 4, 3 steps, 10 tokens), through the device
// step (SpeculativeStep on `backend`) and through the host reference loop (Eagle3Drafter), and
// expects every output to equal the plain one. The device step must also make one host
// synchronization per decode step. The models must hold three sequences of a prompt, 16 new tokens
// and a 10-node tree each. With `tie_tolerance` > 0 the speculative outputs may leave the plain one
// at near-ties (ExpectGreedyEqualUpToNearTies); the plain device step must still equal it.
inline void ExpectSpeculativeGreedyEqualsPlain(TargetModel* target, DraftModel* draft, Backend* backend,
                                               SpeculativeGreedyRuns* runs = nullptr, double tie_tolerance = 0.0) {
  const std::vector<std::vector<int64_t>> prompts = SpeculativeGreedyPrompts(target->config().vocab_size);
  const DecodeOptions options = SpeculativeGreedyOptions();
  SpeculativeDecoder plain(target, nullptr, options);
  auto reference = plain.Generate(prompts);
  ASSERT_TRUE(reference.ok()) << reference.status();
  if (runs != nullptr) runs->plain = *reference;
  {
    SpeculativeDecoder device_plain(target, static_cast<DraftModel*>(nullptr), backend, options);
    DecodeStats stats;
    auto got = device_plain.Generate(prompts, &stats);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, *reference) << "plain decoding through the device step";
    EXPECT_EQ(stats.host_syncs, stats.device_steps);
    EXPECT_LE(stats.device_to_host_bytes, stats.device_steps * 16 * static_cast<int64_t>(prompts.size()) * 2);
  }
  for (const DraftTreeParams& tree : {DraftTreeParams{1, 4, 5}, DraftTreeParams{4, 3, 10}}) {
    DecodeOptions spec_options = options;
    spec_options.tree = tree;
    SpeculativeDecoder spec(target, draft, backend, spec_options);
    DecodeStats stats;
    auto got = spec.Generate(prompts, &stats);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectGreedyEqualUpToNearTies(target, prompts, *got, *reference, tie_tolerance,
                                  "device step, topk " + std::to_string(tree.topk));
    EXPECT_GT(stats.device_steps, 0);
    EXPECT_EQ(stats.host_syncs, stats.device_steps) << "one host synchronization per step";
    // The results of a step are the only bytes it brings to the host: a few per tree node.
    EXPECT_LE(stats.device_to_host_bytes,
              stats.device_steps * 16 * static_cast<int64_t>(prompts.size()) * (tree.num_draft_tokens + 2));
    if (runs != nullptr) runs->stats.push_back(stats);

    Eagle3Drafter drafter(draft, static_cast<int>(prompts.size()));
    SpeculativeDecoder host(target, &drafter, spec_options);
    auto host_got = host.Generate(prompts);
    ASSERT_TRUE(host_got.ok()) << host_got.status();
    ExpectGreedyEqualUpToNearTies(target, prompts, *host_got, *reference, tie_tolerance,
                                  "host reference loop, topk " + std::to_string(tree.topk));
  }
}

}  // namespace eagle3
