// f32 vs bf16 GEMM throughput on this CPU through cpu::gemm: oneDNN's f32 matmul
// primitive against its bf16 matmul (AVX512_BF16, f32 accumulation). The per-shape
// A/B of the f32 paths (sgemm vs primitive) is bench/gemm_shapes.cpp. Median of 7
// timed runs after a warm-up, for 1024^3 and M x N x K = 768 x 3072 x 1024.
//   ./build-amp/bench/bench_gemm_bf16        (set OMP_NUM_THREADS to pin threads)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "athanor/core/half.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/isa.h"

using namespace athanor;

template <class F>
double median_seconds(F&& f, int runs = 7) {
  f();  // warm-up (creates and caches the oneDNN primitive)
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  std::printf("backend: %s\nisa: %s\n", cpu::gemm_backend_name().c_str(), cpu::isa_summary().c_str());
  struct S { int64_t M, N, K; };
  for (S s : {S{1024, 1024, 1024}, S{768, 3072, 1024}}) {
    std::vector<float> a(s.M * s.K), b(s.K * s.N), c(s.M * s.N);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 40503u) % 1000) / 1000.0f - 0.5f;
    std::vector<bfloat16> ah(a.begin(), a.end()), bh(b.begin(), b.end()), ch(c.size());
    const double flop = 2.0 * s.M * s.N * s.K;
    const double tf = median_seconds([&] { cpu::gemm(false, false, s.M, s.N, s.K, 1.0f, a.data(), s.K, b.data(), s.N, 0.0f, c.data(), s.N); });
    const double tb = median_seconds([&] {
      cpu::gemm_lowp<bfloat16>(false, false, s.M, s.N, s.K, 1.0f, ah.data(), s.K, bh.data(), s.N, 0.0f, ch.data(), s.N);
    });
    const double tbt = median_seconds([&] {  // linear's layout: x @ W^T
      cpu::gemm_lowp<bfloat16>(false, true, s.M, s.N, s.K, 1.0f, ah.data(), s.K, bh.data(), s.K, 0.0f, ch.data(), s.N);
    });
    std::printf("M=%lld N=%lld K=%lld  f32 %.1f GFLOP/s  bf16 %.1f GFLOP/s  bf16 (B^T) %.1f GFLOP/s  speedup %.2fx\n",
                (long long)s.M, (long long)s.N, (long long)s.K, flop / tf * 1e-9, flop / tb * 1e-9, flop / tbt * 1e-9, tf / tb);
  }
  return 0;
}
