// The GEMMs of a GPT-2 training step on cuBLASLt (src/backend/cuda/gemm.h), each timed alone with
// CUDA events on the compute stream, as the linear ops issue them under bf16 autocast over f32
// master weights: forward y = x W^T (+ bias epilogue), dx = g W (gelu_linear's with the dgelu
// epilogue), dW = g^T x written in f32 (with the bias_grad epilogue, which also writes db).
// Each GEMM also runs without its epilogue, so the epilogues' cost shows. Prints one JSON line:
// per GEMM ms, TFLOP/s (2 m n k), the count per step, and the step's GEMM total (the variants
// the step runs, times their counts), to hold against the op profile's GEMM-carrying ops.
//
//   bench_cuda_gemm [--rows 16384] [--d 768] [--layers 12] [--vocab 50304] [--dtype bf16|f16]
//                   [--iters 10] [--max-seconds 20]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "athanor/core/dtype.h"
#include "athanor/core/error.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/runtime.h"
#include "cuda_bench.h"

using namespace athanor;
using athanor::bench::device_alloc;

namespace {

struct Options {
  int64_t rows = 16384, d = 768, layers = 12, vocab = 50304;
  DType dtype = DType::bf16;
  int iters = 10;
  double max_seconds = 20;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      ATH_CHECK(i + 1 < argc, "bench_cuda_gemm", a, " needs a value", Hint{"see the usage at the top of bench/cuda_gemm.cpp"});
      return argv[++i];
    };
    if (a == "--rows") o.rows = std::stoll(next());
    else if (a == "--d") o.d = std::stoll(next());
    else if (a == "--layers") o.layers = std::stoll(next());
    else if (a == "--vocab") o.vocab = std::stoll(next());
    else if (a == "--dtype") o.dtype = dtype_from_name(next());
    else if (a == "--iters") o.iters = std::stoi(next());
    else if (a == "--max-seconds") o.max_seconds = std::stod(next());
    else ATH_FAIL("bench_cuda_gemm", "unknown argument ", a, Hint{"see the usage at the top of bench/cuda_gemm.cpp"});
  }
  ATH_CHECK(o.dtype == DType::bf16 || o.dtype == DType::f16, "bench_cuda_gemm", "--dtype ", dtype_name(o.dtype),
            " is not bf16 or f16", Hint{"the step's GEMMs run in the autocast dtype"});
  ATH_CHECK(o.rows > 0 && o.d > 0 && o.layers > 0 && o.vocab > 0 && o.iters > 0, "bench_cuda_gemm",
            "sizes and --iters must be positive", Hint{"see the usage at the top of bench/cuda_gemm.cpp"});
  return o;
}

struct Linear {
  const char* name;
  int64_t out, in, per_step;
  bool bias, dgelu;  // dgelu: its dx carries gelu_linear's dgelu epilogue (the MLP's second linear)
};

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  cuda::require_device(0, "bench_cuda_gemm");
  const cudaStream_t st = cuda::compute_stream(0);
  const int64_t M = o.rows, D = o.d, L = o.layers;
  const std::vector<Linear> linears = {{"attn.c_attn", 3 * D, D, L, true, false},
                                       {"attn.c_proj", D, D, L, true, false},
                                       {"mlp.c_fc", 4 * D, D, L, true, false},
                                       {"mlp.c_proj", D, 4 * D, L, true, true},
                                       {"lm_head", o.vocab, D, 1, false, false}};
  int64_t max_out = 0, max_in = 0;
  for (const Linear& l : linears) max_out = std::max(max_out, l.out), max_in = std::max(max_in, l.in);
  const std::size_t es = 2;
  void* x = device_alloc(M * max_in * es);     // the input rows (and gelu_linear's pre-GELU aux)
  void* g = device_alloc(M * max_out * es);    // the upstream gradient rows
  void* w = device_alloc(max_out * max_in * es);
  void* b = device_alloc(max_out * es);
  void* y = device_alloc(M * std::max(max_out, max_in) * es);  // y [M, out] or dx [M, in]
  void* dw = device_alloc(max_out * max_in * 4);               // f32 (the master weight's gradient)
  void* db = device_alloc(max_out * 4);
  bench::fill_random(x, M * max_in, o.dtype, 1);
  bench::fill_random(g, M * max_out, o.dtype, 2);
  bench::fill_random(w, max_out * max_in, o.dtype, 3);
  bench::fill_random(b, max_out, o.dtype, 4);

  bench::EventTimer timer(st, o.iters, o.max_seconds);
  // ms per call (the warm-up also asks the heuristic); -1: cuBLASLt declined.
  auto time_ms = [&](const cuda::GemmArgs& a) -> double {
    if (!cuda::try_gemm(a, 0, st)) return -1;
    return timer.ms([&] { cuda::gemm(a, 0, st); });
  };
  std::string rows;
  double step_ms = 0, step_flop = 0;
  auto add = [&](const std::string& name, const cuda::GemmArgs& a, int64_t per_step, bool in_step) {
    const double ms = time_ms(a), flop = 2.0 * a.m * a.n * a.k;
    char buf[320];
    std::snprintf(buf, sizeof buf, "%s{\"gemm\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"per_step\": %lld, "
                  "\"in_step\": %s, \"ms\": %.4f, \"tflops\": %.1f}",
                  rows.empty() ? "" : ", ", name.c_str(), static_cast<long long>(a.m), static_cast<long long>(a.n),
                  static_cast<long long>(a.k), static_cast<long long>(per_step), in_step ? "true" : "false", ms,
                  ms > 0 ? flop / (ms * 1e-3) / 1e12 : 0.0);
    rows += buf;
    if (in_step && ms > 0) step_ms += ms * per_step, step_flop += flop * per_step;
  };
  for (const Linear& l : linears) {
    const std::string n = l.name;
    cuda::GemmArgs f;  // y = x W^T (+ b)
    f.dtype = o.dtype, f.trans_a = false, f.trans_b = true, f.m = M, f.n = l.out, f.k = l.in, f.a = x, f.b = w, f.c = y;
    cuda::GemmArgs fb = f;
    fb.bias = b, fb.epilogue = cuda::GemmEpilogue::bias;
    add(n + " forward", l.bias ? fb : f, l.per_step, true);
    if (l.bias) add(n + " forward, no epilogue", f, l.per_step, false);
    cuda::GemmArgs dx;  // dx = g W
    dx.dtype = o.dtype, dx.trans_a = false, dx.trans_b = false, dx.m = M, dx.n = l.in, dx.k = l.out, dx.a = g, dx.b = w,
    dx.c = y;
    if (l.dgelu) {
      cuda::GemmArgs dg = dx;
      dg.aux = x, dg.aux_ld = l.in, dg.epilogue = cuda::GemmEpilogue::dgelu;
      add(n + " dx (dgelu)", dg, l.per_step, true);
    }
    add(n + " dx", dx, l.per_step, !l.dgelu);
    cuda::GemmArgs dwa;  // dW = g^T x in f32 (+ db)
    dwa.dtype = o.dtype, dwa.trans_a = true, dwa.trans_b = false, dwa.m = l.out, dwa.n = l.in, dwa.k = M, dwa.a = g,
    dwa.b = x, dwa.c = dw, dwa.c_f32 = true;
    if (l.bias) {
      cuda::GemmArgs bg = dwa;
      bg.bias = db, bg.epilogue = cuda::GemmEpilogue::bias_grad;
      add(n + " dW (bias_grad)", bg, l.per_step, true);
    }
    add(n + " dW", dwa, l.per_step, !l.bias);
  }
  const cuda::DeviceInfo info = cuda::device_info(0);
  std::printf("{\"bench\": \"cuda_gemm\", \"gpu\": \"%s\", \"dtype\": \"%s\", \"rows\": %lld, \"d\": %lld, \"layers\": %lld, "
              "\"vocab\": %lld, \"step_gemm_ms\": %.3f, \"step_gemm_tflops\": %.1f, \"gemms\": [%s]}\n",
              info.name.c_str(), dtype_name(o.dtype), static_cast<long long>(M), static_cast<long long>(D),
              static_cast<long long>(L), static_cast<long long>(o.vocab), step_ms,
              step_ms > 0 ? step_flop / (step_ms * 1e-3) / 1e12 : 0.0, rows.c_str());
  for (void* p : {x, g, w, b, y, dw, db}) ATH_CUDA(cudaFree(p));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_cuda_gemm: %s\n", e.what());
  return 1;
}
