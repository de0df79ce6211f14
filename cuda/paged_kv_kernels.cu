// Paged cache rows (cuda/attention_ops.h, LaunchPagedWrite and LaunchPagedRead): f32 rows to and
// from an f32 or bf16 cache. No abseil here: nvcc must never see it.
#include <cstdint>

#include <cuda_bf16.h>

#include "attention_common.cuh"
#include "attention_ops.h"
#include "programmatic_launch.cuh"

namespace eagle3::cuda {
namespace {

// One block per token: rows[t] -> its slot (to_cache) or its slot -> rows[t].
template <typename IdType, typename T>
__global__ void PagedCopyKernel(float* rows, int64_t rows_stride, int64_t tokens, int64_t width,
                                const IdType* __restrict__ positions,
                                const int32_t* __restrict__ page_table, int64_t page_size,
                                T* cache, bool to_cache, const int* __restrict__ bad) {
  PdlLaunchDependents();  // lets the weight-streaming GEMV after this one start early
  PdlWait();
  if (*bad != 0) return;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    float* row = rows + t * rows_stride;
    T* slot = cache + SlotOf(positions[t], page_table, page_size) * width;
    if (to_cache) {
      for (int64_t c = threadIdx.x; c < width; c += blockDim.x) StoreCached(slot + c, row[c]);
    } else {
      for (int64_t c = threadIdx.x; c < width; c += blockDim.x) row[c] = LoadCached(slot + c);
    }
  }
}

template <typename IdType, typename T>
cudaError_t PagedCopy(float* rows, int64_t rows_stride, int64_t tokens, int64_t width,
                      const IdType* positions, const int32_t* page_table, int64_t page_size,
                      T* cache, bool to_cache, const int* bad, bool programmatic,
                      cudaStream_t stream) {
  if (tokens < 0 || width < 0 || rows_stride < 0 || page_size < 1) return cudaErrorInvalidValue;
  if (tokens == 0 || width == 0) return cudaSuccess;
  // page_table may be null when it is empty: the check then fails every token.
  if (rows == nullptr || positions == nullptr || cache == nullptr || bad == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int threads = width >= 256 ? 256 : (width >= 128 ? 128 : 64);
  return LaunchKernel(programmatic, PagedCopyKernel<IdType, T>, RowGrid(tokens), dim3(threads), 0,
                      stream, rows, rows_stride, tokens, width, positions, page_table, page_size,
                      cache, to_cache, bad);
}

}  // namespace

template <typename T, typename IdType>
cudaError_t LaunchPagedWrite(const float* rows, int64_t rows_stride, int64_t tokens, int64_t width,
                             const IdType* positions, const int32_t* page_table, int64_t page_size,
                             T* cache, const int* bad, bool programmatic, cudaStream_t stream) {
  return PagedCopy(const_cast<float*>(rows), rows_stride, tokens, width, positions, page_table,
                   page_size, cache, true, bad, programmatic, stream);
}

template <typename T, typename IdType>
cudaError_t LaunchPagedRead(const T* cache, const int32_t* page_table, int64_t page_size,
                            const IdType* positions, int64_t tokens, int64_t width, float* out,
                            int64_t out_stride, const int* bad, bool programmatic,
                            cudaStream_t stream) {
  return PagedCopy(out, out_stride, tokens, width, positions, page_table, page_size,
                   const_cast<T*>(cache), false, bad, programmatic, stream);
}

// The combinations attention_ops.h promises: f32 and bf16 caches, i32 and i64 positions.
template cudaError_t LaunchPagedWrite(const float*, int64_t, int64_t, int64_t, const int32_t*,
                                      const int32_t*, int64_t, float*, const int*, bool,
                                      cudaStream_t);
template cudaError_t LaunchPagedWrite(const float*, int64_t, int64_t, int64_t, const int64_t*,
                                      const int32_t*, int64_t, float*, const int*, bool,
                                      cudaStream_t);
template cudaError_t LaunchPagedWrite(const float*, int64_t, int64_t, int64_t, const int32_t*,
                                      const int32_t*, int64_t, uint16_t*, const int*, bool,
                                      cudaStream_t);
template cudaError_t LaunchPagedWrite(const float*, int64_t, int64_t, int64_t, const int64_t*,
                                      const int32_t*, int64_t, uint16_t*, const int*, bool,
                                      cudaStream_t);
template cudaError_t LaunchPagedRead(const float*, const int32_t*, int64_t, const int32_t*, int64_t,
                                     int64_t, float*, int64_t, const int*, bool, cudaStream_t);
template cudaError_t LaunchPagedRead(const float*, const int32_t*, int64_t, const int64_t*, int64_t,
                                     int64_t, float*, int64_t, const int*, bool, cudaStream_t);
template cudaError_t LaunchPagedRead(const uint16_t*, const int32_t*, int64_t, const int32_t*,
                                     int64_t, int64_t, float*, int64_t, const int*, bool,
                                     cudaStream_t);
template cudaError_t LaunchPagedRead(const uint16_t*, const int32_t*, int64_t, const int64_t*,
                                     int64_t, int64_t, float*, int64_t, const int*, bool,
                                     cudaStream_t);

}  // namespace eagle3::cuda
