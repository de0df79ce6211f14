// CpuBackend's verification and row-gather ops of the speculative step: TreeVerify (the reference
// for the device's verify + commit offsets, sequence by sequence through TreeVerifier's one-tree
// entry), GatherRows and ExtendMaskRows.
#include <cstdint>
#include <cstring>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cpu/cpu_backend_internal.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/draft_tree.h"
#include "eagle3/status.h"
#include "tree_verifier_internal.h"

namespace eagle3::cpu {
namespace {

// The node DraftTree::FromParents rejects first: the root when its parent is not -1, else the
// lowest node whose parent does not precede it.
int64_t FirstBadParent(std::span<const int32_t> parents) {
  if (parents[0] != -1) return 0;
  for (size_t i = 1; i < parents.size(); ++i) {
    if (parents[i] < 0 || parents[i] >= static_cast<int32_t>(i)) return static_cast<int64_t>(i);
  }
  return 0;
}

// Row r of a row-strided matrix of any dtype, as bytes.
char* RowBytes(const TensorView& t, int64_t r) {
  return static_cast<char*>(t.data()) + r * t.stride(0) * static_cast<int64_t>(DTypeSize(t.dtype()));
}

}  // namespace

absl::Status CpuBackend::TreeVerify(const TensorView& tokens, const TensorView& parents, const TensorView& logits,
                                    const SamplingParams& sampling, const TensorView& seed_offset,
                                    const TreeVerifyOutputs& out) {
  EAGLE3_RETURN_IF_ERROR(CheckTreeVerify(tokens, parents, logits, sampling, seed_offset, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32("TreeVerify", "logits", logits));
  const int64_t batch = tokens.dim(0);
  const int64_t nodes = tokens.dim(1);
  const auto* key = seed_offset.data_as<const int64_t>();
  const auto seed = static_cast<uint64_t>(key[0]);
  const auto offset = static_cast<uint64_t>(key[1]);
  for (int64_t b = 0; b < batch; ++b) {
    const std::span<const int64_t> tree_tokens(tokens.data_as<const int64_t>() + b * nodes, nodes);
    const std::span<const int32_t> tree_parents(parents.data_as<const int32_t>() + b * nodes, nodes);
    TreeVerifyOutcome outcome;
    if (absl::StatusOr<DraftTree> tree = DraftTree::FromParents(tree_tokens, tree_parents); tree.ok()) {
      // Stream b: the sequence's index in the whole batch, as TreeVerifier::Verify draws it.
      outcome = VerifyTree(*tree, logits.Narrow(0, b * nodes, nodes), sampling, seed, offset,
                           static_cast<uint32_t>(b));
    } else {
      outcome.error = {VerifyErrorRecord::kBadTree, FirstBadParent(tree_parents), 0};
    }
    int64_t* error = out.errors.data_as<int64_t>() + b * kVerifyErrorWidth;
    error[0] = outcome.error.kind;
    error[1] = outcome.error.row;
    error[2] = outcome.error.token;
    if (outcome.error.kind != VerifyErrorRecord::kNone) {
      out.num_accepted.data_as<int32_t>()[b] = -1;
      out.commit_counts.data_as<int32_t>()[b] = -1;
      continue;
    }
    const VerifyResult& r = outcome.result;
    const int32_t n = r.num_accepted();
    out.num_accepted.data_as<int32_t>()[b] = n;
    out.commit_counts.data_as<int32_t>()[b] = n + 1;
    int32_t* accepted = out.accepted.data_as<int32_t>() + b * nodes;
    int64_t* out_tokens = out.out_tokens.data_as<int64_t>() + b * nodes;
    int32_t* commit = out.commit_offsets.data_as<int32_t>() + b * nodes;
    commit[0] = 0;  // the root's KV row, then the accepted nodes'
    for (int32_t i = 0; i < n; ++i) {
      accepted[i] = r.accepted_nodes[i];
      commit[i + 1] = r.accepted_nodes[i];
    }
    for (int32_t i = 0; i <= n; ++i) out_tokens[i] = r.tokens[i];
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::GatherRows(const TensorView& src, const TensorView& index, const TensorView& out,
                                    int64_t groups) {
  EAGLE3_RETURN_IF_ERROR(CheckGatherRows(src, index, out, groups));
  const int64_t group_rows = src.dim(0) / groups;  // m
  const int64_t group_out = index.dim(0) / groups;  // q
  const int32_t* ids = index.data_as<const int32_t>();
  for (int64_t i = 0; i < index.dim(0); ++i) {
    if (ids[i] < 0 || ids[i] >= group_rows) {
      return Invalid("GatherRows", "index[", i, "] = ", ids[i], " is outside [0, ", group_rows, ") (src ",
                     src.ToString(), " in ", groups, " group(s))");
    }
  }
  const size_t row_bytes = static_cast<size_t>(src.dim(1)) * DTypeSize(src.dtype());
  for (int64_t i = 0; i < index.dim(0); ++i) {
    std::memcpy(RowBytes(out, i), RowBytes(src, i / group_out * group_rows + ids[i]), row_bytes);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::ExtendMaskRows(const TensorView& src, const TensorView& parent, const TensorView& column,
                                        const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckExtendMaskRows(src, parent, column, out));
  const int64_t rows = src.dim(0);
  const int64_t width = src.dim(1);
  const int32_t* parents = parent.data_as<const int32_t>();
  const int32_t* columns = column.data_as<const int32_t>();
  for (int64_t i = 0; i < parent.dim(0); ++i) {
    if (parents[i] < 0 || parents[i] >= rows) {
      return Invalid("ExtendMaskRows", "parent[", i, "] = ", parents[i], " is outside [0, R = ", rows,
                     ") of src ", src.ToString());
    }
    if (columns[i] < 0 || columns[i] >= width) {
      return Invalid("ExtendMaskRows", "column[", i, "] = ", columns[i], " is outside [0, M = ", width,
                     ") of src ", src.ToString());
    }
  }
  for (int64_t i = 0; i < parent.dim(0); ++i) {
    char* row = RowBytes(out, i);
    std::memcpy(row, RowBytes(src, parents[i]), static_cast<size_t>(width));
    row[columns[i]] = 1;
  }
  return absl::OkStatus();
}

}  // namespace eagle3::cpu
