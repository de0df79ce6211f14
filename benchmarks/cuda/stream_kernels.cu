#include "stream_kernels.h"

#include "programmatic_launch.cuh"

namespace eagle3::bench {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint4 LoadStreaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// kLoads independent 16-byte loads a thread in flight (kLoads * 4 KiB a block), a chunk in passes
// of them. At most 64 registers a thread: four blocks fit a multiprocessor at every kLoads.
template <int kLoads>
__global__ void __launch_bounds__(kThreads, 4) StreamReadKernel(const StreamChunk* chunks, int count, uint32_t* sink) {
  static_assert(kStreamChunkPieces % (kLoads * kThreads) == 0);
  // The next kernel may launch now; the chunks (as a round's ids) only once the kernels before end.
  cuda::PdlLaunchDependents();
  cuda::PdlWait();
  uint32_t acc = 0;
  const int stride = static_cast<int>(gridDim.x);
  int c = static_cast<int>(blockIdx.x);
  StreamChunk chunk = c < count ? chunks[c] : StreamChunk{nullptr, 0};
  for (; c < count; c += stride) {
    // The next chunk's entry is read beside this chunk's pieces, not after them.
    const StreamChunk next = c + stride < count ? chunks[c + stride] : StreamChunk{nullptr, 0};
    const uint4* data = static_cast<const uint4*>(chunk.data);
    for (int64_t pass = 0; pass < chunk.pieces; pass += kLoads * kThreads) {
      uint4 v[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int64_t i = pass + static_cast<int64_t>(u) * kThreads + threadIdx.x;
        v[u] = i < chunk.pieces ? LoadStreaming(data + i) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kLoads; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    chunk = next;
  }
  if (acc == 0x9e3779b9u) sink[static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x] = acc;
}

using StreamKernel = void (*)(const StreamChunk*, int, uint32_t*);

StreamKernel KernelFor(int loads) {
  switch (loads) {
    case 2: return StreamReadKernel<2>;
    case 4: return StreamReadKernel<4>;
    case 8: return StreamReadKernel<8>;
    case 16: return StreamReadKernel<16>;
    default: return nullptr;
  }
}

}  // namespace

int StreamReadBlocks(int loads, int blocks_per_sm) {
  const StreamKernel kernel = KernelFor(loads);
  int device = 0, sms = 0, per_sm = 0;
  if (kernel == nullptr || blocks_per_sm < 1 || cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return sms * (per_sm < blocks_per_sm ? per_sm : blocks_per_sm);
}

cudaError_t LaunchStreamRead(const StreamChunk* chunks, int count, int loads, int blocks, uint32_t* sink,
                             bool programmatic, cudaStream_t stream) {
  const StreamKernel kernel = KernelFor(loads);
  if (kernel == nullptr || chunks == nullptr || sink == nullptr || count < 0 || blocks < 1) {
    return cudaErrorInvalidValue;
  }
  return cuda::LaunchKernel(programmatic, kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream,
                            chunks, count, sink);
}

}  // namespace eagle3::bench
