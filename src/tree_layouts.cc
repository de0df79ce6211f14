#include "eagle3/tree_layouts.h"

#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "eagle3/status.h"

namespace eagle3 {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

// Bytes per row of SGLang's QLEN_ONLY_BITPACKING mask: the uint8 / uint16 / uint32 its Python side
// allocates for N <= 8 / 16 / 32.
int64_t SGLangPackedRowBytes(int64_t n) { return n <= 8 ? 1 : (n <= 16 ? 2 : 4); }

// The tree whose ancestor-or-self relation is `bit(i, j)` (i, j < N); `bit(i, j)` for j >= N (if the
// layout has such bits) is checked by the caller. The parent of i is its highest-index proper ancestor
// (ancestors form a chain whose indices increase towards i), and row i must be that parent's row plus i.
template <typename Bit>
absl::StatusOr<DraftTree> TreeFromBits(std::span<const int64_t> tokens, const char* layout, Bit bit) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 1) return absl::InvalidArgumentError(std::string(layout) + ": no nodes (the root is required)");
  std::vector<int32_t> parents(static_cast<size_t>(n), -1);
  for (int64_t i = 0; i < n; ++i) {
    if (!bit(i, i)) {
      return absl::InvalidArgumentError(std::string(layout) + ": row " + Str(i) +
                                        " does not attend node " + Str(i) + " itself");
    }
    for (int64_t j = i + 1; j < n; ++j) {
      if (bit(i, j)) {
        return absl::InvalidArgumentError(std::string(layout) + ": row " + Str(i) + " attends later node " +
                                          Str(j) + "; parents must precede children");
      }
    }
    if (i == 0) continue;
    int64_t p = i - 1;
    while (p >= 0 && !bit(i, p)) --p;
    if (p < 0) {
      return absl::InvalidArgumentError(std::string(layout) + ": row " + Str(i) +
                                        " attends no earlier node, not even the root");
    }
    for (int64_t j = 0; j < i; ++j) {
      if (bit(i, j) != bit(p, j)) {
        return absl::InvalidArgumentError(
            std::string(layout) + ": row " + Str(i) + " is not its parent's row plus itself: column " + Str(j) +
            " is " + (bit(i, j) ? "1" : "0") + " but " + (bit(p, j) ? "1" : "0") + " in row " + Str(p) +
            " (node " + Str(i) + "'s deepest ancestor)");
      }
    }
    parents[i] = static_cast<int32_t>(p);
  }
  return DraftTree::FromParents(tokens, parents);
}

// The tree named by first-child / next-sibling lists, with their sibling order.
absl::StatusOr<DraftTree> TreeFromLists(std::span<const int64_t> tokens, std::span<const int64_t> first_child,
                                        std::span<const int64_t> next_sibling, const char* layout) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 1) return absl::InvalidArgumentError(std::string(layout) + ": no nodes (the root is required)");
  if (static_cast<int64_t>(first_child.size()) != n || static_cast<int64_t>(next_sibling.size()) != n) {
    return absl::InvalidArgumentError(std::string(layout) + ": " + Str(n) + " tokens but " +
                                      Str(first_child.size()) + " first-child and " + Str(next_sibling.size()) +
                                      " next-sibling entries");
  }
  if (next_sibling[0] != -1) {
    return absl::InvalidArgumentError(std::string(layout) + ": the root (node 0) has next sibling " +
                                      Str(next_sibling[0]) + ", expected -1");
  }
  constexpr int32_t kUnseen = -2;
  std::vector<int32_t> parents(static_cast<size_t>(n), kUnseen);
  parents[0] = -1;
  for (int64_t p = 0; p < n; ++p) {
    for (int64_t c = first_child[p]; c != -1; c = next_sibling[c]) {
      if (c < 1 || c >= n) {
        return absl::InvalidArgumentError(std::string(layout) + ": the child list of node " + Str(p) +
                                          " names node " + Str(c) + ", out of range [1, " + Str(n - 1) + "]");
      }
      if (parents[c] != kUnseen) {
        return absl::InvalidArgumentError(std::string(layout) + ": node " + Str(c) + " is listed under node " +
                                          Str(p) + " and again under node " + Str(parents[c]) +
                                          " (or its sibling chain has a cycle)");
      }
      parents[c] = static_cast<int32_t>(p);
    }
  }
  for (int64_t i = 1; i < n; ++i) {
    if (parents[i] == kUnseen) {
      return absl::InvalidArgumentError(std::string(layout) + ": node " + Str(i) + " is in no child list");
    }
  }
  EAGLE3_ASSIGN_OR_RETURN(DraftTree tree, DraftTree::FromParents(tokens, parents));
  for (int64_t i = 0; i < n; ++i) {
    tree.first_child[i] = static_cast<int32_t>(first_child[i]);
    tree.next_sibling[i] = static_cast<int32_t>(next_sibling[i]);
  }
  EAGLE3_RETURN_IF_ERROR(tree.Validate());
  return tree;
}

}  // namespace

std::vector<uint8_t> PrefixedTreeMask(const DraftTree& tree, int64_t prefix_len) {
  const int64_t n = tree.size();
  const int64_t cols = prefix_len + n;
  const std::vector<uint8_t> dense = tree.DenseMask();
  std::vector<uint8_t> mask(static_cast<size_t>(n * cols), 1);
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(dense.begin() + i * n, n, mask.begin() + i * cols + prefix_len);
  }
  return mask;
}

std::vector<uint8_t> PackBitsLittle(std::span<const uint8_t> bits) {
  std::vector<uint8_t> packed((bits.size() + 7) / 8, 0);
  for (size_t e = 0; e < bits.size(); ++e) {
    if (bits[e] != 0) packed[e / 8] |= static_cast<uint8_t>(1u << (e % 8));
  }
  return packed;
}

absl::StatusOr<std::vector<uint8_t>> UnpackBitsLittle(std::span<const uint8_t> packed, int64_t num_bits) {
  if (num_bits < 0 || static_cast<int64_t>(packed.size()) != (num_bits + 7) / 8) {
    return absl::InvalidArgumentError("unpack bits: " + Str(packed.size()) + " bytes cannot hold exactly " +
                                      Str(num_bits) + " bits (expected " + Str((num_bits + 7) / 8) + " bytes)");
  }
  std::vector<uint8_t> bits(static_cast<size_t>(num_bits));
  for (int64_t e = 0; e < num_bits; ++e) bits[e] = (packed[e / 8] >> (e % 8)) & 1u;
  return bits;
}

absl::StatusOr<DraftTree> TreeFromAncestorMask(std::span<const int64_t> tokens, std::span<const uint8_t> mask,
                                               int64_t prefix_len) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (prefix_len < 0) {
    return absl::InvalidArgumentError("tree mask: prefix length " + Str(prefix_len) + " is negative");
  }
  const int64_t cols = prefix_len + n;
  if (static_cast<int64_t>(mask.size()) != n * cols) {
    return absl::InvalidArgumentError("tree mask: " + Str(mask.size()) + " entries, expected [" + Str(n) + ", " +
                                      Str(prefix_len) + " + " + Str(n) + "] = " + Str(n * cols));
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < prefix_len; ++j) {
      if (mask[i * cols + j] == 0) {
        return absl::InvalidArgumentError("tree mask: row " + Str(i) + " does not attend cached column " + Str(j) +
                                          "; every node attends the whole prefix");
      }
    }
  }
  return TreeFromBits(tokens, "tree mask", [&](int64_t i, int64_t j) {
    return mask[i * cols + prefix_len + j] != 0;
  });
}

absl::StatusOr<SGLangTree> ToSGLang(const DraftTree& tree, int64_t seq_len, SGLangTreeMaskMode mode,
                                    int64_t batch_index) {
  EAGLE3_RETURN_IF_ERROR(tree.Validate());
  if (seq_len < 0 || batch_index < 0) {
    return absl::InvalidArgumentError("SGLang tree: seq_len (" + Str(seq_len) + ") and batch_index (" +
                                      Str(batch_index) + ") must be >= 0");
  }
  const int64_t n = tree.size();
  SGLangTree out;
  out.draft_tokens = tree.tokens;
  out.positions = tree.Positions(seq_len);
  out.retrive_index.resize(n);
  out.retrive_next_token.assign(tree.first_child.begin(), tree.first_child.end());
  out.retrive_next_sibling.assign(tree.next_sibling.begin(), tree.next_sibling.end());
  for (int64_t i = 0; i < n; ++i) out.retrive_index[i] = batch_index * n + i;
  switch (mode) {
    case SGLangTreeMaskMode::kFullMask:
      out.tree_mask = PrefixedTreeMask(tree, seq_len);
      break;
    case SGLangTreeMaskMode::kQLenOnly:
      out.tree_mask = tree.DenseMask();
      break;
    case SGLangTreeMaskMode::kQLenOnlyBitPacking: {
      if (n > 32) {
        return absl::InvalidArgumentError(
            "SGLang tree: QLEN_ONLY_BITPACKING holds at most 32 nodes per row, the tree has " + Str(n));
      }
      const int64_t row_bytes = SGLangPackedRowBytes(n);
      const std::vector<uint32_t> packed = tree.PackedMask();  // one word per row for N <= 32
      out.tree_mask.assign(static_cast<size_t>(n * row_bytes), 0);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t byte = 0; byte < row_bytes; ++byte) {
          out.tree_mask[i * row_bytes + byte] = static_cast<uint8_t>(packed[i] >> (8 * byte));
        }
      }
      break;
    }
    default:
      return absl::InvalidArgumentError("SGLang tree: unknown tree mask mode " + Str(static_cast<int>(mode)));
  }
  return out;
}

absl::StatusOr<DraftTree> FromSGLang(std::span<const int64_t> draft_tokens,
                                     std::span<const int64_t> retrive_next_token,
                                     std::span<const int64_t> retrive_next_sibling) {
  return TreeFromLists(draft_tokens, retrive_next_token, retrive_next_sibling, "SGLang tree");
}

absl::StatusOr<DraftTree> FromSGLangMask(std::span<const int64_t> draft_tokens, std::span<const uint8_t> tree_mask,
                                         int64_t seq_len, SGLangTreeMaskMode mode) {
  const int64_t n = static_cast<int64_t>(draft_tokens.size());
  switch (mode) {
    case SGLangTreeMaskMode::kFullMask:
      return TreeFromAncestorMask(draft_tokens, tree_mask, seq_len);
    case SGLangTreeMaskMode::kQLenOnly:
      return TreeFromAncestorMask(draft_tokens, tree_mask, 0);
    case SGLangTreeMaskMode::kQLenOnlyBitPacking: {
      if (n < 1 || n > 32) {
        return absl::InvalidArgumentError("SGLang tree mask: QLEN_ONLY_BITPACKING holds 1 to 32 nodes, got " + Str(n));
      }
      const int64_t row_bytes = SGLangPackedRowBytes(n);
      if (static_cast<int64_t>(tree_mask.size()) != n * row_bytes) {
        return absl::InvalidArgumentError("SGLang tree mask: " + Str(tree_mask.size()) + " bytes, expected " + Str(n) +
                                          " rows of " + Str(row_bytes) + " bytes");
      }
      auto bit = [&](int64_t i, int64_t j) { return ((tree_mask[i * row_bytes + j / 8] >> (j % 8)) & 1u) != 0; };
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = n; j < 8 * row_bytes; ++j) {
          if (bit(i, j)) {
            return absl::InvalidArgumentError("SGLang tree mask: row " + Str(i) + " sets bit " + Str(j) +
                                              ", past the " + Str(n) + " nodes");
          }
        }
      }
      return TreeFromBits(draft_tokens, "SGLang tree mask", bit);
    }
  }
  return absl::InvalidArgumentError("SGLang tree mask: unknown mode " + Str(static_cast<int>(mode)));
}

std::vector<uint8_t> FlashInferPackedCustomMask(const DraftTree& tree, int64_t prefix_len) {
  return PackBitsLittle(PrefixedTreeMask(tree, prefix_len));
}

absl::StatusOr<DraftTree> FromFlashInferPackedMask(std::span<const int64_t> tokens, std::span<const uint8_t> packed,
                                                   int64_t prefix_len) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (prefix_len < 0) {
    return absl::InvalidArgumentError("FlashInfer mask: prefix length " + Str(prefix_len) + " is negative");
  }
  EAGLE3_ASSIGN_OR_RETURN(std::vector<uint8_t> bits, UnpackBitsLittle(packed, n * (prefix_len + n)));
  return TreeFromAncestorMask(tokens, bits, prefix_len);
}

absl::StatusOr<TrtllmTree> ToTrtllm(const DraftTree& tree, int32_t max_decoding_tokens, int32_t max_path_len) {
  EAGLE3_RETURN_IF_ERROR(tree.Validate());
  const int32_t n = tree.size();
  const int32_t depth = tree.max_depth();
  if (max_decoding_tokens != 0 && max_decoding_tokens < n) {
    return absl::InvalidArgumentError("TensorRT-LLM tree: " + Str(n) + " nodes exceed max_decoding_tokens = " +
                                      Str(max_decoding_tokens));
  }
  if (max_path_len != 0 && max_path_len < depth + 1) {
    return absl::InvalidArgumentError("TensorRT-LLM tree: depth " + Str(depth) + " needs paths of " +
                                      Str(depth + 1) + " entries, max_path_len = " + Str(max_path_len));
  }
  TrtllmTree out;
  out.path_len = max_path_len != 0 ? max_path_len : depth + 1;
  out.mask_words = (std::max(n, max_decoding_tokens) + 31) / 32;

  std::vector<std::vector<int32_t>> paths;
  for (int32_t i = 0; i < n; ++i) {
    if (tree.first_child[i] != -1) continue;
    std::vector<int32_t> path;
    for (int32_t v = i; v != -1; v = tree.parents[v]) path.push_back(v);
    std::reverse(path.begin(), path.end());
    paths.push_back(std::move(path));
  }
  std::sort(paths.begin(), paths.end());
  out.num_paths = max_decoding_tokens != 0 ? max_decoding_tokens : static_cast<int32_t>(paths.size());
  out.paths.assign(static_cast<size_t>(out.num_paths) * out.path_len, -1);
  for (size_t r = 0; r < paths.size(); ++r) {
    std::copy(paths[r].begin(), paths[r].end(), out.paths.begin() + static_cast<ptrdiff_t>(r * out.path_len));
  }

  const std::vector<uint32_t> packed = tree.PackedMask();
  const int32_t words = (n + 31) / 32;
  out.packed_mask.assign(static_cast<size_t>(n) * out.mask_words, 0);
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t w = 0; w < words; ++w) {
      out.packed_mask[static_cast<size_t>(i) * out.mask_words + w] = static_cast<int32_t>(packed[i * words + w]);
    }
  }
  out.position_offsets.assign(tree.depths.begin(), tree.depths.end());
  return out;
}

absl::StatusOr<DraftTree> FromTrtllmPaths(std::span<const int64_t> tokens, std::span<const int32_t> paths,
                                          int32_t path_len) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 1) return absl::InvalidArgumentError("TensorRT-LLM paths: no nodes (the root is required)");
  if (path_len < 1 || paths.size() % static_cast<size_t>(path_len) != 0) {
    return absl::InvalidArgumentError("TensorRT-LLM paths: " + Str(paths.size()) +
                                      " entries are not rows of path_len = " + Str(path_len));
  }
  constexpr int32_t kUnseen = -2;
  std::vector<int32_t> parents(static_cast<size_t>(n), kUnseen);
  parents[0] = -1;
  const int64_t rows = static_cast<int64_t>(paths.size()) / path_len;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* row = paths.data() + r * path_len;
    int32_t len = 0;
    while (len < path_len && row[len] != -1) ++len;
    for (int32_t d = len; d < path_len; ++d) {
      if (row[d] != -1) {
        return absl::InvalidArgumentError("TensorRT-LLM paths: row " + Str(r) + " has node " + Str(row[d]) +
                                          " after -1 padding at column " + Str(len));
      }
    }
    if (len == 0) continue;  // an unused row
    if (row[0] != 0) {
      return absl::InvalidArgumentError("TensorRT-LLM paths: row " + Str(r) + " starts at node " + Str(row[0]) +
                                        ", not the root 0");
    }
    for (int32_t d = 1; d < len; ++d) {
      const int32_t node = row[d];
      if (node < 1 || node >= n) {
        return absl::InvalidArgumentError("TensorRT-LLM paths: row " + Str(r) + " column " + Str(d) + " names node " +
                                          Str(node) + ", out of range [1, " + Str(n - 1) + "]");
      }
      if (parents[node] != kUnseen && parents[node] != row[d - 1]) {
        return absl::InvalidArgumentError("TensorRT-LLM paths: row " + Str(r) + " gives node " + Str(node) +
                                          " parent " + Str(row[d - 1]) + ", an earlier row gave it parent " +
                                          Str(parents[node]));
      }
      parents[node] = row[d - 1];
    }
  }
  for (int64_t i = 1; i < n; ++i) {
    if (parents[i] == kUnseen) {
      return absl::InvalidArgumentError("TensorRT-LLM paths: node " + Str(i) + " lies on no path");
    }
  }
  return DraftTree::FromParents(tokens, parents);
}

absl::StatusOr<DraftTree> FromTrtllmPackedMask(std::span<const int64_t> tokens, std::span<const int32_t> packed_mask,
                                               int32_t mask_words) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (mask_words < (n + 31) / 32 || static_cast<int64_t>(packed_mask.size()) != n * mask_words) {
    return absl::InvalidArgumentError("TensorRT-LLM packed mask: " + Str(packed_mask.size()) + " words as rows of " +
                                      Str(mask_words) + " for " + Str(n) + " nodes; expected [" + Str(n) +
                                      ", >= " + Str((n + 31) / 32) + "]");
  }
  auto bit = [&](int64_t i, int64_t j) {
    return ((static_cast<uint32_t>(packed_mask[i * mask_words + j / 32]) >> (j % 32)) & 1u) != 0;
  };
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = n; j < 32 * static_cast<int64_t>(mask_words); ++j) {
      if (bit(i, j)) {
        return absl::InvalidArgumentError("TensorRT-LLM packed mask: row " + Str(i) + " sets bit " + Str(j) +
                                          ", past the " + Str(n) + " nodes");
      }
    }
  }
  return TreeFromBits(tokens, "TensorRT-LLM packed mask", bit);
}

}  // namespace eagle3
