// Argument checks shared by every Communicator implementation, so that the in-process group and the
// NCCL communicator refuse the same calls with the same messages. Internal (not installed); the
// EAGLE3_API marks let a shared libeagle3_cuda call them in libeagle3.
#pragma once

#include "absl/status/status.h"
#include "eagle3/device.h"
#include "eagle3/export.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

// One collective buffer: non-negative dims, on `expected`, a collective dtype (f32, f16, bf16, i32,
// i64), contiguous, with data unless empty.
EAGLE3_API absl::Status CheckCollectiveBuffer(const char* op, const char* name, const TensorView& t, Device expected);

// send/recv of one rank where big.dim(0) == factor * small.dim(0) and the other dims agree (factor
// 1: the same shape), same dtype; each checked with CheckCollectiveBuffer.
EAGLE3_API absl::Status CheckCollectivePair(const char* op, const TensorView& small, const TensorView& big, int factor,
                                            const char* small_name, const char* big_name, Device expected);

// Whether the bytes of two (contiguous) buffers intersect; empty buffers intersect nothing.
EAGLE3_API bool BuffersOverlap(const TensorView& a, const TensorView& b);

// `inner` may be `outer` itself, its block `block` along dim 0 (in place), or disjoint from it.
EAGLE3_API absl::Status CheckCollectiveAliasing(const char* op, const TensorView& outer, const TensorView& inner, int block,
                                                const char* outer_name, const char* inner_name);

}  // namespace eagle3
