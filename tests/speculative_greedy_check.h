// Speculative greedy ≡ plain greedy (docs/semantics.md), the check the CPU and GPU model tests share.
#pragma once

#include <cstdint>
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

// Decodes SpeculativeGreedyPrompts() with SpeculativeGreedyOptions() and `target` alone (the host
// reference loop, and the device step without a draft), then with drafts from `draft` (any kind) as a
// chain (topk 1, 4 steps, 5 tokens) and as a tree (topk 4, 3 steps, 10 tokens), through the device
// step (SpeculativeStep on `backend`) and through the host reference loop (Eagle3Drafter), and
// expects every output to equal the plain one. The device step must also make one host
// synchronization per decode step. The models must hold three sequences of a prompt, 16 new tokens
// and a 10-node tree each.
inline void ExpectSpeculativeGreedyEqualsPlain(TargetModel* target, DraftModel* draft, Backend* backend,
                                               SpeculativeGreedyRuns* runs = nullptr) {
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
    EXPECT_EQ(*got, *reference) << "device step, topk " << tree.topk;
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
    EXPECT_EQ(*host_got, *reference) << "host reference loop, topk " << tree.topk;
  }
}

}  // namespace eagle3
