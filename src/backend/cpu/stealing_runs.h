#pragma once
// A static split of items [0, n) between the threads of a parallel region, with the
// tails up for grabs: thread t owns the t-th contiguous run and takes its items front to
// back; once its run is empty it takes items from the backs of the other runs. Every item
// runs exactly once. Nothing may depend on which thread runs an item (per-item partial
// sums stay deterministic; per-thread ones would not).
//
// Why: on a paravirtualized machine a passive OpenMP worker starts late after the region
// opens (its vCPU is halted and the host wakes it), and the cores run the same share at
// different speeds. With a plain static split the main thread waited at the end of the
// MLP's GEMM and SGD regions for the late worker (an LD_PRELOAD timing of GOMP_parallel,
// bench/RESULTS.md, session 11). Most items stay with their owner, so what the static
// split buys (each core writing the same rows every step) is kept.
#include <emmintrin.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <cstdint>
#include <vector>

namespace athanor::cpu {

// Spins (_mm_pause) until `count` reaches `target` or `max_spins` pauses have passed;
// returns whether it got there (a pause is tens of cycles on current cores).
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
  // a thread that gets there first sleeps in the kernel, and the main thread then leaves the
  // region long after the last item (a wake-up; session 11). Past the spin it goes
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

// The driver of passes over many arrays at once (the optimizer's multi-tensor updates,
// the gradient norm and clipping, the packed-weight refresh): ONE parallel region for all
// of them, so the many small tensors of a model (biases, norm weights) cost neither a
// region each nor an idle second thread.
//
// Every array is cut into fixed chunks of `chunk` elements; the boundaries do not depend
// on the thread count, so a per-chunk result (the norm's partial sums) is the same on any
// number of threads. Thread t of T takes the t-th contiguous run of each array's chunks:
// the same rows of every weight matrix on every step, as the GEMMs split W between
// threads (each thread packs or writes its own block of rows). The lines a thread updates
// are then more often in its own core's cache already. Dealt as one static run of all
// tensors' chunks instead (thread 0 took the first half of the model, thread 1 the rest),
// the MLP's optimizer phase (gradient norm + SGD) ran markedly slower (bench/RESULTS.md:
// profiler spans, interleaved runs).
//
// Runs body(k, begin, end, index) for every chunk [begin, end) of every array k
// (sizes[k] elements); `index` numbers the chunks array by array, in order, from 0
// (num_chunks(sizes, chunk) in all). Parallel when `parallel`. A thread done with its
// runs takes chunks from the end of another's (StealingRuns): the worker thread starts
// late and the cores run at different speeds, which left the main thread waiting for the
// worker at the end of the MLP's SGD region (session 11).
template <class Body>
void for_each_chunk(const std::vector<int64_t>& sizes, int64_t chunk, bool parallel, const Body& body) {
  const int threads = parallel ? omp_get_max_threads() : 1;
  if (threads == 1) {
    int64_t first_index = 0;
    for (int k = 0; k < static_cast<int>(sizes.size()); ++k) {
      const int64_t n = sizes[k], chunks = (n + chunk - 1) / chunk;
      for (int64_t c = 0; c < chunks; ++c) body(k, c * chunk, std::min(n, (c + 1) * chunk), first_index + c);
      first_index += chunks;
    }
    return;
  }
  // Item numbering: thread 0's run (its chunks of tensor 0, of tensor 1, ...), then thread 1's.
  struct Segment {
    int64_t first_item;  // the segment's first item
    int k;               // its tensor
    int64_t c0, index0;  // its first chunk within the tensor, and that chunk's index
  };
  std::vector<Segment> segments;
  std::vector<int64_t> bounds{0};
  int64_t item = 0;
  for (int t = 0; t < threads; ++t) {
    int64_t first_index = 0;
    for (int k = 0; k < static_cast<int>(sizes.size()); ++k) {
      const int64_t chunks = (sizes[k] + chunk - 1) / chunk, c0 = chunks * t / threads, c1 = chunks * (t + 1) / threads;
      if (c1 > c0) segments.push_back({item, k, c0, first_index + c0}), item += c1 - c0;
      first_index += chunks;
    }
    bounds.push_back(item);
  }
  StealingRuns runs(bounds);
#pragma omp parallel num_threads(threads)
  runs.run(omp_get_thread_num(), [&](int64_t i) {
    const auto s = std::prev(std::upper_bound(segments.begin(), segments.end(), i,
                                              [](int64_t v, const Segment& g) { return v < g.first_item; }));
    const int64_t c = s->c0 + (i - s->first_item), n = sizes[s->k];
    body(s->k, c * chunk, std::min(n, (c + 1) * chunk), s->index0 + (i - s->first_item));
  });
}

inline int64_t num_chunks(const std::vector<int64_t>& sizes, int64_t chunk) {
  int64_t n = 0;
  for (const int64_t s : sizes) n += (s + chunk - 1) / chunk;
  return n;
}

}  // namespace athanor::cpu
