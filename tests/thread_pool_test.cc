#include "thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace eagle3 {
namespace {

// Threads of this process now.
int ThreadCount() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// Every index runs once; each thread of a call keeps one slot, below threads(), that no other
// thread of the call has; the caller works on its own job.
TEST(ThreadPoolTest, RunsEveryIndexOnceWithOneSlotPerThread) {
  for (int threads : {2, 3, 8}) {
    SCOPED_TRACE(threads);
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int64_t n : {1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
      std::mutex mutex;
      std::map<std::thread::id, int> slot_of;
      bool consistent = true;
      pool.ParallelFor(n, [&](int64_t i, int slot) {
        runs[static_cast<size_t>(i)].fetch_add(1);
        std::lock_guard<std::mutex> lock(mutex);
        const auto [it, inserted] = slot_of.emplace(std::this_thread::get_id(), slot);
        if (!inserted && it->second != slot) consistent = false;
        if (slot < 0 || slot >= threads) consistent = false;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(runs[static_cast<size_t>(i)].load(), 1) << i;
      EXPECT_TRUE(consistent);
      std::vector<int> slots;
      for (const auto& [id, slot] : slot_of) slots.push_back(slot);
      std::sort(slots.begin(), slots.end());
      EXPECT_EQ(std::unique(slots.begin(), slots.end()), slots.end()) << "two threads shared a slot";
      EXPECT_LE(static_cast<int64_t>(slot_of.size()), std::min<int64_t>(n, threads));
      if (n == 1) {
        ASSERT_EQ(slot_of.size(), 1u);
        EXPECT_EQ(slot_of.begin()->first, std::this_thread::get_id());  // one piece: the caller's
      }
    }
    pool.ParallelFor(0, [](int64_t, int) { ADD_FAILURE() << "no piece to run"; });
    pool.ParallelFor(-3, [](int64_t, int) { ADD_FAILURE() << "no piece to run"; });
  }
}

// One thread (or fewer asked for): every piece on the caller, in order, and no thread started.
TEST(ThreadPoolTest, OneThreadRunsOnTheCallerAlone) {
  const int before = ThreadCount();
  for (int threads : {1, 0, -2}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), 1);
    const std::thread::id caller = std::this_thread::get_id();
    std::vector<int64_t> order;
    pool.ParallelFor(50, [&](int64_t i, int slot) {
      EXPECT_EQ(slot, 0);
      EXPECT_EQ(std::this_thread::get_id(), caller);
      order.push_back(i);
    });
    ASSERT_EQ(order.size(), 50u);
    for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
    EXPECT_EQ(ThreadCount(), before);
  }
}

// The process's thread count once it has come down to `want`, or after 5 s what it is then: a
// joined thread's task can stay listed in /proc/self/task for a moment after its join returns
// (the kernel wakes the joiner as the thread exits, before it has removed the task).
int ThreadCountOnceAt(int want) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int n = ThreadCount();
  while (n != want && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    n = ThreadCount();
  }
  return n;
}

// Helpers start on the first job of more than one piece and are joined by the destructor.
TEST(ThreadPoolTest, HelpersStartOnFirstUseAndAreJoined) {
  const int before = ThreadCount();
  {
    ThreadPool pool(4);
    EXPECT_EQ(ThreadCount(), before);
    pool.ParallelFor(1, [](int64_t, int) {});
    EXPECT_EQ(ThreadCount(), before);  // one piece needs no helper
    std::atomic<int64_t> sum{0};
    pool.ParallelFor(100, [&](int64_t i, int) { sum += i; });
    EXPECT_EQ(sum.load(), 4950);
    EXPECT_EQ(ThreadCount(), before + 3);
  }
  EXPECT_EQ(ThreadCountOnceAt(before), before);
}

// Several threads running jobs on one pool at once each get all of their own pieces, even when
// the helpers are busy with another caller's job.
TEST(ThreadPoolTest, ConcurrentCallersEachFinishTheirOwnJob) {
  ThreadPool pool(3);
  constexpr int kCallers = 4, kRounds = 200;
  std::vector<int64_t> sums(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&pool, &sums, c] {
      for (int round = 0; round < kRounds; ++round) {
        std::vector<int64_t> parts(64, 0);
        pool.ParallelFor(64, [&](int64_t i, int) { parts[static_cast<size_t>(i)] = i + c; });
        for (int64_t v : parts) sums[static_cast<size_t>(c)] += v;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(sums[static_cast<size_t>(c)], kRounds * (2016 + 64 * c)) << c;
}

}  // namespace
}  // namespace eagle3
