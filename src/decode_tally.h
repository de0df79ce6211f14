// What both decode loops of SpeculativeDecoder (the host reference loop and the device step) keep
// the same way (internal to src/): emitting a verify pass's tokens into a sequence, and the
// acceptance statistics of DecodeStats.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "eagle3/speculative_decoder.h"

namespace eagle3 {

// Appends `tokens` to `generated` until an EOS token or max_new_tokens; counts them in
// stats.generated_tokens. Returns whether the sequence is done (it may already have been).
inline bool EmitTokens(std::span<const int64_t> tokens, const DecodeOptions& options, std::vector<int64_t>& generated,
                       bool done, DecodeStats& stats) {
  for (int64_t tok : tokens) {
    if (done) break;
    generated.push_back(tok);
    stats.generated_tokens += 1;
    const bool eos =
        std::find(options.eos_token_ids.begin(), options.eos_token_ids.end(), tok) != options.eos_token_ids.end();
    done = eos || static_cast<int>(generated.size()) >= options.max_new_tokens;
  }
  return done;
}

// Verify passes and what each accepted, into DecodeStats' acceptance fields.
class AcceptanceTally {
 public:
  explicit AcceptanceTally(int num_steps) : at_least_(static_cast<size_t>(num_steps + 1), 0) {}

  // One sequence's verify pass: `accepted` drafted tokens, `emitted` tokens (accepted + 1).
  void Add(int accepted, int64_t emitted, DecodeStats& stats) {
    passes_ += 1;
    emitted_ += emitted;
    const size_t a = static_cast<size_t>(accepted);
    if (stats.accepted_histogram.size() <= a) stats.accepted_histogram.resize(a + 1, 0);
    stats.accepted_histogram[a] += 1;
    for (size_t d = 0; d < a && d < at_least_.size(); ++d) at_least_[d] += 1;
  }

  // Mean accepted length, and with a drafter the fraction of passes accepting at least d + 1 tokens.
  void Finish(bool speculative, int num_steps, DecodeStats& stats) const {
    stats.mean_accepted_length = passes_ > 0 ? static_cast<double>(emitted_) / passes_ : 0;
    stats.acceptance_by_depth.clear();
    if (!speculative) return;
    for (int d = 0; d < num_steps; ++d) {
      stats.acceptance_by_depth.push_back(
          passes_ > 0 ? static_cast<double>(at_least_[static_cast<size_t>(d)]) / passes_ : 0);
    }
  }

 private:
  int64_t passes_ = 0, emitted_ = 0;
  std::vector<int64_t> at_least_;
};

}  // namespace eagle3
