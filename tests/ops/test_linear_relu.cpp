// linear_relu(x, W, b) = relu(linear(x, W, b)), fused: checked against a naive double
// loop (forward and all three gradients, from the tensors' values), the unfused
// composition (f64/f32, bf16 under autocast) (the f64 gradcheck is the op harness's), the gradient at
// the kink, the fused backward kernel on its own (column tails, no bias, g aliasing dy),
// and the allocator (no pre-activation tensor next to y in the forward).
#include <cmath>

#include "athanor/core/allocator.h"
#include "athanor/ops/autocast.h"
#include "athanor/ops/linear_relu.h"
#include "backend/cpu/activation.h"
#include "backend/cpu/small_batch_gemm.h"
#include "backend/cpu/isa.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
Tensor unfused(const Tensor& x, const Tensor& w, const Tensor& b) { return relu(linear(x, w, b)); }
Tensor fused(const Tensor& x, const Tensor& w, const Tensor& b) { return linear_relu(x, w, b); }

// The op in double, from the tensors' values: z = x W^T + b, y = max(z, 0), and for an
// upstream dy: g = dy [z > 0], dx = g W, dW = g^T x, db = rowsum(g).
struct Reference {
  std::vector<double> y, dx, dw, db;
};
Reference naive(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy) {
  const int64_t in = w.size(1), out = w.size(0), M = x.numel() / in;
  const std::vector<double> xv = x.to_vector(), wv = w.to_vector(), dyv = dy.defined() ? dy.to_vector() : std::vector<double>(M * out, 0.0);
  const std::vector<double> bv = b.defined() ? b.to_vector() : std::vector<double>(out, 0.0);
  Reference r{std::vector<double>(M * out), std::vector<double>(M * in, 0.0), std::vector<double>(out * in, 0.0),
              std::vector<double>(out, 0.0)};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t o = 0; o < out; ++o) {
      double z = bv[o];
      for (int64_t i = 0; i < in; ++i) z += xv[m * in + i] * wv[o * in + i];
      r.y[m * out + o] = z > 0 ? z : 0.0;
      const double g = z > 0 ? dyv[m * out + o] : 0.0;
      r.db[o] += g;
      for (int64_t i = 0; i < in; ++i) {
        r.dx[m * in + i] += g * wv[o * in + i];
        r.dw[o * in + i] += g * xv[m * in + i];
      }
    }
  return r;
}

// Forward (under bf16 autocast if asked) and the three gradients (tests/support/test_util.h).
using Result = LinearLikeResult;
Tensor as(const std::vector<double>& v, const Tensor& like) { return from_vector(v, like.sizes(), TensorOptions(DType::f64)); }
}  // namespace

TEST(LinearRelu, ForwardAndGradientsMatchNaiveDoubleLoop) {
  // out = 150: more than one 128-column task of the fused backward and a 6-column tail;
  // M * out = 45,000 takes the threaded path.
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    Generator g(3);
    const Tensor x = randn({3, 100, 40}, {}, g).to(dt), w = mul(randn({150, 40}, {}, g), 0.3).to(dt), b = randn({150}, {}, g).to(dt);
    const Tensor dy = randn({3, 100, 150}, {}, g).to(dt);
    const Result f = run_linear_like(fused, x, w, b, dy);
    const Reference r = naive(x, w, b, dy);
    const double tol = dt == DType::f64 ? 1e-11 : 1e-4;
    ASSERT_EQ(f.y.sizes(), (Shape{3, 100, 150}));
    EXPECT_CLOSE(f.y.to(DType::f64), as(r.y, f.y), tol, tol);
    EXPECT_CLOSE(f.dx.to(DType::f64), as(r.dx, x), tol, tol);
    EXPECT_CLOSE(f.dw.to(DType::f64), as(r.dw, w), 10 * tol, tol);
    EXPECT_CLOSE(f.db.to(DType::f64), as(r.db, b), 10 * tol, tol);
    // About half the pre-activations are negative: the mask is really exercised.
    const std::vector<double> yv = f.y.to_vector();
    const auto zeros_count = std::count(yv.begin(), yv.end(), 0.0);
    EXPECT_GT(zeros_count, static_cast<long>(yv.size() / 4));
    EXPECT_LT(zeros_count, static_cast<long>(3 * yv.size() / 4));
  }
}

// At an MLP's batch (128 rows, in = 784) all three GEMMs take cpu::gemm's small-batch tiles
// (backend/cpu/small_batch_gemm.h), dx included, which then bypasses gemm_row_blocks.
// At the avx2 level the tiles do not exist: the same op then runs on oneDNN, and must agree
// with the naive loop all the same.
TEST(LinearRelu, AtAnMlpBatchTheSmallBatchGemmsMatchNaiveDoubleLoop) {
  for_each_isa_level([](int level) {
  const int64_t M = 128, in = 784, out = 300;
  const bool tiles = level != static_cast<int>(cpu::Isa::avx2);
  ASSERT_EQ(cpu::small_batch_gemm_applies(false, true, M, out, in, 1.0f), tiles);   // y = x W^T
  ASSERT_EQ(cpu::small_batch_gemm_applies(false, false, M, in, out, 1.0f), tiles);  // dx = g W
  ASSERT_EQ(cpu::small_batch_gemm_applies(true, false, out, in, M, 1.0f), tiles);   // dW = g^T x
  Generator g(11);
  const Tensor x = randn({M, in}, {}, g), w = mul(randn({out, in}, {}, g), 0.05), b = randn({out}, {}, g);
  const Tensor dy = randn({M, out}, {}, g);
  const Result f = run_linear_like(fused, x, w, b, dy);
  const Reference r = naive(x, w, b, dy);
  EXPECT_CLOSE(f.y.to(DType::f64), as(r.y, f.y), 1e-4, 1e-4);
  EXPECT_CLOSE(f.dx.to(DType::f64), as(r.dx, x), 1e-4, 1e-4);
  EXPECT_CLOSE(f.dw.to(DType::f64), as(r.dw, w), 1e-3, 1e-4);
  EXPECT_CLOSE(f.db.to(DType::f64), as(r.db, b), 1e-3, 1e-4);
  });
}

TEST(LinearRelu, WithoutBiasAndWithAnInputThatNeedsNoGradient) {
  // The MLP's first layer: the input batch does not require grad, so only dW and db are made.
  Generator g(4);
  const Tensor x = randn({37, 24}, {}, g), dy = randn({37, 20}, {}, g);
  Tensor w = randn({20, 24}, {}, g).requires_grad_(true), b = randn({20}, {}, g).requires_grad_(true);
  Tensor y = linear_relu(x, w, b);
  y.backward(dy);
  const Reference r = naive(x, w, b, dy);
  EXPECT_FALSE(x.grad().defined());
  EXPECT_CLOSE(w.grad().to(DType::f64), as(r.dw, w), 1e-4, 1e-4);
  EXPECT_CLOSE(b.grad().to(DType::f64), as(r.db, b), 1e-4, 1e-4);
  Tensor w2 = w.detach().requires_grad_(true);
  Tensor y2 = linear_relu(x, w2);
  EXPECT_CLOSE(y2.to(DType::f64), as(naive(x, w, Tensor(), Tensor()).y, y2), 1e-5, 1e-5);
  y2.backward(dy);
  EXPECT_CLOSE(w2.grad().to(DType::f64), as(naive(x, w, Tensor(), dy).dw, w), 1e-4, 1e-4);
}

TEST(LinearRelu, ForwardAndGradientsMatchUnfusedComposition) {
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    Generator g(7);
    const Tensor x = randn({4, 9, 48}, {}, g).to(dt), w = mul(randn({33, 48}, {}, g), 0.2).to(dt), b = randn({33}, {}, g).to(dt);
    const Tensor dy = randn({4, 9, 33}, {}, g).to(dt);
    const Result f = run_linear_like(fused, x, w, b, dy), u = run_linear_like(unfused, x, w, b, dy);
    const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
    EXPECT_CLOSE(f.y, u.y, tol, tol);
    EXPECT_CLOSE(f.dx, u.dx, tol, tol);
    EXPECT_CLOSE(f.dw, u.dw, tol, tol);
    EXPECT_CLOSE(f.db, u.db, tol, tol);
  }
}

TEST(LinearRelu, GradientAtTheKinkIsZeroLikeTheComposition) {
  // Rows of x that are 0 with a zero bias give y = 0 exactly: d relu there is 0 (PyTorch).
  Tensor x = zeros({4, 8}), w = random_leaf({6, 8}, 2), b = zeros({6});
  b.requires_grad_(true);
  x.requires_grad_(true);
  Tensor y = linear_relu(x, w, b);
  y.backward(ones({4, 6}));
  EXPECT_CLOSE(y, zeros({4, 6}), 0, 0);
  EXPECT_CLOSE(x.grad(), zeros({4, 8}), 0, 0);
  EXPECT_CLOSE(b.grad(), zeros({6}), 0, 0);
}

TEST(LinearRelu, Bf16UnderAutocastMatchesUnfusedAndF32) {
  Generator g(11);
  const Tensor x = randn({128, 96}, {}, g), w = mul(randn({160, 96}, {}, g), 0.1), b = randn({160}, {}, g);
  const Tensor dy = randn({128, 160}, {}, g);
  const Result f = run_linear_like(fused, x, w, b, dy, /*bf16_autocast=*/true), u = run_linear_like(unfused, x, w, b, dy, /*bf16_autocast=*/true);
  ASSERT_EQ(f.y.dtype(), DType::bf16);  // lower_precision: the GEMM runs on bf16 x, W, b
  ASSERT_EQ(f.dw.dtype(), DType::f32);  // f32 leaves get f32 gradients
  ASSERT_EQ(f.db.dtype(), DType::f32);
  // Same roundings as the composition for y and dx (the GEMM output to bf16; g is exact);
  // dW and db are f32 sums, never rounded to bf16.
  EXPECT_CLOSE(f.y.to(DType::f32), u.y.to(DType::f32), 1e-2, 1e-2);
  EXPECT_CLOSE(f.dx, u.dx, 2e-2, 1e-2);
  EXPECT_CLOSE(f.dw, u.dw, 5e-2, 1e-2);
  EXPECT_CLOSE(f.db, u.db, 5e-2, 1e-2);
  // The double reference on the bf16-rounded operands: y and dx within bf16's rounding,
  // dW and db (f32 out of f32 accumulators, never rounded to bf16) within f32 sums' error.
  const Tensor xb = x.to(DType::bf16), wb = w.to(DType::bf16), bb = b.to(DType::bf16), dyb = dy.to(DType::bf16);
  const Reference r = naive(xb, wb, bb, dyb);
  EXPECT_CLOSE(f.y.to(DType::f64), as(r.y, f.y), 2e-2, 1e-2);
  EXPECT_CLOSE(f.db.to(DType::f64), as(r.db, b), 1e-4, 1e-5);
  EXPECT_CLOSE(f.dw.to(DType::f64), as(r.dw, w), 1e-4, 1e-5);
}

TEST(LinearRelu, Bf16AutocastRecordsTheF32ParametersWithoutCastNodes) {
  // Under bf16 autocast the op's inputs in the graph are W and b themselves (f32), not
  // their casts; x (f32 here, the MLP's input batch) still goes through a cast node.
  Tensor x = random_leaf({8, 12}, 1), w = random_leaf({10, 12}, 2), b = random_leaf({10}, 3);
  Tensor y;
  {
    autocast ac(DType::bf16);
    y = linear_relu(x, w, b);
  }
  ASSERT_TRUE(y.grad_fn());
  ASSERT_EQ(y.grad_fn()->next_edges.size(), 3u);
  EXPECT_EQ(y.grad_fn()->next_edges[0].node->name(), "cast");
  EXPECT_EQ(y.grad_fn()->next_edges[1].node->name(), "AccumulateGrad");
  EXPECT_EQ(y.grad_fn()->next_edges[2].node->name(), "AccumulateGrad");
  // A bf16 x from a previous layer enters as it is, and an f16 region keeps the plain path.
  Tensor xb = x.detach().to(DType::bf16).requires_grad_(true);
  {
    autocast ac(DType::bf16);
    y = linear_relu(xb, w, b);
  }
  EXPECT_EQ(y.grad_fn()->next_edges[0].node->name(), "AccumulateGrad");
  y.backward(ones({8, 10}, TensorOptions(DType::bf16)));
  EXPECT_EQ(xb.grad().dtype(), DType::bf16);
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  {
    autocast ac(DType::f16);
    y = linear_relu(x, w, b);
  }
  EXPECT_EQ(y.dtype(), DType::f16);
  EXPECT_EQ(y.grad_fn()->next_edges[1].node->name(), "cast");
  EXPECT_CLOSE(y.to(DType::f32), relu(linear(x, w, b)), 2e-2, 1e-2);
}

TEST(LinearRelu, Bf16AutocastReadsTheOptimizersPersistentWeightCopy) {
  // The optimizer registers bf16 copies of the f32 weights; the op must read those (no
  // fresh cast per step). Detected with a copy that deliberately differs from cast(W).
  Tensor x = random_leaf({4, 8}, 1), w = random_leaf({6, 8}, 2);
  const Tensor copy = mul(w.detach(), 2.0).to(DType::bf16);
  autocast_set_persistent_cast(w, copy);
  Tensor y;
  {
    autocast ac(DType::bf16);
    y = linear_relu(x, w);
  }
  autocast_forget_persistent_cast(w, DType::bf16);
  EXPECT_CLOSE(y.to(DType::f32), relu(linear(x.detach(), mul(w.detach(), 2.0))), 5e-2, 2e-2);
}

TEST(LinearRelu, FusedBackwardKernelMatchesDoubleLoop) {
  // cpu::relu_backward_rowsum on its own: widths around the 16-lane and column-block edges,
  // with and without db, and g written over dy (linear_relu's scratch is separate, but the
  // kernel allows the alias).
  for (int64_t N : {1, 15, 16, 17, 255, 256, 257, 600}) {
    for (int64_t M : {1, 3, 257}) {
      SCOPED_TRACE("M " + std::to_string(M) + " N " + std::to_string(N));
      const std::vector<float> yv = random_floats(M * N, 100 + N, 1.0), dyv = random_floats(M * N, 200 + M, 1.0);
      std::vector<double> g_ref(M * N), db_ref(N, 0.0);
      for (int64_t i = 0; i < M * N; ++i) {
        g_ref[i] = yv[i] > 0 ? dyv[i] : 0.0;
        db_ref[i % N] += g_ref[i];
      }
      std::vector<float> g(M * N), db(N), g_alias = dyv;
      cpu::relu_backward_rowsum<float>(yv.data(), dyv.data(), g.data(), db.data(), M, N);
      cpu::relu_backward_rowsum<float>(yv.data(), g_alias.data(), g_alias.data(), nullptr, M, N);
      for (int64_t i = 0; i < M * N; ++i) {
        ASSERT_EQ(g[i], g_ref[i]) << i;
        ASSERT_EQ(g_alias[i], g_ref[i]) << i;
      }
      for (int64_t j = 0; j < N; ++j) ASSERT_NEAR(db[j], db_ref[j], 1e-5 * (1 + M)) << j;
      // bf16: g exact, db the f32 sum.
      std::vector<bfloat16> yb(M * N), dyb(M * N), gb(M * N);
      std::vector<float> dbb(N);
      std::vector<double> dbb_ref(N, 0.0);
      for (int64_t i = 0; i < M * N; ++i) {
        yb[i] = bfloat16(yv[i]);
        dyb[i] = bfloat16(dyv[i]);
        if (float(yb[i]) > 0) dbb_ref[i % N] += float(dyb[i]);
      }
      cpu::relu_backward_rowsum<bfloat16>(yb.data(), dyb.data(), gb.data(), dbb.data(), M, N);
      for (int64_t i = 0; i < M * N; ++i) ASSERT_EQ(float(gb[i]), float(yb[i]) > 0 ? float(dyb[i]) : 0.0f) << i;
      for (int64_t j = 0; j < N; ++j) ASSERT_NEAR(dbb[j], dbb_ref[j], 1e-5 * (1 + M)) << j;
    }
  }
}

TEST(LinearRelu, ForwardPeakHoldsNoPreActivationTensor) {
  // f32 [M, out] = [256, 512]: the unfused forward has linear's output and relu's output
  // alive at once; the fused one writes y only. Both graphs keep x, W and y.
  Generator g(5);
  const Tensor x0 = randn({256, 64}, {}, g), w = random_leaf({512, 64}, 6), b = random_leaf({512}, 7);
  const std::size_t y_bytes = 256 * 512 * sizeof(float);
  Allocator& a = Allocator::cpu();
  auto live_and_peak = [&](Tensor (*fn)(const Tensor&, const Tensor&, const Tensor&)) {
    const ForwardActivationBytes m = linear_like_forward_activation_bytes(fn, x0, w, b);
    return std::pair<std::size_t, std::size_t>{m.live, m.peak};
  };
  const auto [fused_live, fused_peak] = live_and_peak(fused);
  const auto [unfused_live, unfused_peak] = live_and_peak(unfused);
  EXPECT_EQ(fused_live, y_bytes);
  EXPECT_EQ(unfused_live, y_bytes);
  EXPECT_EQ(fused_peak, y_bytes);
  EXPECT_GE(unfused_peak, fused_peak + y_bytes);
  // The backward's g is tagged workspace and freed before the backward returns.
  Tensor x = x0.detach().requires_grad_(true);
  linear_relu(x, w, b).backward(ones({256, 512}));
  EXPECT_EQ(a.stats().of(MemTag::workspace), 0u);
}

TEST(LinearRelu, ErrorsNameOpAndShapes) {
  const std::string msg = error_message([] { linear_relu(zeros({2, 5}), zeros({3, 4})); });
  EXPECT_NE(msg.find("linear_relu"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 5]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 4]"), std::string::npos) << msg;
  EXPECT_NE(error_message([] { linear_relu(zeros({2, 4}), zeros({3, 4}), zeros({4})); }).find("bias"), std::string::npos);
  EXPECT_NE(error_message([] { linear_relu(zeros({2, 4}), zeros({3, 4}, TensorOptions(DType::f64))); }).find("linear_relu"),
            std::string::npos);
  EXPECT_NE(error_message([] { linear_relu(zeros({2, 4}, TensorOptions(DType::i64)), zeros({3, 4})); }).find("linear_relu"),
            std::string::npos);
}

}  // namespace athanor
