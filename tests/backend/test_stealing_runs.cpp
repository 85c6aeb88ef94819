// StealingRuns (backend/cpu/stealing_runs.h) and the multi-tensor chunk driver built on it
// (cpu::for_each_chunk, same header): every item runs exactly once whatever the thread count, a thread
// held up in its first item has the rest of its run taken by the others, and wait_all()
// returns on every thread only when all items are done.
#include <omp.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <tuple>
#include <vector>

#include "backend/cpu/stealing_runs.h"
#include "test_util.h"

namespace athanor {
using testing::ThreadCount;

namespace {
// Runs n items over `threads` runs (explicit bounds when given); returns who ran each item
// and how many times. Thread 0 sleeps in its first item when `hold_first` is set.
struct Outcome {
  std::vector<int> times, runner;
  std::vector<int64_t> done_seen;  // items done when each thread returned from wait_all()
};
Outcome run_items(int64_t n, int threads, bool hold_first, const std::vector<int64_t>& bounds = {}) {
  ThreadCount tc(threads);
  std::vector<std::atomic<int>> times(static_cast<std::size_t>(n)), runner(static_cast<std::size_t>(n));
  for (auto& r : runner) r = -1;
  std::atomic<int64_t> done{0};
  std::vector<int64_t> done_seen(static_cast<std::size_t>(threads), -1);
  cpu::StealingRuns runs = bounds.empty() ? cpu::StealingRuns(n, threads) : cpu::StealingRuns(bounds);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    bool first = true;
    runs.run(t, [&](int64_t i) {
      // Held up: thread 0's first item waits (up to 10 s) until 95 items are done, which
      // only happens if the other thread takes most of thread 0's run.
      if (hold_first && t == 0 && first) {
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (done.load() < n - 5 && std::chrono::steady_clock::now() < give_up)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      first = false;
      times[i].fetch_add(1);
      runner[i] = t;
      done.fetch_add(1);
    });
    runs.wait_all();
    done_seen[t] = done.load();
  }
  Outcome o;
  for (int64_t i = 0; i < n; ++i) o.times.push_back(times[i]), o.runner.push_back(runner[i]);
  o.done_seen = done_seen;
  return o;
}
}  // namespace

TEST(StealingRuns, EveryItemRunsOnceForAnyThreadCount) {
  for (const int threads : {1, 2, 3, 4})
    for (const int64_t n : {0, 1, 2, 5, 64, 1001}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + ", items " + std::to_string(n));
      const Outcome o = run_items(n, threads, false);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(o.times[i], 1) << "item " << i;
      for (int t = 0; t < threads; ++t) EXPECT_EQ(o.done_seen[t], n) << "thread " << t << " left before the end";
    }
}

TEST(StealingRuns, AHeldUpThreadsRunIsTakenByTheOthers) {
  // Thread 0 is held in its first item until 95 of the 100 items are done: thread 1 must
  // run its own 50 and take at least 45 of thread 0's (all 50 when thread 0 starts late).
  const Outcome o = run_items(100, 2, true);
  int taken = 0;
  for (int64_t i = 0; i < 100; ++i) {
    ASSERT_EQ(o.times[i], 1) << "item " << i;
    if (i < 50 && o.runner[i] == 1) ++taken;
  }
  EXPECT_GE(taken, 45) << "thread 1 took only " << taken << " of the held-up thread's items";
  EXPECT_EQ(o.done_seen[0], 100);
  EXPECT_EQ(o.done_seen[1], 100);
}

TEST(StealingRuns, UnevenAndEmptyRunsFromBounds) {
  // Runs [0, 0), [0, 7), [7, 7), [7, 30): empty ones steal, the others own theirs.
  const Outcome o = run_items(30, 4, false, {0, 0, 7, 7, 30});
  for (int64_t i = 0; i < 30; ++i) ASSERT_EQ(o.times[i], 1) << "item " << i;
  // A team smaller than the runs: the present threads take the missing ones' items.
  const Outcome few = run_items(30, 2, false, {0, 10, 20, 30});
  for (int64_t i = 0; i < 30; ++i) ASSERT_EQ(few.times[i], 1) << "item " << i;
}

TEST(StealingRuns, ParallelForCoversTheRangeSerialAndParallel) {
  for (const bool parallel : {false, true}) {
    ThreadCount tc(2);
    std::vector<std::atomic<int>> times(777);
    cpu::parallel_for_stealing(777, parallel, [&](int64_t i) { times[i].fetch_add(1); });
    for (int i = 0; i < 777; ++i) ASSERT_EQ(times[i].load(), 1) << "item " << i << (parallel ? " (parallel)" : "");
  }
}

TEST(MultiTensorChunks, EveryChunkOnceWithItsTensorRangeAndIndex) {
  // Sizes straddling the chunk, single elements, an empty tensor; with the owner of the
  // first run held up in its first chunk, so that chunks move between threads.
  const std::vector<int64_t> sizes = {20000, 1, 0, 8192, 8193, 37, 50000};
  const int64_t chunk = 8192;
  // The sequential enumeration: (tensor, begin, end) for each index.
  std::vector<std::tuple<int, int64_t, int64_t>> expect;
  for (int k = 0; k < static_cast<int>(sizes.size()); ++k)
    for (int64_t b = 0; b < sizes[k]; b += chunk) expect.emplace_back(k, b, std::min(sizes[k], b + chunk));
  ASSERT_EQ(static_cast<int64_t>(expect.size()), cpu::num_chunks(sizes, chunk));
  for (const int threads : {1, 2, 3})
    for (const bool hold : {false, true}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + (hold ? ", thread 0 held up" : ""));
      ThreadCount tc(threads);
      std::vector<std::atomic<int>> seen(expect.size());
      std::vector<std::tuple<int, int64_t, int64_t>> got(expect.size());
      std::atomic<bool> held{false};
      cpu::for_each_chunk(sizes, chunk, true, [&](int k, int64_t begin, int64_t end, int64_t index) {
        if (hold && omp_get_thread_num() == 0 && !held.exchange(true)) std::this_thread::sleep_for(std::chrono::milliseconds(30));
        ASSERT_GE(index, 0);
        ASSERT_LT(index, static_cast<int64_t>(expect.size()));
        seen[index].fetch_add(1);
        got[index] = {k, begin, end};
      });
      for (std::size_t i = 0; i < expect.size(); ++i) {
        ASSERT_EQ(seen[i].load(), 1) << "chunk " << i;
        EXPECT_EQ(got[i], expect[i]) << "chunk " << i;
      }
    }
}

}  // namespace athanor
