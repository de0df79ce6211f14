#include "vocab_parallel_head.h"

#include <algorithm>

#include "view_slices.h"
#include "eagle3/status.h"

namespace eagle3 {

absl::StatusOr<int64_t> CopyLogitRows(Backend& backend, const TensorView& hidden, std::span<const int64_t> n,
                                      std::span<const uint8_t> all_logits, const TensorView& out) {
  int64_t rows = 0, offset = 0;
  for (size_t s = 0; s < n.size(); ++s) {
    const int64_t first = all_logits[s] ? 0 : n[s] - 1;
    EAGLE3_RETURN_IF_ERROR(backend.Copy(Rows(hidden, offset + first, n[s] - first), Rows(out, rows, n[s] - first)));
    rows += n[s] - first;
    offset += n[s];
  }
  return rows;
}

absl::Status VocabParallelLogits(const RankCollectives& ranks, const TensorView& rows, const TensorView& head,
                                 const TensorView& shard, const TensorView& gathered, int64_t vocab,
                                 const TensorView& out) {
  const int64_t r = rows.dim(0), vocab_shard = head.dim(0);
  const TensorView shard_r = Rows(shard, 0, r), gathered_r = Rows(gathered, 0, ranks.tp * r);
  EAGLE3_RETURN_IF_ERROR(ranks.backend->Gemm(rows, head, shard_r, kWeightsGemm));
  EAGLE3_RETURN_IF_ERROR(ranks.AllGather(shard_r, gathered_r));
  for (int q_rank = 0; q_rank < ranks.tp; ++q_rank) {
    const int64_t col = q_rank * vocab_shard;
    const int64_t cols = std::min(vocab_shard, vocab - col);
    if (cols <= 0) break;
    EAGLE3_RETURN_IF_ERROR(
        ranks.backend->Copy(Block(gathered_r, q_rank * r, r, 0, cols), Block(out, 0, r, col, cols)));
  }
  return absl::OkStatus();
}

}  // namespace eagle3
