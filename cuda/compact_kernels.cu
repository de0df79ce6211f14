// Kernels behind cuda/compact_ops.h: CompactAccepted (checks, then chunked in-place row
// moves through shared memory) and the verifier-results-to-commit-offsets conversion.
#include <cstdint>

#include "core_kernels.cuh"
#include "compact_accepted_check.h"
#include "compact_ops.h"
#include "programmatic_launch.cuh"

namespace eagle3::cuda {
namespace {

constexpr int kCompactThreads = 128;
constexpr int kChunkRows = 32;   // rows staged in shared memory per round
constexpr int kSegBytes = 512;   // bytes of a row one block moves (its column segment)
constexpr unsigned long long kNoProblem = ~0ull;

// Block (sequence blockIdx.x, column segment blockIdx.y); U is the copy unit.
template <typename U>
__global__ void __launch_bounds__(kCompactThreads)
    CompactAcceptedKernel(CompactLaunchParams p, int64_t row_units, int64_t seg_units, int* error_flag,
                          int error_code) {
  __shared__ __align__(16) unsigned char buf[kChunkRows * kSegBytes];
  __shared__ int64_t src_off[kChunkRows], dst_off[kChunkRows];
  __shared__ unsigned long long problem;  // (condition << 40) | entry, the smallest

  PdlEnter();
  const int64_t b = blockIdx.x;
  const int64_t n = p.num_accepted[b];
  if (n <= 0) return;  // skipped (< 0) or nothing to move; uniform over the block

  CompactSequence s;
  s.accepted = p.accepted + b * p.accepted_stride;
  s.max_nodes = p.max_nodes;
  s.cache_len = p.cache_len_i64 ? static_cast<const int64_t*>(p.cache_len)[b]
                                : static_cast<const int32_t*>(p.cache_len)[b];
  s.page_table = p.page_tables + b * p.page_table_stride;
  s.pages = p.pages_per_seq;
  s.page_size = p.page_size;
  s.num_pages = p.num_pages;

  if (threadIdx.x == 0) problem = n > p.max_nodes ? 0ull : kNoProblem;  // kCompactCount, entry 0
  __syncthreads();
  if (n <= p.max_nodes) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const int c = CompactEntryCheck(s, i);
      if (c != kCompactOk) atomicMin(&problem, (static_cast<unsigned long long>(c) << 40) | i);
    }
  }
  __syncthreads();
  const unsigned long long found = problem;
  if (found != kNoProblem) {
    if (blockIdx.y == 0 && threadIdx.x == 0) {
      RecordDeviceError(error_flag, error_code,
                        CompactErrorIndex(b, static_cast<int>(found >> 40),
                                          static_cast<int64_t>(found & ((1ull << 40) - 1))));
    }
    return;
  }

  const int64_t seg_begin = static_cast<int64_t>(blockIdx.y) * seg_units;
  const int seg_len = static_cast<int>(min(seg_units, row_units - seg_begin));
  if (seg_len <= 0) return;
  U* cache = static_cast<U*>(p.cache);
  U* staged = reinterpret_cast<U*>(buf);
  for (int64_t c0 = 0; c0 < n; c0 += kChunkRows) {
    const int rows = static_cast<int>(min(static_cast<int64_t>(kChunkRows), n - c0));
    if (threadIdx.x < rows) {
      const int64_t i = c0 + threadIdx.x;
      const int64_t a = s.accepted[i];
      // a == i only for a prefix (offsets strictly increasing from >= 0): those rows stay.
      src_off[threadIdx.x] = a == i ? -1 : CompactSlot(s, s.cache_len + a) * row_units + seg_begin;
      dst_off[threadIdx.x] = CompactSlot(s, s.cache_len + i) * row_units + seg_begin;
    }
    __syncthreads();
    const int units = rows * seg_len;
    for (int k = threadIdx.x; k < units; k += blockDim.x) {
      const int r = k / seg_len;
      if (src_off[r] >= 0) staged[k] = cache[src_off[r] + (k - r * seg_len)];
    }
    __syncthreads();
    for (int k = threadIdx.x; k < units; k += blockDim.x) {
      const int r = k / seg_len;
      if (src_off[r] >= 0) cache[dst_off[r] + (k - r * seg_len)] = staged[k];
    }
    __syncthreads();  // the next chunk reuses buf and the offsets
  }
}

__global__ void VerifyCommitOffsetsKernel(const int32_t* num_accepted, const int32_t* accepted_nodes,
                                          int32_t batch, int32_t max_nodes, int32_t* commit_offsets,
                                          int32_t* commit_counts) {
  PdlEnter();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(batch) * max_nodes) return;
  const int64_t b = idx / max_nodes;
  const int32_t j = static_cast<int32_t>(idx - b * max_nodes);
  const int32_t n = num_accepted[b];
  if (j == 0) {
    commit_counts[b] = n < 0 ? -1 : n + 1;
    if (n >= 0) commit_offsets[idx] = 0;  // a failed sequence's row is left as it is
  } else if (j <= n) {
    commit_offsets[idx] = accepted_nodes[idx - 1];
  }
}

template <typename U>
cudaError_t Launch(const CompactLaunchParams& p, int* error_flag, int error_code, bool programmatic,
                   cudaStream_t stream) {
  const int64_t row_units = p.row_bytes / static_cast<int64_t>(sizeof(U));
  const int64_t max_seg_units = kSegBytes / static_cast<int64_t>(sizeof(U));
  // At least one segment: with empty rows the blocks still check their sequences.
  const int64_t segments = row_units == 0 ? 1 : (row_units + max_seg_units - 1) / max_seg_units;
  if (segments > 65535) return cudaErrorInvalidValue;
  const int64_t seg_units = (row_units + segments - 1) / segments;  // balanced, <= max_seg_units
  const dim3 grid(static_cast<unsigned>(p.batch), static_cast<unsigned>(segments));
  return LaunchKernel(programmatic, CompactAcceptedKernel<U>, grid, dim3(kCompactThreads), 0, stream, p,
                      row_units, seg_units, error_flag, error_code);
}

}  // namespace

cudaError_t LaunchCompactAccepted(const CompactLaunchParams& p, int* error_flag, int error_code,
                                  bool programmatic, cudaStream_t stream) {
  if (p.batch < 0 || p.batch > INT32_MAX || p.num_pages < 0 || p.page_size < 1 || p.row_bytes < 0 ||
      p.row_bytes % 2 != 0 || p.pages_per_seq < 0 || p.max_nodes < 0 || error_flag == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0) return cudaSuccess;
  // A pointer may be null only where nothing is read through it (no pages, no entries).
  if ((p.cache == nullptr && p.num_pages > 0 && p.row_bytes > 0) ||
      (p.page_tables == nullptr && p.pages_per_seq > 0) || p.cache_len == nullptr ||
      (p.accepted == nullptr && p.max_nodes > 0) || p.num_accepted == nullptr ||
      (p.batch > 1 && (p.page_table_stride < p.pages_per_seq || p.accepted_stride < p.max_nodes))) {
    return cudaErrorInvalidValue;
  }
  const auto address = reinterpret_cast<uintptr_t>(p.cache);
  if (p.row_bytes % 16 == 0 && address % 16 == 0) {
    return Launch<uint4>(p, error_flag, error_code, programmatic, stream);
  }
  if (p.row_bytes % 4 == 0 && address % 4 == 0) {
    return Launch<uint32_t>(p, error_flag, error_code, programmatic, stream);
  }
  if (address % 2 != 0) return cudaErrorInvalidValue;
  return Launch<uint16_t>(p, error_flag, error_code, programmatic, stream);
}

cudaError_t LaunchVerifyCommitOffsets(const int32_t* num_accepted, const int32_t* accepted_nodes,
                                      int32_t batch, int32_t max_nodes, int32_t* commit_offsets,
                                      int32_t* commit_counts, bool programmatic, cudaStream_t stream) {
  if (batch < 0 || max_nodes < 1) return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  if (num_accepted == nullptr || accepted_nodes == nullptr || commit_offsets == nullptr ||
      commit_counts == nullptr) {
    return cudaErrorInvalidValue;
  }
  constexpr int kThreads = 256;
  const int64_t total = static_cast<int64_t>(batch) * max_nodes;
  const dim3 grid(static_cast<unsigned>((total + kThreads - 1) / kThreads));
  return LaunchKernel(programmatic, VerifyCommitOffsetsKernel, grid, dim3(kThreads), 0, stream, num_accepted,
                      accepted_nodes, batch, max_nodes, commit_offsets, commit_counts);
}

}  // namespace eagle3::cuda
