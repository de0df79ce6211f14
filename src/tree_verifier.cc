#include "eagle3/tree_verifier.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <utility>

#include "eagle3/philox.h"
#include "eagle3/status.h"
#include "tree_verifier_internal.h"

namespace eagle3 {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

// NaN and +inf cannot be ranked or normalized; -inf is a masked token. The row's problem (kind and
// the lowest bad token id; the caller sets the row), or kind kNone when it has a finite logit.
VerifyErrorRecord CheckRow(const float* row, int64_t v) {
  bool any_finite = false;
  for (int64_t j = 0; j < v; ++j) {
    const float x = row[j];
    if (std::isnan(x)) return {VerifyErrorRecord::kNaN, 0, j};
    if (x == std::numeric_limits<float>::infinity()) return {VerifyErrorRecord::kPosInf, 0, j};
    any_finite = any_finite || std::isfinite(x);
  }
  if (!any_finite) return {VerifyErrorRecord::kNoFiniteLogit, 0, 0};
  return {};
}

// What a row problem of CheckRow says (the caller names the row).
std::string RowProblemText(const VerifyErrorRecord& e) {
  if (e.kind == VerifyErrorRecord::kNoFiniteLogit) return "has no finite logit (all -inf)";
  return std::string("has ") + (e.kind == VerifyErrorRecord::kNaN ? "NaN" : "+inf") + " at token id " +
         Str(e.token);
}

// Index of the largest logit, the lowest id among ties.
int64_t Argmax(const float* row, int64_t v) {
  int64_t best = 0;
  for (int64_t j = 1; j < v; ++j) {
    if (row[j] > row[best]) best = j;
  }
  return best;
}

void Normalize(std::vector<double>& p) {
  const double sum = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= sum;
}

// Probability order: higher first, then lower id.
struct ProbOrder {
  const std::vector<double>* p;
  bool operator()(int64_t a, int64_t b) const {
    const double pa = (*p)[a], pb = (*p)[b];
    return pa > pb || (pa == pb && a < b);
  }
};

// The processed distribution in double (see TreeVerifier::ProcessedDistribution). The row is
// checked by the caller; `order` is scratch.
void Process(const float* logits, int64_t v, const SamplingParams& s, std::vector<double>& p,
             std::vector<int64_t>& order) {
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < v; ++j) max = std::max(max, static_cast<double>(logits[j]));
  const double temperature = s.temperature;
  p.resize(static_cast<size_t>(v));
  for (int64_t j = 0; j < v; ++j) p[j] = std::exp((static_cast<double>(logits[j]) - max) / temperature);
  Normalize(p);

  if (s.top_k > 0 && s.top_k < v) {
    order.resize(static_cast<size_t>(v));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::nth_element(order.begin(), order.begin() + s.top_k, order.end(), ProbOrder{&p});
    // nth_element leaves the k best (by ProbOrder, a strict total order) in front.
    for (auto it = order.begin() + s.top_k; it != order.end(); ++it) p[*it] = 0.0;
    Normalize(p);
  }
  if (s.top_p < 1.0f) {
    order.clear();
    for (int64_t j = 0; j < v; ++j) {
      if (p[j] > 0.0) order.push_back(j);
    }
    // Pop the most probable tokens off a heap until the kept mass reaches top_p: the same order as a
    // full sort (ProbOrder is a strict total order) at O(V + kept · log V).
    auto worse = [&p](int64_t a, int64_t b) { return ProbOrder{&p}(b, a); };
    std::make_heap(order.begin(), order.end(), worse);
    const double top_p = s.top_p;
    double mass = 0.0;
    auto heap_end = order.end();
    while (heap_end != order.begin() && mass < top_p) {
      std::pop_heap(order.begin(), heap_end, worse);
      --heap_end;
      mass += p[*heap_end];  // kept
    }
    for (auto it = order.begin(); it != heap_end; ++it) p[*it] = 0.0;
    Normalize(p);
  }
}

// The final token: the smallest id whose cumulative residual weight exceeds u · m (see the header).
int64_t SampleResidual(const std::vector<double>& r, double mass, float u) {
  const double target = static_cast<double>(u) * mass;
  double cumulative = 0.0;
  int64_t last = -1;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r[i] <= 0.0) continue;
    cumulative += r[i];
    if (target < cumulative) return static_cast<int64_t>(i);
    last = static_cast<int64_t>(i);
  }
  return last;
}

const float* Row(const TensorView& logits, int64_t i) {
  return logits.data_as<const float>() + i * logits.stride(0);
}

// The structure and the logits' layout of sequence b; VerifyTree checks the data.
absl::Status CheckSequence(int64_t b, const DraftTree& tree, const TensorView& logits, int64_t vocab) {
  const std::string seq = "verify: sequence " + Str(b);
  if (absl::Status st = tree.Validate(); !st.ok()) {
    return absl::InvalidArgumentError(seq + ": " + std::string(st.message()));
  }
  const int64_t n = tree.size();
  if (logits.rank() != 2 || logits.dtype() != DType::kF32 || !logits.device().is_cpu() ||
      logits.dim(0) != n || logits.dim(1) != vocab || (vocab > 1 && logits.stride(1) != 1) ||
      logits.data() == nullptr) {
    return absl::InvalidArgumentError(seq + ": target logits are " + logits.ToString() +
                                      (logits.data() == nullptr ? " (null)" : "") + ", expected f32[" +
                                      Str(n) + ", " + Str(vocab) + "] cpu with unit stride along the vocabulary (" +
                                      Str(n) + " tree nodes)");
  }
  return absl::OkStatus();
}

// TreeVerifier::Verify's message for a data problem of sequence b.
absl::Status SequenceError(int64_t b, const VerifyErrorRecord& e, int64_t vocab) {
  const std::string seq = "verify: sequence " + Str(b);
  if (e.kind == VerifyErrorRecord::kTokenOutOfRange) {
    return absl::InvalidArgumentError(seq + ": node " + Str(e.row) + " token " + Str(e.token) +
                                      " is out of range [0, " + Str(vocab) + ")");
  }
  return absl::InvalidArgumentError(seq + ": target logits row " + Str(e.row) + " " + RowProblemText(e));
}

VerifyResult VerifyGreedy(const DraftTree& tree, const TensorView& logits, int64_t vocab) {
  VerifyResult result;
  int32_t node = 0;
  while (true) {
    const int64_t target = Argmax(Row(logits, node), vocab);
    int32_t child = tree.first_child[node];
    while (child != -1 && tree.tokens[child] != target) child = tree.next_sibling[child];
    result.tokens.push_back(target);
    if (child == -1) return result;  // `target` is the bonus token
    result.accepted_nodes.push_back(child);
    node = child;
  }
}

VerifyResult VerifyStochastic(const DraftTree& tree, const TensorView& logits, int64_t vocab,
                              const SamplingParams& sampling, uint64_t seed, uint64_t offset,
                              uint32_t stream) {
  VerifyResult result;
  std::vector<double> r;
  std::vector<int64_t> order;
  int32_t node = 0;
  while (true) {
    Process(Row(logits, node), vocab, sampling, r, order);
    double mass = std::accumulate(r.begin(), r.end(), 0.0);
    int32_t accepted = -1;
    for (int32_t child = tree.first_child[node]; child != -1; child = tree.next_sibling[child]) {
      const int64_t x = tree.tokens[child];
      const float u = PhiloxCoin(seed, offset, stream, static_cast<uint32_t>(child));
      if (static_cast<double>(u) < r[x] / mass) {
        accepted = child;
        break;
      }
      if (r[x] > 0.0) {
        r[x] = 0.0;
        // Re-summed rather than decremented, so the last remaining token has probability exactly 1.
        mass = std::accumulate(r.begin(), r.end(), 0.0);
      }
    }
    if (accepted == -1) {
      result.tokens.push_back(SampleResidual(r, mass, PhiloxCoin(seed, offset, stream, 0)));
      return result;
    }
    result.accepted_nodes.push_back(accepted);
    result.tokens.push_back(tree.tokens[accepted]);
    node = accepted;
  }
}

}  // namespace

TreeVerifyOutcome VerifyTree(const DraftTree& tree, const TensorView& logits, const SamplingParams& sampling,
                             uint64_t seed, uint64_t offset, uint32_t stream) {
  TreeVerifyOutcome outcome;
  const int64_t n = tree.size();
  const int64_t vocab = logits.dim(1);
  for (int64_t i = 1; i < n; ++i) {
    if (tree.tokens[i] < 0 || tree.tokens[i] >= vocab) {
      outcome.error = {VerifyErrorRecord::kTokenOutOfRange, i, tree.tokens[i]};
      return outcome;
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if (VerifyErrorRecord e = CheckRow(Row(logits, i), vocab); e.kind != VerifyErrorRecord::kNone) {
      e.row = i;
      outcome.error = e;
      return outcome;
    }
  }
  outcome.result = sampling.temperature == 0.0f
                       ? VerifyGreedy(tree, logits, vocab)
                       : VerifyStochastic(tree, logits, vocab, sampling, seed, offset, stream);
  return outcome;
}

absl::Status SamplingParams::Validate() const {
  if (!(std::isfinite(temperature) && temperature >= 0.0f)) {
    return absl::InvalidArgumentError("sampling: temperature = " + std::to_string(temperature) +
                                      " must be finite and >= 0 (0 = greedy)");
  }
  if (top_k < 0) {
    return absl::InvalidArgumentError("sampling: top_k = " + Str(top_k) + " must be >= 0 (0 = off)");
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError("sampling: top_p = " + std::to_string(top_p) +
                                      " is out of range (0, 1] (1 = off)");
  }
  return absl::OkStatus();
}

absl::Status TreeVerifier::ProcessedDistribution(std::span<const float> logits, const SamplingParams& sampling,
                                                 std::span<float> probs) {
  EAGLE3_RETURN_IF_ERROR(sampling.Validate());
  if (sampling.temperature == 0.0f) {
    return absl::InvalidArgumentError(
        "sampling: temperature = 0 means greedy, which has no distribution to process");
  }
  if (logits.empty() || probs.size() != logits.size()) {
    return absl::InvalidArgumentError("processed distribution: logits have " + Str(logits.size()) +
                                      " entries, probs " + Str(probs.size()) + "; both must be V >= 1");
  }
  const int64_t v = static_cast<int64_t>(logits.size());
  if (const VerifyErrorRecord e = CheckRow(logits.data(), v); e.kind != VerifyErrorRecord::kNone) {
    return absl::InvalidArgumentError("processed distribution: logits " + RowProblemText(e));
  }
  std::vector<double> p;
  std::vector<int64_t> order;
  Process(logits.data(), v, sampling, p, order);
  for (int64_t j = 0; j < v; ++j) probs[j] = static_cast<float>(p[j]);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<VerifyResult>> TreeVerifier::Verify(std::span<const DraftTree> trees,
                                                               std::span<const TensorView> target_logits,
                                                               const SamplingParams& sampling, uint64_t seed,
                                                               uint64_t offset) {
  if (trees.size() != target_logits.size()) {
    return absl::InvalidArgumentError("verify: " + Str(trees.size()) + " trees but " +
                                      Str(target_logits.size()) + " target logits tensors");
  }
  if (trees.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError("verify: batch of " + Str(trees.size()) +
                                      " sequences exceeds the 2^32 Philox streams");
  }
  EAGLE3_RETURN_IF_ERROR(sampling.Validate());
  std::vector<VerifyResult> results;
  if (trees.empty()) return results;
  const int64_t vocab = target_logits[0].rank() == 2 ? target_logits[0].dim(1) : 0;
  if (vocab < 1) {
    return absl::InvalidArgumentError("verify: sequence 0: target logits are " + target_logits[0].ToString() +
                                      ", expected f32[N, V] with V >= 1");
  }
  results.reserve(trees.size());
  for (size_t b = 0; b < trees.size(); ++b) {
    const auto seq = static_cast<int64_t>(b);
    EAGLE3_RETURN_IF_ERROR(CheckSequence(seq, trees[b], target_logits[b], vocab));
    TreeVerifyOutcome outcome =
        VerifyTree(trees[b], target_logits[b], sampling, seed, offset, static_cast<uint32_t>(b));
    if (outcome.error.kind != VerifyErrorRecord::kNone) return SequenceError(seq, outcome.error, vocab);
    results.push_back(std::move(outcome.result));
  }
  return results;
}

}  // namespace eagle3
