// The L2 weight prefetch (prefetch_ops.h).
#include <cstdint>

#include "prefetch_ops.h"
#include "programmatic_launch.cuh"

namespace eagle3::cuda {
namespace {

constexpr int kThreads = 32;

// Thread c of the grid asks for chunk c, c + grid threads, ...: one bulk prefetch each. The kernel
// lets the next one launch first and waits for the kernels before it last, so that its issue
// overlaps them and the next kernel's start is not held back by it (programmatic_launch.cuh: every
// block waits before it exits).
__global__ void __launch_bounds__(kThreads) L2PrefetchKernel(const PrefetchRanges r) {
  PdlLaunchDependents();
  const int64_t total = r.chunk_start[r.count];
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; c < total;
       c += static_cast<int64_t>(gridDim.x) * kThreads) {
    int i = 0;
    while (c >= r.chunk_start[i + 1]) ++i;
    const int64_t offset = (c - r.chunk_start[i]) * kPrefetchChunkBytes;
    const int64_t left = r.bytes[i] - offset;
    const unsigned size = static_cast<unsigned>(left < kPrefetchChunkBytes ? left : kPrefetchChunkBytes);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(r.begin[i] + offset), "r"(size) : "memory");
#endif
  }
  PdlWait();
}

}  // namespace

int64_t AddPrefetchRange(const void* data, int64_t bytes, PrefetchRanges& ranges) {
  if (data == nullptr || bytes <= 0 || ranges.count >= kMaxPrefetchRanges) return 0;
  const uintptr_t start = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (start + 15) & ~uintptr_t{15};
  const uintptr_t end = (start + static_cast<uintptr_t>(bytes)) & ~uintptr_t{15};
  if (end <= first) return 0;
  const int i = ranges.count++;
  ranges.begin[i] = reinterpret_cast<const char*>(first);
  ranges.bytes[i] = static_cast<int64_t>(end - first);
  ranges.chunk_start[i + 1] = ranges.chunk_start[i] + (ranges.bytes[i] + kPrefetchChunkBytes - 1) / kPrefetchChunkBytes;
  return ranges.bytes[i];
}

cudaError_t LaunchL2Prefetch(const PrefetchRanges& ranges, int max_blocks, bool programmatic, cudaStream_t stream) {
  if (ranges.count < 0 || ranges.count > kMaxPrefetchRanges || max_blocks < 1 || ranges.chunk_start[0] != 0) {
    return cudaErrorInvalidValue;
  }
  for (int i = 0; i < ranges.count; ++i) {
    if (ranges.begin[i] == nullptr || ranges.bytes[i] <= 0 || ranges.bytes[i] % 16 != 0 ||
        reinterpret_cast<uintptr_t>(ranges.begin[i]) % 16 != 0 ||
        ranges.chunk_start[i + 1] - ranges.chunk_start[i] !=
            (ranges.bytes[i] + kPrefetchChunkBytes - 1) / kPrefetchChunkBytes) {
      return cudaErrorInvalidValue;
    }
  }
  const int64_t chunks = ranges.chunk_start[ranges.count];
  if (chunks == 0) return cudaSuccess;
  const int64_t blocks = (chunks + kThreads - 1) / kThreads;
  return LaunchKernel(programmatic, L2PrefetchKernel, dim3(static_cast<unsigned>(blocks < max_blocks ? blocks : max_blocks)),
                      dim3(kThreads), 0, stream, ranges);
}

}  // namespace eagle3::cuda
