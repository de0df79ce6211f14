// TreeVerifier: decides which drafted tokens the target accepts (docs/semantics.md, verification).
//
// Greedy (temperature == 0): from the root, accept the first child (sibling order) whose token equals
// the target's argmax at its parent; repeat; the bonus token is the argmax at the last accepted node.
// Argmax ties go to the lowest token id.
//
// Stochastic (lossless): with the processed target distribution p at a node (temperature, then
// top-k, then top-p, renormalized), try the children in sibling order: accept child x with
// probability p'(x), where p' starts as p; on rejection set p'(x) = 0 and renormalize; if every
// child is rejected, sample the correction token from p'. At an accepted leaf the bonus token is
// sampled from that node's p. The emitted tokens are distributed exactly as sampling from the target
// alone (duplicate sibling tokens included: a repeated token has p'(x) = 0 on its second try).
//
// Coins, bit for bit (the CUDA port draws the same ones): for sequence b (its index in `trees`),
//   u_j = PhiloxCoin(seed, offset, b, j)   decides drafted node j (j >= 1): accept iff u_j < r(x_j) / m
//   u_0 = PhiloxCoin(seed, offset, b, 0)   samples the one final token (correction or bonus)
// with PhiloxCoin from eagle3/philox.h (key = seed, counter = (offset lo, offset hi, b, j), word 0,
// 24 high bits × 2^-24). r is the residual weight vector at the current node, in double: r = p on
// arrival, r(x) = 0 after x is rejected, and m = Σ r summed in token-id order. Each node is tried at
// most once and one token is sampled per sequence, so no coin is used twice. The final token is the
// smallest id i with r(i) > 0 and u_0 · m < Σ_{j <= i} r(j) (token-id order, double); if rounding
// leaves none, the largest id with r(i) > 0. Pass a fresh `offset` per decode step (for example the
// step counter): the same (seed, offset) replays the same decisions. A CUDA implementation that
// computes p in float may differ from this reference only when a coin lies within rounding of a
// threshold.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/draft_tree.h"
#include "eagle3/export.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

struct EAGLE3_API SamplingParams {
  float temperature = 0.0f;  // 0: greedy verification; else finite and > 0
  int top_k = 0;             // 0: off; >= V is off too
  float top_p = 1.0f;        // (0, 1]; 1: off

  // InvalidArgument naming the parameter when out of range.
  absl::Status Validate() const;
};

struct VerifyResult {
  std::vector<int32_t> accepted_nodes;  // accepted drafted nodes root-to-leaf (root excluded)
  std::vector<int64_t> tokens;          // their tokens, then the bonus / correction token
  int num_accepted() const { return static_cast<int>(accepted_nodes.size()); }
};

// Verifies one tree per sequence of a batch. Everything is validated before any decision is made:
// each tree (DraftTree::Validate), its drafted tokens in [0, V), the logits' shape, dtype and device,
// and every logit (NaN and +inf are InvalidArgument naming the sequence, row and token id; -inf is a
// masked token; a row needs one finite logit).
//   trees[b]: a valid DraftTree of N_b nodes
//   target_logits[b]: [N_b, V], f32, host, unit stride along V (rows may be strided): row i = the
//                     target's logits after node i; V is the same for every sequence
//   seed, offset: Philox key and counter base; sequence b draws its coins from stream b (see above)
class EAGLE3_API TreeVerifier {
 public:
  static absl::StatusOr<std::vector<VerifyResult>> Verify(std::span<const DraftTree> trees,
                                                          std::span<const TensorView> target_logits,
                                                          const SamplingParams& sampling,
                                                          uint64_t seed, uint64_t offset);

  // The processed target distribution at one node, the semantics every backend reproduces, computed
  // in double and written as float:
  //   1. temperature: p ∝ exp((z - max z) / T); -inf logits get 0
  //   2. top-k (0 < k < V): keep the k most probable tokens, ties to the lower id; renormalize
  //   3. top-p (< 1): sort by probability (descending, ties to the lower id) and keep the smallest
  //      prefix whose mass (double, in that order) is >= double(top_p); renormalize
  // NaN / +inf logits, a row without a finite logit, temperature <= 0 and bad top-k / top-p are
  // InvalidArgument.
  //   logits: [V]      probs: [V], out
  static absl::Status ProcessedDistribution(std::span<const float> logits, const SamplingParams& sampling,
                                            std::span<float> probs);
};

}  // namespace eagle3
