// A tensor-parallel group whose ranks are threads of one process sharing host memory: the CPU
// reference for TP=N runs, and the test double for code written against Communicator.
#pragma once

#include <chrono>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/communicator.h"
#include "eagle3/export.h"

namespace eagle3 {

namespace internal {
class InProcessGroupState;
}  // namespace internal

// Usage: create the group, hand Rank(r) to the thread that drives rank r, call collectives.
//
// Guarantees beyond the Communicator contract:
//  - Sums run in rank order 0..size-1 (one rank sums each element and writes it to every rank),
//    so all ranks get the same bits as a serial reference that adds rank 0, 1, ... in turn.
//  - A collective that not every rank reaches within `timeout` returns DeadlineExceeded on the
//    ranks that did (naming the op and the missing ranks) and poisons the group; Abort() poisons it
//    with Aborted. Once poisoned, every later call returns Aborted quoting the original reason.
//  - Bad arguments on any rank, or ranks disagreeing on op/dtype/shape/root, give InvalidArgument
//    on every rank (naming each rank's call) and poison the group: the ranks' call sequences have
//    diverged, so nothing after that point could pair up correctly.
//  - Buffers of different ranks must not overlap (checked). Send buffers are read until every rank
//    has finished the collective, and a rank returns only when its receive buffer is complete.
//  - No heap allocation per successful collective (one mutex, one condition variable); only error
//    paths build strings.
//
// Buffers: host memory (Device::Cpu(); pinned host memory counts), contiguous.
class EAGLE3_API InProcessGroup {
 public:
  // size >= 1 ranks; timeout > 0 bounds how long a rank waits for the others to arrive (clamped
  // to one year, so milliseconds::max() means "practically forever").
  static absl::StatusOr<std::shared_ptr<InProcessGroup>> Create(
      int size, std::chrono::milliseconds timeout = std::chrono::seconds(60));

  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  int size() const;
  std::chrono::milliseconds timeout() const;

  // The communicator of `rank` (in [0, size())). A rank is held by at most one communicator at a
  // time (FailedPrecondition otherwise); destroying it releases the rank. Communicators keep the
  // shared state alive, so the group object may be destroyed first.
  absl::StatusOr<std::unique_ptr<Communicator>> Rank(int rank);

  // Poisons the group: ranks waiting for a collective wake with Aborted, later calls fail with
  // Aborted. A collective every rank has already entered still completes (its buffers are being
  // written by other ranks). Thread-safe; the first poisoning reason wins.
  void Abort(std::string_view reason);

  // OK, or the status that poisoned the group.
  absl::Status status() const;

 private:
  explicit InProcessGroup(std::shared_ptr<internal::InProcessGroupState> state);

  std::shared_ptr<internal::InProcessGroupState> state_;
};

}  // namespace eagle3
