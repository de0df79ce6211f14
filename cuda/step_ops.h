// Launchers for the small kernels of the speculative step's CudaBackend ops (TreeVerify's tree
// lists, GatherRows, ExtendMaskRows). Raw pointers, stream last, cudaError_t out; no allocation and
// no host synchronization (capturable in a CUDA graph); callable from any C++ compiler (no nvcc
// needed to include this header). cudaErrorInvalidValue for a size or pointer outside what a
// launcher documents (checked on the host; nothing launched). programmatic: the kernel is launched
// as a programmatic dependent (programmatic_launch.cuh; CudaBackendOptions::programmatic_launch)
// that waits for the kernels before it before it touches memory, so results are the same either way.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace eagle3::cuda {

// The flattened trees LaunchTreeVerify (verify_ops.h) walks, for B trees of N nodes given by their
// parents: row_offsets[b] = b N, and each node's first child and next sibling with siblings in
// node order (DraftTree::FromParents' lists). A node that FromParents rejects (the root with a
// parent other than -1, another node whose parent is outside [0, i)) gets first_child = -2, which
// LaunchTreeVerify reports as kBadTree at the lowest such node, the one FromParents names.
// Work: one block per tree, each node scanning the later nodes (N <= kVerifyMaxNodes).
//   parents: [B, N] i32, contiguous, device      row_offsets: [B + 1] i32, device
//   first_child, next_sibling: [B, N] i32, contiguous, device (local node ids)
// B >= 0, N in [1, kVerifyMaxNodes], B N < 2^31.
cudaError_t LaunchTreeListsFromParents(const int32_t* parents, int32_t batch, int32_t nodes, int32_t* row_offsets,
                                       int32_t* first_child, int32_t* next_sibling, bool programmatic,
                                       cudaStream_t stream);

// out[i] = src[g m + index[i]] with g = i / (n / groups), m = rows / groups (Backend::GatherRows:
// indices local to equal groups; groups = 1 is a plain gather), `row_bytes` bytes per row, bit for
// bit (in 16-, 8-, 4-, 2- or 1-byte units as the pointers, strides and row size allow). A row i
// whose index lies outside [0, m) is left unwritten and records error_code | i in error_flag
// (RecordDeviceError's rule, see core_ops.h).
//   src: rows of row_bytes bytes, src_stride bytes apart, device      index: [n] i32, device
//   out: n rows of row_bytes bytes, out_stride bytes apart, device, no overlap with src
// n, rows, row_bytes >= 0; groups >= 1 divides rows and n; strides >= row_bytes when there is more
// than one row.
cudaError_t LaunchGatherRows(const void* src, int64_t src_stride, int64_t rows, int64_t groups, const int32_t* index,
                             int64_t n,
                             void* out, int64_t out_stride, int64_t row_bytes, int* error_flag, int error_code,
                             bool programmatic, cudaStream_t stream);

// out[i] = src[parent[i]], then out[i][column[i]] = 1, over u8 rows of `width` entries. A row i
// with parent[i] outside [0, rows) or column[i] outside [0, width) is left unwritten and records
// error_code | (2 i + c), c = 0 for the parent and 1 for the column (the parent checked first).
//   src: [rows, width] u8, row stride src_stride, device      parent, column: [n] i32, device
//   out: [n, width] u8, row stride out_stride, device, no overlap with src
// n, rows, width >= 0; strides >= width when there is more than one row.
cudaError_t LaunchExtendMaskRows(const uint8_t* src, int64_t src_stride, int64_t rows, const int32_t* parent,
                                 const int32_t* column, int64_t n, uint8_t* out, int64_t out_stride, int64_t width,
                                 int* error_flag, int error_code, bool programmatic, cudaStream_t stream);

}  // namespace eagle3::cuda
