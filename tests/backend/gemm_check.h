#pragma once
// A GEMM case (transposes, sizes, padded leading dimensions, alpha, beta, bias, NaN in C)
// with its random operands, and the check of a computed C against alpha op(A) op(B) +
// bias + beta C0 summed in double: shared by the tests of the f32 GEMM paths.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "test_util.h"

namespace athanor::testing {

struct Gemm {
  bool ta = false, tb = false;
  int64_t M = 0, N = 0, K = 0;
  int64_t pad = 0;  // extra elements per stored row of A, B and C
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false, nan_c = false;

  int64_t lda() const { return (ta ? M : K) + pad; }
  int64_t ldb() const { return (tb ? K : N) + pad; }
  int64_t ldc() const { return N + pad; }
  std::string str() const {
    return std::string(ta ? "T" : "N") + (tb ? "T" : "N") + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
           " K=" + std::to_string(K) + " pad=" + std::to_string(pad) + " alpha=" + std::to_string(alpha) +
           " beta=" + std::to_string(beta) + (bias ? " bias" : "") + (nan_c ? " nan_c" : "");
  }
};

struct Data {
  std::vector<float> a, b, bias, c0;
};

inline Data make_data(const Gemm& g, uint64_t seed) {
  Data d;
  d.a = random_floats((g.ta ? g.K : g.M) * g.lda(), seed, 1.0);
  d.b = random_floats((g.tb ? g.N : g.K) * g.ldb(), seed + 1, 1.0);
  d.bias = random_floats(g.N, seed + 2, 1.0);
  d.c0 = g.nan_c ? std::vector<float>(g.M * g.ldc(), std::numeric_limits<float>::quiet_NaN())
                 : random_floats(g.M * g.ldc(), seed + 3, 1.0);
  return d;
}

// Checks C against alpha op(A) op(B) + bias + beta C0 computed in double, within
// 8 f32 ulps x (sqrt(K) + 2) of the sum of the magnitudes of the terms; the padding
// of C's rows must be untouched.
inline ::testing::AssertionResult check(const Gemm& g, const Data& d, const std::vector<float>& c) {
  for (int64_t i = 0; i < g.M; ++i)
    for (int64_t j = 0; j < g.ldc(); ++j) {
      const int64_t at = i * g.ldc() + j;
      if (j >= g.N) {
        if (std::memcmp(&c[at], &d.c0[at], sizeof(float)) != 0)
          return ::testing::AssertionFailure() << g.str() << ": padding of C written at (" << i << ", " << j << ")";
        continue;
      }
      double acc = 0, mag = 0;
      for (int64_t k = 0; k < g.K; ++k) {
        const double x = g.ta ? d.a[k * g.lda() + i] : d.a[i * g.lda() + k];
        const double y = g.tb ? d.b[j * g.ldb() + k] : d.b[k * g.ldb() + j];
        acc += x * y;
        mag += std::abs(x * y);
      }
      double ref = g.alpha * acc;
      mag *= std::abs(g.alpha);
      if (g.bias) ref += d.bias[j], mag += std::abs(d.bias[j]);
      if (g.beta != 0.0f) ref += g.beta * double(d.c0[at]), mag += std::abs(g.beta * double(d.c0[at]));
      const double tol = 8 * std::numeric_limits<float>::epsilon() * (std::sqrt(double(g.K)) + 2) * mag + 1e-30;
      if (!(std::abs(c[at] - ref) <= tol))
        return ::testing::AssertionFailure() << g.str() << ": C(" << i << ", " << j << ") = " << c[at] << ", reference "
                                             << ref << ", tolerance " << tol;
    }
  return ::testing::AssertionSuccess();
}

// The public entry points on g (cpu::gemm_bias when g.bias, else cpu::gemm with g's beta;
// alpha 1, no padding) with a fast path switched on and then off through set_enabled: both
// results match the f64 reference, and each other within f32 rounding.
inline void expect_fast_path_matches_onednn(const Gemm& g, uint64_t seed, void (*set_enabled)(bool), const char* path) {
  const Data d = make_data(g, seed);
  std::vector<float> fast, onednn;
  for (bool on : {true, false}) {
    set_enabled(on);
    std::vector<float>& c = on ? fast : onednn;
    c = d.c0;
    if (g.bias)
      cpu::gemm_bias<float>(g.ta, g.tb, g.M, g.N, g.K, d.a.data(), g.lda(), d.b.data(), g.ldb(), d.bias.data(),
                            c.data(), g.ldc());
    else
      cpu::gemm(g.ta, g.tb, g.M, g.N, g.K, 1.0f, d.a.data(), g.lda(), d.b.data(), g.ldb(), g.beta, c.data(), g.ldc());
  }
  set_enabled(true);
  EXPECT_TRUE(check(g, d, fast)) << path;
  EXPECT_TRUE(check(g, d, onednn)) << "oneDNN path";
  double worst = 0;
  for (size_t i = 0; i < fast.size(); ++i)
    worst = std::max(worst, double(std::abs(fast[i] - onednn[i])) / (1.0 + std::abs(onednn[i])));
  EXPECT_LT(worst, 1e-4) << g.str();
}

}  // namespace athanor::testing
