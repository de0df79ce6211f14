#include "e2e_kernels.h"

#include "synthetic_acceptance.h"

namespace eagle3::bench {
namespace {

// One thread per tree: a tree is a few nodes and the rewrite a short walk down one path.
__global__ void SyntheticRewriteKernel(int64_t* tokens, const int32_t* parents, const int64_t* positions, int batch,
                                       int nodes, const int64_t* reference, int64_t reference_len, uint64_t seed,
                                       unsigned long long* draw_counter, double alpha, int max_depth,
                                       int64_t vocab) {
  const unsigned long long draw = *draw_counter;
  const int b = static_cast<int>(threadIdx.x);
  if (b < batch) {
    const int64_t row = static_cast<int64_t>(b) * nodes;
    const int64_t root = positions[row];
    const int64_t left = reference_len - root - 1;
    const int length = left <= 0 ? 0 : static_cast<int>(left < nodes ? left : nodes);
    const int m = SyntheticAcceptedCount(seed, draw, static_cast<uint32_t>(b), alpha, max_depth);
    RewriteBestPath(tokens + row, parents + row, nodes, reference + static_cast<int64_t>(b) * reference_len + root + 1,
                    length, m, vocab);
  }
  __syncthreads();  // every thread has read the counter
  if (threadIdx.x == 0) *draw_counter = draw + 1;
}

}  // namespace

cudaError_t LaunchSyntheticRewrite(int64_t* tokens, const int32_t* parents, const int64_t* positions, int batch,
                                   int nodes, const int64_t* reference, int64_t reference_len, uint64_t seed,
                                   unsigned long long* draw_counter, double alpha, int max_depth, int64_t vocab,
                                   cudaStream_t stream) {
  if (batch < 1 || batch > 1024 || nodes < 1) return cudaErrorInvalidValue;
  const int threads = (batch + 31) / 32 * 32;
  SyntheticRewriteKernel<<<1, threads, 0, stream>>>(tokens, parents, positions, batch, nodes, reference,
                                                    reference_len, seed, draw_counter, alpha, max_depth, vocab);
  return cudaGetLastError();
}

}  // namespace eagle3::bench
