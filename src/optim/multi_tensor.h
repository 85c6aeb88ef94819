#pragma once
// The driver of the multi-tensor passes (optimizer updates, gradient norm, clipping):
// ONE OpenMP region for all tensors, so the many small tensors of a model (biases,
// norm weights) cost neither a parallel region each nor an idle second thread.
//
// Every tensor is cut into fixed chunks of `chunk` elements; the boundaries do not
// depend on the thread count, so a per-chunk result (the norm's partial sums) is the
// same on any number of threads. Thread t of T takes the t-th contiguous run of each
// tensor's chunks: the same rows of every weight matrix on every step, as the GEMMs
// split W between threads (each thread packs or writes its own block of rows). The
// lines a thread updates are then more often in its own core's cache already. Dealt
// as one static run of all tensors' chunks instead (thread 0 took the first half of
// the model, thread 1 the rest), the MLP's optimizer phase (gradient norm + SGD) took
// 0.67-0.69 ms per step against 0.48-0.52 ms this way (profiler spans, interleaved runs).
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <vector>

#include "backend/cpu/stealing_runs.h"

namespace athanor::optim::detail {

// Runs body(k, begin, end, index) for every chunk [begin, end) of every tensor k
// (sizes[k] elements); `index` numbers the chunks tensor by tensor, in order, from 0
// (num_chunks(sizes, chunk) in all). Parallel when `parallel`. A thread done with its
// runs takes chunks from the end of another's (backend/cpu/stealing_runs.h): the worker
// thread starts 15+ us late and the cores run at different speeds; the MLP's SGD region
// had the main thread waiting ~100 us for the worker at its end (median, session 11).
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
  cpu::StealingRuns runs(bounds);
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

}  // namespace athanor::optim::detail
