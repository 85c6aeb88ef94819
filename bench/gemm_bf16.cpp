// f32 vs bf16 GEMM throughput on this CPU through cpu::gemm: oneDNN's f32 matmul
// primitive against its bf16 matmul (AVX512_BF16 or AMX, f32 accumulation), for 1024^3 and
// M x N x K = 768 x 3072 x 1024, and bf16 also in Linear's layout (x @ W^T). The per-shape
// A/B of the f32 paths (sgemm vs primitive) is bench/gemm_shapes.cpp. Google Benchmark
// times them; the "GFLOP" counter is a rate (GFLOP/s).
//   OMP_NUM_THREADS=2 ./build/bench/bench_gemm_bf16 --benchmark_repetitions=7 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <vector>

#include "athanor/core/half.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/isa.h"

using namespace athanor;

namespace {

enum Kind { kF32 = 0, kBf16 = 1, kBf16Bt = 2 };

// args: M, N, K, kind.
void BM_gemm(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const auto kind = static_cast<Kind>(state.range(3));
  std::vector<float> a(M * K), b(K * N), c(M * N);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 40503u) % 1000) / 1000.0f - 0.5f;
  std::vector<bfloat16> ah(a.begin(), a.end()), bh(b.begin(), b.end()), ch(c.size());
  auto run = [&] {
    switch (kind) {
      case kF32: cpu::gemm(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c.data(), N); break;
      case kBf16: cpu::gemm_lowp<bfloat16>(false, false, M, N, K, 1.0f, ah.data(), K, bh.data(), N, 0.0f, ch.data(), N); break;
      case kBf16Bt: cpu::gemm_lowp<bfloat16>(false, true, M, N, K, 1.0f, ah.data(), K, bh.data(), K, 0.0f, ch.data(), N); break;
    }
  };
  run();  // creates and caches the oneDNN primitive outside the timing
  for (auto _ : state) {
    run();
    benchmark::ClobberMemory();
  }
  state.SetLabel(kind == kF32 ? "f32" : kind == kBf16 ? "bf16" : "bf16 (B^T)");
  state.counters["GFLOP"] =
      benchmark::Counter(2.0 * static_cast<double>(M * N * K) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "kind"});
  for (const auto& s : {std::vector<int64_t>{1024, 1024, 1024}, std::vector<int64_t>{768, 3072, 1024}})
    for (int64_t kind : {kF32, kBf16, kBf16Bt}) b->Args({s[0], s[1], s[2], kind});
}
BENCHMARK(BM_gemm)->Apply(shapes)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("gemm backend", cpu::gemm_backend_name());
  benchmark::AddCustomContext("isa", cpu::isa_summary());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
