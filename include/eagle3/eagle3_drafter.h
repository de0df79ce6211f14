// Eagle3Drafter: the Drafter of SpeculativeDecoder backed by an EAGLE-3 DraftModel. Keeps, per
// sequence, the draft KV rows of committed positions plus the rows of the tree being built, and the
// fed-back hidden state of every expanded candidate.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "eagle3/draft_model.h"
#include "eagle3/export.h"
#include "eagle3/speculative_decoder.h"

namespace eagle3 {

class EAGLE3_API Eagle3Drafter final : public Drafter {
 public:
  // `draft` must outlive the drafter. Its page pool is split evenly between `max_sequences`.
  Eagle3Drafter(DraftModel* draft, int max_sequences);

  int64_t draft_vocab() const override { return draft_->draft_vocab(); }
  std::span<const int64_t> d2t() const override { return draft_->d2t(); }
  const HiddenStateTap* tap() const override { return &draft_->tap(); }

  absl::Status Reset(int seq) override;
  absl::Status Extend(int seq, int64_t first_position, std::span<const int64_t> tokens, const TensorView& aux,
                      const TensorView& root_logits) override;
  absl::Status Expand(int seq, std::span<const DraftCandidate> candidates, std::span<const int32_t> frontier,
                      const TensorView& logits) override;

 private:
  struct State {
    std::vector<int32_t> pages;
    int64_t cache_len = 0;            // committed draft rows (= target positions covered)
    std::vector<float> root_hidden;   // r of the last committed row: the depth-1 nodes' input
    // Tree rows of the current build: candidate index -> slot and fed-back hidden.
    std::vector<int32_t> row_candidate;
    std::vector<std::vector<float>> row_hidden;
  };
  absl::StatusOr<State*> Get(int seq);

  DraftModel* draft_;
  std::vector<State> states_;
};

}  // namespace eagle3
