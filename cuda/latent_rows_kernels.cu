// The latent rows kernel (cuda/attention_ops.h, LaunchLatentRows): CudaBackend::LatentRowsAndQueries
// in one launch. No abseil here: nvcc must never see it.
//
// One block per token: it norms the row's c (RmsNormRow, the RmsNorm kernel's own row code, so the
// same bits), rotates its k_pe and every head's q_pe into q_rot (RotatePair, the RoPE kernel's),
// then stores the row at its slot (StoreCached, the paged write's). The norm touches c, the
// rotation k_pe: disjoint elements, so their order does not matter; the store waits for both.
#include <cstdint>

#include "attention_common.cuh"
#include "attention_ops.h"
#include "programmatic_launch.cuh"
#include "rms_norm_row.cuh"

namespace eagle3::cuda {
namespace {

constexpr int kRowsThreads = 256;

template <typename IdType, typename T>
__global__ void __launch_bounds__(kNormMaxThreads)
    LatentRowsKernel(LatentRowsParams a, NormOperands norm, const IdType* __restrict__ positions,
                     const IdType* __restrict__ slots, T* __restrict__ cache) {
  PdlLaunchDependents();  // lets the weight-streaming product after this one start early
  PdlWait();
  if (*a.rope_bad != 0 || *a.paged_bad != 0) return;
  const int64_t half = a.rope / 2;
  const int64_t a_step = a.adjacent_pairs ? 2 : 1, b_offset = a.adjacent_pairs ? 1 : half;
  for (int64_t t = blockIdx.x; t < a.tokens; t += gridDim.x) {
    float* row = a.rows + t * a.rows_stride;
    if (a.norm) RmsNormRow(norm, a.eps, t);
    const float* cs = a.cos_sin + static_cast<int64_t>(positions[t]) * a.table_stride;
    // Pair i of "head" 0 is k_pe's, of head h >= 1 q_pe's of head h - 1.
    for (int64_t i = threadIdx.x; i < (a.heads + 1) * half; i += blockDim.x) {
      const int64_t head = i / half, pair = i - head * half;
      const float c = cs[pair], s = cs[half + pair];
      if (head == 0) {
        float* x = row + a.latent + pair * a_step;
        RotatePair(x[0], x[b_offset], c, s, &x[0], &x[b_offset]);
      } else {
        const float* x = a.q_pe + t * a.q_pe_stride[0] + (head - 1) * a.q_pe_stride[1] + pair * a_step;
        float* y = a.q_rot + t * a.q_rot_stride[0] + (head - 1) * a.q_rot_stride[1] + pair * a_step;
        RotatePair(x[0], x[b_offset], c, s, &y[0], &y[b_offset]);
      }
    }
    __syncthreads();  // the normed c and rotated k_pe are the block's before the row is stored
    T* slot = cache + SlotOf(slots[t], a.slot_table, a.page_size) * a.width;
    for (int64_t col = threadIdx.x; col < a.width; col += blockDim.x) StoreCached(slot + col, row[col]);
    __syncthreads();  // the next token's norm reuses the block's reduction scratch
  }
}

}  // namespace

template <typename T, typename IdType>
cudaError_t LaunchLatentRows(const LatentRowsParams& params, const IdType* positions, const IdType* slots, T* cache,
                             bool programmatic, cudaStream_t stream) {
  const LatentRowsParams& a = params;
  if (a.tokens < 0 || a.heads < 0 || a.rope < 2 || a.rope % 2 != 0 || a.latent < 1 || a.width != a.latent + a.rope ||
      (a.tokens > 1 && a.rows_stride < a.width) || a.page_size < 1 || a.table_stride < a.rope || !(a.eps >= 0.0f)) {
    return cudaErrorInvalidValue;
  }
  if (a.tokens == 0) return cudaSuccess;
  if (a.rows == nullptr || a.cos_sin == nullptr || positions == nullptr || slots == nullptr || cache == nullptr ||
      a.rope_bad == nullptr || a.paged_bad == nullptr || (a.norm && a.norm_weight == nullptr) ||
      (a.heads > 0 && (a.q_pe == nullptr || a.q_rot == nullptr))) {
    return cudaErrorInvalidValue;
  }
  NormOperands norm{};
  int threads = kRowsThreads;
  if (a.norm) {
    if (!MakeNormOperands(a.rows, a.rows_stride, nullptr, 0, a.norm_weight, a.rows, a.rows_stride, a.tokens, a.latent,
                          &norm)) {
      return cudaErrorInvalidValue;
    }
    threads = norm.threads > threads ? norm.threads : threads;  // extra threads add zeros to the norm's sum
  }
  return LaunchKernel(programmatic, LatentRowsKernel<IdType, T>, RowGrid(a.tokens), dim3(threads), 0, stream, a,
                      norm, positions, slots, cache);
}

// The combinations attention_ops.h promises: f32 and bf16 caches, i32 and i64 positions.
template cudaError_t LaunchLatentRows(const LatentRowsParams&, const int32_t*, const int32_t*, float*, bool,
                                      cudaStream_t);
template cudaError_t LaunchLatentRows(const LatentRowsParams&, const int64_t*, const int64_t*, float*, bool,
                                      cudaStream_t);
template cudaError_t LaunchLatentRows(const LatentRowsParams&, const int32_t*, const int32_t*, uint16_t*, bool,
                                      cudaStream_t);
template cudaError_t LaunchLatentRows(const LatentRowsParams&, const int64_t*, const int64_t*, uint16_t*, bool,
                                      cudaStream_t);

}  // namespace eagle3::cuda
