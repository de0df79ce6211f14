// Communicator over NCCL: one object per rank, one GPU per rank (eagle3::cuda target). Collectives
// are enqueued on the communicator's CUDA stream and return without waiting for the GPU; Poll() and
// WaitFor() report NCCL and CUDA errors and turn a hung group into a Status instead of a hang.
//
// Built without NCCL (EAGLE3_HAVE_NCCL undefined) the factories return Unimplemented. This header
// does not include nccl.h, so engines without NCCL on their include path can use it.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/communicator.h"
#include "eagle3/export.h"

// The handle type exactly as nccl.h declares it (a redeclaration of the same typedef is allowed).
struct ncclComm;
typedef struct ncclComm* ncclComm_t;

namespace eagle3::cuda {

// The bytes of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES = 128), layout-compatible with it: copy them
// to the other ranks (processes or threads) by any means, then call CreateFromUniqueId on each.
struct NcclUniqueId {
  char bytes[128];
};

// How owned communicators are created and how long the host waits on other ranks.
struct NcclOptions {
  // Bounds the host waits that depend on other ranks: creation and NCCL's lazy connecting (in
  // nonblocking mode only; see below), finalization in the destructor, and Synchronize().
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // NCCL's communicator mode (ncclConfig_t::blocking = !nonblocking).
  //  - Blocking (default): collectives launch inline, costing a few microseconds of host time.
  //    Host calls that need the peers cannot be bounded: creation (CreateFromUniqueId waits for
  //    every rank; CreateAllLocal creates all ranks itself, so it cannot miss one) and NCCL's
  //    connecting on the first collective of each algorithm (it waits for the peers to reach the
  //    same collective). After that a missing peer only stalls the GPU, which WaitFor() bounds.
  //  - Nonblocking: every host wait is bounded by `timeout` (the communicator is then aborted and
  //    DeadlineExceeded returned), but NCCL >= 2.27 launches each collective from a helper thread
  //    that the call waits for: tens of microseconds of host time per collective. For creating
  //    ranks in separate processes that may fail to start, and for tests.
  bool nonblocking = false;
};

// Differences from the Communicator contract (and from InProcessGroup):
//  - Asynchronous: a collective validates its arguments, enqueues the NCCL call on stream() and
//    returns; the data is ready when stream() reaches that point. Buffers must stay valid until
//    then. Give the communicator the stream the rank's ops run on (CudaBackend::stream()), so that
//    a collective is ordered after the kernels that produce its input and before those that read
//    its output; with a separate stream the caller must order the two with events. The host waits
//    only as NcclOptions::nonblocking describes.
//  - Only this rank's arguments are checked (shapes, dtype, device, contiguity, aliasing — the same
//    checks and messages as InProcessGroup); ranks that disagree with each other are not detected
//    on the host: their kernels wait for each other, and WaitFor() reports DeadlineExceeded.
//  - f16/bf16 sums are NCCL's: each partial sum is rounded to the dtype (not accumulated in f32
//    and rounded once), so results may differ from InProcessGroup's by a few units in the last
//    place. Every rank still receives bit-identical results; integer sums wrap.
//
// Errors poison the communicator (later collectives return Aborted quoting the first error) and
// abort an owned NCCL communicator (ncclCommAbort: its kernels quit, its resources are freed):
// invalid arguments (this rank did not enqueue, so the ranks' call sequences have diverged), an
// NCCL error reported by a call or by ncclCommGetAsyncError, a CUDA error on stream(), and a
// deadline passed in WaitFor(). A borrowed communicator (Wrap) is poisoned but never aborted: its
// owner must call ncclCommAbort on it.
//
// Not thread-safe: one thread drives one object (distinct objects may run concurrently). Each
// thread that drives a rank should keep its current device at device() while the collective runs;
// calls set it when it differs and restore the caller's device afterwards.
class EAGLE3_API NcclCommunicator final : public Communicator {
 public:
  // A fresh id (ncclGetUniqueId) for CreateFromUniqueId; generate it once, on one rank.
  static absl::StatusOr<NcclUniqueId> NewUniqueId();

  // Borrows `comm`, an initialized communicator the engine owns (blocking or nonblocking): the
  // wrapper never finalizes, destroys or aborts it, and must be destroyed before it.
  // `stream`: where collectives are enqueued, on the communicator's device; null creates (and owns)
  // a non-blocking stream. Rank, size and device come from NCCL. `timeout`: as NcclOptions's.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Wrap(
      ncclComm_t comm, cudaStream_t stream,
      std::chrono::milliseconds timeout = NcclOptions().timeout);

  // Creates (and owns) rank `rank` of `size` on CUDA device `device` (ncclCommInitRankConfig).
  // Call it from every rank's thread or process with the same id and size; it returns when all
  // ranks have joined (nonblocking mode: or DeadlineExceeded after the timeout, the half-built
  // communicator aborted). `stream`: as for Wrap, on `device`.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> CreateFromUniqueId(
      const NcclUniqueId& id, int size, int rank, int device, cudaStream_t stream = nullptr,
      const NcclOptions& options = {});

  // One communicator per entry of `devices` (distinct visible CUDA ordinals; rank i on devices[i]),
  // created together from this thread in one NCCL group, as ncclCommInitAll does. Hand each to its
  // own thread to run collectives. `streams`: empty, or one per device (a null entry creates an
  // owned non-blocking stream on that device).
  static absl::StatusOr<std::vector<std::unique_ptr<NcclCommunicator>>> CreateAllLocal(
      std::span<const int> devices, std::span<const cudaStream_t> streams = {},
      const NcclOptions& options = {});

  // An owned communicator that is healthy waits (up to timeout()) for stream() to drain, then is
  // finalized and destroyed (ncclCommFinalize, ncclCommDestroy); one that is poisoned, or does not
  // drain or finalize in time, is aborted instead. Owned streams are destroyed.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::Cuda(device_); }

  // Buffers: contiguous memory of device() in f32, f16, bf16, i32 or i64 (shapes as documented by
  // Communicator). Empty tensors enqueue nothing.
  absl::Status AllReduceSum(const TensorView& send, const TensorView& recv) override;
  absl::Status AllGather(const TensorView& send, const TensorView& recv) override;
  absl::Status ReduceScatterSum(const TensorView& send, const TensorView& recv) override;
  absl::Status Broadcast(const TensorView& buffer, int root) override;

  // Never blocks. OK while no error is known; otherwise poisons (and aborts an owned communicator)
  // and returns a status naming the NCCL error. Once poisoned, returns the poisoning status.
  absl::Status Poll();

  // Waits until all work enqueued on stream() so far (collectives and anything else) has finished:
  // polls cudaStreamQuery and ncclCommGetAsyncError with a bounded sleep. Past `timeout` the
  // communicator is poisoned (and an owned one aborted) and DeadlineExceeded is returned, naming
  // the last collective enqueued. A CUDA error on the stream or an NCCL error is returned likewise.
  absl::Status WaitFor(std::chrono::milliseconds timeout);
  absl::Status Synchronize() { return WaitFor(timeout_); }

  // Poisons the communicator with Aborted(reason) and aborts it when owned. No effect once
  // poisoned.
  void Abort(std::string_view reason);

  // OK, or the status that poisoned the communicator.
  const absl::Status& status() const { return poison_; }

  cudaStream_t stream() const { return stream_; }
  // The NCCL handle; null once an owned communicator has been aborted.
  ncclComm_t nccl_comm() const { return comm_; }
  bool owns_comm() const { return owns_comm_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  enum class Op : uint8_t { kNone, kAllReduceSum, kAllGather, kReduceScatterSum, kBroadcast };

  NcclCommunicator(ncclComm_t comm, bool owns_comm, cudaStream_t stream, bool owns_stream, int rank,
                   int size, int device, std::chrono::milliseconds timeout);

  static const char* OpName(Op op);
  // `check` is the result of this rank's argument checks: an error poisons and is returned as is;
  // otherwise the NCCL call for `op` is enqueued (unless poisoned: Aborted).
  absl::Status Enqueue(Op op, const absl::Status& check, const TensorView& send,
                       const TensorView& recv, int root);
  // Poisons with `status` (first error wins), aborts an owned communicator, returns the poison.
  absl::Status Fail(absl::Status status);
  absl::Status Refused(Op op) const;
  std::string Describe() const;        // "NcclCommunicator rank 1 of 8 (cuda:1)"
  std::string DescribeLastOp() const;  // the last collective enqueued, for timeout messages

  ncclComm_t comm_;
  bool owns_comm_;
  cudaStream_t stream_;
  bool owns_stream_;
  int rank_;
  int size_;
  int device_;
  std::chrono::milliseconds timeout_;
  absl::Status poison_;
  // The last collective enqueued (kept as plain fields: no allocation per call).
  Op last_op_ = Op::kNone;
  DType last_dtype_ = DType::kF32;
  int64_t last_count_ = 0;
  uint64_t num_enqueued_ = 0;
};

}  // namespace eagle3::cuda
