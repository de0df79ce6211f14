// Kernels behind cuda/step_ops.h: TreeVerify's tree lists from parents, GatherRows and
// ExtendMaskRows.
#include <cstdint>

#include "core_kernels.cuh"
#include "programmatic_launch.cuh"
#include "step_ops.h"
#include "verify_ops.h"

namespace eagle3::cuda {
namespace {

constexpr int kListThreads = 128;
constexpr int kCopyThreads = 128;
constexpr int64_t kUnitsPerThread = 4;  // a gather block copies up to this many units per thread

// One block per tree. A node's first child is the lowest later node naming it as parent, its next
// sibling the lowest later node with the same parent: siblings in node order, as FromParents links
// them.
__global__ void __launch_bounds__(kListThreads)
    TreeListsKernel(const int32_t* __restrict__ parents, int32_t batch, int32_t nodes, int32_t* row_offsets,
                    int32_t* first_child, int32_t* next_sibling) {
  __shared__ int32_t s_parent[kVerifyMaxNodes];
  PdlEnter();
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  const int64_t base = static_cast<int64_t>(b) * nodes;
  for (int i = threadIdx.x; i < nodes; i += kListThreads) s_parent[i] = parents[base + i];
  if (threadIdx.x == 0) {
    row_offsets[b] = b * nodes;
    if (b == batch - 1) row_offsets[batch] = batch * nodes;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nodes; i += kListThreads) {
    const int32_t p = s_parent[i];
    const bool bad = i == 0 ? p != -1 : (p < 0 || p >= i);
    int32_t child = -1, sibling = -1;
    for (int j = i + 1; j < nodes && (child == -1 || sibling == -1); ++j) {
      const int32_t q = s_parent[j];
      if (child == -1 && q == i) child = j;
      if (sibling == -1 && i > 0 && q == p) sibling = j;
    }
    first_child[base + i] = bad ? -2 : child;  // -2: an entry the verify walk refuses (kBadTree)
    next_sibling[base + i] = sibling;
  }
}

// Block (row i, segment blockIdx.y of seg_units units of type U).
template <typename U>
__global__ void __launch_bounds__(kCopyThreads)
    GatherRowsKernel(const char* __restrict__ src, int64_t src_stride, int64_t group_rows, int64_t group_out,
                     const int32_t* __restrict__ index, char* __restrict__ out, int64_t out_stride, int64_t row_units,
                     int64_t seg_units, int* error_flag, int error_code) {
  PdlEnter();
  const int64_t i = blockIdx.x;
  const int32_t r = index[i];
  if (r < 0 || r >= group_rows) {
    if (blockIdx.y == 0 && threadIdx.x == 0) RecordDeviceError(error_flag, error_code, i);
    return;
  }
  const U* from = reinterpret_cast<const U*>(src + (i / group_out * group_rows + r) * src_stride);
  U* to = reinterpret_cast<U*>(out + i * out_stride);
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * seg_units;
  const int64_t end = begin + seg_units < row_units ? begin + seg_units : row_units;
  for (int64_t u = begin + threadIdx.x; u < end; u += kCopyThreads) to[u] = from[u];
}

template <typename U>
cudaError_t GatherRows(const void* src, int64_t src_stride, int64_t group_rows, int64_t group_out,
                       const int32_t* index, int64_t n, void* out, int64_t out_stride, int64_t row_bytes,
                       int* error_flag, int error_code, bool programmatic, cudaStream_t stream) {
  const int64_t row_units = row_bytes / static_cast<int64_t>(sizeof(U));
  const int64_t max_seg_units = kCopyThreads * kUnitsPerThread;
  // At least one segment: with empty rows the blocks still check their indices.
  const int64_t segments = row_units == 0 ? 1 : (row_units + max_seg_units - 1) / max_seg_units;
  if (segments > 65535 || n > INT32_MAX) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(segments));
  return LaunchKernel(programmatic, GatherRowsKernel<U>, grid, dim3(kCopyThreads), 0, stream,
                      static_cast<const char*>(src), src_stride, group_rows, group_out, index,
                      static_cast<char*>(out), out_stride, row_units, max_seg_units, error_flag, error_code);
}

// One block per row; every entry is written once (the new column with 1), so no ordering is needed.
__global__ void __launch_bounds__(kCopyThreads)
    ExtendMaskRowsKernel(const uint8_t* __restrict__ src, int64_t src_stride, int64_t rows,
                         const int32_t* __restrict__ parent, const int32_t* __restrict__ column,
                         uint8_t* __restrict__ out, int64_t out_stride, int64_t width, int* error_flag,
                         int error_code) {
  PdlEnter();
  const int64_t i = blockIdx.x;
  const int32_t p = parent[i];
  const int32_t c = column[i];
  const bool parent_ok = p >= 0 && p < rows;
  if (!parent_ok || c < 0 || c >= width) {
    if (threadIdx.x == 0) RecordDeviceError(error_flag, error_code, 2 * i + (parent_ok ? 1 : 0));
    return;
  }
  const uint8_t* from = src + p * src_stride;
  uint8_t* to = out + i * out_stride;
  for (int64_t j = threadIdx.x; j < width; j += kCopyThreads) to[j] = j == c ? uint8_t{1} : from[j];
}

// The widest copy unit that divides the row size, both strides and both base addresses.
int CopyUnit(const void* src, int64_t src_stride, const void* out, int64_t out_stride, int64_t row_bytes) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(out) |
                        static_cast<uint64_t>(src_stride) | static_cast<uint64_t>(out_stride) |
                        static_cast<uint64_t>(row_bytes);
  for (int unit = 16; unit > 1; unit /= 2) {
    if ((bits & static_cast<uint64_t>(unit - 1)) == 0) return unit;
  }
  return 1;
}

}  // namespace

cudaError_t LaunchTreeListsFromParents(const int32_t* parents, int32_t batch, int32_t nodes, int32_t* row_offsets,
                                       int32_t* first_child, int32_t* next_sibling, bool programmatic,
                                       cudaStream_t stream) {
  if (batch < 0 || nodes < 1 || nodes > kVerifyMaxNodes ||
      static_cast<int64_t>(batch) * nodes > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (batch == 0) return cudaSuccess;
  if (parents == nullptr || row_offsets == nullptr || first_child == nullptr || next_sibling == nullptr) {
    return cudaErrorInvalidValue;
  }
  return LaunchKernel(programmatic, TreeListsKernel, dim3(static_cast<unsigned>(batch)), dim3(kListThreads), 0,
                      stream, parents, batch, nodes, row_offsets, first_child, next_sibling);
}

cudaError_t LaunchGatherRows(const void* src, int64_t src_stride, int64_t rows, int64_t groups, const int32_t* index,
                             int64_t n, void* out, int64_t out_stride, int64_t row_bytes, int* error_flag,
                             int error_code, bool programmatic, cudaStream_t stream) {
  if (n < 0 || rows < 0 || row_bytes < 0 || src_stride < 0 || out_stride < 0) return cudaErrorInvalidValue;
  if (groups < 1 || rows % groups != 0 || n % groups != 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t m = rows / groups, q = n / groups;
  if ((rows > 1 && src_stride < row_bytes) || (n > 1 && out_stride < row_bytes)) return cudaErrorInvalidValue;
  if (index == nullptr || error_flag == nullptr ||
      (row_bytes > 0 && (out == nullptr || (rows > 0 && src == nullptr)))) {
    return cudaErrorInvalidValue;
  }
  switch (CopyUnit(src, src_stride, out, out_stride, row_bytes)) {
    case 16:
      return GatherRows<uint4>(src, src_stride, m, q, index, n, out, out_stride, row_bytes, error_flag,
                                 error_code, programmatic, stream);
    case 8:
      return GatherRows<uint2>(src, src_stride, m, q, index, n, out, out_stride, row_bytes, error_flag,
                                 error_code, programmatic, stream);
    case 4:
      return GatherRows<uint32_t>(src, src_stride, m, q, index, n, out, out_stride, row_bytes, error_flag,
                                 error_code, programmatic, stream);
    case 2:
      return GatherRows<uint16_t>(src, src_stride, m, q, index, n, out, out_stride, row_bytes, error_flag,
                                 error_code, programmatic, stream);
    default:
      return GatherRows<uint8_t>(src, src_stride, m, q, index, n, out, out_stride, row_bytes, error_flag,
                                 error_code, programmatic, stream);
  }
}

cudaError_t LaunchExtendMaskRows(const uint8_t* src, int64_t src_stride, int64_t rows, const int32_t* parent,
                                 const int32_t* column, int64_t n, uint8_t* out, int64_t out_stride, int64_t width,
                                 int* error_flag, int error_code, bool programmatic, cudaStream_t stream) {
  if (n < 0 || rows < 0 || width < 0 || src_stride < 0 || out_stride < 0 || n > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  if ((rows > 1 && src_stride < width) || (n > 1 && out_stride < width)) return cudaErrorInvalidValue;
  if (parent == nullptr || column == nullptr || error_flag == nullptr ||
      (width > 0 && (out == nullptr || (rows > 0 && src == nullptr)))) {
    return cudaErrorInvalidValue;
  }
  return LaunchKernel(programmatic, ExtendMaskRowsKernel, dim3(static_cast<unsigned>(n)), dim3(kCopyThreads), 0,
                      stream, src, src_stride, rows, parent, column, out, out_stride, width, error_flag, error_code);
}

}  // namespace eagle3::cuda
