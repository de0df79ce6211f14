#include "stream_kernels.h"

namespace eagle3::bench {
namespace {

constexpr int kThreads = 256;
constexpr int kLoads = static_cast<int>(kStreamChunkPieces / kThreads);
static_assert(kLoads * kThreads == kStreamChunkPieces);

__device__ __forceinline__ uint4 LoadStreaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Four blocks of 256 a multiprocessor: 32 KiB of loads in flight a block, 128 KiB a multiprocessor.
__global__ void __launch_bounds__(kThreads, 4) StreamReadKernel(const StreamChunk* chunks, int count, uint32_t* sink) {
  // The next kernel may launch now; the chunks (as a round's ids) only once the kernels before end.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  uint32_t acc = 0;
  const int stride = static_cast<int>(gridDim.x);
  int c = static_cast<int>(blockIdx.x);
  StreamChunk chunk = c < count ? chunks[c] : StreamChunk{nullptr, 0};
  for (; c < count; c += stride) {
    // The next chunk's entry is read beside this chunk's pieces, not after them.
    const StreamChunk next = c + stride < count ? chunks[c + stride] : StreamChunk{nullptr, 0};
    const uint4* data = static_cast<const uint4*>(chunk.data);
    uint4 v[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t i = static_cast<int64_t>(u) * kThreads + threadIdx.x;
      v[u] = i < chunk.pieces ? LoadStreaming(data + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    chunk = next;
  }
  if (acc == 0x9e3779b9u) sink[static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x] = acc;
}

}  // namespace

int StreamReadBlocks() {
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, StreamReadKernel, kThreads, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return sms * per_sm;
}

cudaError_t LaunchStreamRead(const StreamChunk* chunks, int count, int blocks, uint32_t* sink, bool programmatic,
                             cudaStream_t stream) {
  if (chunks == nullptr || sink == nullptr || count < 0 || blocks < 1) return cudaErrorInvalidValue;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = programmatic ? 1 : 0;
  return cudaLaunchKernelEx(&config, StreamReadKernel, chunks, count, sink);
}

}  // namespace eagle3::bench
