// gelu_linear(x, W, b) = linear(gelu_tanh(x), W, b) with gelu recomputed in backward:
// checked against a naive double loop (forward), the unfused composition (forward and
// gradients, f64/f32, and bf16 under autocast) (its f64 gradcheck is the op harness's), and the
// allocator: the graph keeps one [..., in] activation less than the unfused ops.
#include <cmath>

#include "athanor/core/allocator.h"
#include "athanor/ops/autocast.h"
#include "athanor/ops/gelu_linear.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
Tensor unfused(const Tensor& x, const Tensor& w, const Tensor& b) { return linear(gelu(x, GeluApprox::tanh), w, b); }

double gelu_tanh_ref(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}

// y[m, o] = b[o] + sum_i gelu(x[m, i]) w[o, i], in double from the tensors' values.
std::vector<double> naive_forward(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t in = w.size(1), out = w.size(0), M = x.numel() / in;
  const std::vector<double> xv = x.to_vector(), wv = w.to_vector(), bv = b.defined() ? b.to_vector() : std::vector<double>(out, 0.0);
  std::vector<double> y(M * out);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t o = 0; o < out; ++o) {
      double s = bv[o];
      for (int64_t i = 0; i < in; ++i) s += gelu_tanh_ref(xv[m * in + i]) * wv[o * in + i];
      y[m * out + o] = s;
    }
  return y;
}

// Forward (under bf16 autocast if asked) and the three gradients (tests/support/test_util.h).
using Result = LinearLikeResult;
Tensor fused(const Tensor& x, const Tensor& w, const Tensor& b) { return gelu_linear(x, w, b); }
}  // namespace

TEST(GeluLinear, ForwardMatchesNaiveDoubleLoop) {
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    Generator g(3);
    const Tensor x = mul(randn({2, 3, 16}, {}, g), 2.0).to(dt), w = randn({5, 16}, {}, g).to(dt), b = randn({5}, {}, g).to(dt);
    const double tol = dt == DType::f64 ? 1e-12 : 2e-5;
    EXPECT_CLOSE(gelu_linear(x, w, b), from_vector(naive_forward(x, w, b), {2, 3, 5}, TensorOptions(dt)), tol, tol);
    EXPECT_CLOSE(gelu_linear(x, w), from_vector(naive_forward(x, w, Tensor()), {2, 3, 5}, TensorOptions(dt)), tol, tol);
  }
}

TEST(GeluLinear, ForwardAndGradientsMatchUnfusedComposition) {
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    Generator g(7);
    const Tensor x = mul(randn({4, 9, 48}, {}, g), 2.0).to(dt), w = randn({24, 48}, {}, g).to(dt), b = randn({24}, {}, g).to(dt);
    const Tensor dy = randn({4, 9, 24}, {}, g).to(dt);
    const Result f = run_linear_like(fused, x, w, b, dy), u = run_linear_like(unfused, x, w, b, dy);
    const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
    EXPECT_CLOSE(f.y, u.y, tol, tol);
    EXPECT_CLOSE(f.dx, u.dx, tol, tol);
    EXPECT_CLOSE(f.dw, u.dw, tol, tol);
    EXPECT_CLOSE(f.db, u.db, tol, tol);
  }
}

TEST(GeluLinear, Bf16UnderAutocastMatchesUnfusedAndF32) {
  Generator g(11);
  const Tensor x = mul(randn({8, 16, 128}, {}, g), 1.5), w = mul(randn({64, 128}, {}, g), 0.1), b = randn({64}, {}, g);
  const Tensor dy = randn({8, 16, 64}, {}, g);
  const Result f = run_linear_like(fused, x, w, b, dy, /*bf16_autocast=*/true), u = run_linear_like(unfused, x, w, b, dy, /*bf16_autocast=*/true);
  ASSERT_EQ(f.y.dtype(), DType::bf16);  // lower_precision: x, W, b cast to bf16
  ASSERT_EQ(f.dw.dtype(), DType::f32);  // the cast is differentiable: f32 leaves get f32 gradients
  // Same roundings as the composition (gelu(x) and dy W rounded to bf16), so only GEMM
  // accumulation order may differ: within a couple of bf16 ulps.
  EXPECT_CLOSE(f.y.to(DType::f32), u.y.to(DType::f32), 2e-2, 1e-2);
  EXPECT_CLOSE(f.dx, u.dx, 2e-2, 1e-2);
  EXPECT_CLOSE(f.dw, u.dw, 2e-1, 1e-2);
  EXPECT_CLOSE(f.db, u.db, 2e-1, 1e-2);
  // And close to the f32 result within bf16's precision.
  const Result r = run_linear_like(fused, x, w, b, dy);
  EXPECT_CLOSE(f.y.to(DType::f32), r.y, 5e-2, 2e-2);
  // dW sums 128 rows of dy * gelu(x) whose operands are rounded to bf16 (2^-9 relative each):
  // the error is a few tenths on values of order 10 (0.16 measured). atol 0.25 still catches a
  // row dropped from or counted twice in the sum (a change of ~1); the former 1.0 did not.
  EXPECT_CLOSE(f.dw, r.dw, 0.25, 0);
}

TEST(GeluLinear, Bf16AutocastWritesF32ParameterGradientsFromF32Accumulators) {
  // f32 W and b under bf16 autocast are the node's inputs (no cast nodes); dW = dy^T gelu(x)
  // and db come in f32 from f32 sums, against a double loop over the bf16 operands (gelu(x)
  // rounded to bf16 by the bf16 gelu op, as the fused op rounds it). M = 512 rows: a dW
  // rounded to bf16 on the way would be off by up to 2^-9 relative.
  const int64_t M = 512, in = 32, out = 12;
  Generator g(41);
  const Tensor xb = mul(randn({M, in}, {}, g), 1.5).to(DType::bf16).requires_grad_(true);  // a bf16 activation
  Tensor w = random_leaf({out, in}, 42), b = random_leaf({out}, 43);
  const Tensor dy = randn({M, out}, {}, g).to(DType::bf16);
  Tensor y;
  {
    autocast ac(DType::bf16);
    y = gelu_linear(xb, w, b);
  }
  ASSERT_EQ(y.dtype(), DType::bf16);
  EXPECT_EQ(y.grad_fn()->next_edges[0].node->name(), "AccumulateGrad");  // x is bf16 already: no cast
  EXPECT_EQ(y.grad_fn()->next_edges[1].node->name(), "AccumulateGrad");
  EXPECT_EQ(y.grad_fn()->next_edges[2].node->name(), "AccumulateGrad");
  y.backward(dy);
  ASSERT_EQ(w.grad().dtype(), DType::f32);
  ASSERT_EQ(b.grad().dtype(), DType::f32);
  ASSERT_EQ(xb.grad().dtype(), DType::bf16);
  const std::vector<double> h = gelu(xb.detach(), GeluApprox::tanh).to(DType::f64).to_vector(),
                            dyv = dy.to(DType::f64).to_vector();
  std::vector<double> dw_ref(out * in, 0.0), db_ref(out, 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t o = 0; o < out; ++o) {
      db_ref[o] += dyv[m * out + o];
      for (int64_t i = 0; i < in; ++i) dw_ref[o * in + i] += dyv[m * out + o] * h[m * in + i];
    }
  const Tensor dw_expected = from_vector(dw_ref, {out, in});
  EXPECT_CLOSE(w.grad(), dw_expected, 1e-4, 1e-4);
  EXPECT_CLOSE(b.grad(), from_vector(db_ref, {out}), 1e-4, 1e-4);
  EXPECT_FALSE(all_close(dw_expected.to(DType::bf16).to(DType::f32), dw_expected, 1e-4, 1e-4));
  // x's gradient and y as in the bf16 composition (which casts W through cast nodes).
  const Result u = run_linear_like(unfused, xb.detach(), w.detach(), b.detach(), dy.to(DType::f32), /*bf16_autocast=*/true);
  EXPECT_CLOSE(y.to(DType::f32), u.y.to(DType::f32), 2e-2, 1e-2);
  EXPECT_CLOSE(xb.grad().to(DType::f32), u.dx.to(DType::f32), 2e-2, 1e-2);
  EXPECT_CLOSE(w.grad(), u.dw, 2e-1, 1e-2);
}

TEST(GeluLinear, FusedBackwardMatchesDoubleLoop) {
  // The backward's one pass over x (gelu and gelu' together; several parallel blocks and a
  // masked tail: 300 x 130 elements), then dx = (dy W) ⊙ gelu'(x), against double loops over
  // the stored values. bf16: dy W and dx are each rounded to bf16 (2^-9 relative each).
  auto dgelu = [](double x) {
    const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x), t = std::tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * std::sqrt(2.0 / M_PI) * (1.0 + 3 * 0.044715 * x * x);
  };
  const int64_t M = 300, in = 130, out = 40;
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    Generator g(61);
    const Tensor x0 = mul(randn({M, in}, {}, g), 1.5).to(dt), w0 = mul(randn({out, in}, {}, g), 0.2).to(dt),
                 b0 = randn({out}, {}, g).to(dt), dy = randn({M, out}, {}, g).to(dt);
    const Result f = run_linear_like(fused, x0, w0, b0, dy);
    const std::vector<double> xv = x0.to(DType::f64).to_vector(), wv = w0.to(DType::f64).to_vector(),
                              dyv = dy.to(DType::f64).to_vector();
    std::vector<double> dx_ref(M * in), dw_ref(out * in, 0.0);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t i = 0; i < in; ++i) {
        double dh = 0;
        for (int64_t o = 0; o < out; ++o) {
          dh += dyv[m * out + o] * wv[o * in + i];
          dw_ref[o * in + i] += dyv[m * out + o] * gelu_tanh_ref(xv[m * in + i]);
        }
        dx_ref[m * in + i] = dh * dgelu(xv[m * in + i]);
      }
    const double tol = dt == DType::f32 ? 1e-5 : 8e-3;
    EXPECT_CLOSE(f.dx.to(DType::f64), from_vector(dx_ref, {M, in}, TensorOptions(DType::f64)), tol, tol);
    // dW from gelu(x) rounded to x's dtype: bf16 allows the rounding of h (2^-9) and of dW.
    EXPECT_CLOSE(f.dw.to(DType::f64), from_vector(dw_ref, {out, in}, TensorOptions(DType::f64)), dt == DType::f32 ? 1e-4 : 0.1,
                 dt == DType::f32 ? 1e-5 : 1e-2);
  }
}

TEST(GeluLinear, F32RowBlocksMatchDoubleLoop) {
  // f32 computes dx and gelu(x) per block of rows, one block per thread (an odd M = 333
  // splits unevenly), and dW as (gelu(x)^T dy)^T since out < in. Against double loops: the
  // forward with and without a bias, the three gradients, and each gradient alone: dx
  // without dW (gelu(x) not kept), dW without dx (gelu(x) without the blocked pass).
  auto dgelu = [](double x) {
    const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x), t = std::tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * std::sqrt(2.0 / M_PI) * (1.0 + 3 * 0.044715 * x * x);
  };
  const int64_t M = 333, in = 1024, out = 24;
  Generator g(71);
  const Tensor x0 = mul(randn({M, in}, {}, g), 1.5), w0 = mul(randn({out, in}, {}, g), 0.1), b0 = randn({out}, {}, g),
               dy = randn({M, out}, {}, g);
  const std::vector<double> xv = x0.to_vector(), wv = w0.to_vector(), dyv = dy.to_vector();
  std::vector<double> dx_ref(M * in), dw_ref(out * in, 0.0), db_ref(out, 0.0);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t o = 0; o < out; ++o) db_ref[o] += dyv[m * out + o];
    for (int64_t i = 0; i < in; ++i) {
      double dh = 0;
      const double h = gelu_tanh_ref(xv[m * in + i]);
      for (int64_t o = 0; o < out; ++o) {
        dh += dyv[m * out + o] * wv[o * in + i];
        dw_ref[o * in + i] += dyv[m * out + o] * h;
      }
      dx_ref[m * in + i] = dh * dgelu(xv[m * in + i]);
    }
  }
  EXPECT_CLOSE(gelu_linear(x0, w0, b0), from_vector(naive_forward(x0, w0, b0), {M, out}), 1e-4, 1e-5);
  EXPECT_CLOSE(gelu_linear(x0, w0), from_vector(naive_forward(x0, w0, Tensor()), {M, out}), 1e-4, 1e-5);
  const Tensor dx_expected = from_vector(dx_ref, {M, in}), dw_expected = from_vector(dw_ref, {out, in}),
               db_expected = from_vector(db_ref, {out});
  for (int which = 0; which < 3; ++which) {  // 0: all, 1: x only, 2: W (and b) only
    SCOPED_TRACE(which);
    Tensor x = x0.detach().requires_grad_(which != 2), w = w0.detach().requires_grad_(which != 1),
           b = b0.detach().requires_grad_(which != 1);
    gelu_linear(x, w, b).backward(dy);
    if (which != 2) EXPECT_CLOSE(x.grad(), dx_expected, 1e-5, 1e-5);
    else EXPECT_FALSE(x.grad().defined());
    if (which != 1) {
      EXPECT_CLOSE(w.grad(), dw_expected, 1e-3, 1e-5);
      EXPECT_CLOSE(b.grad(), db_expected, 1e-4, 1e-5);
    } else {
      EXPECT_FALSE(w.grad().defined());
    }
  }
  // No rows: empty dx, zero dW and db.
  Tensor xe = zeros({0, in}).requires_grad_(true), we = w0.detach().requires_grad_(true), be = b0.detach().requires_grad_(true);
  gelu_linear(xe, we, be).backward(zeros({0, out}));
  EXPECT_EQ(xe.grad().sizes(), (Shape{0, in}));
  EXPECT_CLOSE(we.grad(), zeros({out, in}), 0.0, 0.0);
  EXPECT_CLOSE(be.grad(), zeros({out}), 0.0, 0.0);
}

TEST(GeluLinear, GraphKeepsOneActivationLessThanUnfused) {
  // f32 [M, in] = [256, 512]: the gelu output the unfused graph keeps is 512 KiB.
  Generator g(5);
  const Tensor x0 = randn({256, 512}, {}, g), w = random_leaf({64, 512}, 6), b = random_leaf({64}, 7);
  const std::size_t gelu_bytes = 256 * 512 * sizeof(float);
  Allocator& a = Allocator::cpu();
  auto live_and_peak = [&](Tensor (*fn)(const Tensor&, const Tensor&, const Tensor&)) {
    const ForwardActivationBytes m = linear_like_forward_activation_bytes(fn, x0, w, b);
    return std::pair<std::size_t, std::size_t>{m.live, m.peak};
  };
  const auto [fused_live, fused_peak] = live_and_peak(fused);
  const auto [unfused_live, unfused_peak] = live_and_peak(unfused);
  std::printf("activation bytes kept by the graph: fused %zu, unfused %zu; forward peak: fused %zu, unfused %zu\n", fused_live,
              unfused_live, fused_peak, unfused_peak);
  EXPECT_EQ(unfused_live - fused_live, gelu_bytes);
  EXPECT_GE(unfused_peak, fused_peak + gelu_bytes);
  // The fused forward's scratch is tagged workspace and freed before it returns.
  EXPECT_EQ(a.stats().of(MemTag::workspace), 0u);
}

TEST(GeluLinear, ErrorsNameOpAndShapes) {
  const std::string msg = error_message([] { gelu_linear(zeros({2, 5}), zeros({3, 4})); });
  EXPECT_NE(msg.find("gelu_linear"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 5]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 4]"), std::string::npos) << msg;
  EXPECT_NE(error_message([] { gelu_linear(zeros({2, 4}), zeros({3, 4}), zeros({4})); }).find("bias"), std::string::npos);
  EXPECT_NE(error_message([] { gelu_linear(zeros({2, 4}), zeros({3, 4}, TensorOptions(DType::f64))); }).find("gelu_linear"),
            std::string::npos);
}

}  // namespace athanor
