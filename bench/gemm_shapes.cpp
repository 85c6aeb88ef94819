// The GEMM shapes of the benchmark models, A/B: the old f32 path (dnnl_sgemm, with
// linear's bias as a prefill of C and beta = 1) against athanor's dispatch
// (cpu::gemm / cpu::gemm_bias: cached oneDNN matmul primitives, bias in the
// epilogue), and the bf16 primitives. Interleaved repetitions (A, B, A, B, ...) so a
// shared machine's load hits both alike; medians of wall time, and of process CPU
// time per call (work done by all threads, insensitive to time slicing: a variant
// that parallelises by duplicating work shows up there).
//   ./bench_gemm_shapes [reps=15]         (set OMP_NUM_THREADS / OMP_WAIT_POLICY as for training)
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "athanor/core/half.h"
#include "backend/cpu/gemm.h"

using namespace athanor;

namespace {

double clock_s(clockid_t id) {
  timespec t{};
  clock_gettime(id, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

struct Timing {
  std::vector<double> wall, cpu;
  double median(std::vector<double> v) const {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
};

struct GemmShape {
  const char* what;
  int64_t M, N, K;
  bool ta, tb, bias;  // bias: linear's forward (x W^T + b)
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 15;
  std::printf("backend: %s\nthreads: %d, OMP_WAIT_POLICY=%s, %d interleaved repetitions, medians\n",
              cpu::gemm_backend_name().c_str(), omp_get_max_threads(),
              std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "(default)", reps);
  const std::vector<GemmShape> shapes = {
      {"mlp fc1 fwd", 128, 1024, 784, false, true, true},     {"mlp fc2 fwd", 128, 1024, 1024, false, true, true},
      {"mlp fc3 fwd", 128, 10, 1024, false, true, true},      {"mlp fc2 dx", 128, 1024, 1024, false, false, false},
      {"mlp fc2 dW", 1024, 1024, 128, true, false, false},    {"mlp fc1 dW", 1024, 784, 128, true, false, false},
      {"gpt-tiny qkv fwd", 2048, 768, 256, false, true, true}, {"gpt-tiny fc fwd", 2048, 1024, 256, false, true, true},
      {"gpt-tiny proj fwd", 2048, 256, 1024, false, true, true}, {"gpt-tiny qkv dx", 2048, 256, 768, false, false, false},
      {"gpt-tiny qkv dW", 768, 256, 2048, true, false, false}, {"gpt2 qkv fwd", 1024, 2304, 768, false, true, true},
      {"gpt2 fc fwd", 1024, 3072, 768, false, true, true},     {"gpt2 proj fwd", 1024, 768, 3072, false, true, true},
      {"gpt2 qkv dW", 2304, 768, 1024, true, false, false},
      {"gpt-tiny fc2 dx", 2048, 1024, 256, false, false, false}, {"gpt-tiny fc2 dW", 256, 1024, 2048, true, false, false},
      {"gpt-tiny fc dW", 1024, 256, 2048, true, false, false},
  };
  std::printf("%-18s %5s %5s %5s %2s | %-29s | %-29s | %-14s\n", "shape", "M", "N", "K", "op", "f32 sgemm: ms  GF/s  GF/cpu-s",
              "f32 athanor: ms GF/s GF/cpu-s", "bf16: ms  GF/s");
  for (const GemmShape& s : shapes) {
    const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    std::vector<float> a(s.M * s.K), b(s.K * s.N), bias(s.N), c(s.M * s.N);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 40503u) % 1000) / 1000.0f - 0.5f;
    for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.01f * static_cast<float>(i % 7);
    std::vector<bfloat16> ah(a.begin(), a.end()), bh(b.begin(), b.end()), biash(bias.begin(), bias.end()), ch(c.size());
    const std::vector<std::function<void()>> variants = {
        [&] {  // the old path: bias prefill + dnnl_sgemm (beta = 1), or plain sgemm
          if (s.bias)
            for (int64_t r = 0; r < s.M; ++r) std::copy(bias.begin(), bias.end(), c.begin() + r * s.N);
          dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K, 1.0f, a.data(), lda, b.data(), ldb,
                     s.bias ? 1.0f : 0.0f, c.data(), s.N);
        },
        [&] {
          if (s.bias) cpu::gemm_bias<float>(s.ta, s.tb, s.M, s.N, s.K, a.data(), lda, b.data(), ldb, bias.data(), c.data(), s.N);
          else cpu::gemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), s.N);
        },
        [&] {
          if (s.bias)
            cpu::gemm_bias<bfloat16>(s.ta, s.tb, s.M, s.N, s.K, ah.data(), lda, bh.data(), ldb, biash.data(), ch.data(), s.N);
          else cpu::gemm_lowp<bfloat16>(s.ta, s.tb, s.M, s.N, s.K, 1.0f, ah.data(), lda, bh.data(), ldb, 0.0f, ch.data(), s.N);
        },
    };
    std::vector<Timing> t(variants.size());
    for (auto& v : variants) v(), v();  // warm-up: primitives created, buffers touched
    for (int r = 0; r < reps; ++r)
      for (size_t i = 0; i < variants.size(); ++i) {
        const double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
        variants[i]();
        t[i].cpu.push_back(clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0);
        t[i].wall.push_back(clock_s(CLOCK_MONOTONIC) - w0);
      }
    const double gf = 2.0 * s.M * s.N * s.K * 1e-9;
    auto col = [&](const Timing& x) {
      const double w = x.median(x.wall), cp = x.median(x.cpu);
      return std::to_string(w * 1e3).substr(0, 6) + " " + std::to_string(static_cast<int>(gf / w)) + " " +
             std::to_string(static_cast<int>(gf / cp));
    };
    std::printf("%-18s %5lld %5lld %5lld %c%c | %-29s | %-29s | %s\n", s.what, (long long)s.M, (long long)s.N,
                (long long)s.K, s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', col(t[0]).c_str(), col(t[1]).c_str(),
                col(t[2]).c_str());
  }
  return 0;
}
