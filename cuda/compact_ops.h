// Launchers for the commit after tree verification on the device: Backend::CompactAccepted's kernel
// (CudaBackend::CompactAccepted) and the conversion of DeviceTreeVerifier's results into commit
// offsets. Raw pointers, stream last, cudaError_t out; no allocation and no host synchronization
// (capturable in a CUDA graph); callable from any C++ compiler (no nvcc needed to include this
// header).
//
// Work of LaunchCompactAccepted: one kernel, blocks (sequence, column segment of at most 512 bytes
// of a row), 128 threads. Each block checks its sequence (src/compact_accepted_check.h; only the
// segment-0 block records the error) and then moves its column segment of the accepted rows in
// chunks of 32 rows in increasing entry order: a chunk's rows are all read into shared memory before
// any is written. That equals moving the rows one at a time in increasing order, because a move's
// destination cache_len + i lies below every later source cache_len + accepted[j] (j > i): no
// global scratch is needed and column segments never interact. Rows are copied bit for bit, in
// 16-byte units when the row size and the cache pointer allow, else 4- or 2-byte units.
//
// programmatic: the kernel is launched as a programmatic dependent of the kernel before it on
// `stream` (programmatic_launch.cuh; CudaBackendOptions::programmatic_launch): it waits for the
// earlier kernels before it touches memory, so results are the same either way.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace eagle3::cuda {

struct CompactLaunchParams {
  // The paged cache: num_pages * page_size rows of row_bytes bytes (slot = page * page_size +
  // position % page_size), contiguous, device. row_bytes even, >= 0 (0: only the checks run).
  void* cache = nullptr;
  int64_t num_pages = 0;
  int64_t page_size = 0;  // >= 1
  int64_t row_bytes = 0;
  int64_t batch = 0;  // B >= 0 sequences (0: nothing launched)
  // [B, P] i32, row stride page_table_stride elements (>= P when B > 1), device.
  const int32_t* page_tables = nullptr;
  int64_t page_table_stride = 0;
  int64_t pages_per_seq = 0;  // P >= 0
  // [B], i64 when cache_len_i64 else i32, contiguous, device.
  const void* cache_len = nullptr;
  bool cache_len_i64 = false;
  // [B, max_nodes] i32, row stride accepted_stride (>= max_nodes when B > 1), device.
  const int32_t* accepted = nullptr;
  int64_t accepted_stride = 0;
  int64_t max_nodes = 0;  // >= 0
  // [B] i32, device; < 0 skips the sequence.
  const int32_t* num_accepted = nullptr;
};

// Backend::CompactAccepted. A sequence that fails a check records
// error_code | CompactErrorIndex(b, condition, entry) in error_flag (RecordDeviceError's rule, see
// core_ops.h) and is left unwritten; the others are compacted. cudaErrorInvalidValue for sizes or
// pointers outside the contract above (checked on the host; nothing launched).
cudaError_t LaunchCompactAccepted(const CompactLaunchParams& params, int* error_flag, int error_code,
                                  bool programmatic, cudaStream_t stream);

// DeviceTreeVerifier's results (verify_ops.h: accepted node ids root excluded, -1 for a failed
// sequence) as CompactAccepted's inputs for a tree verified at cache_len, where node i's KV row sits
// at offset i: the root (offset 0) and then the accepted nodes.
//   commit_offsets[b] = {0, accepted_nodes[b][0], ..., accepted_nodes[b][n - 1]} (n =
//   num_accepted[b]; entries from n + 1 on, and every entry of a sequence with n < 0, are left as
//   they are)
//   commit_counts[b] = n + 1, or -1 when n < 0 (CompactAccepted then skips the sequence)
// Shapes (device, contiguous): num_accepted [batch] i32; accepted_nodes, commit_offsets
// [batch, max_nodes] i32 (row stride max_nodes); commit_counts [batch] i32. n < max_nodes is the
// verifier's guarantee (n < the tree's node count <= max_nodes); a larger n yields a count that
// CompactAccepted refuses. cudaErrorInvalidValue for batch < 0, max_nodes < 1 or a null pointer.
cudaError_t LaunchVerifyCommitOffsets(const int32_t* num_accepted, const int32_t* accepted_nodes,
                                      int32_t batch, int32_t max_nodes, int32_t* commit_offsets,
                                      int32_t* commit_counts, bool programmatic,
                                      cudaStream_t stream);

}  // namespace eagle3::cuda
