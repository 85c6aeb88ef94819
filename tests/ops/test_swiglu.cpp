// swiglu: the fused op against its unfused composition (linear, linear, silu, mul) forward and
// backward in f32 at sizes that take the threaded and packed GEMM paths, f64 gradchecks beyond the
// op harness's cases, autocast, and the errors.
#include "athanor/ops/autocast.h"
#include "athanor/ops/swiglu.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
Tensor composed(const Tensor& x, const Tensor& wg, const Tensor& wu) { return mul(silu(linear(x, wg)), linear(x, wu)); }
}  // namespace

TEST(Swiglu, MatchesTheCompositionForwardAndBackward) {
  Generator g(3);
  for (const Shape& xs : {Shape{4, 70, 48}, Shape{300, 64}}) {
    SCOPED_TRACE(shape_str(xs));
    const int64_t d = xs.back(), I = 40;
    const Tensor x0 = randn(xs, {}, g), wg0 = randn({I, d}, {}, g), wu0 = randn({I, d}, {}, g);
    Shape ys = xs;
    ys.back() = I;
    const Tensor w = randn(ys, {}, g);
    auto run = [&](bool fused) {
      Tensor x = x0.detach().requires_grad_(true), wg = wg0.detach().requires_grad_(true), wu = wu0.detach().requires_grad_(true);
      const Tensor y = fused ? swiglu(x, wg, wu) : composed(x, wg, wu);
      backward({y}, {w});
      return std::array<Tensor, 4>{y.detach(), x.grad(), wg.grad(), wu.grad()};
    };
    const auto f = run(true), c = run(false);
    for (int i = 0; i < 4; ++i) EXPECT_CLOSE(f[i], c[i], 1e-4, 1e-4) << "output/gradient " << i;
  }
}

TEST(Swiglu, Gradchecks) {
  // 3-D x with more rows than a GEMM micro-tile; a transposed x; I != d.
  Tensor x = randn64({2, 9, 5}, 1), wg = randn64({7, 5}, 2), wu = randn64({7, 5}, 3);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& t) { return swiglu(t[0], t[1], t[2]); }, {x, wg, wu}));
  Tensor xt = make_noncontiguous(randn64({6, 4}, 4)), wg2 = randn64({3, 4}, 5), wu2 = make_noncontiguous(randn64({3, 4}, 6));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& t) { return swiglu(t[0], t[1], t[2]); }, {xt, wg2, wu2}));
}

TEST(Swiglu, AutocastRunsInBf16WithF32WeightGradients) {
  Generator g(4);
  Tensor x = randn({16, 32}, {}, g).requires_grad_(true), wg = randn({24, 32}, {}, g).requires_grad_(true),
         wu = randn({24, 32}, {}, g).requires_grad_(true);
  Tensor y, unfused;
  {
    autocast ac(DType::bf16);
    y = swiglu(x, wg, wu);
    NoGradGuard ng;
    unfused = composed(x, wg, wu);  // the same bf16 GEMMs; silu and mul each round to bf16
  }
  EXPECT_EQ(y.dtype(), DType::bf16);
  backward({y}, {ones_like(y)});
  EXPECT_EQ(wg.grad().dtype(), DType::f32);
  EXPECT_EQ(x.grad().dtype(), DType::f32);
  EXPECT_EQ(unfused.dtype(), DType::bf16);
  EXPECT_CLOSE(y, unfused, 1e-2, 1e-2);
  // dW from the f32 accumulators (f32 master), as linear's under autocast in the composition.
  Tensor x2 = x.detach().requires_grad_(true), wg2 = wg.detach().requires_grad_(true), wu2 = wu.detach().requires_grad_(true);
  {
    autocast ac(DType::bf16);
    const Tensor y2 = composed(x2, wg2, wu2);
    backward({y2}, {ones_like(y2)});
  }
  EXPECT_CLOSE(wg.grad(), wg2.grad(), 0.1, 2e-2);
  EXPECT_CLOSE(wu.grad(), wu2.grad(), 0.1, 2e-2);
  EXPECT_CLOSE(x.grad(), x2.grad(), 0.1, 2e-2);
}

TEST(Swiglu, Errors) {
  auto expect_msg = [&](const std::function<void()>& fn, const std::vector<std::string>& parts) {
    const std::string msg = error_message(fn);
    EXPECT_NE(msg.find("swiglu"), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
  };
  const Tensor x = zeros({3, 8}), w = zeros({5, 8});
  expect_msg([&] { swiglu(x, w, zeros({6, 8})); }, {"[5, 8]", "[6, 8]", "same shape"});
  expect_msg([&] { swiglu(zeros({3, 7}), w, w); }, {"[3, 7]", "[5, 8]", "hint:"});
  expect_msg([&] { swiglu(x, zeros({5, 8, 1}), zeros({5, 8, 1})); }, {"2-D", "[5, 8, 1]"});
  expect_msg([&] { swiglu(x, w, zeros({5, 8}, DType::f64)); }, {"f64", "f32"});
}

}  // namespace athanor
