// Speculative greedy ≡ plain greedy (DESIGN §3), the check the CPU and GPU model tests share.
#pragma once

#include <cstdint>
#include <vector>

#include "eagle3/draft_model.h"
#include "eagle3/eagle3_drafter.h"
#include "eagle3/speculative_decoder.h"
#include "eagle3/target_model.h"
#include "gtest/gtest.h"

namespace eagle3 {

// What ExpectSpeculativeGreedyEqualsPlain ran: the plain output, and the stats of the chain and of
// the tree run (in that order).
struct SpeculativeGreedyRuns {
  std::vector<std::vector<int64_t>> plain;
  std::vector<DecodeStats> stats;
};

// A batch of three prompts of different lengths, and plain greedy decoding of 16 new tokens each.
inline std::vector<std::vector<int64_t>> SpeculativeGreedyPrompts() {
  return {{5, 17, 99, 3, 42, 8, 1}, {7, 7, 300}, {11, 23}};
}
inline DecodeOptions SpeculativeGreedyOptions() {
  DecodeOptions options;
  options.max_new_tokens = 16;
  return options;
}

// Decodes SpeculativeGreedyPrompts() with SpeculativeGreedyOptions() and `target` alone, then with
// EAGLE-3 drafts from `draft` as a chain (topk 1, 4 steps, 5 tokens) and as a tree (topk 4, 3
// steps, 10 tokens), and expects every speculative output to equal the plain one. The models must
// hold three sequences of a prompt, 16 new tokens and a 10-node tree each.
inline void ExpectSpeculativeGreedyEqualsPlain(TargetModel* target, DraftModel* draft,
                                               SpeculativeGreedyRuns* runs = nullptr) {
  const std::vector<std::vector<int64_t>> prompts = SpeculativeGreedyPrompts();
  const DecodeOptions options = SpeculativeGreedyOptions();
  SpeculativeDecoder plain(target, nullptr, options);
  auto reference = plain.Generate(prompts);
  ASSERT_TRUE(reference.ok()) << reference.status();
  if (runs != nullptr) runs->plain = *reference;
  for (const DraftTreeParams& tree : {DraftTreeParams{1, 4, 5}, DraftTreeParams{4, 3, 10}}) {
    Eagle3Drafter drafter(draft, static_cast<int>(prompts.size()));
    DecodeOptions spec_options = options;
    spec_options.tree = tree;
    SpeculativeDecoder spec(target, &drafter, spec_options);
    DecodeStats stats;
    auto got = spec.Generate(prompts, &stats);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, *reference) << "topk " << tree.topk;
    if (runs != nullptr) runs->stats.push_back(stats);
  }
}

}  // namespace eagle3
