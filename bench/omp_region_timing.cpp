// LD_PRELOAD library: times every OpenMP parallel region a program opens with more than
// one thread (libgomp's GOMP_parallel), per call site. For each call it notes when each
// of the first two threads starts and ends its share and when the call returns, and on
// exit writes the records to $OMP_REGION_TIMING_OUT (default omp_region_timing.bin) for
// bench/omp_region_timing.py. What bench/RESULTS.md's session-11 figures (worker start
// delays, end gaps, time to leave a region) come from:
//   LD_PRELOAD=build/bench/libomp_region_timing.so build/apps/athanor/athanor bench CONFIG
//   python3 bench/omp_region_timing.py omp_region_timing.bin
#include <dlfcn.h>
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

using GompParallel = void (*)(void (*)(void*), void*, unsigned, unsigned);

namespace {

enum { kMaxSites = 64, kMaxCalls = 4096 };
// Per call: main start, worker start, worker end - main end, last end -> return, whole call (us).
float records[kMaxSites][kMaxCalls][5];
void* sites[kMaxSites];
long calls[kMaxSites];
int num_sites;

double now_us() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

struct Wrapped {
  void (*fn)(void*);
  void* data;
  double start[2], end[2];
};
void trampoline(void* p) {
  auto* w = static_cast<Wrapped*>(p);
  const int t = omp_get_thread_num();
  if (t < 2) w->start[t] = now_us();
  w->fn(w->data);
  if (t < 2) w->end[t] = now_us();
}

}  // namespace

extern "C" void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags) {
  static GompParallel real;
  if (!real) real = reinterpret_cast<GompParallel>(dlsym(RTLD_NEXT, "GOMP_parallel"));
  if (num_threads == 1 || omp_in_parallel()) {  // serialized (an `if` clause) or nested
    real(fn, data, num_threads, flags);
    return;
  }
  void* site = __builtin_return_address(0);
  int i = 0;
  while (i < num_sites && sites[i] != site) ++i;
  if (i == num_sites && num_sites < kMaxSites) sites[num_sites++] = site;
  Wrapped w{fn, data, {0, 0}, {0, 0}};
  const double t0 = now_us();
  real(trampoline, &w, num_threads, flags);
  const double t1 = now_us();
  if (i < kMaxSites && w.start[1] > 0) {  // the worker took part
    if (calls[i] < kMaxCalls) {
      float* r = records[i][calls[i]];
      const double last = w.end[0] > w.end[1] ? w.end[0] : w.end[1];
      r[0] = w.start[0] - t0, r[1] = w.start[1] - t0, r[2] = w.end[1] - w.end[0], r[3] = t1 - last, r[4] = t1 - t0;
    }
    ++calls[i];
  }
}

// Binary file: per site, its offset in its object, the object's path length and path,
// the number of calls, the number of records kept (at most kMaxCalls), the records (5 floats).
__attribute__((destructor)) static void write_records() {
  const char* path = std::getenv("OMP_REGION_TIMING_OUT");
  std::FILE* out = std::fopen(path ? path : "omp_region_timing.bin", "wb");
  if (!out) return;
  for (int i = 0; i < num_sites; ++i) {
    Dl_info info{};
    dladdr(sites[i], &info);
    const long offset = static_cast<char*>(sites[i]) - static_cast<char*>(info.dli_fbase);
    const long n = calls[i] < kMaxCalls ? calls[i] : kMaxCalls;
    const char* object = info.dli_fname ? info.dli_fname : "?";
    const long object_len = static_cast<long>(std::strlen(object));
    fwrite(&offset, sizeof offset, 1, out);
    fwrite(&object_len, sizeof object_len, 1, out);
    fwrite(object, 1, static_cast<std::size_t>(object_len), out);
    fwrite(&calls[i], sizeof calls[i], 1, out);
    fwrite(&n, sizeof n, 1, out);
    fwrite(records[i], sizeof(float) * 5, static_cast<std::size_t>(n), out);
  }
  std::fclose(out);
}
