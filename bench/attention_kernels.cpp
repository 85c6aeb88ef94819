// The flash-attention kernels at the GPT shapes: cpu::attention_forward and attention_backward
// (causal, q, k, v read from one packed [B, T, 3 H D] projection, as the GPT block calls them),
// f32 and bf16, at the tiny / small / gpt2-124M shapes, timed by Google Benchmark. The
// "GFLOP" counter (a rate: GFLOP/s) counts the causal FLOPs: forward 4 B H T^2 D / 2
// (S = Q K^T and O = P V on the lower triangle), backward twice that (S recomputed, dV, dP,
// dQ, dK: 5 products, FlashAttention's convention counts 2.5x the forward; we count 2x as
// the issue does). Shapes: tiny, small, gpt2, and "slice": one (b, h) slice that stays in
// cache (the speed without memory stalls). Times are
// wall time; the CPU time column is the whole process's (all threads, spinning included):
// with OMP_NUM_THREADS=1 on a loaded machine it is the steadiest figure. For an old-vs-new
// A/B run two builds of this program interleaved.
//   ./bench_attention_kernels [--benchmark_filter=gpt2/bf16] [--benchmark_repetitions=30] [query_tile key_tile]
//   (tiles: cpu::AttentionTiles, default the kernels')
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "athanor/core/half.h"
#include "backend/cpu/attention.h"

using namespace athanor;

namespace {


struct BenchShape {
  const char* name;
  int64_t B, H, T, D;
};

// Deterministic N(0,1)-ish inputs (sum of uniforms): the kernels' speed does not depend on
// the values, but realistic magnitudes keep the softmax away from all-zero rows.
template <class T> void fill(std::vector<T>& x, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& e : x) {
    float acc = 0;
    for (int i = 0; i < 4; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      acc += static_cast<float>((s >> 40) & 0xFFFFFF) / 16777216.0f;
    }
    e = static_cast<T>((acc - 2.0f) * 1.7f);
  }
}

cpu::AttentionTiles g_tiles;  // the kernels' defaults unless given on the command line

// One pass (forward or backward) of one shape and dtype; the backward reads the forward's
// output and statistics, computed once before the timing.
template <class T> void attention(benchmark::State& state, BenchShape sh, bool backward) {
  const int64_t B = sh.B, H = sh.H, T_ = sh.T, D = sh.D, dm = H * D;
  const cpu::AttentionDims d{B, H, T_, T_, D, D};
  const cpu::AttentionLayout L = cpu::AttentionLayout::packed_qkv(d);
  std::vector<T> qkv(B * T_ * 3 * dm), o(B * T_ * dm), dout(B * T_ * dm), dqkv(B * T_ * 3 * dm);
  std::vector<cpu::attn_acc_t<T>> lse(B * H * T_);
  fill(qkv, 1), fill(dout, 2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const T* q = qkv.data();
  T* g = dqkv.data();
  const cpu::AttentionTiles tiles = g_tiles;
  auto fwd = [&] { cpu::attention_forward<T>(q, q + dm, q + 2 * dm, o.data(), lse.data(), d, L, true, scale, tiles); };
  auto bwd = [&] {
    cpu::attention_backward<T>(q, q + dm, q + 2 * dm, o.data(), dout.data(), lse.data(), g, g + dm, g + 2 * dm, d, L,
                               true, scale, tiles);
  };
  for (int i = 0; i < 3; ++i) fwd(), bwd();  // warm-up: workspace, caches, thread pool
  for (auto _ : state) {
    if (backward) bwd();
    else fwd();
    benchmark::ClobberMemory();
  }
  const double flops_f = 4.0 * B * H * T_ * T_ * D / 2;
  state.counters["GFLOP"] =
      benchmark::Counter((backward ? 2 : 1) * flops_f * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (argc == 3) g_tiles = {std::atoi(argv[1]), std::atoi(argv[2])};
  else if (argc != 1) {
    std::fprintf(stderr, "usage: %s [benchmark flags] [query_tile key_tile]\n", argv[0]);
    return 1;
  }
  benchmark::AddCustomContext("threads", std::to_string(omp_get_max_threads()));
  benchmark::AddCustomContext("GOMP_SPINCOUNT", std::getenv("GOMP_SPINCOUNT") ? std::getenv("GOMP_SPINCOUNT") : "(default)");
  benchmark::AddCustomContext("tiles", std::to_string(g_tiles.q) + " x " + std::to_string(g_tiles.k));
  // "slice": one (b, h) slice of the GPT shapes (one thread: it is one task), in cache.
  const BenchShape shapes[] = {
      {"tiny", 8, 4, 256, 64}, {"small", 8, 6, 256, 64}, {"gpt2", 4, 12, 256, 64}, {"slice", 1, 1, 256, 64}};
  for (const BenchShape& s : shapes)
    for (const char* pass : {"fwd", "bwd"}) {
      const bool backward = pass[0] == 'b';
      const std::string base = std::string(s.name) + "/";
      benchmark::RegisterBenchmark((base + "f32/" + pass).c_str(), [s, backward](benchmark::State& st) { attention<float>(st, s, backward); })
          ->UseRealTime()->MeasureProcessCPUTime()->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark((base + "bf16/" + pass).c_str(), [s, backward](benchmark::State& st) { attention<bfloat16>(st, s, backward); })
          ->UseRealTime()->MeasureProcessCPUTime()->Unit(benchmark::kMillisecond);
    }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
