// Synthetic acceptance: the benchmark method serving benchmarks use to time speculative decoding at a
// chosen mean accepted length, independent of how good the draft head is. After the draft has built
// a tree, its best path (each node's first child, the child of highest draft score) is rewritten to
// the target's own greedy continuation for a drawn number m of tokens, and the next node of the path
// (and any of its siblings) is made to differ from it, so greedy verification accepts exactly
// min(m, depth of the path) drafted tokens. Everything else of the step (the draft forwards, the tree
// build, the verify forward over the whole tree) runs on its real shapes.
//
// m is drawn per sequence and step with P(m >= j) = alpha^j for j <= max_depth (each drafted token
// accepted with probability alpha given its parent was), so the mean accepted length (m + 1, the
// bonus token included) is sum_{j=0}^{max_depth} alpha^j; SyntheticAlphaFor inverts it.
//
// Header-only with no abseil and no std:: containers: the same code runs in CUDA kernels
// (benchmarks/cuda/e2e_kernels.cu) and in host tests.
#pragma once

#include <cstdint>

#include "eagle3/detail/host_device.h"
#include "eagle3/philox.h"

namespace eagle3 {

// The mean accepted length (bonus token included) of draws with per-token probability `alpha` over
// paths of `max_depth` drafted tokens.
EAGLE3_HOST_DEVICE constexpr double SyntheticMeanAccepted(double alpha, int max_depth) {
  double sum = 0, term = 1;
  for (int j = 0; j <= max_depth; ++j, term *= alpha) sum += term;
  return sum;
}

// The alpha in [0, 1] whose mean accepted length is `mean` (clamped to [1, max_depth + 1]).
EAGLE3_HOST_DEVICE constexpr double SyntheticAlphaFor(double mean, int max_depth) {
  double lo = 0, hi = 1;
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (lo + hi);
    (SyntheticMeanAccepted(mid, max_depth) < mean ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// m for (seed, draw, sequence): the number of leading Philox coins below alpha, at most max_depth.
EAGLE3_HOST_DEVICE constexpr int SyntheticAcceptedCount(uint64_t seed, uint64_t draw, uint32_t sequence, double alpha,
                                                        int max_depth) {
  int m = 0;
  while (m < max_depth && PhiloxCoin(seed, draw, sequence, static_cast<uint32_t>(m)) < alpha) ++m;
  return m;
}

// Rewrites one tree (`tokens` / `parents`: n nodes, node 0 the root, parents before children,
// siblings in decreasing draft score) so that greedy verification against a target whose greedy
// continuation after the root is continuation[0], continuation[1], ... (`length` entries) accepts
// exactly the returned count: min(m, the depth of the first-child path, length). Every token stays in
// [0, vocab) when the tree's and the continuation's do.
EAGLE3_HOST_DEVICE inline int RewriteBestPath(int64_t* tokens, const int32_t* parents, int n,
                                              const int64_t* continuation, int length, int m, int64_t vocab) {
  int node = 0;
  for (int depth = 0; depth < length; ++depth) {
    const int64_t want = continuation[depth];
    int first = -1;
    for (int i = node + 1; i < n; ++i) {
      if (parents[i] != node) continue;
      if (first < 0) first = i;
      // A sibling equal to the continuation would be accepted in place of the rewritten path (or
      // beyond m): make it differ.
      if (tokens[i] == want) tokens[i] = want + 1 < vocab ? want + 1 : 0;
    }
    if (first < 0 || depth >= m) return depth;
    tokens[first] = want;
    node = first;
  }
  return length;
}

}  // namespace eagle3
