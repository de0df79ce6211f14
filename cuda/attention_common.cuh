// Helpers the kernel files behind cuda/attention_ops.h share: launch geometry, the check kernels'
// flagging, and the cache row of a paged position. No abseil here: nvcc must never see it.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core_kernels.cuh"

namespace eagle3::cuda {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items (n > 0); the loop covers what the cap leaves out.
inline unsigned GridFor(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::min<int64_t>(blocks, int64_t{1} << 16));
}

// Blocks for a loop with one block per row (rows > 0).
inline unsigned RowGrid(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 16));
}

// Marks the op's call bad (its writers then write nothing) and records the entry for Synchronize.
__device__ inline void Flag(int* bad, int* error_flag, int error_code, int64_t index) {
  *bad = 1;
  RecordDeviceError(error_flag, error_code, index);
}

// Cache row of sequence position `pos` (validated by the check kernels).
__device__ inline int64_t SlotOf(int64_t pos, const int32_t* __restrict__ page_table,
                                 int64_t page_size) {
  const int64_t page = NonNegativeDiv(pos, page_size);
  return static_cast<int64_t>(page_table[page]) * page_size + (pos - page * page_size);
}

}  // namespace eagle3::cuda
