// The GEMM-carrying ops of a GPT step, timed as the step runs them, and broken into their
// parts, so that in-situ time above the isolated GEMM time shows where it goes:
//   linear        qkv (d -> 3d), attn proj (d -> d), fc (d -> 4d) with bias; lm_head (d -> 256, no bias)
//   gelu_linear   fc2 (4d -> d, bias)
// Rows M = B·T = 2048 (B 8, T 256); d = 256 (tiny GPT) and 384 (small GPT).
// For each op: the op's forward and backward through the public API (backward on fresh
// leaves each time: gradients adopted, nothing accumulated), then the parts of the plain
// composition alone: each GEMM (cpu::gemm / cpu::gemm_bias, as linear calls them), the
// GELU passes (activation kernels) and the bias sum (cpu::sum_3d). Variants are interleaved
// (A, B, C, A, B, C, ...) so a shared machine's load hits all alike; medians (and minima)
// of wall time and the median of process CPU time (all threads, spinning included);
// "parts" is the sum of the part medians.
//   ./bench_gpt_ops [reps=15] [f32|bf16]   the ops and their parts
//   ./bench_gpt_ops REPS exp               tiny GPT fc2 (gelu_linear): the backward before the
//                                          row-blocked path, the blocked variants, and the
//                                          forward as row blocks (measured slower, not used)
//   ./bench_gpt_ops REPS orient            weight-gradient orientation per shape: dy^T x vs (x^T dy)^T
//   ./bench_gpt_ops REPS dxdb              linear's dx + db: primitive + sum_3d vs per-thread sgemm + row sums
// (set OMP_NUM_THREADS / GOMP_SPINCOUNT as for training)
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "athanor/autograd/engine.h"
#include "athanor/core/rng.h"
#include "athanor/core/tensor.h"
#include "athanor/ops/elementwise.h"
#include "athanor/ops/autocast.h"
#include "athanor/ops/gelu_linear.h"
#include "athanor/ops/linalg.h"
#include "backend/cpu/activation.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/reduce.h"
#include "bench_timing.h"
#include "ops/op_utils.h"

using namespace athanor;
using bench::median;

namespace {

double now_s(clockid_t id = CLOCK_MONOTONIC) { return bench::clock_s(id); }

struct Part {
  std::string name;
  double gflop;                  // 0: not a GEMM
  std::function<void()> setup;   // untimed, before each timed call (may be empty)
  std::function<void()> run;
};

// Interleaved repetitions of all parts; prints median ms (and GFLOP/s for GEMMs).
void time_parts(const char* title, const std::vector<Part>& parts, int reps, size_t first_part = 1) {
  std::vector<std::vector<double>> t(parts.size()), c(parts.size());
  for (const Part& p : parts) {
    if (p.setup) p.setup();
    p.run();
  }
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].setup) parts[i].setup();
      const double t0 = now_s(), c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
      parts[i].run();
      c[i].push_back(now_s(CLOCK_PROCESS_CPUTIME_ID) - c0);
      t[i].push_back(now_s() - t0);
    }
  std::printf("%s\n", title);
  double sum_parts = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const double m = median(t[i]);
    if (i >= first_part) sum_parts += m;
    std::printf("  %-34s %8.3f ms  (min %7.3f, cpu %7.3f ms)", parts[i].name.c_str(), m * 1e3,
                *std::min_element(t[i].begin(), t[i].end()) * 1e3, median(c[i]) * 1e3);
    if (parts[i].gflop > 0) std::printf("  %6.0f GFLOP/s", parts[i].gflop / m);
    std::printf("\n");
  }
  std::printf("  %-34s %8.3f ms\n", "(sum of the parts)", sum_parts * 1e3);
}

Tensor rnd(const Shape& s, uint64_t seed, double scale, DType dt) {
  Generator g(seed);
  return mul(randn(s, {}, g), scale).to(dt);
}

using LinearLike = Tensor (*)(const Tensor&, const Tensor&, const Tensor&);

// The op's forward, and its backward on fresh leaves (y recomputed untimed before each).
struct OpTimers {
  Tensor x, w, b, dy, y;
  Part forward(const char* name, LinearLike op, double gflop) {
    return {name, gflop, {}, [=, this] { (void)op(x, w, b); }};
  }
  Part backward(const char* name, LinearLike op, double gflop) {
    return {name, gflop,
            [=, this] {
              for (const Tensor* t : {&x, &w, &b})
                if (t->defined()) t->set_grad(Tensor());
              y = op(x, w, b);
            },
            [this] { athanor::backward({y}, {dy}); }};
  }
};

template <class T> const T* cp(const Tensor& t) { return static_cast<const T*>(t.raw_data()); }
template <class T> T* mp(const Tensor& t) { return static_cast<T*>(t.raw_data()); }

// C = op(A) op(B) at T's precision (the calls linear and gelu_linear make).
template <class T>
void gemm_t(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) cpu::gemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
  else cpu::gemm_lowp<T>(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}

template <class T> void bench_linear(const char* what, int64_t M, int64_t in, int64_t out, bool bias, int reps, DType dt) {
  OpTimers o;
  o.x = rnd({M, in}, 1, 1.0, dt).requires_grad_(true);
  o.w = rnd({out, in}, 2, 0.05, dt).requires_grad_(true);
  if (bias) o.b = rnd({out}, 3, 0.1, dt).requires_grad_(true);
  o.dy = rnd({M, out}, 4, 1.0, dt);
  const Tensor y = empty({M, out}, TensorOptions(dt)), dx = empty({M, in}, TensorOptions(dt)), dw = empty({out, in}, TensorOptions(dt)),
               db = empty({out}, TensorOptions(dt));
  const double gf = 2e-9 * M * in * out;
  const std::string t = std::string(what) + " linear M=" + std::to_string(M) + " in=" + std::to_string(in) + " out=" + std::to_string(out);
  time_parts((t + " forward").c_str(),
             {o.forward("op forward", linear, gf),
              {"gemm_bias (y = x W^T + b)", gf, {}, [&] {
                 cpu::gemm_bias<T>(false, true, M, out, in, cp<T>(o.x), in, cp<T>(o.w), in, bias ? cp<T>(o.b) : nullptr, mp<T>(y), out);
               }}},
             reps);
  std::vector<Part> parts = {o.backward("op backward", linear, 2 * gf),
                             {"dx = dy W (NN)", gf, {}, [&] { gemm_t<T>(false, false, M, in, out, cp<T>(o.dy), out, cp<T>(o.w), in, mp<T>(dx), in); }},
                             {"dW = dy^T x (TN)", gf, {}, [&] { gemm_t<T>(true, false, out, in, M, cp<T>(o.dy), out, cp<T>(o.x), in, mp<T>(dw), in); }}};
  if (bias) parts.push_back({"db = rowsum dy (sum_3d)", 0, {}, [&] { cpu::sum_3d<T>(cp<T>(o.dy), mp<T>(db), 1, M, out); }});
  time_parts((t + " backward").c_str(), parts, reps);
}

template <class T> void bench_gelu_linear(const char* what, int64_t M, int64_t in, int64_t out, int reps, DType dt) {
  OpTimers o;
  o.x = rnd({M, in}, 5, 1.5, dt).requires_grad_(true);
  o.w = rnd({out, in}, 6, 0.05, dt).requires_grad_(true);
  o.b = rnd({out}, 7, 0.1, dt).requires_grad_(true);
  o.dy = rnd({M, out}, 8, 1.0, dt);
  const Tensor h = empty({M, in}, TensorOptions(dt)), y = empty({M, out}, TensorOptions(dt)), dx = empty({M, in}, TensorOptions(dt)),
               dw = empty({out, in}, TensorOptions(dt)), db = empty({out}, TensorOptions(dt));
  const double gf = 2e-9 * M * in * out;
  const std::string t = std::string(what) + " gelu_linear M=" + std::to_string(M) + " in=" + std::to_string(in) + " out=" + std::to_string(out);
  constexpr cpu::Activation kGelu = cpu::Activation::gelu_tanh;
  time_parts((t + " forward").c_str(),
             {o.forward("op forward", gelu_linear, gf),
              {"h = gelu(x) pass", 0, {}, [&] { cpu::activation_forward<T>(kGelu, cp<T>(o.x), mp<T>(h), M * in); }},
              {"gemm_bias (y = h W^T + b)", gf, {}, [&] {
                 cpu::gemm_bias<T>(false, true, M, out, in, cp<T>(h), in, cp<T>(o.w), in, cp<T>(o.b), mp<T>(y), out);
               }}},
             reps);
  time_parts((t + " backward").c_str(),
             {o.backward("op backward", gelu_linear, 2 * gf),
              {"h = gelu(x) pass", 0, {}, [&] { cpu::activation_forward<T>(kGelu, cp<T>(o.x), mp<T>(h), M * in); }},
              {"dW = dy^T h (TN)", gf, {}, [&] { gemm_t<T>(true, false, out, in, M, cp<T>(o.dy), out, cp<T>(h), in, mp<T>(dw), in); }},
              {"dh = dy W (NN)", gf, {}, [&] { gemm_t<T>(false, false, M, in, out, cp<T>(o.dy), out, cp<T>(o.w), in, mp<T>(dx), in); }},
              {"dx = dh * gelu'(x) pass", 0, {}, [&] { cpu::activation_backward<T>(kGelu, cp<T>(o.x), cp<T>(dx), mp<T>(dx), M * in); }},
              {"db = rowsum dy (sum_3d)", 0, {}, [&] { cpu::sum_3d<T>(cp<T>(o.dy), mp<T>(db), 1, M, out); }}},
             reps);
}

template <class T> void bench_model(const char* what, int64_t d, int reps, DType dt) {
  const int64_t M = 2048;
  bench_linear<T>(what, M, d, 3 * d, true, reps, dt);       // attn.c_attn (qkv)
  bench_linear<T>(what, M, d, d, true, reps, dt);           // attn.c_proj
  bench_linear<T>(what, M, d, 4 * d, true, reps, dt);       // mlp.c_fc
  bench_gelu_linear<T>(what, M, 4 * d, d, reps, dt);        // mlp.c_proj (gelu fused)
  bench_linear<T>(what, M, d, 256, false, reps, dt);        // tied lm_head (byte vocabulary)
}

// Experiments on the tiny GPT fc2 backward (gelu_linear): GEMM orientation and library for
// dW, and dx = (dy W) * gelu'(x) done per row block inside one parallel region (each thread
// a single-threaded sgemm on its rows, then the slope pass while the block is in cache).
void experiments(int reps) {
  const int64_t M = 2048, in = 1024, out = 256;
  const Tensor x = rnd({M, in}, 5, 1.5, DType::f32), w = rnd({out, in}, 6, 0.05, DType::f32), dy = rnd({M, out}, 8, 1.0, DType::f32);
  const Tensor h = empty({M, in}), dx = empty({M, in}), dw = empty({out, in}), dwt = empty({in, out});
  cpu::activation_forward<float>(cpu::Activation::gelu_tanh, cp<float>(x), mp<float>(h), M * in);
  const double gf = 2e-9 * M * in * out;
  const Tensor s = empty({M, in});
  // gelu_linear's f32 backward before the blocked path: slope pass (h, s), dW, dh GEMM (primitive), multiply pass
  auto before = [&] {
    cpu::gelu_tanh_value_and_slope<float>(cp<float>(x), mp<float>(h), mp<float>(s), M * in);
    cpu::gemm(true, false, out, in, M, 1.0f, cp<float>(dy), out, cp<float>(h), in, 0.0f, mp<float>(dw), in);
    cpu::gemm(false, false, M, in, out, 1.0f, cp<float>(dy), out, cp<float>(w), in, 0.0f, mp<float>(dx), in);
    cpu::multiply_by_slope<float>(mp<float>(dx), cp<float>(s), M * in);
  };
  // blocked: per row block (one region) dh = dy W (sgemm), then h and dh *= slope in cache; then dW
  auto blocked = [&](int64_t rows) {
    return [&, rows] {
#pragma omp parallel for schedule(static)
      for (int64_t r0 = 0; r0 < M; r0 += rows) {
        const int64_t n = std::min(rows, M - r0);
        cpu::gemm_tile(false, false, n, in, out, 1.0f, cp<float>(dy) + r0 * out, out, cp<float>(w), in, 0.0f, mp<float>(dx) + r0 * in, in);
        cpu::gelu_tanh_value_and_apply_slope(cp<float>(x) + r0 * in, mp<float>(h) + r0 * in, mp<float>(dx) + r0 * in, n * in);
      }
      cpu::gemm(true, false, out, in, M, 1.0f, cp<float>(dy), out, cp<float>(h), in, 0.0f, mp<float>(dw), in);
    };
  };
  time_parts("experiments: tiny fc2 backward (dW, dx; no db)",
             {{"before: pass, dW, dh, multiply", 2 * gf, {}, before},
              {"blocked 128 rows + dW", 2 * gf, {}, blocked(128)},
              {"blocked 256 rows + dW", 2 * gf, {}, blocked(256)},
              {"blocked 1024 rows + dW", 2 * gf, {}, blocked(1024)},
              {"dW = dy^T h  TN primitive", gf, {}, [&] { cpu::gemm(true, false, out, in, M, 1.0f, cp<float>(dy), out, cp<float>(h), in, 0.0f, mp<float>(dw), in); }},
              {"dW^T = h^T dy TN primitive", gf, {}, [&] { cpu::gemm(true, false, in, out, M, 1.0f, cp<float>(h), in, cp<float>(dy), out, 0.0f, mp<float>(dwt), out); }}},
             reps, 99);
  // forward: gelu pass + gemm_bias primitive, against per row block gelu into a per-thread
  // buffer and a single-threaded sgemm (bias as prefill, beta = 1)
  const Tensor bias = rnd({out}, 7, 0.1, DType::f32), y = empty({M, out});
  auto fwd_blocked = [&](int64_t rows) {
    return [&, rows] {
      std::vector<float> hb(2 * rows * in);
#pragma omp parallel for schedule(static)
      for (int64_t r0 = 0; r0 < M; r0 += rows) {
        const int64_t n = std::min(rows, M - r0);
        float* hh = hb.data() + omp_get_thread_num() * rows * in;
        cpu::activation_forward<float>(cpu::Activation::gelu_tanh, cp<float>(x) + r0 * in, hh, n * in);
        for (int64_t r = 0; r < n; ++r) std::copy(cp<float>(bias), cp<float>(bias) + out, mp<float>(y) + (r0 + r) * out);
        cpu::gemm_tile(false, true, n, out, in, 1.0f, hh, in, cp<float>(w), in, 1.0f, mp<float>(y) + r0 * out, out);
      }
    };
  };
  time_parts("experiments: tiny fc2 forward",
             {{"op path: gelu pass + gemm_bias", gf, {}, [&] {
                 cpu::activation_forward<float>(cpu::Activation::gelu_tanh, cp<float>(x), mp<float>(h), M * in);
                 cpu::gemm_bias<float>(false, true, M, out, in, cp<float>(h), in, cp<float>(w), in, cp<float>(bias), mp<float>(y), out);
               }},
              {"blocked 64", gf, {}, fwd_blocked(64)},
              {"blocked 128", gf, {}, fwd_blocked(128)},
              {"blocked 256", gf, {}, fwd_blocked(256)}},
             reps, 99);
}

// Weight-gradient orientation per shape: dW = dy^T x [out, in] as one TN GEMM, against
// dW^T = x^T dy [in, out] (TN, operands swapped) and a transpose into [out, in]; f32 and
// bf16 inputs with f32 output (the autocast path).
void orientations(int reps) {
  const int64_t M = 2048;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{768, 256}, {256, 256}, {1024, 256}, {256, 1024}, {1152, 384},
                                                           {384, 384}, {1536, 384}, {384, 1536}, {256, 384}};
  for (auto [out, in] : shapes) {
    const Tensor x = rnd({M, in}, 1, 1.0, DType::f32), dy = rnd({M, out}, 2, 1.0, DType::f32);
    const Tensor xb = x.to(DType::bf16), dyb = dy.to(DType::bf16), dw = empty({out, in}), dwt = empty({in, out});
    const double gf = 2e-9 * M * in * out;
    const std::string t = "dW orientation out=" + std::to_string(out) + " in=" + std::to_string(in) + " (K = M = 2048)";
    time_parts(t.c_str(),
               {{"f32  dW = dy^T x", gf, {}, [&] { cpu::gemm(true, false, out, in, M, 1.0f, cp<float>(dy), out, cp<float>(x), in, 0.0f, mp<float>(dw), in); }},
                {"f32  dW^T = x^T dy + transpose", gf, {}, [&] {
                   cpu::gemm(true, false, in, out, M, 1.0f, cp<float>(x), in, cp<float>(dy), out, 0.0f, mp<float>(dwt), out);
                   detail::transpose_2d(cp<float>(dwt), in, out, mp<float>(dw));
                 }},
                {"bf16 dW = dy^T x", gf, {}, [&] {
                   cpu::gemm_bf16_f32out(true, false, out, in, M, 1.0f, cp<bfloat16>(dyb), out, cp<bfloat16>(xb), in, 0.0f, mp<float>(dw), in);
                 }},
                {"bf16 dW^T = x^T dy + transpose", gf, {}, [&] {
                   cpu::gemm_bf16_f32out(true, false, in, out, M, 1.0f, cp<bfloat16>(xb), in, cp<bfloat16>(dyb), out, 0.0f, mp<float>(dwt), out);
                   detail::transpose_2d(cp<float>(dwt), in, out, mp<float>(dw));
                 }}},
               reps, 99);
  }
}

// linear's dx and db: the matmul primitive (2 threads) and sum_3d, against one parallel
// region where each thread runs a single-threaded sgemm on its rows and sums its rows of dy.
void linear_dx_db(int reps) {
  const int64_t M = 2048;
  for (auto [out, in] : std::vector<std::pair<int64_t, int64_t>>{{768, 256}, {256, 256}, {1024, 256}, {1152, 384}, {1536, 384}}) {
    const Tensor w = rnd({out, in}, 2, 0.05, DType::f32), dy = rnd({M, out}, 4, 1.0, DType::f32);
    const Tensor dx = empty({M, in}), db = empty({out});
    std::vector<float> partial(2 * out);
    const double gf = 2e-9 * M * in * out;
    const std::string t = "linear dx + db out=" + std::to_string(out) + " in=" + std::to_string(in);
    time_parts(t.c_str(),
               {{"primitive dx + sum_3d", gf, {}, [&] {
                   cpu::gemm(false, false, M, in, out, 1.0f, cp<float>(dy), out, cp<float>(w), in, 0.0f, mp<float>(dx), in);
                   cpu::sum_3d<float>(cp<float>(dy), mp<float>(db), 1, M, out);
                 }},
                {"per-thread sgemm + row sums", gf, {}, [&] {
#pragma omp parallel num_threads(2)
                   {
                     const int tid = omp_get_thread_num();
                     const int64_t r0 = tid * M / 2, r1 = (tid + 1) * M / 2;
                     cpu::gemm_tile(false, false, r1 - r0, in, out, 1.0f, cp<float>(dy) + r0 * out, out, cp<float>(w), in, 0.0f,
                                    mp<float>(dx) + r0 * in, in);
                     float* acc = partial.data() + tid * out;
                     std::fill(acc, acc + out, 0.0f);
                     for (int64_t r = r0; r < r1; ++r) {
                       const float* row = cp<float>(dy) + r * out;
#pragma omp simd
                       for (int64_t i = 0; i < out; ++i) acc[i] += row[i];
                     }
                   }
                   for (int64_t i = 0; i < out; ++i) mp<float>(db)[i] = partial[i] + partial[out + i];
                 }}},
               reps, 99);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 15;
  const bool bf16 = argc > 2 && std::strcmp(argv[2], "bf16") == 0;
  std::printf("threads %d, GOMP_SPINCOUNT=%s, %d interleaved repetitions, medians, %s\n", omp_get_max_threads(),
              std::getenv("GOMP_SPINCOUNT") ? std::getenv("GOMP_SPINCOUNT") : "(unset)", reps, bf16 ? "bf16" : "f32");
  if (argc > 2 && std::strcmp(argv[2], "dxdb") == 0) {
    linear_dx_db(reps);
    return 0;
  }
  if (argc > 2 && std::strcmp(argv[2], "orient") == 0) {
    orientations(reps);
    return 0;
  }
  if (argc > 2 && std::strcmp(argv[2], "exp") == 0) {
    experiments(reps);
    return 0;
  }
  if (bf16) {
    bench_model<bfloat16>("tiny", 256, reps, DType::bf16);
    bench_model<bfloat16>("small", 384, reps, DType::bf16);
  } else {
    bench_model<float>("tiny", 256, reps, DType::f32);
    bench_model<float>("small", 384, reps, DType::f32);
  }
  return 0;
}
