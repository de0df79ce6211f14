// Launcher of the L2 weight prefetch behind CudaBackend::PrefetchWeights (Backend::PrefetchWeights):
// raw pointers, stream last, cudaError_t out; callable from any C++ compiler.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace eagle3::cuda {

// Ranges one launch takes (the kernel receives them by value).
inline constexpr int kMaxPrefetchRanges = 32;

// Bytes one bulk prefetch instruction asks for: small enough that a range spreads over many
// threads (and so over many multiprocessors' copy engines), large enough that a few thousand
// instructions cover a layer's weights.
inline constexpr int64_t kPrefetchChunkBytes = 16 * 1024;

// Device byte ranges to read into L2. begin[i] is 16-byte aligned and bytes[i] a positive multiple
// of 16 (PrefetchRange rounds a span inward to that); chunk_start[i] is the number of
// kPrefetchChunkBytes chunks of the ranges before i, chunk_start[count] of all of them.
struct PrefetchRanges {
  const char* begin[kMaxPrefetchRanges] = {};
  int64_t bytes[kMaxPrefetchRanges] = {};
  int64_t chunk_start[kMaxPrefetchRanges + 1] = {};
  int count = 0;
};

// Adds the 16-byte-aligned interior of [data, data + bytes) to `ranges` (nothing when it is empty
// or `ranges` is full). Returns the bytes added.
int64_t AddPrefetchRange(const void* data, int64_t bytes, PrefetchRanges& ranges);

// Starts reading every range into L2 (cp.async.bulk.prefetch.L2: no data reaches the
// multiprocessors, and the kernel does not wait for the reads) on `stream`. The ranges must be
// device memory that no kernel enqueued after this one writes before the ranges' readers run.
// programmatic: launched as a programmatic dependent (programmatic_launch.cuh); the prefetches are
// issued before the kernel waits for the kernels before it, since they read only such memory.
// max_blocks >= 1 bounds the grid. cudaErrorInvalidValue for a malformed `ranges`.
cudaError_t LaunchL2Prefetch(const PrefetchRanges& ranges, int max_blocks, bool programmatic, cudaStream_t stream);

}  // namespace eagle3::cuda
