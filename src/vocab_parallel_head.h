// The vocab-parallel output head shared by TargetModel and DraftModel (internal to src/).
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rank_collectives.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

// Copies the rows whose logits a batch asks for into `out`, sequence by sequence: every row of a
// sequence with all_logits, else its last row. Returns the rows written.
//   hidden: [sum n, H]      n[s], all_logits[s]: per sequence      out: [>= rows, H]
absl::StatusOr<int64_t> CopyLogitRows(Backend& backend, const TensorView& hidden, std::span<const int64_t> n,
                                      std::span<const uint8_t> all_logits, const TensorView& out);

// Logits of `rows` over the whole vocabulary from this rank's head shard: the head GEMM over its
// shard of the padded vocabulary, the all-gather of every rank's shard, and the shards laid side by
// side as full rows (the padding columns dropped).
//   rows: [R, H]      head: [V_shard, H], this rank's rows of lm_head (or of the tied embedding)
//   shard: [>= R, V_shard] f32 scratch      gathered: [>= tp R, V_shard] f32 scratch
//   out: [R, vocab] f32, row-strided (host staging or a device buffer)
absl::Status VocabParallelLogits(const RankCollectives& ranks, const TensorView& rows, const TensorView& head,
                                 const TensorView& shard, const TensorView& gathered, int64_t vocab,
                                 const TensorView& out);

}  // namespace eagle3
