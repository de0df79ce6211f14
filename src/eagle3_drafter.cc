#include "eagle3/eagle3_drafter.h"

#include <algorithm>
#include <string>

#include "eagle3/status.h"

namespace eagle3 {

Eagle3Drafter::Eagle3Drafter(DraftModel* draft, int max_sequences) : draft_(draft) {
  const int n = std::max(max_sequences, 1);
  const DraftModelOptions& o = draft_->options();
  const int64_t pages_per_seq = o.num_kv_pages / n;
  states_.resize(static_cast<size_t>(n));
  for (int s = 0; s < n; ++s) {
    for (int64_t p = 0; p < pages_per_seq; ++p) {
      states_[static_cast<size_t>(s)].pages.push_back(static_cast<int32_t>(s * pages_per_seq + p));
    }
  }
}

absl::StatusOr<Eagle3Drafter::State*> Eagle3Drafter::Get(int seq) {
  if (seq < 0 || seq >= static_cast<int>(states_.size())) {
    return absl::InvalidArgumentError("Eagle3Drafter: sequence " + std::to_string(seq) + " is not in [0, " +
                                      std::to_string(states_.size()) + ")");
  }
  return &states_[static_cast<size_t>(seq)];
}

absl::Status Eagle3Drafter::Reset(int seq) {
  EAGLE3_ASSIGN_OR_RETURN(State * s, Get(seq));
  s->cache_len = 0;
  s->root_hidden.clear();
  s->row_candidate.clear();
  s->row_hidden.clear();
  return absl::OkStatus();
}

absl::Status Eagle3Drafter::Extend(int seq, int64_t first_position, std::span<const int64_t> tokens,
                                   const TensorView& aux, const TensorView& root_logits) {
  EAGLE3_ASSIGN_OR_RETURN(State * s, Get(seq));
  if (first_position != s->cache_len) {
    return absl::InvalidArgumentError("Eagle3Drafter::Extend: sequence " + std::to_string(seq) + " has " +
                                      std::to_string(s->cache_len) + " committed rows, the new rows start at " +
                                      std::to_string(first_position));
  }
  // The tree rows of the last build are dead: overwrite them from the committed end.
  s->row_candidate.clear();
  s->row_hidden.clear();
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t hidden = draft_->shape().hidden_size;
  std::vector<float> hidden_out(static_cast<size_t>(n * hidden));
  DraftSequenceInput in;
  in.tokens = tokens;
  in.page_table = s->pages;
  in.cache_len = s->cache_len;
  EAGLE3_RETURN_IF_ERROR(draft_->Forward(std::span<const DraftSequenceInput>(&in, 1), aux, /*from_target=*/true,
                                         root_logits.Reshape(Shape{1, draft_vocab()}),
                                         TensorView(hidden_out.data(), DType::kF32, Shape{n, hidden})));
  s->cache_len += n;
  s->root_hidden.assign(hidden_out.end() - hidden, hidden_out.end());
  return absl::OkStatus();
}

absl::Status Eagle3Drafter::Expand(int seq, std::span<const DraftCandidate> candidates,
                                   std::span<const int32_t> frontier, const TensorView& logits) {
  EAGLE3_ASSIGN_OR_RETURN(State * s, Get(seq));
  const int64_t n = static_cast<int64_t>(frontier.size());
  const int64_t hidden = draft_->shape().hidden_size;
  const int64_t tree_rows = static_cast<int64_t>(s->row_candidate.size());
  const int64_t kv_len = s->cache_len + tree_rows + n;
  std::vector<int64_t> tokens(static_cast<size_t>(n)), positions(static_cast<size_t>(n));
  std::vector<float> inputs(static_cast<size_t>(n * hidden));
  std::vector<uint8_t> mask(static_cast<size_t>(n * kv_len), 0);
  for (int64_t i = 0; i < n; ++i) {
    const DraftCandidate& c = candidates[static_cast<size_t>(frontier[i])];
    tokens[i] = c.token;
    // The root's row sits at position cache_len - 1; a node at depth d at cache_len - 1 + d.
    positions[i] = s->cache_len - 1 + c.depth;
    uint8_t* row = &mask[static_cast<size_t>(i * kv_len)];
    std::fill(row, row + s->cache_len, uint8_t{1});
    row[s->cache_len + tree_rows + i] = 1;
    // The input hidden is the parent's fed-back r; ancestors' tree rows are visible.
    const std::vector<float>* parent_hidden = &s->root_hidden;
    for (int32_t a = c.parent; a > 0; a = candidates[static_cast<size_t>(a)].parent) {
      const auto it = std::find(s->row_candidate.begin(), s->row_candidate.end(), a);
      if (it == s->row_candidate.end()) {
        return absl::InvalidArgumentError("Eagle3Drafter::Expand: candidate " + std::to_string(frontier[i]) +
                                          " has ancestor " + std::to_string(a) + " that was never expanded");
      }
      const size_t r = static_cast<size_t>(it - s->row_candidate.begin());
      row[s->cache_len + static_cast<int64_t>(r)] = 1;
      if (a == c.parent) parent_hidden = &s->row_hidden[r];
    }
    std::copy(parent_hidden->begin(), parent_hidden->end(), inputs.begin() + i * hidden);
  }
  std::vector<float> hidden_out(static_cast<size_t>(n * hidden));
  DraftSequenceInput in;
  in.tokens = tokens;
  in.positions = positions;
  in.page_table = s->pages;
  in.cache_len = s->cache_len + tree_rows;
  in.mask = mask;
  in.all_logits = true;
  EAGLE3_RETURN_IF_ERROR(draft_->Forward(std::span<const DraftSequenceInput>(&in, 1),
                                         TensorView(inputs.data(), DType::kF32, Shape{n, hidden}),
                                         /*from_target=*/false, logits,
                                         TensorView(hidden_out.data(), DType::kF32, Shape{n, hidden})));
  for (int64_t i = 0; i < n; ++i) {
    s->row_candidate.push_back(frontier[i]);
    s->row_hidden.emplace_back(hidden_out.begin() + i * hidden, hidden_out.begin() + (i + 1) * hidden);
  }
  return absl::OkStatus();
}

}  // namespace eagle3
