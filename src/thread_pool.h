// ThreadPool: helper threads that run the pieces of a job together with the thread that asks for it
// (ParallelFor), for host work that splits into independent pieces, such as one large checkpoint
// read cut into byte ranges. Private to src/.
//
// The caller always works on its own job, so a job finishes even when every helper is busy with
// another caller's job (no deadlock, no wait for a free thread), and several threads may run jobs
// on one pool at once.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace eagle3 {

class ThreadPool {
 public:
  // At most `threads` threads run one job: the caller and up to threads - 1 helpers. The helpers
  // start on the first job that can use them (a pool that only ever runs one-piece jobs starts
  // none) and are joined by the destructor. `threads` < 1 counts as 1.
  explicit ThreadPool(int threads);
  // Requires that no ParallelFor is running.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return threads_; }

  // Calls body(i, slot) once for every i in [0, n) and returns when all calls have returned: on the
  // calling thread and on up to min(threads(), n) - 1 helpers, each taking the next unclaimed i, so
  // pieces are not run in order. `slot` in [0, threads()) is the same for every piece one thread
  // runs within this call and differs between threads of the call: an index into per-thread
  // scratch. Writes made by `body` are visible to the caller on return. Thread-safe; `body` must
  // not throw (an exception in a helper ends the process). n <= 0 calls nothing. If no helper
  // thread can be started, the caller runs every piece.
  void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t index, int slot)> body);

 private:
  struct Job;

  // Starts the helpers if they are not running yet. Requires mutex_.
  void StartHelpersLocked();
  void HelperLoop();

  const int threads_;
  std::mutex mutex_;
  std::condition_variable wake_;  // a job was queued, or stop_
  std::deque<Job*> queue_;        // one entry per helper a job asks for
  bool started_ = false;
  bool stop_ = false;
  std::vector<std::thread> helpers_;
};

}  // namespace eagle3
