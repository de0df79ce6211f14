// Launcher for grouped-query attention over a paged K|V cache for a batch of sequences, every
// length on the device: the kernels behind CudaBackend::BatchedPagedAttention (semantics in
// eagle3/backend.h). Raw pointers, stream last, cudaError_t out; no allocation, no host sync;
// callable from any C++ compiler (no nvcc needed to include this header). fp32 throughout; strides
// are in elements. Returns cudaErrorInvalidValue for negative sizes, a missing pointer, or a
// parameter outside what is documented here (a pointer may be null where its operand has no
// elements: q and out with no query heads, cache with no pages, page_tables with no columns; and
// mask, which null makes causal).
//
// Two kernels on `stream`: a check kernel (one block per sequence) that records bad metadata in the
// backend's error flag as error_code | (8 * index + condition), with
//   condition 0: q_start[0] != 0 (index 0)
//   condition 1: sequence b: q_start[b + 1] outside [q_start[b], T] (index b)
//   condition 2: sequence b with rows: kv_len[b] outside [0, min(max_kv_len, P * page_size)]
//   condition 3: sequence b: a page entry it uses (j < ceil(kv_len[b] / page_size)) outside
//                [0, num_pages)
//   condition 4: query row t allows no key whose page entry is good (index t; recorded by the
//                attention kernel, also with no query heads)
//   condition 5: q_start[B] != T (index B)
//   condition 6: causal (null mask), sequence b: n_b = q_start[b + 1] - q_start[b] > kv_len[b]
//                (index b; its page entries are then not checked)
// (RecordDeviceError in cuda/core_kernels.cuh keeps the lowest code of the first failing op), and
// the attention kernel, one block of kPagedAttentionThreads per (query row, kv head) (the split
// register kernel: per (query row, kv head, split of its keys), then a combine kernel; see
// PagedAttentionParams::register_kernel): it finds the row's sequence by binary search over
// q_start, walks the sequence's keys (the shared-memory kernel: warps take interleaved chunks of 32
// keys, a lane a key, online softmax in fp32 per query head of the group) and merges the warps'
// partial results. A row whose metadata is bad (no sequence, kv_len out of range, n_b > kv_len[b]
// when causal) is not written; a key whose page entry is bad is skipped; a row with no allowed key
// is not written. Rows of good sequences are written even when another sequence is bad.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace eagle3::cuda {

inline constexpr int kPagedAttentionThreads = 256;
// The register kernel (PagedAttentionParams::register_kernel) holds a lane's value sums in
// registers: head_dim up to this; a larger head_dim runs the shared-memory kernel.
inline constexpr int64_t kPagedAttentionRegisterMaxDim = 256;
inline constexpr int kPagedAttentionWarps = kPagedAttentionThreads / 32;
// The attention kernel's dynamic shared memory is at most this (no opt-in beyond the default).
inline constexpr int64_t kPagedAttentionMaxSharedBytes = 48 * 1024;

// Dynamic shared memory of the attention kernel for `group` query heads per kv head of head_dim
// floats: the scaled queries, each warp's accumulators, and each warp's running max / sum.
inline constexpr int64_t PagedAttentionSharedBytes(int64_t group, int64_t head_dim) {
  return static_cast<int64_t>(sizeof(float)) *
         ((1 + kPagedAttentionWarps) * group * head_dim + 2 * kPagedAttentionWarps * group);
}

struct PagedAttentionParams {
  // q: [tokens, q_heads, head_dim], last dim contiguous.
  const float* q = nullptr;
  int64_t q_token_stride = 0, q_head_stride = 0;
  // cache: [num_pages, page_size, 2 * kv_heads * head_dim], contiguous: per row K of every kv
  // head, then V of every kv head.
  const float* cache = nullptr;
  int64_t num_pages = 0, page_size = 1;
  // page_tables: [batch, pages_per_seq], i32, row stride page_table_stride.
  const int32_t* page_tables = nullptr;
  int64_t page_table_stride = 0, pages_per_seq = 0;
  const int32_t* q_start = nullptr;  // [batch + 1]
  const int32_t* kv_len = nullptr;   // [batch]
  int64_t batch = 0, tokens = 0;
  int64_t max_kv_len = 1;  // >= 1, <= INT32_MAX: the host bound on every kv_len[b]
  // mask: [tokens, max_kv_len] bytes (nonzero = allowed), row stride mask_stride; or null for
  // causal: row i of sequence b (n_b rows) allows keys s <= kv_len[b] - n_b + i, with no mask reads.
  const uint8_t* mask = nullptr;
  int64_t mask_stride = 0;
  // q_heads = group * kv_heads, group >= 0; PagedAttentionSharedBytes(group, head_dim) <=
  // kPagedAttentionMaxSharedBytes; kv_heads <= 65535.
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
  // out: [tokens, q_heads, head_dim], last dim contiguous; no overlap with the inputs.
  float* out = nullptr;
  int64_t out_token_stride = 0, out_head_stride = 0;
  // Run the split register kernel (same results to fp32 rounding, same checks and reports) when
  // head_dim <= kPagedAttentionRegisterMaxDim and q_heads > 0; else the shared-memory kernel runs.
  // It spreads each row's keys over up to 32 splits, one block per (row, kv head, split) (the count
  // chosen on the host so that tokens x kv_heads x splits is about target_blocks, never more than
  // partials can hold); a warp reads 4 keys and their values at once with its lanes across
  // head_dim, the block keeps an online softmax over 32-key chunks and the value sums in registers;
  // with more than one split a combine kernel merges the blocks' partial results from `partials`.
  // The shared-memory kernel is one block per (row, kv head) over all its keys, a lane per key: at
  // a decode step's few rows it fills a few multiprocessors and walks every key serially, which is
  // why the split kernel replaced it there (benchmarks/NOTES.md has both timed). The backend sets it from
  // CudaBackendOptions::paged_attention_registers (on by default).
  bool register_kernel = false;
  // Device scratch of partial_floats floats for the split kernel's partial results (null or too
  // small for two splits: one block per (row, kv head)); target_blocks: the grid size to aim for
  // (about twice the multiprocessors).
  float* partials = nullptr;
  int64_t partial_floats = 0;
  int64_t target_blocks = 0;
};

// error_flag: [1], i32, device (the backend's flag); error_code: the op's id shifted left by
// kDeviceErrorIndexBits (core_ops.h). programmatic: the kernels are launched as programmatic
// dependents (programmatic_launch.cuh; CudaBackendOptions::programmatic_launch), each waiting for
// the kernels before it before it touches memory, so results are the same either way.
cudaError_t LaunchBatchedPagedAttention(const PagedAttentionParams& params, int* error_flag,
                                        int error_code, bool programmatic, cudaStream_t stream);

}  // namespace eagle3::cuda
