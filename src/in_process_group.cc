#include "eagle3/in_process_group.h"

#include "collective_checks.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "eagle3/half.h"
#include "eagle3/status.h"

namespace eagle3 {
namespace internal {
namespace {

enum class Op : uint8_t { kAllReduceSum, kAllGather, kReduceScatterSum, kBroadcast };

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllReduceSum:
      return "AllReduceSum";
    case Op::kAllGather:
      return "AllGather";
    case Op::kReduceScatterSum:
      return "ReduceScatterSum";
    case Op::kBroadcast:
      return "Broadcast";
  }
  return "?";
}

// One rank's side of a collective. Broadcast uses `send` == `recv` == the buffer.
struct Call {
  Op op = Op::kAllReduceSum;
  TensorView send;
  TensorView recv;
  int root = 0;
  absl::Status local;  // argument errors the calling rank found; reported to every rank
};

std::string DescribeCall(const Call& call) {
  if (call.op == Op::kBroadcast) {
    return absl::StrCat("Broadcast(buffer ", call.send.ToString(), ", root ", call.root, ")");
  }
  return absl::StrCat(OpName(call.op), "(send ", call.send.ToString(), ", recv ",
                      call.recv.ToString(), ")");
}

// ---- Local argument checks
// -----------------------------------------------------------------------

// Shared with the NCCL communicator (src/collective_checks.h), with host memory expected here.
absl::Status CheckPair(Op op, const TensorView& small, const TensorView& big, int factor, const char* small_name,
                       const char* big_name) {
  return CheckCollectivePair(OpName(op), small, big, factor, small_name, big_name, Device::Cpu());
}

absl::Status CheckAliasing(Op op, const TensorView& outer, const TensorView& inner, int block,
                           const char* outer_name, const char* inner_name) {
  return CheckCollectiveAliasing(OpName(op), outer, inner, block, outer_name, inner_name);
}

absl::Status CheckBuffer(Op op, const char* name, const TensorView& t) {
  return CheckCollectiveBuffer(OpName(op), name, t, Device::Cpu());
}

// ---- Reductions
// -----------------------------------------------------------------------------------

// Per-dtype load to the accumulator type, and the single rounding back. Integers wrap.
struct F32Sum {
  using T = float;
  using Acc = float;
  static Acc Load(T v) { return v; }
  static T Store(Acc a) { return a; }
};
struct F16Sum {
  using T = uint16_t;
  using Acc = float;
  static Acc Load(T v) { return F16ToFloat(v); }
  static T Store(Acc a) { return FloatToF16(a); }
};
struct Bf16Sum {
  using T = uint16_t;
  using Acc = float;
  static Acc Load(T v) { return Bf16ToFloat(v); }
  static T Store(Acc a) { return FloatToBf16(a); }
};
struct I32Sum {
  using T = int32_t;
  using Acc = uint32_t;
  static Acc Load(T v) { return static_cast<Acc>(v); }
  static T Store(Acc a) { return static_cast<T>(a); }
};
struct I64Sum {
  using T = int64_t;
  using Acc = uint64_t;
  static Acc Load(T v) { return static_cast<Acc>(v); }
  static T Store(Acc a) { return static_cast<T>(a); }
};

// dsts[d][dst_offset + i] = srcs[0][src_offset + i] + ... + srcs[n-1][src_offset + i], i < count,
// summed in source order. Works through a stack block so that no heap memory is needed and a
// destination may alias a source (each element is fully read before any destination is written).
template <typename Traits>
void SumBlocks(const void* const* srcs, int num_srcs, void* const* dsts, int num_dsts,
               int64_t src_offset, int64_t dst_offset, int64_t count) {
  using T = typename Traits::T;
  using Acc = typename Traits::Acc;
  constexpr int64_t kBlock = 512;
  Acc acc[kBlock];
  for (int64_t base = 0; base < count; base += kBlock) {
    const int64_t n = std::min(kBlock, count - base);
    const T* first = static_cast<const T*>(srcs[0]) + src_offset + base;
    for (int64_t i = 0; i < n; ++i) acc[i] = Traits::Load(first[i]);
    for (int s = 1; s < num_srcs; ++s) {
      const T* src = static_cast<const T*>(srcs[s]) + src_offset + base;
      for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] + Traits::Load(src[i]);
    }
    for (int d = 0; d < num_dsts; ++d) {
      T* dst = static_cast<T*>(dsts[d]) + dst_offset + base;
      for (int64_t i = 0; i < n; ++i) dst[i] = Traits::Store(acc[i]);
    }
  }
}

void Sum(DType dtype, const void* const* srcs, int num_srcs, void* const* dsts, int num_dsts,
         int64_t src_offset, int64_t dst_offset, int64_t count) {
  switch (dtype) {
    case DType::kF32:
      return SumBlocks<F32Sum>(srcs, num_srcs, dsts, num_dsts, src_offset, dst_offset, count);
    case DType::kF16:
      return SumBlocks<F16Sum>(srcs, num_srcs, dsts, num_dsts, src_offset, dst_offset, count);
    case DType::kBF16:
      return SumBlocks<Bf16Sum>(srcs, num_srcs, dsts, num_dsts, src_offset, dst_offset, count);
    case DType::kI32:
      return SumBlocks<I32Sum>(srcs, num_srcs, dsts, num_dsts, src_offset, dst_offset, count);
    case DType::kI64:
      return SumBlocks<I64Sum>(srcs, num_srcs, dsts, num_dsts, src_offset, dst_offset, count);
    default:
      return;  // unreachable: CheckBuffer admits only the dtypes above
  }
}

std::string RankList(const std::vector<char>& flags, bool value) {
  std::vector<int> ranks;
  for (size_t r = 0; r < flags.size(); ++r) {
    if ((flags[r] != 0) == value) ranks.push_back(static_cast<int>(r));
  }
  return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
}

}  // namespace

// The rendezvous shared by the rank communicators. Each collective is one "round":
//   phase 1: every rank posts its Call; the last to arrive validates the round for everyone.
//   data:    every rank moves its share of the data, reading the others' posted buffers.
//   phase 2: every rank waits until all have finished, so no send buffer is reused (and no
//            receive buffer returned) while another rank still touches it.
// Only phase 1 can time out or be aborted: once all ranks are in, the round runs to completion
// (nothing in it blocks), which is what keeps early returns from racing with other ranks' writes.
class InProcessGroupState {
 public:
  InProcessGroupState(int size, std::chrono::milliseconds timeout)
      : size_(size),
        timeout_(timeout),
        calls_(size),
        arrived_flags_(size, 0),
        claimed_(size, 0),
        src_table_(static_cast<size_t>(size) * size),
        dst_table_(static_cast<size_t>(size) * size) {}

  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  absl::Status Claim(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    if (claimed_[rank]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "InProcessGroup::Rank(", rank, "): rank is already held by another communicator"));
    }
    claimed_[rank] = 1;
    return absl::OkStatus();
  }

  void Release(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    claimed_[rank] = 0;
  }

  void Abort(std::string_view reason) {
    std::lock_guard<std::mutex> lock(mu_);
    if (poison_.ok()) {
      poison_ = absl::AbortedError(absl::StrCat("InProcessGroup aborted: ", std::string(reason)));
    }
    cv_.notify_all();
  }

  absl::Status status() const {
    std::lock_guard<std::mutex> lock(mu_);
    return poison_;
  }

  absl::Status Run(int rank, const Call& call) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!poison_.ok()) {
      return absl::AbortedError(
          absl::StrCat("InProcessGroup ", OpName(call.op), " on rank ", rank,
                       " refused: the group is poisoned: ", poison_.message()));
    }
    const uint64_t round = round_;
    calls_[rank] = call;
    arrived_flags_[rank] = 1;
    if (++arrived_ == size_) {
      round_status_ = CheckRound();
      if (!round_status_.ok()) poison_ = round_status_;
      cv_.notify_all();
    } else {
      const auto deadline = std::chrono::steady_clock::now() + timeout_;
      while (arrived_ < size_) {
        if (!poison_.ok()) return poison_;  // aborted, or another waiter timed out this round
        if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && arrived_ < size_) {
          poison_ = absl::DeadlineExceededError(
              absl::StrCat("InProcessGroup ", OpName(call.op), " (collective #", round,
                           ") did not complete within ", timeout_.count(), " ms: ranks ",
                           RankList(arrived_flags_, false), " never arrived (ranks ",
                           RankList(arrived_flags_, true), " waited)"));
          cv_.notify_all();
          return poison_;
        }
      }
    }
    const absl::Status status = round_status_;
    lock.unlock();

    if (status.ok()) Execute(rank);

    lock.lock();
    if (++departed_ == size_) {
      departed_ = 0;
      arrived_ = 0;
      std::fill(arrived_flags_.begin(), arrived_flags_.end(), 0);
      round_status_ = absl::OkStatus();
      ++round_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return round_ != round; });
    }
    return status;
  }

 private:
  // Runs under mu_ on the last rank to arrive; the verdict applies to every rank.
  absl::Status CheckRound() const {
    const Call& first = calls_[0];
    std::vector<std::string> bad;
    for (int r = 0; r < size_; ++r) {
      if (!calls_[r].local.ok()) {
        bad.push_back(absl::StrCat("rank ", r, ": ", calls_[r].local.message()));
      }
    }
    if (!bad.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("InProcessGroup ", OpName(first.op),
                                                     ": invalid arguments on ",
                                                     absl::StrJoin(bad, "; ")));
    }
    bool match = true;
    for (int r = 1; r < size_ && match; ++r) {
      const Call& c = calls_[r];
      match = c.op == first.op && c.send.dtype() == first.send.dtype() &&
              c.send.shape() == first.send.shape() && c.recv.shape() == first.recv.shape() &&
              c.root == first.root;
    }
    if (!match) {
      std::vector<std::string> lines;
      for (int r = 0; r < size_; ++r) {
        lines.push_back(absl::StrCat("rank ", r, ": ", DescribeCall(calls_[r])));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "InProcessGroup: ranks called mismatched collectives (every rank must call the same op "
          "with the same dtype, shapes and root): ",
          absl::StrJoin(lines, "; ")));
    }
    for (int r = 0; r < size_; ++r) {
      for (int s = r + 1; s < size_; ++s) {
        const Call& a = calls_[r];
        const Call& b = calls_[s];
        if (BuffersOverlap(a.send, b.send) ||
            BuffersOverlap(a.send, b.recv) ||
            BuffersOverlap(a.recv, b.send) ||
            BuffersOverlap(a.recv, b.recv)) {
          return absl::InvalidArgumentError(
              absl::StrCat("InProcessGroup ", OpName(first.op), ": buffers of ranks ", r, " and ",
                           s, " overlap; each rank needs its own memory"));
        }
      }
    }
    return absl::OkStatus();
  }

  // The data movement of `rank` for the current round; runs outside mu_ between the two phases.
  void Execute(int rank) {
    const Call& own = calls_[rank];
    const void** srcs = src_table_.data() + static_cast<size_t>(rank) * size_;
    void** dsts = dst_table_.data() + static_cast<size_t>(rank) * size_;
    for (int r = 0; r < size_; ++r) {
      srcs[r] = calls_[r].send.data();
      dsts[r] = calls_[r].recv.data();
    }
    switch (own.op) {
      case Op::kAllReduceSum: {
        // This rank sums elements [begin, end) and writes them to every rank's recv.
        const int64_t n = own.send.numel();
        const int64_t begin = n * rank / size_;
        const int64_t end = n * (rank + 1) / size_;
        Sum(own.send.dtype(), srcs, size_, dsts, size_, begin, begin, end - begin);
        break;
      }
      case Op::kReduceScatterSum: {
        const int64_t n = own.recv.numel();
        Sum(own.send.dtype(), srcs, size_, dsts + rank, 1, n * rank, 0, n);
        break;
      }
      case Op::kAllGather: {
        const size_t bytes = own.send.nbytes();
        for (int r = 0; r < size_; ++r) {
          char* dst = static_cast<char*>(own.recv.data()) + r * bytes;
          if (bytes > 0 && dst != srcs[r]) std::memcpy(dst, srcs[r], bytes);
        }
        break;
      }
      case Op::kBroadcast: {
        const void* src = srcs[own.root];
        if (rank != own.root && own.send.nbytes() > 0) {
          std::memcpy(own.send.data(), src, own.send.nbytes());
        }
        break;
      }
    }
  }

  const int size_;
  const std::chrono::milliseconds timeout_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_, except that calls_ is read without it between the phases of a round (nobody
  // writes it then).
  std::vector<Call> calls_;
  std::vector<char> arrived_flags_;
  std::vector<char> claimed_;
  int arrived_ = 0;
  int departed_ = 0;
  uint64_t round_ = 0;
  absl::Status round_status_;
  absl::Status poison_;
  // Per-rank pointer tables for Execute (row r belongs to rank r), preallocated.
  std::vector<const void*> src_table_;
  std::vector<void*> dst_table_;
};

namespace {

class RankCommunicator final : public Communicator {
 public:
  RankCommunicator(std::shared_ptr<InProcessGroupState> state, int rank)
      : state_(std::move(state)), rank_(rank) {}
  ~RankCommunicator() override { state_->Release(rank_); }

  int rank() const override { return rank_; }
  int size() const override { return state_->size(); }
  Device device() const override { return Device::Cpu(); }

  absl::Status AllReduceSum(const TensorView& send, const TensorView& recv) override {
    Call call{Op::kAllReduceSum, send, recv, 0, {}};
    call.local = CheckPair(call.op, send, recv, 1, "send", "recv");
    if (call.local.ok() && send.data() != recv.data() && BuffersOverlap(send, recv)) {
      call.local = absl::InvalidArgumentError(
          absl::StrCat("AllReduceSum: send ", send.ToString(), " and recv ", recv.ToString(),
                       " partially overlap (must be the same buffer or disjoint)"));
    }
    return state_->Run(rank_, call);
  }

  absl::Status AllGather(const TensorView& send, const TensorView& recv) override {
    Call call{Op::kAllGather, send, recv, 0, {}};
    call.local = CheckPair(call.op, send, recv, size(), "send", "recv");
    if (call.local.ok()) call.local = CheckAliasing(call.op, recv, send, rank_, "recv", "send");
    return state_->Run(rank_, call);
  }

  absl::Status ReduceScatterSum(const TensorView& send, const TensorView& recv) override {
    Call call{Op::kReduceScatterSum, send, recv, 0, {}};
    call.local = CheckPair(call.op, recv, send, size(), "recv", "send");
    if (call.local.ok()) call.local = CheckAliasing(call.op, send, recv, rank_, "send", "recv");
    return state_->Run(rank_, call);
  }

  absl::Status Broadcast(const TensorView& buffer, int root) override {
    Call call{Op::kBroadcast, buffer, buffer, root, {}};
    call.local = CheckBuffer(call.op, "buffer", buffer);
    if (call.local.ok() && (root < 0 || root >= size())) {
      call.local = absl::InvalidArgumentError(
          absl::StrCat("Broadcast: root ", root, " is outside [0, ", size(), ")"));
    }
    return state_->Run(rank_, call);
  }

 private:
  std::shared_ptr<InProcessGroupState> state_;
  int rank_;
};

}  // namespace
}  // namespace internal

InProcessGroup::InProcessGroup(std::shared_ptr<internal::InProcessGroupState> state)
    : state_(std::move(state)) {}

InProcessGroup::~InProcessGroup() = default;

absl::StatusOr<std::shared_ptr<InProcessGroup>> InProcessGroup::Create(
    int size, std::chrono::milliseconds timeout) {
  if (size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("InProcessGroup::Create: size must be >= 1, got ", size));
  }
  if (timeout.count() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "InProcessGroup::Create: timeout must be positive, got ", timeout.count(), " ms"));
  }
  // Keeps steady_clock::now() + timeout from overflowing.
  const std::chrono::milliseconds max_timeout = std::chrono::hours(24 * 365);
  return std::shared_ptr<InProcessGroup>(new InProcessGroup(
      std::make_shared<internal::InProcessGroupState>(size, std::min(timeout, max_timeout))));
}

int InProcessGroup::size() const { return state_->size(); }

std::chrono::milliseconds InProcessGroup::timeout() const { return state_->timeout(); }

absl::StatusOr<std::unique_ptr<Communicator>> InProcessGroup::Rank(int rank) {
  if (rank < 0 || rank >= size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("InProcessGroup::Rank: rank ", rank, " is outside [0, ", size(), ")"));
  }
  EAGLE3_RETURN_IF_ERROR(state_->Claim(rank));
  return std::unique_ptr<Communicator>(new internal::RankCommunicator(state_, rank));
}

void InProcessGroup::Abort(std::string_view reason) { state_->Abort(reason); }

absl::Status InProcessGroup::status() const { return state_->status(); }

}  // namespace eagle3
