// Hooks into SpeculativeStep for benchmarks; not part of the installed surface.
//
// A draft rewriter runs while a drafting step is enqueued, after the trees are built and before
// the target's verify forward, so it is captured with the rest of the step. It may enqueue device
// work on the step's backend that rewrites the drafted tokens in place: the synthetic-acceptance
// benchmark (benchmarks/cuda/e2e_benchmark.cc) replaces each tree's best path with the target's
// own greedy continuation for a drawn number of tokens, which fixes the accepted length while every
// kernel of the step (the real draft head included) still runs on its real shapes.
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "eagle3/speculative_step.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

// The trees of the step being enqueued, on the backend's device (Backend::TreeBuildFinalize's
// outputs).
struct DraftedTrees {
  int64_t batch = 0;  // B: sequences, in the Run's order
  int64_t nodes = 0;  // N: nodes per tree, root included
  TensorView tokens;     // [B, N] i64 target ids, node 0 the root; writable
  TensorView parents;    // [B, N] i32, -1 for the root; children in decreasing draft score
  TensorView positions;  // [B, N] i64: root position + depth
};

using DraftRewriter = std::function<absl::Status(const DraftedTrees&)>;

struct SpeculativeStepTesting {
  // Installs `rewriter` (or removes it: an empty function) for every later drafting step. Captured
  // steps keep whatever device work the rewriter enqueued when they were captured, so its device
  // inputs must stay at the same addresses.
  static void SetDraftRewriter(SpeculativeStep& step, DraftRewriter rewriter);
};

}  // namespace eagle3
