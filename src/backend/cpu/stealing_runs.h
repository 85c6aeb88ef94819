#pragma once
// A static split of items [0, n) between the threads of a parallel region, with the
// tails up for grabs: thread t owns the t-th contiguous run and takes its items front to
// back; once its run is empty it takes items from the backs of the other runs. Every item
// runs exactly once. Nothing may depend on which thread runs an item (per-item partial
// sums stay deterministic; per-thread ones would not).
//
// Why: on this paravirtualized 2-vCPU machine a passive OpenMP worker starts 15-50 us after
// the region opens (its vCPU is halted and the host wakes it), and the two cores run the
// same share at different speeds. With a plain static split the main thread waited 40-100 us
// at the end of the MLP's GEMM and SGD regions for the late worker (an LD_PRELOAD timing
// of GOMP_parallel, bench/RESULTS.md, session 11). Most items stay with their owner, so
// what the static split buys (each core writing the same rows every step) is kept.
#include <emmintrin.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

namespace athanor::cpu {

// Spins (_mm_pause) until `count` reaches `target` or `max_spins` pauses have passed;
// returns whether it got there. 4,096 pauses take ~75 us here (Zen 5, measured).
inline bool spin_for_count(const std::atomic<int64_t>& count, int64_t target, int max_spins) {
  for (int spins = 0; spins < max_spins; ++spins) {
    if (count.load(std::memory_order_acquire) >= target) return true;
    _mm_pause();
  }
  return count.load(std::memory_order_acquire) >= target;
}

class StealingRuns {
 public:
  // n items among `threads` runs; run t is [n t / threads, n (t + 1) / threads).
  StealingRuns(int64_t n, int threads) : runs_(static_cast<std::size_t>(threads)), items_(n) {
    for (int t = 0; t < threads; ++t)
      runs_[t].ends.store(pack(n * t / threads, n * (t + 1) / threads), std::memory_order_relaxed);
  }
  // Run t is [bounds[t], bounds[t + 1]) (bounds ascending, threads + 1 of them).
  explicit StealingRuns(const std::vector<int64_t>& bounds) : runs_(bounds.size() - 1), items_(bounds.back() - bounds.front()) {
    for (std::size_t t = 0; t + 1 < bounds.size(); ++t)
      runs_[t].ends.store(pack(bounds[t], bounds[t + 1]), std::memory_order_relaxed);
  }
  StealingRuns(const StealingRuns&) = delete;
  StealingRuns& operator=(const StealingRuns&) = delete;

  // Inside the region, on thread t: f(i) for this thread's items, then stolen ones. Then
  // it spins a little (kEndSpins) for the items other threads are still running, so that
  // the threads reach the region's closing barrier together: under the passive wait policy
  // a thread that gets there first sleeps in the kernel, and the main thread left the
  // region 10-25 us after the last item instead of ~3 (session 11). Past the spin it goes
  // on to the barrier, which waits passively (a descheduled thread may take a long time).
  template <class F> void run(int t, const F& f) {
    const int threads = static_cast<int>(runs_.size());
    int64_t mine = 0;
    for (int64_t i; (i = take(t, true)) >= 0; ++mine) f(i);
    for (int k = 1; k < threads; ++k)
      for (int64_t i; (i = take((t + k) % threads, false)) >= 0; ++mine) f(i);
    done_.count.fetch_add(mine, std::memory_order_acq_rel);
    spin_for_count(done_.count, items_, kEndSpins);
  }

  // After run(), on every thread: returns once all items are done (results other threads
  // wrote are visible), spinning and then yielding the core to a thread that may hold one.
  void wait_all() const {
    while (!spin_for_count(done_.count, items_, kEndSpins)) sched_yield();
  }

 private:
  static constexpr int kEndSpins = 4096;
  struct alignas(64) Run {
    // Front in the low 32 bits, back (one past) in the high: items are numbered below 2^32
    // (the most any caller makes is a gpt2-124M's ~15k optimizer chunks).
    std::atomic<uint64_t> ends{0};
  };
  static uint64_t pack(int64_t front, int64_t back) {
    return static_cast<uint64_t>(front) | static_cast<uint64_t>(back) << 32;
  }
  // The front item of run r (its owner) or the back one (a thief); -1 when it is empty.
  int64_t take(int r, bool front) {
    std::atomic<uint64_t>& e = runs_[r].ends;
    uint64_t v = e.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t f = static_cast<int64_t>(v & 0xffffffffu), b = static_cast<int64_t>(v >> 32);
      if (f >= b) return -1;
      const uint64_t next = front ? pack(f + 1, b) : pack(f, b - 1);
      if (e.compare_exchange_weak(v, next, std::memory_order_relaxed)) return front ? f : b - 1;
    }
  }
  struct alignas(64) Count {
    std::atomic<int64_t> count{0};
  };
  std::vector<Run> runs_;
  int64_t items_;
  Count done_;
};

// f(i) for i in [0, n), in parallel (when `parallel` and n > 1) over StealingRuns.
template <class F> void parallel_for_stealing(int64_t n, bool parallel, const F& f) {
  const int threads = parallel ? static_cast<int>(std::min<int64_t>(omp_get_max_threads(), n)) : 1;
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  StealingRuns runs(n, threads);
#pragma omp parallel num_threads(threads)
  runs.run(omp_get_thread_num(), f);
}

}  // namespace athanor::cpu
