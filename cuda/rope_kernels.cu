// The rotary embedding kernel (cuda/attention_ops.h, LaunchApplyRope). No abseil here: nvcc must
// never see it.
#include <cstdint>

#include "attention_common.cuh"
#include "attention_ops.h"
#include "programmatic_launch.cuh"

namespace eagle3::cuda {
namespace {

// One thread per (token, head, pair); pair i is (h[i * a_step], h[i * a_step + b_offset]).
template <typename IdType>
__global__ void RopeKernel(float* __restrict__ x, int64_t tokens, int64_t heads,
                           int64_t token_stride, int64_t head_stride, int64_t offset, int64_t half,
                           const IdType* __restrict__ positions, const float* __restrict__ cos_sin,
                           int64_t table_stride, int64_t a_step, int64_t b_offset,
                           const int* __restrict__ bad) {
  PdlEnter();
  if (*bad != 0) return;
  const int64_t total = tokens * heads * half;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t pair = i % half;
    const int64_t head = i / half;
    const int64_t n = head % heads;
    const int64_t t = head / heads;
    const float* cos = cos_sin + static_cast<int64_t>(positions[t]) * table_stride;
    const float c = cos[pair];
    const float s = cos[half + pair];
    float* h = x + t * token_stride + n * head_stride + offset + pair * a_step;
    RotatePair(h[0], h[b_offset], c, s, &h[0], &h[b_offset]);
  }
}

}  // namespace

template <typename IdType>
cudaError_t LaunchApplyRope(float* x, int64_t tokens, int64_t heads, int64_t token_stride,
                            int64_t head_stride, int64_t offset, int64_t rope_dim,
                            const IdType* positions, const float* cos_sin, int64_t table_stride,
                            bool adjacent_pairs, const int* bad, bool programmatic,
                            cudaStream_t stream) {
  if (tokens < 0 || heads < 0 || offset < 0 || rope_dim < 2 || rope_dim % 2 != 0 ||
      token_stride < 0 || head_stride < 0 || table_stride < 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t half = rope_dim / 2;
  const int64_t total = tokens * heads * half;
  if (total == 0) return cudaSuccess;
  if (x == nullptr || positions == nullptr || cos_sin == nullptr || bad == nullptr) {
    return cudaErrorInvalidValue;
  }
  return LaunchKernel(programmatic, RopeKernel<IdType>, GridFor(total, kThreads), dim3(kThreads),
                      0, stream, x, tokens, heads, token_stride, head_stride, offset, half,
                      positions, cos_sin, table_stride, int64_t{adjacent_pairs ? 2 : 1},
                      adjacent_pairs ? int64_t{1} : half, bad);
}

template cudaError_t LaunchApplyRope(float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                     const int32_t*, const float*, int64_t, bool, const int*, bool,
                                     cudaStream_t);
template cudaError_t LaunchApplyRope(float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                     const int64_t*, const float*, int64_t, bool, const int*, bool,
                                     cudaStream_t);

}  // namespace eagle3::cuda
