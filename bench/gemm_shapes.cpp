// The GEMM shapes of the benchmark models, A/B: the old f32 path (dnnl_sgemm, with
// linear's bias as a prefill of C and beta = 1) against athanor's dispatch
// (cpu::gemm / cpu::gemm_bias: cached oneDNN matmul primitives, bias in the
// epilogue), and the bf16 primitives. Interleaved repetitions (A, B, A, B, ...) so a
// shared machine's load hits both alike; medians of wall time, and of process CPU
// time per call (work done by all threads, insensitive to time slicing: a variant
// that parallelises by duplicating work shows up there).
// Linear's forward (x W^T + b) and input-gradient (dy W) shapes also run with W
// pre-packed in the layout oneDNN picks (format_tag::any, reordered once outside the
// timing): what athanor's packed weight copies (src/ops/packed_weights.h) save per call. A
// reorder per call costs more than it saves, hence copies kept beside the weights.
// The bf16 column is athanor's dispatch as a step runs it: its weight-gradient (TN) shapes
// with >= 512 rows include the one packing of B that gemm_lowp does first (gemm.cpp).
//   ./bench_gemm_shapes [reps=15]         (set OMP_NUM_THREADS / OMP_WAIT_POLICY as for training)
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "athanor/core/half.h"
#include "backend/cpu/gemm.h"
#include "bench_timing.h"

using namespace athanor;
using bench::clock_s;

namespace {

struct Timing {
  std::vector<double> wall, cpu;
  double median(const std::vector<double>& v) const { return bench::median(v); }
};

// y[M, N] = x[M, K] op(W) (+ b) with W reordered once into the weights layout oneDNN
// chooses (format_tag::any); run() executes the matmul on the packed copy. tb: W is
// [N, K] (linear's forward, x W^T + b); else W is [K, N] (linear's dx = dy W, no bias).
template <class T> class PrepackedLinear {
 public:
  PrepackedLinear(bool tb, int64_t M, int64_t N, int64_t K, const T* x, const T* w, const T* bias, T* y) {
    using md = dnnl::memory::desc;
    const auto t = std::is_same_v<T, float> ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16;
    const md x_md({M, K}, t, dnnl::memory::dims{K, 1}),
        w_md({K, N}, t, tb ? dnnl::memory::dims{1, K} : dnnl::memory::dims{N, 1}),
        any_md({K, N}, t, dnnl::memory::format_tag::any), b_md({1, N}, t, dnnl::memory::dims{N, 1}),
        y_md({M, N}, t, dnnl::memory::dims{N, 1});
    const dnnl::matmul::primitive_desc pd = bias ? dnnl::matmul::primitive_desc(dnnl::matmul::desc(x_md, any_md, b_md, y_md), eng_)
                                                 : dnnl::matmul::primitive_desc(dnnl::matmul::desc(x_md, any_md, y_md), eng_);
    prim_ = dnnl::matmul(pd);
    packed_ = dnnl::memory(pd.weights_desc(), eng_);
    dnnl::memory src(w_md, eng_, const_cast<T*>(w));
    dnnl::reorder(src, packed_).execute(stream_, src, packed_);
    stream_.wait();
    args_ = {{DNNL_ARG_SRC, dnnl::memory(x_md, eng_, const_cast<T*>(x))}, {DNNL_ARG_WEIGHTS, packed_},
             {DNNL_ARG_DST, dnnl::memory(y_md, eng_, y)}};
    if (bias) args_.emplace(DNNL_ARG_BIAS, dnnl::memory(b_md, eng_, const_cast<T*>(bias)));
  }
  void run() {
    prim_.execute(stream_, args_);
    stream_.wait();
  }

 private:
  dnnl::engine eng_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{eng_};
  dnnl::matmul prim_;
  dnnl::memory packed_;
  std::unordered_map<int, dnnl::memory> args_;
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
      {"mlp fc3 dx", 128, 1024, 10, false, false, false},     {"mlp fc3 dW", 10, 1024, 128, true, false, false},
      {"mlp fc2 dW", 1024, 1024, 128, true, false, false},    {"mlp fc1 dW", 1024, 784, 128, true, false, false},
      {"gpt-tiny qkv fwd", 2048, 768, 256, false, true, true}, {"gpt-tiny fc fwd", 2048, 1024, 256, false, true, true},
      {"gpt-tiny proj fwd", 2048, 256, 1024, false, true, true}, {"gpt-tiny qkv dx", 2048, 256, 768, false, false, false},
      {"gpt-tiny qkv dW", 768, 256, 2048, true, false, false}, {"gpt2 qkv fwd", 1024, 2304, 768, false, true, true},
      {"gpt2 fc fwd", 1024, 3072, 768, false, true, true},     {"gpt2 proj fwd", 1024, 768, 3072, false, true, true},
      {"gpt2 qkv dW", 2304, 768, 1024, true, false, false},
      {"gpt-tiny fc2 dx", 2048, 1024, 256, false, false, false}, {"gpt-tiny fc2 dW", 256, 1024, 2048, true, false, false},
      {"gpt-tiny fc dW", 1024, 256, 2048, true, false, false},
  };
  std::printf("%-18s %5s %5s %5s %2s | %-29s | %-29s | %-29s | %-29s | %s\n", "shape", "M", "N", "K", "op",
              "f32 sgemm: ms  GF/s  GF/cpu-s", "f32 athanor: ms GF/s GF/cpu-s", "bf16: ms  GF/s  GF/cpu-s",
              "f32 prepacked W: ms GF/s", "bf16 prepacked W");
  for (const GemmShape& s : shapes) {
    const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    std::vector<float> a(s.M * s.K), b(s.K * s.N), bias(s.N), c(s.M * s.N);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 40503u) % 1000) / 1000.0f - 0.5f;
    for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.01f * static_cast<float>(i % 7);
    std::vector<bfloat16> ah(a.begin(), a.end()), bh(b.begin(), b.end()), biash(bias.begin(), bias.end()), ch(c.size());
    std::vector<bfloat16> ch2(c.size());
    std::vector<float> c2(c.size());
    std::optional<PrepackedLinear<float>> packed32;
    std::optional<PrepackedLinear<bfloat16>> packed16;
    if (!s.ta && (s.bias == s.tb)) {  // linear's forward (W [N, K] is op(B)) or its dx (B = W [K, N])
      packed32.emplace(s.tb, s.M, s.N, s.K, a.data(), b.data(), s.bias ? bias.data() : nullptr, c2.data());
      packed16.emplace(s.tb, s.M, s.N, s.K, ah.data(), bh.data(), s.bias ? biash.data() : nullptr, ch2.data());
    }
    std::vector<std::function<void()>> variants = {
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
    if (packed32) {
      variants.push_back([&] { packed32->run(); });
      variants.push_back([&] { packed16->run(); });
    }
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
    std::printf("%-18s %5lld %5lld %5lld %c%c | %-29s | %-29s | %-29s | %-29s | %s\n", s.what, (long long)s.M,
                (long long)s.N, (long long)s.K, s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', col(t[0]).c_str(), col(t[1]).c_str(),
                col(t[2]).c_str(), packed32 ? col(t[3]).c_str() : "-", packed32 ? col(t[4]).c_str() : "-");
    if (packed32) {  // the packed result is the same GEMM: check it against athanor's (same inputs)
      double worst = 0;
      for (size_t i = 0; i < c.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(c[i] - c2[i])) / (1.0 + std::abs(c[i])));
      if (worst > 1e-4) std::printf("  WARNING: prepacked f32 result differs from gemm_bias by %.3g (relative)\n", worst);
    }
  }
  return 0;
}
