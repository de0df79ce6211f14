#include "eagle3/draft_tree.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "draft_tree_steps.h"
#include "eagle3/status.h"

namespace eagle3 {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

}  // namespace

namespace draft_tree_internal {
namespace {

// Log-softmax normalizer of one row, in double: lse = max + log(sum exp(x - max)). NaN and +inf
// cannot be ranked and a row with nothing finite has no distribution: those come back as the
// error (its row left for the caller).
RowError LogSumExp(const float* row, int64_t n, double& lse) {
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    const float x = row[j];
    if (std::isnan(x) || x == std::numeric_limits<float>::infinity()) {
      return {std::isnan(x) ? RowProblem::kNaN : RowProblem::kPosInf, 0, j};
    }
    max = std::max(max, static_cast<double>(x));
  }
  if (max == -std::numeric_limits<double>::infinity()) return {RowProblem::kNoFiniteLogit, 0, -1};
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(row[j]) - max);
  lse = max + std::log(sum);
  return {};
}

// The k largest entries of `row`, largest first; equal values keep the lower index first.
void TopKIndices(const float* row, int64_t n, int k, std::vector<int64_t>& ids) {
  ids.resize(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [row](int64_t a, int64_t b) {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  });
  ids.resize(static_cast<size_t>(k));
}

// Candidate order of the frontier and the final pick: higher score first, then lower index.
struct ScoreOrder {
  const double* scores;
  bool operator()(int32_t a, int32_t b) const {
    const double sa = scores[a], sb = scores[b];
    return sa > sb || (sa == sb && a < b);
  }
};

}  // namespace

int64_t MaxCandidates(int topk, int num_steps) { return CandidatesBefore(topk, num_steps); }

int64_t CandidatesBefore(int topk, int step) {
  const int64_t k = topk;
  return step == 0 ? 1 : 1 + k + (static_cast<int64_t>(step) - 1) * k * k;
}

void StartBuild(int64_t root_token, const CandidateStore& store) {
  store.candidates[0] = DraftCandidate{root_token, -1, -1, 0, 0.0f};
  store.scores[0] = 0.0;
  store.frontier[0] = 0;
  *store.count = 1;
}

RowError ExpandPass(const DraftTreeParams& params, int step, const float* logits, int64_t ld,
                    int64_t vocab, std::span<const int64_t> d2t, const CandidateStore& store) {
  const int k = params.topk;
  const int64_t rows = step == 0 ? 1 : k;
  const int64_t first = *store.count;
  std::vector<int64_t> top;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * ld;
    double lse = 0.0;
    RowError error = LogSumExp(row, vocab, lse);
    if (error.kind != RowProblem::kNone) {
      error.row = r;
      return error;
    }
    const int32_t parent = store.frontier[r];
    TopKIndices(row, vocab, k, top);
    for (const int64_t id : top) {
      const double score = store.scores[parent] + (static_cast<double>(row[id]) - lse);
      const int64_t c = (*store.count)++;
      store.candidates[c] = DraftCandidate{d2t.empty() ? id : id + d2t[id], id, parent,
                                           store.candidates[parent].depth + 1,
                                           static_cast<float>(score)};
      store.scores[c] = score;
    }
  }
  if (step + 1 < params.num_steps) {
    // Next frontier: the best k of this pass's candidates, best first.
    std::vector<int32_t> pass(static_cast<size_t>(*store.count - first));
    std::iota(pass.begin(), pass.end(), static_cast<int32_t>(first));
    std::partial_sort(pass.begin(), pass.begin() + k, pass.end(), ScoreOrder{store.scores});
    std::copy_n(pass.begin(), k, store.frontier);
  }
  return {};
}

absl::StatusOr<DraftTree> PickTree(const CandidateStore& store, int64_t root_token,
                                   int num_draft_tokens) {
  // The best num_draft_tokens - 1 candidates, then back to candidate order.
  const int64_t count = *store.count;
  std::vector<int32_t> picked(static_cast<size_t>(count - 1));
  std::iota(picked.begin(), picked.end(), 1);
  const size_t keep = static_cast<size_t>(num_draft_tokens - 1);
  std::partial_sort(picked.begin(), picked.begin() + static_cast<ptrdiff_t>(keep), picked.end(),
                    ScoreOrder{store.scores});
  picked.resize(keep);
  std::sort(picked.begin(), picked.end());

  std::vector<int32_t> node_of(static_cast<size_t>(count), -1);
  node_of[0] = 0;
  std::vector<int64_t> tokens = {root_token};
  std::vector<int32_t> parents = {-1};
  for (const int32_t c : picked) {
    const int32_t parent_node = node_of[store.candidates[c].parent];
    if (parent_node < 0) {
      // Impossible: a parent scores at least as high as its child and has the lower index.
      return absl::InternalError("draft tree: candidate " + Str(c) + " was kept without its parent " +
                                 Str(store.candidates[c].parent));
    }
    node_of[c] = static_cast<int32_t>(tokens.size());
    tokens.push_back(store.candidates[c].token);
    parents.push_back(parent_node);
  }
  EAGLE3_ASSIGN_OR_RETURN(DraftTree tree, DraftTree::FromParents(tokens, parents));
  for (size_t i = 0; i < picked.size(); ++i) tree.scores[i + 1] = store.candidates[picked[i]].score;
  return tree;
}

}  // namespace draft_tree_internal

absl::Status DraftTreeParams::Validate(int64_t draft_vocab) const {
  if (draft_vocab < 1) {
    return absl::InvalidArgumentError("draft tree: draft_vocab = " + Str(draft_vocab) + " must be >= 1");
  }
  if (topk < 1 || topk > draft_vocab) {
    return absl::InvalidArgumentError("draft tree: topk = " + Str(topk) + " is out of range [1, " +
                                      Str(draft_vocab) + "] (the draft vocabulary size)");
  }
  if (num_steps < 1) {
    return absl::InvalidArgumentError("draft tree: num_steps = " + Str(num_steps) + " must be >= 1");
  }
  // In int64: topk² overflows int for a large topk.
  const int64_t k = topk;
  const int64_t max_tokens = 1 + k + (static_cast<int64_t>(num_steps) - 1) * k * k;
  if (num_draft_tokens < 2 || num_draft_tokens > max_tokens) {
    return absl::InvalidArgumentError(
        "draft tree: num_draft_tokens = " + Str(num_draft_tokens) + " is out of range [2, " +
        Str(max_tokens) + "] (1 + topk + (num_steps - 1) * topk^2 with topk = " + Str(topk) +
        ", num_steps = " + Str(num_steps) + ")");
  }
  return absl::OkStatus();
}

int DraftTree::max_depth() const {
  return depths.empty() ? 0 : *std::max_element(depths.begin(), depths.end());
}

absl::StatusOr<DraftTree> DraftTree::FromParents(std::span<const int64_t> tokens,
                                                 std::span<const int32_t> parents) {
  if (tokens.size() != parents.size()) {
    return absl::InvalidArgumentError("draft tree: " + Str(tokens.size()) + " tokens but " +
                                      Str(parents.size()) + " parents");
  }
  const int n = static_cast<int>(tokens.size());
  if (n < 1) return absl::InvalidArgumentError("draft tree: no nodes (the root is required)");
  DraftTree tree;
  tree.tokens.assign(tokens.begin(), tokens.end());
  tree.parents.assign(parents.begin(), parents.end());
  tree.depths.assign(n, 0);
  tree.first_child.assign(n, -1);
  tree.next_sibling.assign(n, -1);
  tree.scores.assign(n, 0.0f);
  if (parents[0] != -1) {
    return absl::InvalidArgumentError("draft tree: node 0 is the root, its parent must be -1, got " +
                                      Str(parents[0]));
  }
  // Siblings in node order: link each node after the previous child of its parent.
  std::vector<int32_t> last_child(n, -1);
  for (int i = 1; i < n; ++i) {
    const int32_t p = parents[i];
    if (p < 0 || p >= i) {
      return absl::InvalidArgumentError("draft tree: node " + Str(i) + " has parent " + Str(p) +
                                        "; parents must precede children (0 <= parent < " + Str(i) +
                                        ")");
    }
    tree.depths[i] = tree.depths[p] + 1;
    if (last_child[p] < 0) {
      tree.first_child[p] = i;
    } else {
      tree.next_sibling[last_child[p]] = i;
    }
    last_child[p] = i;
  }
  return tree;
}

absl::Status DraftTree::Validate() const {
  const size_t n = tokens.size();
  if (n < 1) return absl::InvalidArgumentError("draft tree: no nodes (the root is required)");
  auto size_error = [n](const char* name, size_t got) {
    return absl::InvalidArgumentError(std::string("draft tree: ") + name + " has " + Str(got) +
                                      " entries, tokens has " + Str(n));
  };
  if (parents.size() != n) return size_error("parents", parents.size());
  if (depths.size() != n) return size_error("depths", depths.size());
  if (first_child.size() != n) return size_error("first_child", first_child.size());
  if (next_sibling.size() != n) return size_error("next_sibling", next_sibling.size());
  if (!scores.empty() && scores.size() != n) return size_error("scores", scores.size());

  const int32_t num = static_cast<int32_t>(n);
  if (parents[0] != -1) {
    return absl::InvalidArgumentError("draft tree: node 0 is the root, its parent must be -1, got " +
                                      Str(parents[0]));
  }
  if (depths[0] != 0) {
    return absl::InvalidArgumentError("draft tree: node 0 (root) has depth " + Str(depths[0]) +
                                      ", expected 0");
  }
  if (next_sibling[0] != -1) {
    return absl::InvalidArgumentError("draft tree: node 0 (root) has next_sibling " +
                                      Str(next_sibling[0]) + ", expected -1");
  }
  for (int32_t i = 1; i < num; ++i) {
    const int32_t p = parents[i];
    if (p < 0 || p >= i) {
      return absl::InvalidArgumentError("draft tree: node " + Str(i) + " has parent " + Str(p) +
                                        "; parents must precede children (0 <= parent < " + Str(i) +
                                        ")");
    }
    if (depths[i] != depths[p] + 1) {
      return absl::InvalidArgumentError("draft tree: node " + Str(i) + " has depth " + Str(depths[i]) +
                                        ", expected " + Str(depths[p] + 1) + " (parent " + Str(p) +
                                        " has depth " + Str(depths[p]) + ")");
    }
  }
  // Walk every node's child chain: each node must appear exactly once, in its parent's chain.
  std::vector<int32_t> listed_under(n, -1);
  for (int32_t p = 0; p < num; ++p) {
    int32_t c = first_child[p];
    const char* link = "first_child";
    int32_t from = p;
    while (c != -1) {
      if (c < 1 || c >= num) {
        return absl::InvalidArgumentError("draft tree: node " + Str(from) + " has " + link + " " + Str(c) +
                                          ", out of range [1, " + Str(num - 1) + "] or -1");
      }
      if (parents[c] != p) {
        return absl::InvalidArgumentError("draft tree: node " + Str(c) + " is in the child list of node " +
                                          Str(p) + " (via " + link + " of node " + Str(from) +
                                          ") but its parent is " + Str(parents[c]));
      }
      if (listed_under[c] != -1) {
        return absl::InvalidArgumentError("draft tree: node " + Str(c) +
                                          " appears twice in the child list of node " + Str(p) +
                                          " (the sibling chain has a cycle)");
      }
      listed_under[c] = p;
      from = c;
      link = "next_sibling";
      c = next_sibling[c];
    }
  }
  for (int32_t i = 1; i < num; ++i) {
    if (listed_under[i] == -1) {
      return absl::InvalidArgumentError("draft tree: node " + Str(i) +
                                        " is missing from the child list of its parent " + Str(parents[i]) +
                                        " (first_child/next_sibling do not reach it)");
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> DraftTree::Positions(int64_t root_position) const {
  std::vector<int64_t> positions(depths.size());
  for (size_t i = 0; i < depths.size(); ++i) positions[i] = root_position + depths[i];
  return positions;
}

std::vector<uint8_t> DraftTree::DenseMask() const {
  const size_t n = parents.size();
  std::vector<uint8_t> mask(n * n, 0);
  // Row i = row of its parent plus itself (parents precede children).
  for (size_t i = 0; i < n; ++i) {
    if (parents[i] >= 0) {
      std::copy_n(mask.begin() + static_cast<ptrdiff_t>(parents[i] * n), n,
                  mask.begin() + static_cast<ptrdiff_t>(i * n));
    }
    mask[i * n + i] = 1;
  }
  return mask;
}

std::vector<uint32_t> DraftTree::PackedMask() const {
  const size_t n = parents.size();
  const size_t w = (n + 31) / 32;
  std::vector<uint32_t> mask(n * w, 0);
  for (size_t i = 0; i < n; ++i) {
    if (parents[i] >= 0) {
      std::copy_n(mask.begin() + static_cast<ptrdiff_t>(parents[i] * w), w,
                  mask.begin() + static_cast<ptrdiff_t>(i * w));
    }
    mask[i * w + i / 32] |= uint32_t{1} << (i % 32);
  }
  return mask;
}

absl::StatusOr<DraftTree> BuildDraftTree(int64_t root_token, const DraftTreeParams& params,
                                         int64_t draft_vocab, std::span<const int64_t> d2t,
                                         const DraftExpandFn& expand) {
  EAGLE3_RETURN_IF_ERROR(params.Validate(draft_vocab));
  if (root_token < 0) {
    return absl::InvalidArgumentError("draft tree: root token " + Str(root_token) + " is negative");
  }
  if (!d2t.empty()) {
    if (static_cast<int64_t>(d2t.size()) != draft_vocab) {
      return absl::InvalidArgumentError("draft tree: d2t has " + Str(d2t.size()) +
                                        " entries, the draft vocabulary " + Str(draft_vocab));
    }
    for (int64_t id = 0; id < draft_vocab; ++id) {
      // d2t holds offsets; an offset below -id maps to a negative target id.
      if (d2t[id] < -id) {
        return absl::InvalidArgumentError("draft tree: d2t[" + Str(id) + "] = " + Str(d2t[id]) +
                                          " maps draft id " + Str(id) + " to target id " +
                                          Str(id + d2t[id]) +
                                          " (< 0); d2t holds offsets: target = draft + d2t[draft]");
      }
    }
  }
  if (!expand) return absl::InvalidArgumentError("draft tree: no draft expand callback");

  using draft_tree_internal::RowProblem;
  const size_t capacity =
      static_cast<size_t>(draft_tree_internal::MaxCandidates(params.topk, params.num_steps));
  std::vector<DraftCandidate> candidates(capacity);
  std::vector<double> scores(capacity);
  std::vector<int32_t> frontier(static_cast<size_t>(params.topk));
  int64_t count = 0;
  const draft_tree_internal::CandidateStore store{candidates.data(), scores.data(), frontier.data(),
                                                  &count};
  draft_tree_internal::StartBuild(root_token, store);

  std::vector<float> logits;
  for (int step = 0; step < params.num_steps; ++step) {
    const int64_t rows = step == 0 ? 1 : params.topk;
    logits.assign(static_cast<size_t>(rows * draft_vocab), 0.0f);
    const TensorView view(logits.data(), DType::kF32, Shape{rows, draft_vocab});
    EAGLE3_RETURN_IF_ERROR(expand(std::span<const DraftCandidate>(candidates.data(), count),
                                  std::span<const int32_t>(frontier.data(), rows), view));
    const draft_tree_internal::RowError error = draft_tree_internal::ExpandPass(
        params, step, logits.data(), draft_vocab, draft_vocab, d2t, store);
    if (error.kind != RowProblem::kNone) {
      const std::string what =
          error.kind == RowProblem::kNoFiniteLogit
              ? std::string("has no finite logit (all -inf)")
              : std::string("has ") + (error.kind == RowProblem::kNaN ? "NaN" : "+inf") +
                    " at draft id " + Str(error.draft_id);
      return absl::InvalidArgumentError("draft tree: logits of step " + Str(step) + " row " +
                                        Str(error.row) + " (candidate " +
                                        Str(frontier[static_cast<size_t>(error.row)]) + ") " + what);
    }
  }
  return draft_tree_internal::PickTree(store, root_token, params.num_draft_tokens);
}

}  // namespace eagle3
