// Fast reduction kernels vs their naive references on large random inputs:
// cpu::sum_3d (src/backend/cpu/reduce.cpp), cpu::minmax_3d and cpu::var_3d
// (src/backend/cpu/minmax.cpp). Shapes cover inner == 1 (row reductions) and
// inner > 1 (column reductions), odd sizes (SIMD tails), and >= 1e5 elements
// so the OpenMP paths run.
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "athanor/core/half.h"
#include "backend/cpu/minmax.h"
#include "backend/cpu/reduce.h"

namespace athanor {
namespace {

struct Geo {
  int64_t outer, r, inner;
};
// Every case has >= 1e5 elements.
const std::vector<Geo> kGeos = {
    {64, 2003, 1},    // row sums, many rows, odd length (SIMD tail)
    {1, 300007, 1},   // one long row (a reduction over everything)
    {3, 40000, 1},    // few long rows
    {8, 501, 33},     // column reductions, inner not a multiple of the block
    {2, 1000, 129},   // inner spans several 64-column blocks
    {1000, 7, 97},    // many short columns
    {1, 2048, 768},   // a bias gradient: one outer, the columns split over the threads
    {1, 300, 1037},   // ... with a ragged last block
    {1, 2048, 1152},  // ... as four equal blocks (a small GPT's qkv bias)
    {2, 500, 2304},   // with 3+ threads, outer < threads: the blocks per outer a multiple of them
};

std::vector<float> uniform(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

std::string name(const Geo& g) {
  return "[" + std::to_string(g.outer) + ", " + std::to_string(g.r) + ", " + std::to_string(g.inner) + "]";
}

}  // namespace

TEST(SumKernel, FastMatchesReferenceF32) {
  for (const Geo& g : kGeos) {
    SCOPED_TRACE(name(g));
    const int64_t n = g.outer * g.r * g.inner, m = g.outer * g.inner;
    ASSERT_GE(n, 100000);
    // Values in [0, 1): no cancellation, so a relative tolerance is meaningful.
    const auto x = uniform(n, 0.f, 1.f, 1);
    std::vector<float> fast(m), ref(m);
    cpu::sum_3d<float>(x.data(), fast.data(), g.outer, g.r, g.inner, 0.5);
    cpu::ref::sum_3d<float>(x.data(), ref.data(), g.outer, g.r, g.inner, 0.5);
    // Tolerance 2e-4 relative: the fast kernel accumulates in f32 (the reference
    // in f64); for r positive terms the f32 error is ~eps*sqrt(r) relative
    // (~4e-5 at r = 3e5). A dropped/duplicated element is caught exactly by
    // FastMatchesReferenceExactOnIntegers below.
    for (int64_t i = 0; i < m; ++i) ASSERT_NEAR(fast[i], ref[i], 2e-4 * std::fabs(ref[i])) << "output " << i;
  }
}

TEST(SumKernel, FastMatchesReferenceExactOnIntegers) {
  // Small integers are summed exactly in f32 (all partial sums < 2^24), so the
  // fast kernel must agree with the reference bit for bit: catches a dropped or
  // duplicated element that a relative tolerance might hide.
  for (const Geo& g : kGeos) {
    SCOPED_TRACE(name(g));
    const int64_t n = g.outer * g.r * g.inner, m = g.outer * g.inner;
    std::mt19937 gen(2);
    std::uniform_int_distribution<int> d(-8, 8);
    std::vector<float> x(n);
    for (auto& v : x) v = static_cast<float>(d(gen));
    std::vector<float> fast(m), ref(m);
    cpu::sum_3d<float>(x.data(), fast.data(), g.outer, g.r, g.inner);
    cpu::ref::sum_3d<float>(x.data(), ref.data(), g.outer, g.r, g.inner);
    for (int64_t i = 0; i < m; ++i) ASSERT_EQ(fast[i], ref[i]) << "output " << i;
  }
}

TEST(SumKernel, LowPrecisionAccumulatesInF32) {
  // 4096 ones in bf16: a bf16 accumulator would stall at 256; f32 gives 4096 exactly.
  std::vector<bfloat16> x(4096 * 3, bfloat16(1.0f));
  std::vector<bfloat16> fast(3), ref(3);
  cpu::sum_3d<bfloat16>(x.data(), fast.data(), 3, 4096, 1);
  cpu::ref::sum_3d<bfloat16>(x.data(), ref.data(), 3, 4096, 1);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(static_cast<float>(fast[i]), 4096.0f);
    EXPECT_EQ(static_cast<float>(ref[i]), 4096.0f);
  }
  std::vector<float16> h(3 * 1000 * 5, float16(0.5f)), hf(15);
  cpu::sum_3d<float16>(h.data(), hf.data(), 3, 1000, 5);
  for (auto v : hf) EXPECT_EQ(static_cast<float>(v), 500.0f);
}

TEST(SumKernel, ReferenceIsCorrectByHand) {
  // [2, 3, 2]: out[o, i] = sum_j x[o, j, i]
  const std::vector<double> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<double> out(4), fast(4);
  cpu::ref::sum_3d<double>(x.data(), out.data(), 2, 3, 2);
  cpu::sum_3d<double>(x.data(), fast.data(), 2, 3, 2);
  EXPECT_EQ(out, (std::vector<double>{9, 12, 27, 30}));
  EXPECT_EQ(fast, out);
}

TEST(MinMaxKernel, FastMatchesReferenceF32) {
  for (const Geo& g : kGeos)
    for (bool is_max : {true, false}) {
      SCOPED_TRACE(name(g) + (is_max ? " max" : " min"));
      const int64_t n = g.outer * g.r * g.inner, m = g.outer * g.inner;
      // Values on a coarse grid: plenty of ties, so first-index selection is checked.
      std::mt19937 gen(3);
      std::uniform_int_distribution<int> d(-50, 50);
      std::vector<float> x(n);
      for (auto& v : x) v = static_cast<float>(d(gen)) * 0.25f;
      std::vector<float> fv(m), rv(m);
      std::vector<int64_t> fi(m), ri(m);
      cpu::minmax_3d<float>(x.data(), fv.data(), fi.data(), g.outer, g.r, g.inner, is_max);
      cpu::ref::minmax_3d<float>(x.data(), rv.data(), ri.data(), g.outer, g.r, g.inner, is_max);
      // Exact: selection does no arithmetic.
      for (int64_t i = 0; i < m; ++i) {
        ASSERT_EQ(fv[i], rv[i]) << "output " << i;
        ASSERT_EQ(fi[i], ri[i]) << "output " << i;
      }
    }
}

TEST(MinMaxKernel, NaNAndTiesInEveryLane) {
  // A NaN late in a long row, and the maximum repeated in several SIMD lanes/chunks.
  const int64_t r = 100000;
  std::vector<float> x(r, 0.0f);
  x[70001] = 5.0f;
  x[50003] = 5.0f;
  x[99998] = 5.0f;
  float v;
  int64_t i;
  cpu::minmax_3d<float>(x.data(), &v, &i, 1, r, 1, true);
  EXPECT_EQ(v, 5.0f);
  EXPECT_EQ(i, 50003);
  x[80000] = std::nanf("");
  x[90000] = std::nanf("");
  cpu::minmax_3d<float>(x.data(), &v, &i, 1, r, 1, true);
  EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(i, 80000);
  cpu::minmax_3d<float>(x.data(), &v, &i, 1, r, 1, false);
  EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(i, 80000);
  int64_t ri;
  cpu::ref::minmax_3d<float>(x.data(), nullptr, &ri, 1, r, 1, false);
  EXPECT_EQ(ri, 80000);
}

TEST(MinMaxKernel, IntegerAndHalfTypes) {
  const int64_t outer = 5, r = 1001, inner = 3, n = outer * r * inner;
  std::mt19937 gen(4);
  std::uniform_int_distribution<int> d(-100, 100);
  std::vector<int32_t> xi(n);
  std::vector<bfloat16> xb(n);
  for (int64_t k = 0; k < n; ++k) xi[k] = d(gen), xb[k] = bfloat16(static_cast<float>(xi[k]) / 8);
  std::vector<int32_t> fv(outer * inner), rv(outer * inner);
  std::vector<bfloat16> fb(outer * inner), rb(outer * inner);
  std::vector<int64_t> fi(outer * inner), ri(outer * inner), fbi(outer * inner), rbi(outer * inner);
  cpu::minmax_3d<int32_t>(xi.data(), fv.data(), fi.data(), outer, r, inner, false);
  cpu::ref::minmax_3d<int32_t>(xi.data(), rv.data(), ri.data(), outer, r, inner, false);
  cpu::minmax_3d<bfloat16>(xb.data(), fb.data(), fbi.data(), outer, r, inner, false);
  cpu::ref::minmax_3d<bfloat16>(xb.data(), rb.data(), rbi.data(), outer, r, inner, false);
  EXPECT_EQ(fv, rv);
  EXPECT_EQ(fi, ri);
  EXPECT_EQ(fbi, ri);  // x/8 is exact in bf16 for |x| <= 100: same order, same ties
  for (size_t k = 0; k < fb.size(); ++k) EXPECT_EQ(fb[k].bits, rb[k].bits);
}

TEST(VarKernel, FastMatchesReferenceF32) {
  for (const Geo& g : kGeos)
    for (int64_t corr : {0, 1}) {
      SCOPED_TRACE(name(g) + " correction " + std::to_string(corr));
      const int64_t n = g.outer * g.r * g.inner, m = g.outer * g.inner;
      // Mean 10, spread 1: the two-pass kernel must not lose the variance to cancellation.
      const auto x = uniform(n, 9.f, 11.f, 5);
      std::vector<float> fv(m), rv(m), fm(m), rm(m);
      cpu::var_3d<float, float>(x.data(), fv.data(), fm.data(), g.outer, g.r, g.inner, corr);
      cpu::ref::var_3d<float, float>(x.data(), rv.data(), rm.data(), g.outer, g.r, g.inner, corr);
      // Tolerance: f32 accumulation of r terms: the mean is off by ~eps*sqrt(r)*10
      // (~2e-4 absolute at r = 3e5), which changes the variance (~1/3) only at
      // second order; the sum of squares has relative error ~eps*sqrt(r). 1e-3
      // relative on var and 1e-4 relative on the mean cover this with margin.
      for (int64_t i = 0; i < m; ++i) {
        ASSERT_NEAR(fv[i], rv[i], 1e-3 * std::fabs(rv[i])) << "output " << i;
        ASSERT_NEAR(fm[i], rm[i], 1e-4 * std::fabs(rm[i])) << "output " << i;
      }
    }
}

TEST(VarKernel, ReferenceIsCorrectByHand) {
  // [1, 4, 2] columns {1, 2, 3, 4} and {2, 4, 6, 8}: means 2.5, 5; sums of squared deviations 5, 20.
  const std::vector<double> x = {1, 2, 2, 4, 3, 6, 4, 8};
  std::vector<double> v(2), mean(2), fv(2), fm(2);
  cpu::ref::var_3d<double, double>(x.data(), v.data(), mean.data(), 1, 4, 2, 1);
  cpu::var_3d<double, double>(x.data(), fv.data(), fm.data(), 1, 4, 2, 1);
  EXPECT_DOUBLE_EQ(v[0], 5.0 / 3);
  EXPECT_DOUBLE_EQ(v[1], 20.0 / 3);
  EXPECT_DOUBLE_EQ(mean[1], 5.0);
  EXPECT_DOUBLE_EQ(fv[0], 5.0 / 3);
  EXPECT_DOUBLE_EQ(fv[1], 20.0 / 3);
  EXPECT_DOUBLE_EQ(fm[0], 2.5);
}

}  // namespace athanor
