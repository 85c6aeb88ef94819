// The ops a Llama block adds to GPT-2's, at a Llama of gpt2-124M's size (n_embd 768, 12 heads of
// 64, 4 kv heads, intermediate 2048; B 4, T 256: 1024 tokens), through the functional API as
// nn::Llama calls them, timed by Google Benchmark:
//   rope/<dt>/fwd          rope on a [B, T, H, D] view of the q projection; "GB/s" counts one
//                          read and one write of x (a memory-bound pass);
//   swiglu/<dt>/...        the fused op against its GEMMs alone (two_linears: add(linear, linear),
//                          2 GEMMs forward, 6 with the backward, plus one add) and against the
//                          unfused linear, linear, silu, mul;
//   sdpa/<dt>/Hkv<n>/...   causal attention on the transposed views, Hkv = 12 (MHA), 4 (GQA),
//                          1 (MQA); the time per query head is the same work in every case.
// fwd runs without grad; fwd+bwd records the graph and runs backward from a gradient of ones.
//   ./bench_llama_ops [--benchmark_filter=swiglu] [--benchmark_repetitions=10]
#include <benchmark/benchmark.h>
#include <omp.h>

#include <string>

#include "athanor/ops.h"
#include "athanor/ops/linear_relu.h"

using namespace athanor;

namespace {
constexpr int64_t kB = 4, kT = 256, kH = 12, kD = 64, kC = kH * kD, kI = 2048;

Tensor input(const Shape& s, DType dt, uint64_t seed) {
  Generator g(seed);
  return randn(s, TensorOptions(dt), g);
}
void run(benchmark::State& state, bool with_backward, const std::vector<Tensor>& leaves,
         const std::function<Tensor(const std::vector<Tensor>&)>& fn) {
  std::vector<Tensor> in;
  for (const Tensor& t : leaves) in.push_back(with_backward ? t.detach().requires_grad_(true) : t);
  auto once = [&] {
    if (!with_backward) {
      NoGradGuard ng;
      benchmark::DoNotOptimize(fn(in));
      return;
    }
    for (Tensor& t : in) t.set_grad(Tensor());
    const Tensor y = fn(in);
    backward({y}, {ones_like(y)});
  };
  for (int i = 0; i < 3; ++i) once();  // warm-up: workspaces, packed weights, thread pool
  for (auto _ : state) once();
}

void rope_bench(benchmark::State& state, DType dt) {
  const Tensor x = input({kB, kT, kC}, dt, 1);
  run(state, false, {x}, [](const std::vector<Tensor>& t) { return rope(t[0].view({kB, kT, kH, kD})); });
  state.counters["GB/s"] = benchmark::Counter(2.0 * static_cast<double>(x.nbytes()) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}
void rope_fb(benchmark::State& state, DType dt) {
  run(state, true, {input({kB, kT, kC}, dt, 1)}, [](const std::vector<Tensor>& t) { return rope(t[0].view({kB, kT, kH, kD})); });
}

enum class Mlp { fused, two_linears, composed };
void swiglu_bench(benchmark::State& state, DType dt, Mlp m, bool bwd) {
  const std::vector<Tensor> in = {input({kB, kT, kC}, dt, 2), input({kI, kC}, dt, 3), input({kI, kC}, dt, 4)};
  run(state, bwd, in, [m](const std::vector<Tensor>& t) {
    switch (m) {
      case Mlp::fused: return swiglu(t[0], t[1], t[2]);
      case Mlp::two_linears: return add(linear(t[0], t[1]), linear(t[0], t[2]));  // the 2 (6) GEMMs and a sum
      case Mlp::composed: return mul(silu(linear(t[0], t[1])), linear(t[0], t[2]));
    }
    return Tensor();
  });
  const double flops = 2.0 * 2 * kB * kT * kC * kI * (bwd ? 3 : 1);
  state.counters["GFLOP"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void sdpa_bench(benchmark::State& state, DType dt, int64_t hkv, bool bwd) {
  const std::vector<Tensor> in = {input({kB, kT, kH, kD}, dt, 5), input({kB, kT, hkv, kD}, dt, 6), input({kB, kT, hkv, kD}, dt, 7)};
  run(state, bwd, in, [](const std::vector<Tensor>& t) {
    return scaled_dot_product_attention(t[0].transpose(1, 2), t[1].transpose(1, 2), t[2].transpose(1, 2), true, {}, true)
        .transpose(1, 2)
        .reshape({kB, kT, kC});
  });
  // causal: half the T x T scores; forward 2 products, backward 5 (counted as twice the forward)
  const double flops = 4.0 * kB * kH * kT * kT * kD / 2 * (bwd ? 3 : 1);
  state.counters["GFLOP"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

template <class F> void reg(const std::string& name, F f) {
  benchmark::RegisterBenchmark(name.c_str(), f)->UseRealTime()->MeasureProcessCPUTime()->Unit(benchmark::kMillisecond);
}
}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("threads", std::to_string(omp_get_max_threads()));
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::string d = dtype_name(dt);
    reg("rope/" + d + "/fwd", [dt](benchmark::State& s) { rope_bench(s, dt); });
    reg("rope/" + d + "/fwd+bwd", [dt](benchmark::State& s) { rope_fb(s, dt); });
    for (bool bwd : {false, true}) {
      const std::string pass = bwd ? "/fwd+bwd" : "/fwd";
      reg("swiglu/" + d + "/fused" + pass, [=](benchmark::State& s) { swiglu_bench(s, dt, Mlp::fused, bwd); });
      reg("swiglu/" + d + "/two_linears" + pass, [=](benchmark::State& s) { swiglu_bench(s, dt, Mlp::two_linears, bwd); });
      reg("swiglu/" + d + "/composed" + pass, [=](benchmark::State& s) { swiglu_bench(s, dt, Mlp::composed, bwd); });
    }
    for (int64_t hkv : {12, 4, 1})
      for (bool bwd : {false, true})
        reg("sdpa/" + d + "/Hkv" + std::to_string(hkv) + (bwd ? "/fwd+bwd" : "/fwd"),
            [=](benchmark::State& s) { sdpa_bench(s, dt, hkv, bwd); });
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
