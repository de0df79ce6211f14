// Private: what the CudaBackend op implementation files share (host code only; no .cu includes it).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/device_allocator.h"

namespace eagle3::cuda {

struct CudaBackend::State {
  CudaBackendOptions options;
  cudaStream_t stream = nullptr;
  bool owns_stream = false;
  cublasLtHandle_t lt = nullptr;
  void* gemm_workspace = nullptr;
  // Device flag an op sets when it meets bad data (NaN logits, out-of-range ids); read and cleared
  // by Synchronize(), which turns it into a Status naming the op.
  int* error_flag = nullptr;
  DeviceAllocator allocator{0};
  // Scratch buffers owned by the op files, created on first use within the options' bounds
  // (allocation happens once; later calls reuse them).
  void* attention_scratch = nullptr;
  size_t attention_scratch_bytes = 0;
  void* moe_scratch = nullptr;
  size_t moe_scratch_bytes = 0;
};

}  // namespace eagle3::cuda
