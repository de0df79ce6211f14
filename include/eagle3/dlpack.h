// Zero-copy exchange with other frameworks (PyTorch, JAX, CuPy, ...) through DLPack 0.6
// (DLTensor / DLManagedTensor; no versioned struct).
#pragma once

#include <dlpack/dlpack.h>

#include "absl/status/statusor.h"
#include "eagle3/export.h"
#include "eagle3/tensor.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

// Borrows a DLPack tensor as a view (no copy); the producer keeps the memory alive.
//   Devices: kDLCPU and kDLCUDAHost (pinned host memory) -> Device::Cpu(); kDLCUDA ->
//   Device::Cuda(device_id). Dtypes: float32/16, bfloat16, int32/64, uint8, all with lanes == 1
//   (DLPack 0.6 has no bool code, so a producer's bool arrives as u8). ndim <= Shape::kMaxRank.
//   strides == nullptr means row-major; byte_offset is added to data.
// Malformed tensors (negative ndim/dims/strides, null shape or data, a misaligned element
// pointer) are InvalidArgument; well-formed but unsupported ones (device type, dtype, lanes, rank)
// are Unimplemented. Messages name the device type, dtype code/bits/lanes or dim involved.
EAGLE3_API absl::StatusOr<TensorView> FromDLPack(const DLTensor& tensor);

// Hands `tensor` to a DLPack consumer. The returned DLManagedTensor owns the tensor and its shape
// and stride arrays; its deleter (call exactly once) frees all of them through the tensor's
// allocator. bool and f8_e4m3 have no DLPack 0.6 code and are refused (Unimplemented); on any
// error the tensor is released.
EAGLE3_API absl::StatusOr<DLManagedTensor*> ToDLPack(Tensor tensor);

// Exports a view without ownership: the deleter frees only the DLPack bookkeeping, so the
// memory behind `view` must outlive the consumer's use. Strides are exported as they are.
EAGLE3_API absl::StatusOr<DLManagedTensor*> ToDLPackView(const TensorView& view);

}  // namespace eagle3
