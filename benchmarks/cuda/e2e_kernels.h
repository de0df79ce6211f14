// The synthetic-acceptance kernel of e2e_benchmark.cc (src/synthetic_acceptance.h states the
// method). A C-style launcher: no abseil reaches the .cu.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace eagle3::bench {

// Rewrites `batch` trees of `nodes` nodes on `stream`: tree b's best path becomes the target's
// greedy continuation reference[b][root position + 1 ...] for m tokens, m drawn by
// SyntheticAcceptedCount(seed, *draw_counter, b, alpha, max_depth); then *draw_counter += 1, so
// that every replay of a captured step draws afresh.
//   tokens: [batch, nodes] i64 (rewritten)      parents: [batch, nodes] i32
//   positions: [batch, nodes] i64 (node 0: the root's position)
//   reference: [batch, reference_len] i64: each sequence's tokens by position (prompt, then the
//              target's greedy continuation)
//   draw_counter: one device u64
cudaError_t LaunchSyntheticRewrite(int64_t* tokens, const int32_t* parents, const int64_t* positions, int batch,
                                   int nodes, const int64_t* reference, int64_t reference_len, uint64_t seed,
                                   unsigned long long* draw_counter, double alpha, int max_depth, int64_t vocab,
                                   cudaStream_t stream);

}  // namespace eagle3::bench
