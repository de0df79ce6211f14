#include "eagle3/testing/rank_threads.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "eagle3/in_process_group.h"
#include "eagle3/status.h"

namespace eagle3 {

absl::Status RunRankThreads(int tp_size, const std::function<absl::Status(int rank, Communicator* comm)>& fn,
                            std::chrono::milliseconds timeout) {
  if (tp_size < 1) return absl::InvalidArgumentError("RunRankThreads: tp_size " + std::to_string(tp_size) + " < 1");
  if (tp_size == 1) return fn(0, nullptr);
  EAGLE3_ASSIGN_OR_RETURN(std::shared_ptr<InProcessGroup> group, InProcessGroup::Create(tp_size, timeout));
  std::vector<absl::Status> statuses(static_cast<size_t>(tp_size));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < tp_size; ++rank) {
    threads.emplace_back([&, rank] {
      absl::Status& status = statuses[static_cast<size_t>(rank)];
      auto comm = group->Rank(rank);
      status = comm.ok() ? fn(rank, comm->get()) : comm.status();
      if (!status.ok()) group->Abort("rank " + std::to_string(rank) + " failed: " + std::string(status.message()));
    });
  }
  for (auto& t : threads) t.join();
  // A rank that failed first is the cause; the others report the abort.
  for (const absl::Status& st : statuses) {
    if (!st.ok() && st.code() != absl::StatusCode::kAborted) return st;
  }
  for (const absl::Status& st : statuses) EAGLE3_RETURN_IF_ERROR(st);
  return absl::OkStatus();
}

}  // namespace eagle3
