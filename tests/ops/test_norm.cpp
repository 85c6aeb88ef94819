// layer_norm, rms_norm, batch_norm: batch_norm's gradcheck (train and eval, 4-D), forward
// against independent per-row computations, 16-bit dtypes, running statistics
// against hand-computed values, the shape errors, and layer_norm's backward adding into
// the residual stream's gradient.
// The f64 gradchecks over the op's registered shapes (broadcast, transposed, strided) are the
// op harness's (tests/ops/test_op_harness.cpp); this file keeps what the harness does not do.
#include <cmath>

#include "athanor/autograd/engine.h"
#include "athanor/ops/autocast.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
// Independent layer norm / rms norm of a [rows, cols] f64 vector.
std::vector<double> layer_norm_expected(const std::vector<double>& x, int64_t cols, const std::vector<double>& w,
                                        const std::vector<double>& b, double eps, bool rms) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / cols; ++r) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < cols; ++i) m += x[r * cols + i];
    m = rms ? 0.0 : m / cols;
    for (int64_t i = 0; i < cols; ++i) v += (x[r * cols + i] - m) * (x[r * cols + i] - m);
    v /= cols;
    for (int64_t i = 0; i < cols; ++i)
      y[r * cols + i] = (x[r * cols + i] - m) / std::sqrt(v + eps) * (w.empty() ? 1 : w[i]) + (b.empty() ? 0 : b[i]);
  }
  return y;
}
}  // namespace

// ---- layer_norm ----------------------------------------------------------------------------

TEST(LayerNorm, OnlyWeightNeedsGrad) {
  Tensor x = randn64({3, 4}, 7, false), w = uniform64({4}, 0.5, 1.5, 8);
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return layer_norm(in[0], {4}, in[1]); }, {x, w}));
}

TEST(LayerNorm, ForwardMatchesDefinition) {
  for (DType dt : {DType::f32, DType::f64}) {
    Generator g(9);
    Tensor x = randn({6, 13}, TensorOptions(dt), g) * 3.0 + 10.0, w = randn({13}, TensorOptions(dt), g), b = randn({13}, TensorOptions(dt), g);
    const auto want = layer_norm_expected(x.to_vector(), 13, w.to_vector(), b.to_vector(), 1e-5, false);
    EXPECT_CLOSE(layer_norm(x, {13}, w, b), from_vector(want, {6, 13}, TensorOptions(DType::f64)), 1e-5, 1e-5);
    const auto want_plain = layer_norm_expected(x.to_vector(), 13, {}, {}, 1e-3, false);
    EXPECT_CLOSE(layer_norm(x, {13}, Tensor(), Tensor(), 1e-3), from_vector(want_plain, {6, 13}, TensorOptions(DType::f64)), 1e-5, 1e-5);
  }
}

TEST(LayerNorm, LowPrecisionDtypes) {
  Generator g(10);
  Tensor x = randn({4, 40}, {}, g), w = randn({40}, {}, g), b = randn({40}, {}, g);
  const auto want = layer_norm_expected(x.to_vector(), 40, w.to_vector(), b.to_vector(), 1e-5, false);
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor y = layer_norm(x.to(dt), {40}, w.to(dt), b.to(dt));
    EXPECT_EQ(y.dtype(), dt);
    // inputs rounded to 16 bits, then the output: a few ulps of bf16 (2^-8) relative
    EXPECT_CLOSE(y, from_vector(want, {4, 40}, TensorOptions(DType::f64)), 0.05, 0.02);
    Tensor xg = x.to(dt).requires_grad_(), wg = w.to(dt).requires_grad_();
    layer_norm(xg, {40}, wg).sum().backward();
    EXPECT_EQ(xg.grad().dtype(), dt);
    EXPECT_EQ(wg.grad().dtype(), dt);
    EXPECT_TRUE(all_finite(xg.grad()));
  }
}

TEST(LayerNorm, ErrorsNameOpAndShapes) {
  Tensor x = zeros({2, 3});
  std::string msg = error_message([&] { layer_norm(x, {4}); });
  EXPECT_NE(msg.find("layer_norm"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  msg = error_message([&] { layer_norm(x, {2, 3, 1}); });
  EXPECT_NE(msg.find("[2, 3, 1]"), std::string::npos) << msg;
  msg = error_message([&] { layer_norm(x, {3}, ones({4})); });
  EXPECT_NE(msg.find("weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
}

// A transformer's residual stream h feeds a layer norm and the next residual add: the layer
// norm's backward adds its gradient into the one h already has (Node::take_pending_grad)
// instead of the engine summing the two in a pass of its own. Bit for bit the sum of the two
// gradients computed apart (f32, and f32 under bf16 autocast, where the backward runs from
// the saved bf16 xhat); f64 (portable loops) to rounding.
TEST(LayerNorm, TheBackwardAddsIntoTheGradientOfTheResidualStream) {
  for (DType dt : {DType::f32, DType::f64}) {
    for (bool autocast_bf16 : {false, true}) {
      if (dt == DType::f64 && autocast_bf16) continue;
      SCOPED_TRACE(std::string(dtype_name(dt)) + (autocast_bf16 ? " under bf16 autocast" : ""));
      const Tensor h0 = randn64({6, 40}, 31, false).to(dt), c1 = randn64({6, 40}, 32, false).to(dt),
                   c2 = randn64({6, 40}, 33, false).to(dt);
      const Tensor w = uniform64({40}, 0.5, 1.5, 34, false).to(dt), b = randn64({40}, 35, false).to(dt);
      auto grad_of_h = [&](bool ln_use, bool residual_use) {
        Tensor h = h0.clone().requires_grad_(true);
        Tensor loss;
        {
          autocast ac(DType::bf16, autocast_bf16);
          Tensor ln = ln_use ? sum(mul(layer_norm(h, {40}, w, b), c1)) : Tensor();  // created first: runs last
          Tensor res = residual_use ? sum(mul(h, c2)) : Tensor();
          loss = ln.defined() && res.defined() ? add(ln, res) : ln.defined() ? ln : res;
        }
        loss.backward();
        return h.grad();
      };
      const Tensor apart = add(grad_of_h(true, false), grad_of_h(false, true));
      const uint64_t before = pending_grads_taken();
      const Tensor fused = grad_of_h(true, true);
      EXPECT_EQ(pending_grads_taken() - before, 1u) << "the layer norm did not take the residual's gradient";
      if (dt == DType::f32) EXPECT_EQ(fused.to_vector(), apart.to_vector());
      else EXPECT_CLOSE(fused, apart, 1e-14, 1e-14);
    }
  }
}

// ---- rms_norm ------------------------------------------------------------------------------

TEST(RmsNorm, ForwardMatchesDefinitionAndErrors) {
  Generator g(15);
  Tensor x = randn({5, 9}, {}, g), w = randn({9}, {}, g);
  const auto want = layer_norm_expected(x.to_vector(), 9, w.to_vector(), {}, 1e-6, true);
  EXPECT_CLOSE(rms_norm(x, {9}, w), from_vector(want, {5, 9}, TensorOptions(DType::f64)), 1e-5, 1e-5);
  EXPECT_CLOSE(rms_norm(x.to(DType::bf16), {9}, w.to(DType::bf16)), from_vector(want, {5, 9}, TensorOptions(DType::f64)), 0.05, 0.02);
  const std::string msg = error_message([&] { rms_norm(x, {5}); });
  EXPECT_NE(msg.find("rms_norm"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[5, 9]"), std::string::npos) << msg;
}

// Llama's RMSNorm (HF's LlamaRMSNorm): y = x * rsqrt(mean(x^2) + eps) * weight, eps inside the
// square root, a weight and no bias, computed in f32 for bf16 inputs. Pinned by hand: with eps
// 0.25, row 1's mean square 1.3125 + 0.25 = 1.5625 = 1.25^2 gives rstd 0.8 exactly (eps outside
// the root would give 1 / (1.1456 + 0.25) = 0.7165); row 0's rstd is 1 / sqrt(7.75).
TEST(RmsNorm, LlamaDefinitionByHand) {
  const Tensor x = from_vector(std::vector<double>{1, 2, 3, 4, 0.5, -1, 0, 2}, {2, 4}, TensorOptions(DType::f64));
  const Tensor w = from_vector(std::vector<double>{1, 0.5, 2, -1}, {4}, TensorOptions(DType::f64));
  const double r0 = 0.3592106040535498;  // 1 / sqrt(7.5 + 0.25)
  const std::vector<double> want{r0, r0, 6 * r0, -4 * r0, 0.4, -0.4, 0.0, -1.6};
  const std::vector<double> got = rms_norm(x, {4}, w, 0.25).to_vector();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-15) << i;
  // bf16 x (these values are exact in bf16) with the f32 weight under autocast: the kernel reads
  // bf16 and computes and returns f32, as HF's upcast; a bf16 computation would be off by ~1e-2.
  {
    autocast ac(DType::bf16);
    const Tensor y = rms_norm(x.to(DType::bf16), {4}, w.to(DType::f32), 0.25);
    EXPECT_EQ(y.dtype(), DType::f32);
    const std::vector<double> yv = y.to_vector();
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(yv[i], want[i], 1e-6) << i;
  }
  // bf16 in and out without autocast: f32 math, rounded once (within half a bf16 ulp).
  const std::vector<double> yb = rms_norm(x.to(DType::bf16), {4}, w.to(DType::bf16), 0.25).to_vector();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(yb[i], want[i], std::fabs(want[i]) / 256 + 1e-7) << i;
}

// ---- batch_norm ----------------------------------------------------------------------------

TEST(BatchNorm, GradcheckTraining) {
  struct Case { Shape x; bool w, b; };
  for (const Case& c : {Case{{4, 3}, true, true}, Case{{3, 2, 4}, true, true}, Case{{2, 3, 2, 2}, false, false}, Case{{5, 2}, true, false}}) {
    SCOPED_TRACE(shape_str(c.x));
    const int64_t C = c.x[1];
    Tensor x = randn64(c.x, 21);
    Tensor w = c.w ? uniform64({C}, 0.5, 1.5, 22) : Tensor(), b = c.b ? randn64({C}, 23) : Tensor();
    Tensor rm = zeros({C}, DType::f64), rv = ones({C}, DType::f64);
    EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return batch_norm(in[0], rm, rv, in[1], in[2], true); }, {x, w, b}));
  }
  Tensor xn = make_noncontiguous(randn64({6, 3}, 24));
  ASSERT_FALSE(xn.is_contiguous());
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], true); },
                        {xn, uniform64({3}, 0.5, 1.5, 25), randn64({3}, 26)}));
}

TEST(BatchNorm, GradcheckEval) {
  for (const Shape& s : {Shape{4, 3}, Shape{2, 3, 5}}) {
    SCOPED_TRACE(shape_str(s));
    Tensor x = randn64(s, 27), w = uniform64({3}, 0.5, 1.5, 28), b = randn64({3}, 29);
    Tensor rm = randn64({3}, 30, false), rv = uniform64({3}, 0.5, 2.0, 31, false);
    EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return batch_norm(in[0], rm, rv, in[1], in[2], false); }, {x, w, b}));
  }
}

TEST(BatchNorm, RunningStatsMatchHandComputed) {
  // x [4, 2]: channel 0 = {1, 2, 3, 6}, channel 1 = {-1, -1, 1, 1}
  Tensor x = from_vector(std::vector<double>{1, -1, 2, -1, 3, 1, 6, 1}, {4, 2});
  // channel 0: mean 3, biased var (4 + 1 + 0 + 9) / 4 = 3.5, unbiased 14/3
  // channel 1: mean 0, biased var 1, unbiased 4/3
  Tensor rm = from_vector(std::vector<double>{1, 2}, {2}), rv = from_vector(std::vector<double>{1, 1}, {2});
  const uint64_t v0 = rm.version(), v1 = rv.version();
  Tensor w = ones({2}).requires_grad_();
  Tensor y = batch_norm(x, rm, rv, w, Tensor(), true, 0.1, 1e-5);
  EXPECT_GT(rm.version(), v0);
  EXPECT_GT(rv.version(), v1);
  EXPECT_FALSE(rm.requires_grad());
  // running = 0.9 * running + 0.1 * batch
  EXPECT_CLOSE(rm, from_vector(std::vector<double>{0.9 * 1 + 0.1 * 3, 0.9 * 2 + 0.1 * 0}, {2}), 1e-6, 1e-6);
  EXPECT_CLOSE(rv, from_vector(std::vector<double>{0.9 + 0.1 * 14.0 / 3.0, 0.9 + 0.1 * 4.0 / 3.0}, {2}), 1e-6, 1e-6);
  // normalization uses the biased variance
  const double s0 = 1 / std::sqrt(3.5 + 1e-5), s1 = 1 / std::sqrt(1 + 1e-5);
  EXPECT_CLOSE(y, from_vector(std::vector<double>{-2 * s0, -s1, -1 * s0, -s1, 0, s1, 3 * s0, s1}, {4, 2}), 1e-6, 1e-6);
  // a second step keeps averaging
  batch_norm(x, rm, rv, Tensor(), Tensor(), true, 0.5);
  EXPECT_CLOSE(rm, from_vector(std::vector<double>{0.5 * 1.2 + 0.5 * 3, 0.5 * 1.8}, {2}), 1e-6, 1e-6);
  // eval: running statistics, not the batch's; running stats untouched
  const uint64_t v2 = rm.version();
  Tensor ye = batch_norm(x, rm, rv, Tensor(), Tensor(), false);
  EXPECT_EQ(rm.version(), v2);
  const auto rmv = rm.to_vector(), rvv = rv.to_vector(), xv = x.to_vector(), yv = ye.to_vector();
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(yv[i], (xv[i] - rmv[i % 2]) / std::sqrt(rvv[i % 2] + 1e-5), 1e-6) << i;
}

TEST(BatchNorm, SpatialDimsAndLowPrecision) {
  // [N, C, L]: statistics over N and L per channel; compare with a hand loop.
  Generator g(32);
  Tensor x = randn({3, 2, 5}, {}, g) * 2.0 + 1.0;
  const auto xv = x.to_vector();
  std::vector<double> want(xv.size());
  for (int c = 0; c < 2; ++c) {
    double m = 0, v = 0;
    for (int n = 0; n < 3; ++n)
      for (int l = 0; l < 5; ++l) m += xv[(n * 2 + c) * 5 + l] / 15;
    for (int n = 0; n < 3; ++n)
      for (int l = 0; l < 5; ++l) v += std::pow(xv[(n * 2 + c) * 5 + l] - m, 2) / 15;
    for (int n = 0; n < 3; ++n)
      for (int l = 0; l < 5; ++l) want[(n * 2 + c) * 5 + l] = (xv[(n * 2 + c) * 5 + l] - m) / std::sqrt(v + 1e-5);
  }
  EXPECT_CLOSE(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true), from_vector(want, {3, 2, 5}, TensorOptions(DType::f64)), 1e-5, 1e-5);
  Tensor rm = zeros({2}), rv = ones({2});  // f32 running stats with bf16 input
  Tensor yb = batch_norm(x.to(DType::bf16), rm, rv, Tensor(), Tensor(), true);
  EXPECT_EQ(yb.dtype(), DType::bf16);
  EXPECT_CLOSE(yb, from_vector(want, {3, 2, 5}, TensorOptions(DType::f64)), 0.05, 0.02);
}

TEST(BatchNorm, Errors) {
  std::string msg = error_message([] { batch_norm(zeros({4}), Tensor(), Tensor(), Tensor(), Tensor(), true); });
  EXPECT_NE(msg.find("batch_norm"), std::string::npos) << msg;
  msg = error_message([] { batch_norm(zeros({4, 3}), zeros({2}), ones({2}), Tensor(), Tensor(), true); });
  EXPECT_NE(msg.find("running_mean"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4, 3]"), std::string::npos) << msg;
  msg = error_message([] { batch_norm(zeros({1, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true); });
  EXPECT_NE(msg.find("more than 1 value per channel"), std::string::npos) << msg;
}

}  // namespace athanor
