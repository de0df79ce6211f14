// CpuBackend::TreeBuildStep / TreeBuildFinalize: BuildDraftTree's passes (src/draft_tree_steps.h)
// for a batch of sequences, each sequence's candidate store kept in the caller's workspace between
// the calls, so that the op holds no state of its own.
//
// Workspace: B slices of SliceLayout::stride bytes, one per sequence, each (8-byte aligned parts):
//   int64_t count                  candidates so far
//   int32_t frontier[topk]         the next pass's frontier (candidate indices), padded to 8 bytes
//   DraftCandidate candidates[C]   C = 1 + topk + (num_steps - 1) topk², candidate 0 the root
//   double scores[C]               exact cumulative scores
#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "cpu/cpu_backend_internal.h"
#include "draft_tree_steps.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/draft_tree.h"
#include "eagle3/status.h"

namespace eagle3::cpu {
namespace {

using draft_tree_internal::CandidatesBefore;
using draft_tree_internal::CandidateStore;
using draft_tree_internal::MaxCandidates;

static_assert(std::is_trivially_copyable_v<DraftCandidate> && alignof(DraftCandidate) <= 8,
              "candidates live in a byte workspace");

int64_t AlignUp8(int64_t n) { return (n + 7) / 8 * 8; }

// Byte offsets of one sequence's slice.
struct SliceLayout {
  int64_t frontier = 0;
  int64_t candidates = 0;
  int64_t scores = 0;
  int64_t stride = 0;
};

SliceLayout LayoutOf(const TreeBuildShape& shape) {
  const int64_t c = MaxCandidates(shape.topk, shape.num_steps);
  SliceLayout l;
  l.frontier = sizeof(int64_t);
  l.candidates = l.frontier + AlignUp8(shape.topk * static_cast<int64_t>(sizeof(int32_t)));
  l.scores = l.candidates + c * static_cast<int64_t>(sizeof(DraftCandidate));
  l.stride = l.scores + c * static_cast<int64_t>(sizeof(double));
  return l;
}

CandidateStore SequenceStore(const TensorView& workspace, const SliceLayout& l, int64_t b) {
  char* base = workspace.data_as<char>() + b * l.stride;
  return {reinterpret_cast<DraftCandidate*>(base + l.candidates),
          reinterpret_cast<double*>(base + l.scores), reinterpret_cast<int32_t*>(base + l.frontier),
          reinterpret_cast<int64_t*>(base)};
}

// A workspace whose sequences do not hold `expected` candidates was not built by the passes before
// this call (out of order, or another shape): refused before anything is written.
absl::Status CheckCounts(const char* op, const TreeBuildShape& shape, const TensorView& workspace,
                         const TensorView& errors, int64_t expected) {
  const SliceLayout layout = LayoutOf(shape);
  const int64_t* records = errors.data_as<const int64_t>();
  for (int64_t b = 0; b < shape.batch; ++b) {
    if (records[b * kTreeBuildErrorWidth] != 0) continue;
    const int64_t count = *SequenceStore(workspace, layout, b).count;
    if (count != expected) {
      return Invalid(op, "workspace: sequence ", b, " holds ", count,
                     " candidates, this call expects ", expected,
                     " (the passes run in order from step 0, one shape per build)");
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t CpuBackend::TreeBuildWorkspaceBytes(const TreeBuildShape& shape) const {
  const DraftTreeParams params{shape.topk, shape.num_steps, shape.num_draft_tokens};
  if (shape.batch < 0 || !params.Validate(shape.vocab).ok()) return 0;
  // Candidate indices are int32 (DraftCandidate::parent); a double bound cannot overflow.
  const double k = shape.topk;
  if (1.0 + k + (shape.num_steps - 1.0) * k * k > std::numeric_limits<int32_t>::max()) return 0;
  const int64_t stride = LayoutOf(shape).stride;
  if (shape.batch > std::numeric_limits<int64_t>::max() / stride) return 0;
  return shape.batch * stride;
}

absl::Status CpuBackend::TreeBuildStep(const TreeBuildShape& shape, int step,
                                       const TensorView& logits, const TensorView& d2t,
                                       const TensorView& workspace, const TensorView& errors,
                                       const TensorView& frontier_tokens,
                                       const TensorView& frontier_parents) {
  const char* op = "TreeBuildStep";
  EAGLE3_RETURN_IF_ERROR(CheckTreeBuildStep(shape, step, logits, d2t, workspace, errors,
                                            frontier_tokens, frontier_parents));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "logits", logits));
  const int64_t before = CandidatesBefore(shape.topk, step);
  if (step > 0) {
    EAGLE3_RETURN_IF_ERROR(CheckCounts(op, shape, workspace, errors, before));
  }
  const DraftTreeParams params{shape.topk, shape.num_steps, shape.num_draft_tokens};
  const SliceLayout layout = LayoutOf(shape);
  const int64_t k = shape.topk;
  const int64_t rows_per_sequence = step == 0 ? 1 : k;
  const std::span<const int64_t> offsets =
      d2t.empty() ? std::span<const int64_t>()
                  : std::span<const int64_t>(d2t.data_as<const int64_t>(),
                                             static_cast<size_t>(shape.vocab));
  int64_t* records = errors.data_as<int64_t>();
  for (int64_t b = 0; b < shape.batch; ++b) {
    int64_t* record = records + b * kTreeBuildErrorWidth;
    const CandidateStore store = SequenceStore(workspace, layout, b);
    if (step == 0) {
      std::fill_n(record, kTreeBuildErrorWidth, 0);
      // The root's token comes with TreeBuildFinalize.
      draft_tree_internal::StartBuild(/*root_token=*/0, store);
    } else if (record[0] != 0) {
      continue;
    }
    const int64_t first_row = b * rows_per_sequence;
    const draft_tree_internal::RowError error = draft_tree_internal::ExpandPass(
        params, step, Row(logits, first_row), logits.stride(0), shape.vocab, offsets, store);
    if (error.kind != draft_tree_internal::RowProblem::kNone) {
      record[0] = static_cast<int64_t>(error.kind);
      record[1] = step;
      record[2] = error.row;
      record[3] = error.draft_id;
      continue;
    }
    if (step + 1 == shape.num_steps) continue;
    for (int64_t r = 0; r < k; ++r) {
      const int32_t c = store.frontier[r];
      frontier_tokens.data_as<int64_t>()[b * k + r] = store.candidates[c].token;
      // This pass appended k children per row in row order: the parent's row is (c - before) / k.
      frontier_parents.data_as<int32_t>()[b * k + r] =
          static_cast<int32_t>(first_row + (c - before) / k);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::TreeBuildFinalize(const TreeBuildShape& shape,
                                           const TensorView& workspace, const TensorView& errors,
                                           const TensorView& root_tokens,
                                           const TensorView& root_positions,
                                           const TensorView& tokens, const TensorView& parents,
                                           const TensorView& positions, const TensorView& mask) {
  const char* op = "TreeBuildFinalize";
  EAGLE3_RETURN_IF_ERROR(CheckTreeBuildFinalize(shape, workspace, errors, root_tokens,
                                                root_positions, tokens, parents, positions, mask));
  EAGLE3_RETURN_IF_ERROR(
      CheckCounts(op, shape, workspace, errors, MaxCandidates(shape.topk, shape.num_steps)));
  const SliceLayout layout = LayoutOf(shape);
  const int64_t n = shape.num_draft_tokens;
  const int64_t* records = errors.data_as<const int64_t>();
  for (int64_t b = 0; b < shape.batch; ++b) {
    if (records[b * kTreeBuildErrorWidth] != 0) continue;
    EAGLE3_ASSIGN_OR_RETURN(
        const DraftTree tree,
        draft_tree_internal::PickTree(SequenceStore(workspace, layout, b),
                                      root_tokens.data_as<const int64_t>()[b],
                                      shape.num_draft_tokens));
    const std::vector<int64_t> node_positions =
        tree.Positions(root_positions.data_as<const int64_t>()[b]);
    const std::vector<uint8_t> node_mask = tree.DenseMask();
    std::copy(tree.tokens.begin(), tree.tokens.end(), tokens.data_as<int64_t>() + b * n);
    std::copy(tree.parents.begin(), tree.parents.end(), parents.data_as<int32_t>() + b * n);
    std::copy(node_positions.begin(), node_positions.end(), positions.data_as<int64_t>() + b * n);
    std::copy(node_mask.begin(), node_mask.end(), mask.data_as<uint8_t>() + b * n * n);
  }
  return absl::OkStatus();
}

}  // namespace eagle3::cpu
