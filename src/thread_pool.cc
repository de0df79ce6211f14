#include "thread_pool.h"

#include <algorithm>
#include <atomic>
#include <system_error>

namespace eagle3 {

// One ParallelFor call, on its caller's stack: the caller withdraws the queue entries no helper
// took and waits until no helper runs it before returning, so no helper sees it after that.
struct ThreadPool::Job {
  Job(int64_t pieces, absl::FunctionRef<void(int64_t, int)> fn) : n(pieces), body(fn) {}

  // Runs unclaimed pieces until none is left.
  void Run(int slot) {
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      body(i, slot);
    }
  }

  const int64_t n;
  const absl::FunctionRef<void(int64_t, int)> body;
  std::atomic<int64_t> next{0};
  // Guarded by the pool's mutex_.
  int slots = 1;    // slots handed out; the caller has slot 0
  int queued = 0;   // entries of queue_ naming this job
  int running = 0;  // helpers working on it
  std::condition_variable idle;  // running dropped to 0
};

ThreadPool::ThreadPool(int threads) : threads_(std::max(threads, 1)) {}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& helper : helpers_) helper.join();
}

void ThreadPool::StartHelpersLocked() {
  if (started_) return;
  started_ = true;
  helpers_.reserve(static_cast<size_t>(threads_ - 1));
  for (int i = 1; i < threads_; ++i) {
    try {
      helpers_.emplace_back([this] { HelperLoop(); });
    } catch (const std::system_error&) {
      break;  // out of threads: the jobs run on the helpers that did start, or on their callers
    }
  }
}

void ThreadPool::HelperLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    Job* job = queue_.front();
    queue_.pop_front();
    --job->queued;
    ++job->running;
    const int slot = job->slots++;
    lock.unlock();
    job->Run(slot);
    lock.lock();
    // Still under the lock, so the caller cannot return (and free the job) before this is done.
    if (--job->running == 0) job->idle.notify_one();
  }
}

void ThreadPool::ParallelFor(int64_t n, absl::FunctionRef<void(int64_t index, int slot)> body) {
  if (n <= 0) return;
  Job job(n, body);
  int helpers = 0;
  if (threads_ > 1 && n > 1) {
    std::lock_guard<std::mutex> lock(mutex_);
    StartHelpersLocked();
    helpers = static_cast<int>(std::min<int64_t>(static_cast<int64_t>(helpers_.size()), n - 1));
    for (int i = 0; i < helpers; ++i) queue_.push_back(&job);
    job.queued = helpers;
  }
  if (helpers > 0) wake_.notify_all();
  job.Run(0);
  if (helpers == 0) return;
  std::unique_lock<std::mutex> lock(mutex_);
  if (job.queued > 0) {
    std::erase(queue_, &job);
    job.queued = 0;
  }
  job.idle.wait(lock, [&job] { return job.running == 0; });
}

}  // namespace eagle3
