// Private: TreeVerifier's one-sequence entry, shared by TreeVerifier::Verify and the CPU backend's
// TreeVerify op (src/cpu/cpu_backend_verify.cc), which verifies each sequence of a batch on its
// own Philox stream and records a sequence's bad data instead of failing the batch.
#pragma once

#include <cstdint>

#include "eagle3/draft_tree.h"
#include "eagle3/tensor_view.h"
#include "eagle3/tree_verifier.h"

namespace eagle3 {

// What is wrong with one sequence, as Backend::TreeVerify records it (eagle3/backend.h,
// kVerifyErrorWidth; the kinds of eagle3::cuda::VerifyErrorKind).
struct VerifyErrorRecord {
  static constexpr int64_t kNone = 0;
  static constexpr int64_t kBadTree = 1;          // node `row`
  static constexpr int64_t kTokenOutOfRange = 2;  // node `row` has token `token`
  static constexpr int64_t kNaN = 3;              // logits row `row`, the lowest bad token id
  static constexpr int64_t kPosInf = 4;           // logits row `row`, the lowest bad token id
  static constexpr int64_t kNoFiniteLogit = 5;    // logits row `row` is all -inf
  int64_t kind = kNone;
  int64_t row = 0;
  int64_t token = 0;
};

struct TreeVerifyOutcome {
  VerifyErrorRecord error;  // kind kNone when the sequence was verified
  VerifyResult result;      // empty unless it was
};

// Verifies one tree with the coins of Philox stream `stream` (TreeVerifier's semantics). Checks
// first, in TreeVerifier's order: the drafted tokens in [0, V) by node, then every logits row by
// row; the first problem is the outcome's error.
//   tree: valid (DraftTree::Validate or DraftTree::FromParents)
//   logits: [N, V] f32 host, V >= 1, unit stride along V (checked by the caller)
//   sampling: validated by the caller
TreeVerifyOutcome VerifyTree(const DraftTree& tree, const TensorView& logits, const SamplingParams& sampling,
                             uint64_t seed, uint64_t offset, uint32_t stream);

}  // namespace eagle3
