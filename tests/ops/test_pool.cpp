// max_pool2d / avg_pool2d: fast kernels vs the naive reference (forward and
// backward), -inf padding, first-max tie breaking, count_include_pad, dtypes and errors.
// The f64 gradchecks over the op's registered shapes (broadcast, transposed, strided) are the
// op harness's (tests/ops/test_op_harness.cpp); this file keeps what the harness does not do.
#include <cmath>
#include <limits>

#include "backend/cpu/pool.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
cpu::Pool2dGeom geom(const Shape& xs, Pair k, Pair s, Pair p) {
  cpu::Pool2dGeom g;
  g.N = xs[0], g.C = xs[1], g.H = xs[2], g.W = xs[3], g.KH = k[0], g.KW = k[1], g.sh = s[0], g.sw = s[1];
  g.ph = p[0], g.pw = p[1];
  g.OH = (g.H + 2 * g.ph - g.KH) / g.sh + 1, g.OW = (g.W + 2 * g.pw - g.KW) / g.sw + 1;
  return g;
}
}  // namespace

TEST(Pool2d, FastMatchesReferenceF32) {
  // Max pooling copies values (exact); averages of <= 9 f32 values are within ~1e-6 relative.
  Generator gen(44);
  const Shape xs{4, 8, 17, 19};
  Tensor x = randn(xs, {}, gen);
  for (auto [k, s, p] : std::vector<std::tuple<Pair, Pair, Pair>>{
           {{3, 3}, {2, 2}, {1, 1}}, {{2, 2}, {2, 2}, {0, 0}}, {{3, 3}, {1, 1}, {1, 1}}, {{4, 3}, {3, 2}, {2, 1}}}) {
    SCOPED_TRACE(std::to_string(k[0]) + "x" + std::to_string(k[1]) + " s" + std::to_string(s[0]) + " p" +
                 std::to_string(p[0]));
    const cpu::Pool2dGeom g = geom(xs, k, s, p);
    Tensor xr = x.detach();
    xr.requires_grad_(true);
    Tensor ym = max_pool2d(xr, k, s, p);
    EXPECT_CLOSE(ym, cpu::ref::max_pool2d(x, g), 0, 0);
    Tensor dy = randn(ym.sizes(), {}, gen);
    backward({ym}, {dy});
    EXPECT_CLOSE(xr.grad(), cpu::ref::max_pool2d_backward(x, dy, g), 1e-6, 1e-6);

    Tensor xa = x.detach();
    xa.requires_grad_(true);
    Tensor ya = avg_pool2d(xa, k, s, p);
    EXPECT_CLOSE(ya, cpu::ref::avg_pool2d(x, g), 1e-6, 1e-5);
    backward({ya}, {dy});
    EXPECT_CLOSE(xa.grad(), cpu::ref::avg_pool2d_backward(dy, g), 1e-6, 1e-5);
  }
}

TEST(Pool2d, MaxPaddingIsMinusInfinityAndTiesGoToFirstMax) {
  // All-negative input: zero padding would win; -inf padding must not.
  Tensor x = full({1, 1, 2, 2}, -3.0);
  Tensor y = max_pool2d(x, {2, 2}, {1, 1}, {1, 1});
  EXPECT_CLOSE(y, full({1, 1, 3, 3}, -3.0), 0, 0);
  // Ties: every value equal; each window's gradient goes to its first (row-major) element.
  Tensor t = ones({1, 1, 4, 4});
  t.requires_grad_(true);
  max_pool2d(t, {2, 2}).sum().backward();
  EXPECT_CLOSE(t.grad(), from_vector(std::vector<double>{1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0}, {1, 1, 4, 4}),
               0, 0);
  // NaN propagates through max.
  Tensor nan = from_vector(std::vector<double>{1, std::nan(""), 3, 4}, {1, 1, 2, 2});
  EXPECT_TRUE(std::isnan(max_pool2d(nan, {2, 2}).item()));
}

TEST(Pool2d, AvgCountsPadding) {
  // 3x3 window at the corner of a padded image holds 4 real values and 5 zeros: divide by 9.
  Tensor x = ones({1, 1, 3, 3});
  Tensor y = avg_pool2d(x, {3, 3}, {2, 2}, {1, 1});
  EXPECT_CLOSE(y, full({1, 1, 2, 2}, 4.0 / 9.0), 1e-7, 0);
}

TEST(Pool2d, LowPrecisionKeepsDtype) {
  Generator gen(45);
  Tensor x = randn({2, 3, 8, 8}, {}, gen).to(DType::bf16);
  x.requires_grad_(true);
  Tensor y = avg_pool2d(x, {2, 2});
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_CLOSE(y, cpu::ref::avg_pool2d(x, geom({2, 3, 8, 8}, {2, 2}, {2, 2}, {0, 0})), 1e-2, 1e-2);
  Tensor m = max_pool2d(x, {2, 2});
  EXPECT_CLOSE(m, cpu::ref::max_pool2d(x, geom({2, 3, 8, 8}, {2, 2}, {2, 2}, {0, 0})), 0, 0);
  (y.sum() + m.sum()).backward();
  EXPECT_EQ(x.grad().dtype(), DType::bf16);
}

TEST(Pool2d, ErrorsNameOpAndShapes) {
  Tensor x = zeros({2, 3, 4, 4});
  std::string msg = error_message([&] { max_pool2d(x, {5, 5}); });
  EXPECT_NE(msg.find("max_pool2d"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3, 4, 4]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("larger than the padded input"), std::string::npos) << msg;
  msg = error_message([&] { avg_pool2d(x, {2, 2}, {0, 0}, {2, 2}); });
  EXPECT_NE(msg.find("avg_pool2d"), std::string::npos) << msg;
  EXPECT_NE(msg.find("half the kernel"), std::string::npos) << msg;
  msg = error_message([&] { avg_pool2d(zeros({3, 4, 4}), {2, 2}); });
  EXPECT_NE(msg.find("avg_pool2d"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 4, 4]"), std::string::npos) << msg;
  msg = error_message([&] { max_pool2d(x, {0, 2}); });
  EXPECT_NE(msg.find("kernel size"), std::string::npos) << msg;
}

}  // namespace athanor
