// The data checks of the attention ops (cuda/attention_ops.h, "Checks"): index ranges, paged
// positions and mask rows, run on the device ahead of the op's writing kernels. No abseil here:
// nvcc must never see it.
#include <cstdint>

#include "attention_common.cuh"
#include "attention_ops.h"
#include "programmatic_launch.cuh"

namespace eagle3::cuda {
namespace {

// A check that clears the op's flag runs as one block of this many threads: it zeroes *bad, then
// every thread may set it, all within the block (ClearFlag's barrier orders the two).
constexpr int kClearingThreads = 1024;

// The op's first check clears *bad itself (attention_ops.h): after PdlEnter, so that the kernels of
// the op before, which read the flag, have completed.
__device__ __forceinline__ void ClearFlag(bool clear, int* bad) {
  if (!clear) return;
  if (threadIdx.x == 0) *bad = 0;
  __syncthreads();
}

// Grid and block of a check over n entries (one entry per thread and iteration).
struct CheckShape {
  dim3 grid, block;
};
CheckShape ShapeFor(int64_t n, bool clear) {
  if (clear) return {dim3(1), dim3(kClearingThreads)};
  return {GridFor(n, kThreads), dim3(kThreads)};
}

template <typename IdType>
__global__ void CheckIndexRangeKernel(const IdType* __restrict__ idx, int64_t n, int64_t limit,
                                      int* bad, int* error_flag, int error_code, bool clear) {
  PdlEnter();
  ClearFlag(clear, bad);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t value = idx[i];
    if (value < 0 || value >= limit) Flag(bad, error_flag, error_code, i);
  }
}

template <typename IdType>
__global__ void CheckPagedPositionsKernel(const IdType* __restrict__ positions, int64_t tokens,
                                          const int32_t* __restrict__ page_table, int64_t pages,
                                          int64_t page_size, int64_t num_pages, int* bad,
                                          int* error_flag, int error_code, bool clear) {
  PdlEnter();
  ClearFlag(clear, bad);
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < tokens;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t pos = positions[t];
    if (pos < 0 || pos >= pages * page_size) {
      Flag(bad, error_flag, error_code, t);
      continue;
    }
    const int64_t page = page_table[pos / page_size];
    if (page < 0 || page >= num_pages) Flag(bad, error_flag, error_code, t);
  }
}

// One block per mask row.
__global__ void CheckMaskRowsKernel(const uint8_t* __restrict__ mask, int64_t rows, int64_t cols,
                                    int64_t mask_stride, int* bad, int* error_flag,
                                    int error_code) {
  PdlEnter();
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint8_t* row = mask + r * mask_stride;
    int any = 0;
    for (int64_t c = threadIdx.x; c < cols && !any; c += blockDim.x) any = row[c] != 0;
    const int allowed = __syncthreads_or(any);
    if (!allowed && threadIdx.x == 0) Flag(bad, error_flag, error_code, r);
  }
}

}  // namespace

template <typename IdType>
cudaError_t LaunchCheckIndexRange(const IdType* idx, int64_t n, int64_t limit, int* bad,
                                  int* error_flag, int error_code, bool clear_flag, bool programmatic,
                                  cudaStream_t stream) {
  if (n < 0 || (n > 0 && idx == nullptr) || ((n > 0 || clear_flag) && (bad == nullptr || error_flag == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (n == 0 && !clear_flag) return cudaSuccess;
  const CheckShape shape = ShapeFor(n, clear_flag);
  return LaunchKernel(programmatic, CheckIndexRangeKernel<IdType>, shape.grid, shape.block, 0, stream, idx, n,
                      limit, bad, error_flag, error_code, clear_flag);
}

template cudaError_t LaunchCheckIndexRange(const int32_t*, int64_t, int64_t, int*, int*, int, bool, bool,
                                           cudaStream_t);
template cudaError_t LaunchCheckIndexRange(const int64_t*, int64_t, int64_t, int*, int*, int, bool, bool,
                                           cudaStream_t);

template <typename IdType>
cudaError_t LaunchCheckPagedPositions(const IdType* positions, int64_t tokens,
                                      const int32_t* page_table, int64_t pages, int64_t page_size,
                                      int64_t num_pages, int* bad, int* error_flag, int error_code,
                                      bool clear_flag, bool programmatic, cudaStream_t stream) {
  if (tokens < 0 || pages < 0 || page_size < 1 || num_pages < 0) return cudaErrorInvalidValue;
  if (tokens == 0 && !clear_flag) return cudaSuccess;
  if ((tokens > 0 && (positions == nullptr || (pages > 0 && page_table == nullptr))) || bad == nullptr ||
      error_flag == nullptr) {
    return cudaErrorInvalidValue;
  }
  const CheckShape shape = ShapeFor(tokens, clear_flag);
  return LaunchKernel(programmatic, CheckPagedPositionsKernel<IdType>, shape.grid, shape.block, 0, stream,
                      positions, tokens, page_table, pages, page_size, num_pages, bad, error_flag, error_code,
                      clear_flag);
}

template cudaError_t LaunchCheckPagedPositions(const int32_t*, int64_t, const int32_t*, int64_t, int64_t, int64_t,
                                               int*, int*, int, bool, bool, cudaStream_t);
template cudaError_t LaunchCheckPagedPositions(const int64_t*, int64_t, const int32_t*, int64_t, int64_t, int64_t,
                                               int*, int*, int, bool, bool, cudaStream_t);

cudaError_t LaunchCheckMaskRows(const uint8_t* mask, int64_t rows, int64_t cols,
                                int64_t mask_stride, int* bad, int* error_flag, int error_code,
                                bool programmatic, cudaStream_t stream) {
  if (rows < 0 || cols < 0 || mask_stride < 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if ((cols > 0 && mask == nullptr) || bad == nullptr || error_flag == nullptr) {
    return cudaErrorInvalidValue;
  }
  return LaunchKernel(programmatic, CheckMaskRowsKernel, RowGrid(rows), dim3(kThreads), 0, stream,
                      mask, rows, cols, mask_stride, bad, error_flag, error_code);
}

}  // namespace eagle3::cuda
