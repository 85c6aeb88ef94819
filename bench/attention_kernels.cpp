// The flash-attention kernels at the GPT shapes: cpu::attention_forward and attention_backward
// (causal, q, k, v read from one packed [B, T, 3 H D] projection, as the GPT block calls them),
// f32 and bf16, at the tiny / small / gpt2-124M shapes. Prints ms per call and GFLOP/s
// (median, min, max of the repetitions), counting the causal FLOPs: forward 4 B H T^2 D / 2
// (S = Q K^T and O = P V on the lower triangle), backward twice that (S recomputed, dV, dP, dQ,
// dK: 5 products, FlashAttention's convention counts 2.5x the forward; we count 2x as the
// issue does), plus "slice": one (b, h) slice that stays in cache (the speed without memory
// stalls). The forward and backward alternate within each repetition, so a shared machine's
// load hits both alike; for an old-vs-new A/B run two builds of this program interleaved.
// Process CPU time is printed too (the work all threads did, spinning included): with
// OMP_NUM_THREADS=1 on a loaded machine it is the steadiest figure.
//   ./bench_attention_kernels [reps=30] [filter] [query_tile key_tile]
//   (filter: substring of "tiny f32", "gpt2 bf16", ...; tiles: cpu::AttentionTiles, default the kernels')
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "athanor/core/half.h"
#include "backend/cpu/attention.h"
#include "bench_timing.h"

using namespace athanor;
using bench::clock_s;

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

template <class T> void run(const BenchShape& sh, const char* dtype, int reps, cpu::AttentionTiles tiles) {
  const int64_t B = sh.B, H = sh.H, T_ = sh.T, D = sh.D, dm = H * D;
  const cpu::AttentionDims d{B, H, T_, T_, D, D};
  const cpu::AttentionLayout L = cpu::AttentionLayout::packed_qkv(d);
  std::vector<T> qkv(B * T_ * 3 * dm), o(B * T_ * dm), dout(B * T_ * dm), dqkv(B * T_ * 3 * dm);
  std::vector<cpu::attn_acc_t<T>> lse(B * H * T_);
  fill(qkv, 1), fill(dout, 2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const T* q = qkv.data();
  T* g = dqkv.data();
  auto fwd = [&] { cpu::attention_forward<T>(q, q + dm, q + 2 * dm, o.data(), lse.data(), d, L, true, scale, tiles); };
  auto bwd = [&] {
    cpu::attention_backward<T>(q, q + dm, q + 2 * dm, o.data(), dout.data(), lse.data(), g, g + dm, g + 2 * dm, d, L,
                               true, scale, tiles);
  };
  for (int i = 0; i < 3; ++i) fwd(), bwd();  // warm-up: workspace, caches, thread pool
  std::vector<double> fw, bw, fc, bc;
  for (int i = 0; i < reps; ++i) {
    double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    fwd();
    double w1 = clock_s(CLOCK_MONOTONIC), c1 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    bwd();
    double w2 = clock_s(CLOCK_MONOTONIC), c2 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    fw.push_back(w1 - w0), bw.push_back(w2 - w1), fc.push_back(c1 - c0), bc.push_back(c2 - c1);
  }
  const double flops_f = 4.0 * B * H * T_ * T_ * D / 2, flops_b = 2 * flops_f;
  auto line = [&](const char* pass, const std::vector<double>& w, const std::vector<double>& c, double flops) {
    const bench::Spread s = bench::spread(w), cs = bench::spread(c);
    std::printf("%-6s %-5s %-4s %8.3f ms (min %7.3f max %7.3f)  %6.1f GFLOP/s (best %6.1f)  cpu %8.3f ms\n", sh.name,
                dtype, pass, 1e3 * s.median, 1e3 * s.min, 1e3 * s.max, flops / s.median * 1e-9, flops / s.min * 1e-9,
                1e3 * cs.median);
  };
  line("fwd", fw, fc, flops_f);
  line("bwd", bw, bc, flops_b);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 30;
  const std::string filter = argc > 2 ? argv[2] : "";
  cpu::AttentionTiles tiles;  // the kernels' defaults unless given
  if (argc > 4) tiles = {std::atoi(argv[3]), std::atoi(argv[4])};
  std::printf("threads: %d, GOMP_SPINCOUNT=%s, %d repetitions, tiles %lld x %lld, causal, packed qkv; median (min, max)\n",
              omp_get_max_threads(), std::getenv("GOMP_SPINCOUNT") ? std::getenv("GOMP_SPINCOUNT") : "(default)",
              reps, static_cast<long long>(tiles.q), static_cast<long long>(tiles.k));
  // "slice": one (b, h) slice of the GPT shapes (one thread: it is one task), in cache.
  const BenchShape shapes[] = {
      {"tiny", 8, 4, 256, 64}, {"small", 8, 6, 256, 64}, {"gpt2", 4, 12, 256, 64}, {"slice", 1, 1, 256, 64}};
  for (const BenchShape& s : shapes) {
    auto want = [&](const char* dt) { return filter.empty() || (std::string(s.name) + " " + dt).find(filter) != std::string::npos; };
    if (want("f32")) run<float>(s, "f32", reps, tiles);
    if (want("bf16")) run<bfloat16>(s, "bf16", reps, tiles);
  }
}
