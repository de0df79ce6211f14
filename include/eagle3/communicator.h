// Collective communication between the tensor-parallel ranks of one model. One Communicator object
// per rank; the host application owns the threads or processes that drive them.
#pragma once

#include "absl/status/status.h"
#include "eagle3/device.h"
#include "eagle3/export.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

// Contract shared by every implementation (in-process threads, NCCL):
//  - Every rank calls the same collectives in the same order, with matching op, dtype, shapes and
//    root. A collective is a rendezvous: it returns only when every rank took part (or on error).
//  - Buffers live on device(), are contiguous, and hold f32, f16, bf16, i32 or i64.
//    Sums of f16/bf16 accumulate in f32 and round once; integer sums wrap (two's complement).
//  - Every rank receives bit-identical results (the TP=1 == TP=8 invariants rely on it).
//  - A failed collective returns a non-OK status on every rank that reached it; implementations
//    that detect a hung or inconsistent group poison it so later calls fail fast instead of
//    hanging.
//  - Implementations are used by one thread per rank object; distinct rank objects may run
//    concurrently (that is the point).
class EAGLE3_API Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // in [0, size())
  virtual int size() const = 0;
  // Where the collective buffers must live.
  virtual Device device() const = 0;

  // recv = sum over ranks of send, elementwise.
  //   send: [...], device()                         recv: same shape and dtype as send
  // In place is allowed (send.data() == recv.data()); otherwise the two must not overlap.
  virtual absl::Status AllReduceSum(const TensorView& send, const TensorView& recv) = 0;

  // recv = concat(send of rank 0, ..., send of rank size-1) along dim 0.
  //   send: [n, ...], device()                      recv: [size * n, ...], same dtype
  // send may be recv's own block (recv rows [rank*n, rank*n + n)); otherwise no overlap.
  virtual absl::Status AllGather(const TensorView& send, const TensorView& recv) = 0;

  // recv = rows [rank*n, rank*n + n) of the elementwise sum over ranks of send.
  //   send: [size * n, ...], device()               recv: [n, ...], same dtype
  // recv may be send's own block (rows [rank*n, rank*n + n)); otherwise no overlap.
  virtual absl::Status ReduceScatterSum(const TensorView& send, const TensorView& recv) = 0;

  // Copies root's buffer into every other rank's buffer.
  //   buffer: [...], device(), same shape and dtype on every rank; root in [0, size())
  virtual absl::Status Broadcast(const TensorView& buffer, int root) = 0;
};

}  // namespace eagle3
