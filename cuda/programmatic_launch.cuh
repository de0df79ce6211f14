// Programmatic dependent launch (Hopper): a kernel launched with the programmatic-serialization
// attribute may start while the kernel before it on the stream is still running, once every block
// of that kernel has called PdlLaunchDependents (or exited). Its blocks must call PdlWait before
// they read anything an earlier kernel writes, and before they write anything an earlier kernel
// may still read: PdlWait returns when the earlier kernels have completed and their writes are
// visible. What a kernel may do before PdlWait is read memory no kernel of the step writes (the
// weights): so a weight-streaming kernel has its first weight loads in flight while the kernel
// before it drains, instead of paying a launch and a memory latency after it.
//
// Every block of a kernel launched this way must execute PdlWait (before it exits), so that the
// kernel completes only after its predecessor: the next kernel's PdlWait then covers both.
// In a kernel launched without the attribute PdlWait returns at once, and PdlLaunchDependents
// does nothing when the next kernel was launched without it. Stream capture records the
// dependency as a programmatic edge, so CUDA graphs keep the overlap.
//
// Every kernel that a decode, verify or draft step runs follows this rule and is launched through
// LaunchKernel with the `programmatic` flag its launcher takes (CudaBackendOptions::
// programmatic_launch), so that no kernel of a step waits out its predecessor's end and a launch
// gap: a new step kernel must do the same. A kernel with nothing to read before its inputs are
// complete opens with PdlEnter; one that precedes a weight-streaming kernel may trigger its
// dependents before it waits, so that their weight loads overlap its wait too.
// No abseil here: nvcc must never see it.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace eagle3::cuda {

__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void PdlLaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The opening of a kernel that reads what the kernels before it write and has nothing to do before
// that: waits for them, then lets the next kernel launch, so that its launch and block scheduling
// overlap this kernel's work. Waiting first keeps the next kernel's blocks from being parked on
// SMs while this one still waits, and means that when the next kernel starts, everything before
// this one has completed (what a kernel that reads before its own PdlWait relies on).
__device__ __forceinline__ void PdlEnter() {
  PdlWait();
  PdlLaunchDependents();
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...) in thread-block clusters of
// cluster_blocks blocks along x (1: no cluster), with the programmatic-serialization attribute
// when `programmatic` (the kernel must then follow the PdlWait rule above).
template <typename... Params, typename... Args>
cudaError_t LaunchKernelInClusters(bool programmatic, unsigned cluster_blocks, void (*kernel)(Params...),
                                   dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                                   Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  unsigned count = 0;
  if (cluster_blocks > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = cluster_blocks;
    attributes[count].val.clusterDim.y = 1;
    attributes[count].val.clusterDim.z = 1;
    ++count;
  }
  if (programmatic) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  config.attrs = attributes;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// The same without clusters.
template <typename... Params, typename... Args>
cudaError_t LaunchKernel(bool programmatic, void (*kernel)(Params...), dim3 grid, dim3 block,
                         size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  return LaunchKernelInClusters(programmatic, 1, kernel, grid, block, shared_bytes, stream,
                                std::forward<Args>(args)...);
}

}  // namespace eagle3::cuda
