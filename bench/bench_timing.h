#pragma once
// Timing helpers of the A/B benchmark programs that interleave their variants inside each
// repetition (gemm_shapes, gpt_ops, step_floor), a pattern Google Benchmark's one function
// per benchmark does not express: a clock, and the median / min / max of repeated
// measurements (the figures of record on a shared, noisy machine). Single-kernel
// micro-benchmarks use Google Benchmark instead (bench/CMakeLists.txt).
#include <time.h>

#include <algorithm>
#include <vector>

namespace athanor::bench {

// Seconds on clock id: CLOCK_MONOTONIC for wall time, CLOCK_PROCESS_CPUTIME_ID for the CPU
// time of all the process's threads.
inline double clock_s(clockid_t id = CLOCK_MONOTONIC) {
  timespec t{};
  clock_gettime(id, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

struct Spread {
  double median, min, max;
};
inline Spread spread(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}
inline double median(const std::vector<double>& v) { return spread(v).median; }

}  // namespace athanor::bench
