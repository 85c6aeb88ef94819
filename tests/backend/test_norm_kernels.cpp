// Fast normalization kernels (backend/cpu/norm.h, batch_norm.h) against the naive double
// reference kernels: LayerNorm, RMSNorm and BatchNorm, forward and backward,
// f32 and bf16, rows of 1 to ~5000 columns, data with a large common offset
// (stresses the variance computation) and with a missing weight/bias.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "athanor/core/rng.h"
#include "backend/cpu/batch_norm.h"
#include "backend/cpu/norm.h"

namespace athanor {
namespace {

std::vector<float> random_floats(int64_t n, uint64_t seed, double offset, double scale) {
  Generator g(seed);
  Tensor t = randn({n}, {}, g);
  std::vector<float> v(n);
  const float* p = t.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(offset + scale * p[i]);
  return v;
}

template <class A, class B>
::testing::AssertionResult near_all(const std::vector<A>& a, const std::vector<B>& e, double atol, double rtol) {
  if (a.size() != e.size()) return ::testing::AssertionFailure() << "size " << a.size() << " vs " << e.size();
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = static_cast<double>(static_cast<float>(a[i])), y = static_cast<double>(static_cast<float>(e[i]));
    if (!(std::fabs(x - y) <= atol + rtol * std::fabs(y)))
      return ::testing::AssertionFailure() << "element " << i << ": " << x << " vs reference " << y;
  }
  return ::testing::AssertionSuccess();
}

const std::vector<int64_t> kCols = {1, 3, 16, 17, 64, 1000, 4999};

struct NormCase {
  int64_t rows, cols;
  bool weight, bias;
};
std::vector<NormCase> cases() {
  std::vector<NormCase> out;
  for (int64_t c : kCols) {
    out.push_back({c >= 1000 ? 3 : 37, c, true, true});
    out.push_back({5, c, false, false});
    out.push_back({4, c, true, false});
  }
  return out;
}

}  // namespace

TEST(NormKernels, LayerNormF32MatchesReference) {
  // Tolerance: forward atol/rtol 2e-5 (f32 sums of <= 5000 terms in 16 SIMD lanes)
  // plus the mean's rounding amplified by rstd (below); backward atol/rtol 1e-4
  // (dweight/dbias are sums over up to 37 rows).
  for (const auto& tc : cases()) {
    SCOPED_TRACE(::testing::Message() << tc.rows << "x" << tc.cols << " w=" << tc.weight << " b=" << tc.bias);
    const int64_t n = tc.rows * tc.cols;
    auto x = random_floats(n, 1 + tc.cols, 50.0, 3.0);  // large offset: the two-pass variance must handle it
    auto w = random_floats(tc.cols, 2, 1.0, 0.5), b = random_floats(tc.cols, 3, 0.0, 1.0);
    auto dy = random_floats(n, 4, 0.0, 1.0);
    const float* pw = tc.weight ? w.data() : nullptr;
    const float* pb = tc.bias ? b.data() : nullptr;
    std::vector<float> y(n), yr(n), m(tc.rows), mr(tc.rows), r(tc.rows), rr(tc.rows);
    cpu::layer_norm_forward<float>(x.data(), pw, pb, y.data(), m.data(), r.data(), tc.rows, tc.cols, 1e-5);
    cpu::ref::layer_norm_forward<float>(x.data(), pw, pb, yr.data(), mr.data(), rr.data(), tc.rows, tc.cols, 1e-5);
    // x ~ 50 +- 3 in f32: the mean carries a few ulps of |x| (ulp(50) = 3.8e-6), which
    // xhat = (x - mean) * rstd amplifies by rstd; allow 16 such ulps on top.
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = i / tc.cols;
      const double wi = tc.weight ? std::fabs(w[i % tc.cols]) : 1.0;
      const double tol = 2e-5 + 2e-5 * std::fabs(yr[i]) + 16 * 1.2e-7 * (std::fabs(mr[row]) + 1) * rr[row] * wi;
      ASSERT_NEAR(y[i], yr[i], tol) << "element " << i;
    }
    EXPECT_TRUE(near_all(m, mr, 1e-5, 1e-6));
    EXPECT_TRUE(near_all(r, rr, 1e-6, 2e-5));
    std::vector<float> dx(n), dxr(n), dw(tc.cols), dwr(tc.cols), db(tc.cols), dbr(tc.cols);
    cpu::layer_norm_backward<float>(dy.data(), x.data(), pw, m.data(), r.data(), dx.data(), tc.weight ? dw.data() : nullptr,
                                    tc.bias ? db.data() : nullptr, tc.rows, tc.cols);
    cpu::ref::layer_norm_backward<float>(dy.data(), x.data(), pw, m.data(), r.data(), dxr.data(),
                                         tc.weight ? dwr.data() : nullptr, tc.bias ? dbr.data() : nullptr, tc.rows, tc.cols);
    EXPECT_TRUE(near_all(dx, dxr, 1e-4, 1e-4));
    if (tc.weight) { EXPECT_TRUE(near_all(dw, dwr, 1e-4, 1e-4)); }
    if (tc.bias) { EXPECT_TRUE(near_all(db, dbr, 1e-4, 1e-4)); }
  }
}

TEST(NormKernels, LayerNormStatisticsOfOffsetConstantAndOutlierRows) {
  // The fast kernel takes the row statistics in one pass, shifted by the row's first
  // element (f64 lanes). Rows that stress that: common offsets up to 3e6 times the spread,
  // a constant row (variance 0: rstd = 1/sqrt(eps)), a first element far from the rest
  // (the shift is then a poor guess of the mean), and a tail of every length 1..16.
  const int64_t cols = 263;  // 16 full vectors and a 7-lane tail
  std::vector<std::vector<float>> rows_data;
  rows_data.push_back(random_floats(cols, 70, 1e4, 1.0));
  rows_data.push_back(random_floats(cols, 71, -3e5, 7.0));
  rows_data.push_back(random_floats(cols, 76, 1e7, 3.0));  // unshifted f64 E[x^2] - E[x]^2 would lose ~1% here
  rows_data.push_back(std::vector<float>(cols, 2.5f));
  auto outlier = random_floats(cols, 72, 0.0, 1.0);
  outlier[0] = 1e3f;
  rows_data.push_back(outlier);
  auto outlier_last = random_floats(cols, 73, 0.0, 1.0);
  outlier_last[cols - 1] = -1e3f;
  rows_data.push_back(outlier_last);
  const int64_t rows = static_cast<int64_t>(rows_data.size());
  std::vector<float> x;
  for (const auto& r : rows_data) x.insert(x.end(), r.begin(), r.end());
  const auto w = random_floats(cols, 74, 1.0, 0.5), b = random_floats(cols, 75, 0.0, 1.0);
  std::vector<float> y(rows * cols), m(rows), r(rows);
  cpu::layer_norm_forward<float>(x.data(), w.data(), b.data(), y.data(), m.data(), r.data(), rows, cols, 1e-5);
  std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), bd(b.begin(), b.end());
  std::vector<double> yr(rows * cols), mr(rows), rr(rows);
  cpu::ref::layer_norm_forward<double>(xd.data(), wd.data(), bd.data(), yr.data(), mr.data(), rr.data(), rows, cols, 1e-5);
  for (int64_t row = 0; row < rows; ++row) {
    SCOPED_TRACE(row);
    EXPECT_NEAR(m[row], mr[row], 1.2e-7 * std::fabs(mr[row]) + 1e-6);  // the mean rounded to f32
    EXPECT_NEAR(r[row], rr[row], 2e-6 * rr[row]);
    for (int64_t c = 0; c < cols; ++c) {
      // xhat = (x - mean) * rstd with the mean rounded to f32: |mean| ulps, amplified by rstd
      const double tol = 1e-5 * (1 + std::fabs(yr[row * cols + c])) + 2 * 1.2e-7 * std::fabs(mr[row]) * rr[row] * std::fabs(wd[c]);
      ASSERT_NEAR(y[row * cols + c], yr[row * cols + c], tol) << "column " << c;
    }
  }
  // Every tail length: rows of 1..40 columns against the reference.
  for (int64_t c = 1; c <= 40; ++c) {
    SCOPED_TRACE(c);
    const auto xs = random_floats(3 * c, 80 + c, 5.0, 2.0);
    std::vector<float> ys(3 * c), ms(3), rs(3), dys = random_floats(3 * c, 81, 0, 1), dx(3 * c), dw(c), db(c);
    std::vector<double> xsd(xs.begin(), xs.end()), dyd(dys.begin(), dys.end()), ysr(3 * c), msr(3), rsr(3), dxr(3 * c),
        dwr(c), dbr(c);
    cpu::layer_norm_forward<float>(xs.data(), nullptr, nullptr, ys.data(), ms.data(), rs.data(), 3, c, 1e-5);
    cpu::ref::layer_norm_forward<double>(xsd.data(), nullptr, nullptr, ysr.data(), msr.data(), rsr.data(), 3, c, 1e-5);
    EXPECT_TRUE(near_all(ys, ysr, 2e-5, 2e-5));
    cpu::layer_norm_backward<float>(dys.data(), xs.data(), nullptr, ms.data(), rs.data(), dx.data(), dw.data(), db.data(), 3, c);
    cpu::ref::layer_norm_backward<double>(dyd.data(), xsd.data(), nullptr, msr.data(), rsr.data(), dxr.data(), dwr.data(),
                                          dbr.data(), 3, c);
    EXPECT_TRUE(near_all(dx, dxr, 1e-4, 1e-4));
    EXPECT_TRUE(near_all(dw, dwr, 1e-4, 1e-4));
    EXPECT_TRUE(near_all(db, dbr, 1e-4, 1e-4));
  }
}

TEST(NormKernels, RmsNormF32MatchesReference) {
  // Same tolerances as LayerNorm.
  for (const auto& tc : cases()) {
    SCOPED_TRACE(::testing::Message() << tc.rows << "x" << tc.cols << " w=" << tc.weight);
    const int64_t n = tc.rows * tc.cols;
    auto x = random_floats(n, 10 + tc.cols, 0.5, 2.0), w = random_floats(tc.cols, 11, 1.0, 0.5);
    auto dy = random_floats(n, 12, 0.0, 1.0);
    const float* pw = tc.weight ? w.data() : nullptr;
    std::vector<float> y(n), yr(n), r(tc.rows), rr(tc.rows);
    cpu::rms_norm_forward<float>(x.data(), pw, y.data(), r.data(), tc.rows, tc.cols, 1e-6);
    cpu::ref::rms_norm_forward<float>(x.data(), pw, yr.data(), rr.data(), tc.rows, tc.cols, 1e-6);
    EXPECT_TRUE(near_all(y, yr, 2e-5, 2e-5));
    EXPECT_TRUE(near_all(r, rr, 1e-6, 2e-5));
    std::vector<float> dx(n), dxr(n), dw(tc.cols), dwr(tc.cols);
    cpu::rms_norm_backward<float>(dy.data(), x.data(), pw, r.data(), dx.data(), tc.weight ? dw.data() : nullptr, tc.rows, tc.cols);
    cpu::ref::rms_norm_backward<float>(dy.data(), x.data(), pw, r.data(), dxr.data(), tc.weight ? dwr.data() : nullptr,
                                       tc.rows, tc.cols);
    EXPECT_TRUE(near_all(dx, dxr, 1e-4, 1e-4));
    if (tc.weight) { EXPECT_TRUE(near_all(dw, dwr, 1e-4, 1e-4)); }
  }
}

TEST(NormKernels, LayerNormBf16MatchesReference) {
  // bf16 in/out, f32 compute: both kernels round their result to bf16 once, so
  // they may differ by one bf16 ulp (relative 2^-8 = 0.0039) plus f32 noise.
  for (int64_t cols : kCols) {
    SCOPED_TRACE(cols);
    const int64_t rows = 9, n = rows * cols;
    auto xf = random_floats(n, 20 + cols, 1.0, 2.0), wf = random_floats(cols, 21, 1.0, 0.5), bf = random_floats(cols, 22, 0, 1);
    auto dyf = random_floats(n, 23, 0.0, 1.0);
    std::vector<bfloat16> x(n), w(cols), b(cols), dy(n);
    for (int64_t i = 0; i < n; ++i) x[i] = bfloat16(xf[i]), dy[i] = bfloat16(dyf[i]);
    for (int64_t i = 0; i < cols; ++i) w[i] = bfloat16(wf[i]), b[i] = bfloat16(bf[i]);
    std::vector<bfloat16> y(n), yr(n), dx(n), dxr(n), dw(cols), dwr(cols), db(cols), dbr(cols);
    std::vector<float> m(rows), r(rows), mr(rows), rr(rows);
    cpu::layer_norm_forward<bfloat16>(x.data(), w.data(), b.data(), y.data(), m.data(), r.data(), rows, cols, 1e-5);
    cpu::ref::layer_norm_forward<bfloat16>(x.data(), w.data(), b.data(), yr.data(), mr.data(), rr.data(), rows, cols, 1e-5);
    EXPECT_TRUE(near_all(y, yr, 1e-2, 8e-3));
    EXPECT_TRUE(near_all(r, rr, 1e-6, 2e-5));
    cpu::layer_norm_backward<bfloat16>(dy.data(), x.data(), w.data(), m.data(), r.data(), dx.data(), dw.data(), db.data(), rows, cols);
    cpu::ref::layer_norm_backward<bfloat16>(dy.data(), x.data(), w.data(), m.data(), r.data(), dxr.data(), dwr.data(),
                                            dbr.data(), rows, cols);
    EXPECT_TRUE(near_all(dx, dxr, 1e-2, 8e-3));
    EXPECT_TRUE(near_all(dw, dwr, 2e-2, 8e-3));
    EXPECT_TRUE(near_all(db, dbr, 2e-2, 8e-3));
  }
}

TEST(NormKernels, BatchNormMatchesReference) {
  // Channel statistics over N*L values (up to 64*4999 = 3.2e5): f32 sums in SIMD
  // lanes, rtol 1e-5 on stats, 1e-4 on gradients (sums of that many terms).
  struct Case { int64_t N, C, L; };
  for (const Case tc : {Case{8, 3, 1}, Case{64, 1, 4999}, Case{4, 17, 33}, Case{2, 5, 1000}}) {
    SCOPED_TRACE(::testing::Message() << tc.N << "x" << tc.C << "x" << tc.L);
    const int64_t n = tc.N * tc.C * tc.L;
    auto x = random_floats(n, 30 + tc.L, 5.0, 2.0), dy = random_floats(n, 31, 0, 1);
    auto w = random_floats(tc.C, 32, 1.0, 0.5), b = random_floats(tc.C, 33, 0, 1);
    std::vector<float> m(tc.C), v(tc.C), mr(tc.C), vr(tc.C);
    cpu::batch_norm_stats<float>(x.data(), m.data(), v.data(), tc.N, tc.C, tc.L);
    cpu::ref::batch_norm_stats<float>(x.data(), mr.data(), vr.data(), tc.N, tc.C, tc.L);
    EXPECT_TRUE(near_all(m, mr, 1e-5, 1e-5));
    EXPECT_TRUE(near_all(v, vr, 1e-5, 1e-4));
    std::vector<float> rs(tc.C);
    for (int64_t c = 0; c < tc.C; ++c) rs[c] = 1.0f / std::sqrt(vr[c] + 1e-5f);
    std::vector<float> y(n), yr(n);
    cpu::batch_norm_forward<float>(x.data(), mr.data(), rs.data(), w.data(), b.data(), y.data(), tc.N, tc.C, tc.L);
    cpu::ref::batch_norm_forward<float>(x.data(), mr.data(), rs.data(), w.data(), b.data(), yr.data(), tc.N, tc.C, tc.L);
    EXPECT_TRUE(near_all(y, yr, 1e-5, 1e-5));
    for (bool training : {true, false}) {
      SCOPED_TRACE(training ? "training" : "eval");
      std::vector<float> dx(n), dxr(n), dw(tc.C), dwr(tc.C), db(tc.C), dbr(tc.C);
      cpu::batch_norm_backward<float>(dy.data(), x.data(), mr.data(), rs.data(), w.data(), dx.data(), dw.data(), db.data(),
                                      tc.N, tc.C, tc.L, training);
      cpu::ref::batch_norm_backward<float>(dy.data(), x.data(), mr.data(), rs.data(), w.data(), dxr.data(), dwr.data(),
                                           dbr.data(), tc.N, tc.C, tc.L, training);
      EXPECT_TRUE(near_all(dx, dxr, 1e-5, 1e-4));
      EXPECT_TRUE(near_all(dw, dwr, 1e-2, 1e-4));  // sums of up to 3.2e5 terms of size O(1)
      EXPECT_TRUE(near_all(db, dbr, 1e-2, 1e-4));
    }
  }
}

TEST(NormKernels, LayerNormBackwardDeterministicPerThreadCount) {
  // dweight/dbias are per-thread partial sums added in thread order: bitwise
  // identical for a fixed thread count, and within rounding across counts.
  const int64_t rows = 256, cols = 300, n = rows * cols;
  auto x = random_floats(n, 40, 0, 1), w = random_floats(cols, 41, 1, 0.5), dy = random_floats(n, 42, 0, 1);
  std::vector<float> y(n), m(rows), r(rows);
  cpu::layer_norm_forward<float>(x.data(), w.data(), nullptr, y.data(), m.data(), r.data(), rows, cols, 1e-5);
  auto run = [&](int threads) {
    const int prev = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<float> dx(n), dw(cols), db(cols);
    cpu::layer_norm_backward<float>(dy.data(), x.data(), w.data(), m.data(), r.data(), dx.data(), dw.data(), db.data(), rows, cols);
    omp_set_num_threads(prev);
    dx.insert(dx.end(), dw.begin(), dw.end());
    dx.insert(dx.end(), db.begin(), db.end());
    return dx;
  };
  const auto a = run(2), b = run(2), c = run(1);
  EXPECT_EQ(a, b);
  EXPECT_TRUE(near_all(a, c, 1e-5, 1e-5));
}

namespace {
// max_i |a_i - e_i| / max_i |e_i|: the error relative to the tensor's scale (a 16-bit
// rounding of an intermediate perturbs every element by a fraction of that scale).
// A scale > 0 given by the caller replaces max_i |e_i|.
template <class A> double scaled_error(const std::vector<A>& a, const std::vector<double>& e, double scale = 0) {
  double err = 0, emax = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(static_cast<float>(a[i])) - e[i]));
    emax = std::max(emax, std::fabs(e[i]));
  }
  if (scale <= 0) scale = emax;
  return scale > 0 ? err / scale : err;
}

template <class L> void check_keep_xhat(double round_rel) {
  // f32 x (with a large common offset in one case: xhat must not lose x - mean to it),
  // xhat kept in L. Forward: y/mean/rstd identical to the plain f32 kernel, xhat the
  // double reference's (x - mean) * rstd within one rounding to L. Backward: against a
  // naive double evaluation of the formula on the same rounded xhat (f32 noise only),
  // and against the exact double reference on x (L's rounding of xhat only).
  for (double offset : {0.5, 300.0})
    for (const auto& tc : cases()) {
      SCOPED_TRACE(::testing::Message() << tc.rows << "x" << tc.cols << " w=" << tc.weight << " b=" << tc.bias
                                        << " offset=" << offset);
      const int64_t rows = tc.rows, cols = tc.cols, n = rows * cols;
      const auto x = random_floats(n, 60 + cols, offset, 2.0), wv = random_floats(cols, 61, 1.0, 0.5);
      const auto bv = random_floats(cols, 62, 0, 1), dy = random_floats(n, 63, 0, 1);
      const float* w = tc.weight ? wv.data() : nullptr;
      const float* b = tc.bias ? bv.data() : nullptr;
      std::vector<float> y(n), m(rows), r(rows), y32(n), m32(rows), r32(rows);
      std::vector<L> xhat(n);
      cpu::layer_norm_forward_keep_xhat<L>(x.data(), w, b, y.data(), xhat.data(), m.data(), r.data(), rows, cols, 1e-5);
      cpu::layer_norm_forward<float>(x.data(), w, b, y32.data(), m32.data(), r32.data(), rows, cols, 1e-5);
      EXPECT_EQ(y, y32);
      EXPECT_EQ(r, r32);
      std::vector<double> xd(x.begin(), x.end()), dyd(dy.begin(), dy.end()), wd(cols, 1.0), bd(cols, 0.0);
      if (tc.weight) wd.assign(wv.begin(), wv.end());
      if (tc.bias) bd.assign(bv.begin(), bv.end());
      std::vector<double> yr(n), mr(rows), rr(rows), dxr(n), dwr(cols), dbr(cols), hr(n);
      cpu::ref::layer_norm_forward<double>(xd.data(), wd.data(), bd.data(), yr.data(), mr.data(), rr.data(), rows, cols, 1e-5);
      for (int64_t i = 0; i < n; ++i) hr[i] = (xd[i] - mr[i / cols]) * rr[i / cols];
      EXPECT_LE(scaled_error(xhat, hr), round_rel + 1e-5);
      cpu::ref::layer_norm_backward<double>(dyd.data(), xd.data(), wd.data(), mr.data(), rr.data(), dxr.data(),
                                            dwr.data(), dbr.data(), rows, cols);

      // The formula in double on the rounded xhat and the kernel's rstd.
      std::vector<double> dxh(n), dwh(cols, 0.0), dbh(cols, 0.0);
      for (int64_t row = 0; row < rows; ++row) {
        double dn_mean = 0, dn_h_mean = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const double h = static_cast<float>(xhat[row * cols + c]), dn = dyd[row * cols + c] * wd[c];
          dn_mean += dn / cols;
          dn_h_mean += dn * h / cols;
          dwh[c] += dyd[row * cols + c] * h;
          dbh[c] += dyd[row * cols + c];
        }
        for (int64_t c = 0; c < cols; ++c) {
          const double h = static_cast<float>(xhat[row * cols + c]);
          dxh[row * cols + c] = r[row] * (dyd[row * cols + c] * wd[c] - dn_mean - h * dn_h_mean);
        }
      }
      // dx is a difference of terms of size rstd * |dy * w| that nearly cancel for short rows
      // (cols = 3: one direction is left after projecting out 1 and xhat): errors are
      // measured against the size of those terms.
      double dx_terms = 0;
      for (int64_t i = 0; i < n; ++i) dx_terms = std::max(dx_terms, rr[i / cols] * std::fabs(dyd[i] * wd[i % cols]));
      std::vector<float> dx(n), dw(cols), db(cols);
      cpu::layer_norm_backward_from_xhat<L>(dy.data(), xhat.data(), w, r.data(), dx.data(), tc.weight ? dw.data() : nullptr,
                                            tc.bias ? db.data() : nullptr, rows, cols);
      EXPECT_LE(scaled_error(dx, dxh, dx_terms), 1e-5);
      if (tc.weight) { EXPECT_LE(scaled_error(dw, dwh), 1e-5); }
      if (tc.bias) { EXPECT_LE(scaled_error(db, dbh), 1e-5); }
      // Against the exact gradients: what keeping xhat in L costs.
      EXPECT_LE(scaled_error(dx, dxr, dx_terms), 2 * round_rel);
      if (tc.weight) { EXPECT_LE(scaled_error(dw, dwr), 2 * round_rel); }
      if (tc.bias) { EXPECT_LE(scaled_error(db, dbr), 1e-5); }
    }
}
}  // namespace

TEST(NormKernels, LayerNormKeepXhatBf16MatchesReference) { check_keep_xhat<bfloat16>(std::ldexp(1.0, -8)); }
TEST(NormKernels, LayerNormKeepXhatF16MatchesReference) { check_keep_xhat<float16>(std::ldexp(1.0, -10)); }

}  // namespace athanor
