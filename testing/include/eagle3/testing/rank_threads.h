// Runs N tensor-parallel ranks as threads of this process, each with its own Communicator of one
// InProcessGroup: how the tools, the tests and single-process CPU deployments drive TP > 1. Engines
// with their own processes and an NcclCommunicator do not need it.
#pragma once

#include <chrono>
#include <functional>

#include "absl/status/status.h"
#include "eagle3/communicator.h"

namespace eagle3 {

// Calls fn(rank, communicator) for every rank in [0, tp_size) on its own thread and waits for all.
// The communicator is null when tp_size == 1 (run on the calling thread). When a rank fails, the
// group is aborted so that the others return instead of waiting for it; the first failure (by rank)
// is returned.
absl::Status RunRankThreads(int tp_size, const std::function<absl::Status(int rank, Communicator* comm)>& fn,
                            std::chrono::milliseconds timeout = std::chrono::seconds(600));

}  // namespace eagle3
