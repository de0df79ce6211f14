#include "eagle3/cuda/nccl_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda_status.h"
#include "eagle3/cuda/device_allocator.h"
#include "collective_checks.h"
#include "eagle3/status.h"

#if EAGLE3_HAVE_NCCL
#include <nccl.h>
#endif

namespace eagle3::cuda {

#if EAGLE3_HAVE_NCCL

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "NcclCommunicator needs NCCL >= 2.14 (nonblocking communicators, ncclCommFinalize)"
#endif
static_assert(sizeof(NcclUniqueId) == sizeof(ncclUniqueId),
              "NcclUniqueId must mirror ncclUniqueId");

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point DeadlineAfter(std::chrono::milliseconds timeout) {
  // Clamped so that now() + timeout cannot overflow (milliseconds::max() means "practically
  // never").
  const std::chrono::milliseconds max_timeout = std::chrono::hours(24 * 365);
  return Clock::now() + std::clamp(timeout, std::chrono::milliseconds(0), max_timeout);
}

// Host polling with a bounded sleep: a few yields first (most collectives finish within
// microseconds), then sleeps doubling from 10 us up to 1 ms.
class Backoff {
 public:
  void Wait() {
    if (yields_ < 16) {
      ++yields_;
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  int yields_ = 0;
  std::chrono::microseconds sleep_{10};
};

// Makes `device` current for the scope when it is not already, and restores the caller's device.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device) {
      error_ = cudaSetDevice(device);
      switched_ = error_ == cudaSuccess;
    }
  }
  ~ScopedDevice() {
    if (switched_ && previous_ >= 0) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  cudaError_t error() const { return error_; }

 private:
  int previous_ = -1;
  bool switched_ = false;
  cudaError_t error_ = cudaSuccess;
};

// A stream this module created, destroyed unless released to a communicator.
class StreamGuard {
 public:
  StreamGuard() = default;
  StreamGuard(cudaStream_t stream, bool owned) : stream_(stream), owned_(owned) {}
  StreamGuard(StreamGuard&& other) noexcept
      : stream_(std::exchange(other.stream_, nullptr)),
        owned_(std::exchange(other.owned_, false)) {}
  StreamGuard& operator=(StreamGuard&&) = delete;
  ~StreamGuard() {
    if (owned_ && stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  bool owned() const { return owned_; }
  cudaStream_t release() {
    owned_ = false;
    return stream_;
  }

 private:
  cudaStream_t stream_ = nullptr;
  bool owned_ = false;
};

// `stream` when given (checked to be on `device` where the runtime can tell), else a new
// non-blocking stream on `device`.
absl::StatusOr<StreamGuard> UseOrCreateStream(cudaStream_t stream, int device, const char* caller) {
  if (stream != nullptr) {
#if CUDART_VERSION >= 12080
    int stream_device = -1;
    EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaStreamGetDevice(stream, &stream_device),
                                      std::string(caller) + ": cudaStreamGetDevice"));
    if (stream_device != device) {
      return absl::InvalidArgumentError(absl::StrCat(caller,
                                                     ": the stream belongs to cuda:", stream_device,
                                                     ", the communicator to cuda:", device));
    }
#endif
    return StreamGuard(stream, false);
  }
  ScopedDevice scoped(device);
  EAGLE3_RETURN_IF_ERROR(
      CudaStatus(scoped.error(), absl::StrCat(caller, ": cudaSetDevice(", device, ")")));
  cudaStream_t created = nullptr;
  EAGLE3_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking),
                 absl::StrCat(caller, ": cudaStreamCreateWithFlags on cuda:", device)));
  return StreamGuard(created, true);
}

absl::Status CheckDevice(int device, const char* caller) {
  const int count = CudaDeviceCount();
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat(caller, ": CUDA device ", device, " does not exist (", count, " visible)"));
  }
  return absl::OkStatus();
}

absl::Status CheckTimeout(std::chrono::milliseconds timeout, const char* caller) {
  if (timeout.count() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(caller, ": timeout must be positive, got ", timeout.count(), " ms"));
  }
  return absl::OkStatus();
}

// "invalid usage (run with NCCL_DEBUG=WARN for details) [ncclResult_t 5]: <NCCL's last message>".
// `comm` may be null; call before the communicator is aborted.
std::string NcclErrorText(ncclResult_t result, ncclComm_t comm) {
  std::string text =
      absl::StrCat(ncclGetErrorString(result), " [ncclResult_t ", static_cast<int>(result), "]");
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && detail[0] != '\0') absl::StrAppend(&text, ": ", detail);
  return text;
}

absl::Status NcclStatus(ncclResult_t result, const std::string& what, ncclComm_t comm) {
  std::string message = absl::StrCat(what, ": ", NcclErrorText(result, comm));
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclRemoteError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

// Polls `comm` until it leaves ncclInProgress (nonblocking communicators report initialization,
// lazy connection and finalization that way) or `deadline` passes; returns its state then.
ncclResult_t AwaitNotInProgress(ncclComm_t comm, Clock::time_point deadline) {
  Backoff backoff;
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm, &state);
    if (result != ncclSuccess) return result;
    if (state != ncclInProgress || Clock::now() >= deadline) return state;
    backoff.Wait();
  }
}

// After a nonblocking call completes, NCCL keeps the helper job in the calling thread's
// thread-local group state until the next call on that communicator. Joining it now, from this
// thread, keeps a later call from another thread (say the destructor) from reaching into the
// thread-local state of a thread that may have exited. Any call that checks readiness joins it.
ncclResult_t JoinPendingJob(ncclComm_t comm) {
  int count = 0;
  return ncclCommCount(comm, &count);
}

ncclConfig_t ConfigFor(const NcclOptions& options) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = options.nonblocking ? 0 : 1;
  return config;
}

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    default:
      return ncclFloat32;  // kF32; the argument checks admit no other dtype
  }
}

// "AllReduceSum of 1024 f32 elements", for error messages.
std::string DescribeCollective(const char* op, int64_t count, DType dtype) {
  return absl::StrCat(op, " of ", count, " ", std::string(DTypeName(dtype)), " elements");
}

// ---- This rank's argument checks: those of InProcessGroup, with device memory instead of host ---

// Shared with the in-process group (src/collective_checks.h), with this device's memory expected.
absl::Status CheckBuffer(const char* op, const char* name, const TensorView& t, int device) {
  return CheckCollectiveBuffer(op, name, t, Device::Cuda(device));
}

absl::Status CheckAliasing(const char* op, const TensorView& outer, const TensorView& inner, int block,
                           const char* outer_name, const char* inner_name) {
  return CheckCollectiveAliasing(op, outer, inner, block, outer_name, inner_name);
}

absl::Status CheckPair(const char* op, const TensorView& small, const TensorView& big, int factor,
                       const char* small_name, const char* big_name, int device) {
  return CheckCollectivePair(op, small, big, factor, small_name, big_name, Device::Cuda(device));
}

}  // namespace

// ---- Factories ----------------------------------------------------------------------------------

absl::StatusOr<NcclUniqueId> NcclCommunicator::NewUniqueId() {
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) {
    return NcclStatus(result, "NcclCommunicator::NewUniqueId: ncclGetUniqueId", nullptr);
  }
  NcclUniqueId out;
  std::memcpy(out.bytes, &id, sizeof(id));
  return out;
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Wrap(
    ncclComm_t comm, cudaStream_t stream, std::chrono::milliseconds timeout) {
  constexpr const char* kCaller = "NcclCommunicator::Wrap";
  if (comm == nullptr) return absl::InvalidArgumentError("NcclCommunicator::Wrap: comm is null");
  EAGLE3_RETURN_IF_ERROR(CheckTimeout(timeout, kCaller));
  // A nonblocking communicator may still be initializing.
  const ncclResult_t state = AwaitNotInProgress(comm, DeadlineAfter(timeout));
  if (state == ncclInProgress) {
    return absl::DeadlineExceededError(
        absl::StrCat(kCaller, ": the communicator is still in progress (initializing?) after ",
                     timeout.count(), " ms"));
  }
  if (state != ncclSuccess) {
    return NcclStatus(state, absl::StrCat(kCaller, ": the communicator is in error"), comm);
  }
  int size = 0, rank = 0, device = 0;
  for (auto [result, what] : {std::pair{ncclCommCount(comm, &size), "ncclCommCount"},
                              std::pair{ncclCommUserRank(comm, &rank), "ncclCommUserRank"},
                              std::pair{ncclCommCuDevice(comm, &device), "ncclCommCuDevice"}}) {
    if (result != ncclSuccess) return NcclStatus(result, absl::StrCat(kCaller, ": ", what), comm);
  }
  EAGLE3_ASSIGN_OR_RETURN(StreamGuard owned_stream, UseOrCreateStream(stream, device, kCaller));
  const bool owns_stream = owned_stream.owned();
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(
      comm, /*owns_comm=*/false, owned_stream.release(), owns_stream, rank, size, device, timeout));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::CreateFromUniqueId(
    const NcclUniqueId& id, int size, int rank, int device, cudaStream_t stream,
    const NcclOptions& options) {
  constexpr const char* kCaller = "NcclCommunicator::CreateFromUniqueId";
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(
        kCaller, ": need size >= 1 and rank in [0, size); got rank ", rank, " of size ", size));
  }
  EAGLE3_RETURN_IF_ERROR(CheckDevice(device, kCaller));
  EAGLE3_RETURN_IF_ERROR(CheckTimeout(options.timeout, kCaller));
  EAGLE3_ASSIGN_OR_RETURN(StreamGuard owned_stream, UseOrCreateStream(stream, device, kCaller));

  const std::string who = absl::StrCat(kCaller, ": rank ", rank, " of ", size, " on cuda:", device);
  ncclUniqueId nccl_id;
  std::memcpy(&nccl_id, id.bytes, sizeof(nccl_id));
  ncclConfig_t config = ConfigFor(options);
  ncclComm_t comm = nullptr;
  ncclResult_t state;
  {
    ScopedDevice scoped(device);  // NCCL binds the communicator to the current device
    EAGLE3_RETURN_IF_ERROR(CudaStatus(scoped.error(), who + ": cudaSetDevice"));
    state = ncclCommInitRankConfig(&comm, size, nccl_id, rank, &config);
    if (state == ncclInProgress) state = AwaitNotInProgress(comm, DeadlineAfter(options.timeout));
    if (state == ncclSuccess) state = JoinPendingJob(comm);
    if (state != ncclSuccess) {
      absl::Status status =
          state == ncclInProgress
              ? absl::DeadlineExceededError(absl::StrCat(who, ": not every rank joined within ",
                                                         options.timeout.count(),
                                                         " ms (same id and size on every rank?)"))
              : NcclStatus(state, who + ": ncclCommInitRankConfig", comm);
      if (comm != nullptr) ncclCommAbort(comm);
      return status;
    }
  }
  const bool owns_stream = owned_stream.owned();
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(comm, /*owns_comm=*/true, owned_stream.release(), owns_stream, rank,
                           size, device, options.timeout));
}

absl::StatusOr<std::vector<std::unique_ptr<NcclCommunicator>>> NcclCommunicator::CreateAllLocal(
    std::span<const int> devices, std::span<const cudaStream_t> streams,
    const NcclOptions& options) {
  constexpr const char* kCaller = "NcclCommunicator::CreateAllLocal";
  const int size = static_cast<int>(devices.size());
  if (size < 1) return absl::InvalidArgumentError(absl::StrCat(kCaller, ": no devices"));
  if (!streams.empty() && streams.size() != devices.size()) {
    return absl::InvalidArgumentError(absl::StrCat(kCaller, ": ", streams.size(), " streams for ",
                                                   size, " devices (give none or one per device)"));
  }
  EAGLE3_RETURN_IF_ERROR(CheckTimeout(options.timeout, kCaller));
  std::vector<char> seen(CudaDeviceCount(), 0);
  for (int device : devices) {
    EAGLE3_RETURN_IF_ERROR(CheckDevice(device, kCaller));
    if (seen[device]++) {
      return absl::InvalidArgumentError(
          absl::StrCat(kCaller, ": cuda:", device, " is listed twice (one rank per device)"));
    }
  }
  std::vector<StreamGuard> owned_streams;
  owned_streams.reserve(size);
  for (int r = 0; r < size; ++r) {
    EAGLE3_ASSIGN_OR_RETURN(StreamGuard s, UseOrCreateStream(streams.empty() ? nullptr : streams[r],
                                                             devices[r], kCaller));
    owned_streams.push_back(std::move(s));
  }

  ncclUniqueId id;
  ncclResult_t state = ncclGetUniqueId(&id);
  if (state != ncclSuccess) {
    return NcclStatus(state, absl::StrCat(kCaller, ": ncclGetUniqueId"), nullptr);
  }
  std::vector<ncclComm_t> comms(size, nullptr);
  auto abort_all = [&comms] {
    for (ncclComm_t& comm : comms) {
      if (comm != nullptr) ncclCommAbort(comm);
      comm = nullptr;
    }
  };
  ncclConfig_t config = ConfigFor(options);
  cudaError_t set_device = cudaSuccess;
  {
    int saved_device = 0;
    EAGLE3_RETURN_IF_ERROR(
        CudaStatus(cudaGetDevice(&saved_device), absl::StrCat(kCaller, ": cudaGetDevice")));
    // One group, as ncclCommInitAll does: the ranks initialize concurrently, so none waits for a
    // peer this thread has not reached yet. Per-call results surface at ncclGroupEnd (which, in
    // blocking mode, returns when all are done).
    ncclGroupStart();
    for (int r = 0; r < size; ++r) {
      const cudaError_t e = cudaSetDevice(devices[r]);
      if (e != cudaSuccess && set_device == cudaSuccess) set_device = e;
      ncclCommInitRankConfig(&comms[r], size, id, r, &config);
    }
    state = ncclGroupEnd();
    cudaSetDevice(saved_device);
  }
  if (set_device != cudaSuccess) {
    abort_all();
    return CudaStatus(set_device, absl::StrCat(kCaller, ": cudaSetDevice"));
  }
  if (state != ncclSuccess && state != ncclInProgress) {
    absl::Status status = NcclStatus(state, absl::StrCat(kCaller, ": ncclGroupEnd"), nullptr);
    abort_all();
    return status;
  }
  const Clock::time_point deadline = DeadlineAfter(options.timeout);
  for (int r = 0; r < size; ++r) {
    state = comms[r] == nullptr ? ncclInternalError : AwaitNotInProgress(comms[r], deadline);
    if (state == ncclSuccess) state = JoinPendingJob(comms[r]);
    if (state != ncclSuccess) {
      const std::string who =
          absl::StrCat(kCaller, ": rank ", r, " of ", size, " on cuda:", devices[r]);
      absl::Status status =
          state == ncclInProgress
              ? absl::DeadlineExceededError(absl::StrCat(
                    who, ": initialization did not finish within ", options.timeout.count(), " ms"))
              : NcclStatus(state, who + ": initialization failed", comms[r]);
      abort_all();
      return status;
    }
  }
  std::vector<std::unique_ptr<NcclCommunicator>> result;
  result.reserve(size);
  for (int r = 0; r < size; ++r) {
    const bool owns_stream = owned_streams[r].owned();
    result.emplace_back(new NcclCommunicator(std::exchange(comms[r], nullptr), /*owns_comm=*/true,
                                             owned_streams[r].release(), owns_stream, r, size,
                                             devices[r], options.timeout));
  }
  return result;
}

NcclCommunicator::NcclCommunicator(ncclComm_t comm, bool owns_comm, cudaStream_t stream,
                                   bool owns_stream, int rank, int size, int device,
                                   std::chrono::milliseconds timeout)
    : comm_(comm),
      owns_comm_(owns_comm),
      stream_(stream),
      owns_stream_(owns_stream),
      rank_(rank),
      size_(size),
      device_(device),
      timeout_(timeout) {}

NcclCommunicator::~NcclCommunicator() {
  if (owns_comm_ && comm_ != nullptr) {
    // A healthy communicator finishes its work and is finalized; anything else is aborted (WaitFor
    // aborts it itself when it fails).
    const bool drained = WaitFor(timeout_).ok();
    if (comm_ != nullptr) {
      ScopedDevice scoped(device_);
      ncclResult_t state = drained ? ncclCommFinalize(comm_) : ncclInternalError;
      if (state == ncclInProgress) state = AwaitNotInProgress(comm_, DeadlineAfter(timeout_));
      if (state == ncclSuccess) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
      comm_ = nullptr;
    }
  }
  if (owns_stream_ && stream_ != nullptr) cudaStreamDestroy(stream_);
}

// ---- Collectives --------------------------------------------------------------------------------

const char* NcclCommunicator::OpName(Op op) {
  switch (op) {
    case Op::kAllReduceSum:
      return "AllReduceSum";
    case Op::kAllGather:
      return "AllGather";
    case Op::kReduceScatterSum:
      return "ReduceScatterSum";
    case Op::kBroadcast:
      return "Broadcast";
    case Op::kNone:
      break;
  }
  return "?";
}

absl::Status NcclCommunicator::AllReduceSum(const TensorView& send, const TensorView& recv) {
  const char* op = OpName(Op::kAllReduceSum);
  absl::Status check = CheckPair(op, send, recv, 1, "send", "recv", device_);
  if (check.ok() && send.data() != recv.data() && BuffersOverlap(send, recv)) {
    check = absl::InvalidArgumentError(
        absl::StrCat(op, ": send ", send.ToString(), " and recv ", recv.ToString(),
                     " partially overlap (must be the same buffer or disjoint)"));
  }
  return Enqueue(Op::kAllReduceSum, check, send, recv, 0);
}

absl::Status NcclCommunicator::AllGather(const TensorView& send, const TensorView& recv) {
  const char* op = OpName(Op::kAllGather);
  absl::Status check = CheckPair(op, send, recv, size_, "send", "recv", device_);
  if (check.ok()) check = CheckAliasing(op, recv, send, rank_, "recv", "send");
  return Enqueue(Op::kAllGather, check, send, recv, 0);
}

absl::Status NcclCommunicator::ReduceScatterSum(const TensorView& send, const TensorView& recv) {
  const char* op = OpName(Op::kReduceScatterSum);
  absl::Status check = CheckPair(op, recv, send, size_, "recv", "send", device_);
  if (check.ok()) check = CheckAliasing(op, send, recv, rank_, "send", "recv");
  return Enqueue(Op::kReduceScatterSum, check, send, recv, 0);
}

absl::Status NcclCommunicator::Broadcast(const TensorView& buffer, int root) {
  const char* op = OpName(Op::kBroadcast);
  absl::Status check = CheckBuffer(op, "buffer", buffer, device_);
  if (check.ok() && (root < 0 || root >= size_)) {
    check = absl::InvalidArgumentError(
        absl::StrCat(op, ": root ", root, " is outside [0, ", size_, ")"));
  }
  return Enqueue(Op::kBroadcast, check, buffer, buffer, root);
}

absl::Status NcclCommunicator::Enqueue(Op op, const absl::Status& check, const TensorView& send,
                                       const TensorView& recv, int root) {
  if (!check.ok()) {
    // This rank enqueues nothing while its peers may: the call sequences have diverged.
    Fail(check).IgnoreError();
    return check;
  }
  if (!poison_.ok()) return Refused(op);
  EAGLE3_RETURN_IF_ERROR(Poll());
  // ReduceScatter counts the elements each rank receives; the others those each rank sends.
  const int64_t count = op == Op::kReduceScatterSum ? recv.numel() : send.numel();
  if (count == 0) return absl::OkStatus();  // same shapes on every rank: every rank skips it

  ScopedDevice scoped(device_);
  if (scoped.error() != cudaSuccess) {
    return Fail(CudaStatus(scoped.error(), Describe() + ": cudaSetDevice"));
  }
  const ncclDataType_t type = NcclType(send.dtype());
  const size_t n = static_cast<size_t>(count);
  ncclResult_t result = ncclSuccess;
  switch (op) {
    case Op::kAllReduceSum:
      result = ncclAllReduce(send.data(), recv.data(), n, type, ncclSum, comm_, stream_);
      break;
    case Op::kAllGather:
      result = ncclAllGather(send.data(), recv.data(), n, type, comm_, stream_);
      break;
    case Op::kReduceScatterSum:
      result = ncclReduceScatter(send.data(), recv.data(), n, type, ncclSum, comm_, stream_);
      break;
    case Op::kBroadcast:
      result = ncclBroadcast(send.data(), recv.data(), n, type, root, comm_, stream_);
      break;
    case Op::kNone:
      break;
  }
  if (result == ncclInProgress) {
    // Nonblocking mode: NCCL launches from a helper thread, after connecting to the peers if this
    // is the first collective of its algorithm. The kernel is not on the stream until then, so
    // wait here — bounded, since a peer that never calls never connects.
    result = AwaitNotInProgress(comm_, DeadlineAfter(timeout_));
    if (result == ncclInProgress) {
      return Fail(absl::DeadlineExceededError(
          absl::StrCat(Describe(), ": ", DescribeCollective(OpName(op), count, send.dtype()),
                       " could not connect to its peers within ", timeout_.count(),
                       " ms (did every rank call it?)")));
    }
    if (result == ncclSuccess) result = JoinPendingJob(comm_);
  }
  if (result != ncclSuccess) {
    return Fail(NcclStatus(
        result, absl::StrCat(Describe(), ": ", DescribeCollective(OpName(op), count, send.dtype())),
        comm_));
  }
  last_op_ = op;
  last_dtype_ = send.dtype();
  last_count_ = count;
  ++num_enqueued_;
  return absl::OkStatus();
}

// ---- Errors and waiting -------------------------------------------------------------------------

absl::Status NcclCommunicator::Poll() {
  if (!poison_.ok()) return poison_;
  ncclResult_t state = ncclSuccess;
  const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
  if (result != ncclSuccess) {
    return Fail(NcclStatus(result, Describe() + ": ncclCommGetAsyncError", comm_));
  }
  if (state != ncclSuccess && state != ncclInProgress) {
    return Fail(NcclStatus(state, Describe() + ": NCCL reported an asynchronous error", comm_));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::WaitFor(std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = DeadlineAfter(timeout);
  Backoff backoff;
  while (true) {
    EAGLE3_RETURN_IF_ERROR(Poll());
    const cudaError_t query = cudaStreamQuery(stream_);
    if (query == cudaSuccess) return Poll();  // an error may have been recorded as it finished
    if (query != cudaErrorNotReady) {
      return Fail(CudaStatus(query, Describe() + ": work on its stream failed"));
    }
    cudaGetLastError();  // "not ready" is no error: keep it from a later launcher's error check
    if (Clock::now() >= deadline) {
      return Fail(absl::DeadlineExceededError(absl::StrCat(
          Describe(), ": the work on its stream did not finish within ", timeout.count(), " ms (",
          DescribeLastOp(),
          "); a rank that skips, reorders or mismatches a collective leaves the others waiting")));
    }
    backoff.Wait();
  }
}

void NcclCommunicator::Abort(std::string_view reason) {
  if (!poison_.ok()) return;
  Fail(absl::AbortedError(absl::StrCat(Describe(), " aborted: ", std::string(reason))))
      .IgnoreError();
}

absl::Status NcclCommunicator::Fail(absl::Status status) {
  if (!poison_.ok()) return poison_;
  if (owns_comm_) {
    if (comm_ != nullptr) {
      ScopedDevice scoped(device_);
      ncclCommAbort(comm_);  // kernels of this communicator quit; its resources are freed
      comm_ = nullptr;
    }
    poison_ = absl::Status(status.code(),
                           absl::StrCat(status.message(), " [the NCCL communicator was aborted]"));
  } else {
    poison_ = absl::Status(
        status.code(),
        absl::StrCat(status.message(),
                     " [the borrowed NCCL communicator must be aborted by its owner]"));
  }
  return poison_;
}

absl::Status NcclCommunicator::Refused(Op op) const {
  return absl::AbortedError(
      absl::StrCat("NcclCommunicator ", OpName(op), " on rank ", rank_,
                   " refused: the communicator is poisoned: ", poison_.message()));
}

std::string NcclCommunicator::Describe() const {
  return absl::StrCat("NcclCommunicator rank ", rank_, " of ", size_, " (cuda:", device_, ")");
}

std::string NcclCommunicator::DescribeLastOp() const {
  if (num_enqueued_ == 0) return "no collective enqueued yet";
  return absl::StrCat("last collective enqueued: #", num_enqueued_, " ",
                      DescribeCollective(OpName(last_op_), last_count_, last_dtype_));
}

#else  // !EAGLE3_HAVE_NCCL

namespace {

absl::Status NoNccl() {
  return absl::UnimplementedError(
      "NcclCommunicator: eagle3 was built without NCCL (FindNCCL found none)");
}

}  // namespace

absl::StatusOr<NcclUniqueId> NcclCommunicator::NewUniqueId() { return NoNccl(); }

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Wrap(
    ncclComm_t, cudaStream_t, std::chrono::milliseconds) {
  return NoNccl();
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::CreateFromUniqueId(
    const NcclUniqueId&, int, int, int, cudaStream_t, const NcclOptions&) {
  return NoNccl();
}

absl::StatusOr<std::vector<std::unique_ptr<NcclCommunicator>>> NcclCommunicator::CreateAllLocal(
    std::span<const int>, std::span<const cudaStream_t>, const NcclOptions&) {
  return NoNccl();
}

// No object can exist without NCCL (every factory fails); the members below only complete the
// class.
NcclCommunicator::~NcclCommunicator() = default;
absl::Status NcclCommunicator::AllReduceSum(const TensorView&, const TensorView&) {
  return NoNccl();
}
absl::Status NcclCommunicator::AllGather(const TensorView&, const TensorView&) { return NoNccl(); }
absl::Status NcclCommunicator::ReduceScatterSum(const TensorView&, const TensorView&) {
  return NoNccl();
}
absl::Status NcclCommunicator::Broadcast(const TensorView&, int) { return NoNccl(); }
absl::Status NcclCommunicator::Poll() { return NoNccl(); }
absl::Status NcclCommunicator::WaitFor(std::chrono::milliseconds) { return NoNccl(); }
void NcclCommunicator::Abort(std::string_view) {}

#endif  // EAGLE3_HAVE_NCCL

}  // namespace eagle3::cuda
