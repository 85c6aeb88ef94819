// softmax / log_softmax: forward against the definition, fast kernels against the double reference
// (rows of 1..5000 columns, logits up to ±1e4), 16-bit dtypes, -inf masking.
// The f64 gradchecks over the op's registered shapes (broadcast, transposed, strided) are the
// op harness's (tests/ops/test_op_harness.cpp); this file keeps what the harness does not do.
#include <cmath>
#include <limits>

#include "backend/cpu/softmax.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
// Independent softmax of x along `dim` (x contiguous, any rank), in double.
std::vector<double> softmax_expected(const Tensor& x, int64_t dim, bool log) {
  const auto v = x.to_vector();
  const Shape& s = x.sizes();
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= s[d];
  const int64_t r = s[dim], outer = x.numel() / (r * inner);
  std::vector<double> out(v.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t j) { return (o * r + j) * inner + i; };
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j < r; ++j) m = std::max(m, v[at(j)]);
      for (int64_t j = 0; j < r; ++j) sum += std::exp(v[at(j)] - m);
      for (int64_t j = 0; j < r; ++j) out[at(j)] = log ? v[at(j)] - m - std::log(sum) : std::exp(v[at(j)] - m) / sum;
    }
  return out;
}

}  // namespace

TEST(Softmax, ForwardMatchesDefinitionAnyDim) {
  Generator g(3);
  Tensor x = randn({3, 4, 5}, {}, g) * 4.0;
  for (int64_t dim = 0; dim < 3; ++dim)
    for (bool log : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "dim " << dim << " log " << log);
      Tensor y = log ? log_softmax(x, dim) : softmax(x, dim);
      EXPECT_TRUE(y.is_contiguous());
      EXPECT_CLOSE(y, from_vector(softmax_expected(x, dim, log), x.sizes(), TensorOptions(DType::f64)), 1e-6, 1e-5);
    }
  // non-contiguous input, negative dim
  Tensor xt = x.transpose(0, 2);
  EXPECT_CLOSE(softmax(xt, -2), from_vector(softmax_expected(xt.contiguous(), 1, false), xt.sizes(), TensorOptions(DType::f64)), 1e-6, 1e-5);
}

TEST(Softmax, MaskedAndExtremeRows) {
  const double inf = std::numeric_limits<double>::infinity();
  Tensor x = from_vector(std::vector<double>{0, -inf, 0, -inf, 1e4, -1e4, 1e4, 1e4}, {2, 4});
  EXPECT_CLOSE(softmax(x, -1), from_vector(std::vector<double>{0.5, 0, 0.5, 0, 1.0 / 3, 0, 1.0 / 3, 1.0 / 3}, {2, 4}), 1e-7, 1e-6);
  const auto ls = log_softmax(x, -1).to_vector();
  EXPECT_TRUE(std::isinf(ls[1]) && ls[1] < 0);
  EXPECT_NEAR(ls[5], -2e4 - std::log(3.0), 1e-2);
  EXPECT_NEAR(ls[4], -std::log(3.0), 1e-6);
}

TEST(Softmax, LowPrecisionDtypes) {
  Generator g(4);
  Tensor x = randn({5, 37}, {}, g) * 3.0;
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor xl = x.to(dt);
    for (bool log : {false, true}) {
      Tensor y = log ? log_softmax(xl, 1) : softmax(xl, 1);
      EXPECT_EQ(y.dtype(), dt);
      // the reference sees the same rounded inputs; outputs differ by <= 1 ulp of the 16-bit type
      EXPECT_CLOSE(y, from_vector(softmax_expected(xl, 1, log), x.sizes(), TensorOptions(DType::f64)), 1e-3, 8e-3);
    }
    Tensor xg = xl.detach().requires_grad_();
    (softmax(xg, 0) * x.to(dt)).sum().backward();
    EXPECT_EQ(xg.grad().dtype(), dt);
  }
}

TEST(Softmax, FastKernelsMatchReference) {
  // f32 rows of 1..5000 columns, logits at scale 1, 30 and 1e4. Tolerances:
  //  softmax: atol 1e-7 + rtol 2e-5 (AVX-512 exp is ~2 ulp; the row sum adds ~1e-6);
  //  log_softmax: rtol 1e-6 of |y| + atol 2e-5 (|y| up to 2e4 at scale 1e4, f32 ulp 2e-3 there);
  //  backward: atol 2e-5 + rtol 1e-4.
  for (int64_t cols : {1, 2, 15, 16, 17, 100, 1024, 4999}) {
    for (double scale : {1.0, 30.0, 1e4}) {
      SCOPED_TRACE(::testing::Message() << cols << " cols, scale " << scale);
      const int64_t rows = cols > 1000 ? 3 : 40, n = rows * cols;
      const auto x = random_floats(n, 5 + cols, scale), g = random_floats(n, 6, 1.0);
      for (bool log : {false, true}) {
        std::vector<float> y(n), yr(n), dx(n), dxr(n);
        cpu::softmax_forward<float>(x.data(), y.data(), rows, cols, log);
        cpu::ref::softmax_forward<float>(x.data(), yr.data(), rows, cols, log);
        for (int64_t i = 0; i < n; ++i) {
          const double tol = log ? 2e-5 + 1e-6 * std::fabs(yr[i]) : 1e-7 + 2e-5 * std::fabs(yr[i]);
          ASSERT_NEAR(y[i], yr[i], tol) << "forward log=" << log << " element " << i;
        }
        cpu::softmax_backward<float>(g.data(), yr.data(), dx.data(), rows, cols, log);
        cpu::ref::softmax_backward<float>(g.data(), yr.data(), dxr.data(), rows, cols, log);
        for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(dx[i], dxr[i], 2e-5 + 1e-4 * std::fabs(dxr[i])) << "backward element " << i;
      }
    }
  }
}

TEST(Softmax, RowPrimitives) {
  // widen/narrow are bit-exact with the scalar conversions (incl. NaN, inf, subnormals, ties)
  std::vector<float> v = random_floats(103, 7, 100.0);
  v[0] = NAN, v[1] = INFINITY, v[2] = -INFINITY, v[3] = 1e-40f, v[4] = 1.00390625f /* bf16 tie */, v[5] = 65520.0f, v[6] = 3e-8f;
  std::vector<bfloat16> b(v.size());
  std::vector<float16> h(v.size());
  cpu::row::from_f32(v.data(), b.data(), static_cast<int64_t>(v.size()));
  cpu::row::from_f32(v.data(), h.data(), static_cast<int64_t>(v.size()));
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(b[i].bits, bfloat16(v[i]).bits) << i;
    if (!std::isnan(v[i])) { EXPECT_EQ(h[i].bits, float16(v[i]).bits) << i; }
  }
  std::vector<float> back(v.size());
  cpu::row::to_f32(b.data(), back.data(), static_cast<int64_t>(v.size()));
  for (size_t i = 7; i < v.size(); ++i) EXPECT_EQ(back[i], static_cast<float>(b[i])) << i;
  // exp: relative error vs double exp over a wide range
  std::vector<float> xs, es(2001);
  for (int i = 0; i <= 2000; ++i) xs.push_back(-100.0f + 0.094f * i);
  cpu::row::exp_shift(xs.data(), 0.0f, es.data(), 2001);
  for (int i = 0; i <= 2000; ++i) {
    const double want = std::exp(static_cast<double>(xs[i]));
    if (want > 1e-37) { EXPECT_NEAR(es[i], want, 4e-7 * want) << xs[i]; }
  }
  EXPECT_EQ(cpu::row::max(xs.data(), 2001), xs[2000]);
}

}  // namespace athanor
