// bf16/f16 activations read and written directly by the kernels (issue 4): each op on
// 16-bit inputs is compared with the naive double reference (or with the f32 path on
// the same widened values, which is bit-identical by construction), and the allocator's
// peak shows that no full-size f32 copy of a large 16-bit input is made.
#include "backend/cpu/activation.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/binary.h"
#include "backend/cpu/norm.h"
#include "athanor/core/allocator.h"
#include "athanor/ops/activation.h"
#include "athanor/ops/attention.h"
#include "athanor/ops/autocast.h"
#include "athanor/ops/loss.h"
#include "athanor/ops/norm.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
// Bytes a call allocates on top of what is live before it (high-water mark).
template <class Fn> std::size_t peak_delta(Fn&& fn) {
  Allocator& a = Allocator::cpu();
  const std::size_t before = a.stats().current_total;
  a.reset_peak();
  fn();
  return a.stats().peak_total - before;
}
Tensor randn_as(const Shape& s, DType dt, uint64_t seed, double scale = 1.0) {
  Generator g(seed);
  return mul(randn(s, {}, g), scale).to(dt);
}
constexpr std::size_t kSlack = 256 * 1024;  // per-thread row/tile scratch, small tensors
}  // namespace

TEST(LowpDirect, MixedBinaryMatchesReferenceExactly) {
  // f32 op bf16/f16 (either order), same shape: each result is one correctly rounded f32
  // operation on exactly widened inputs, so the double reference rounded to f32 is equal.
  for (DType low : {DType::bf16, DType::f16})
    for (int64_t n : {int64_t{37}, int64_t{100003}}) {  // masked tail; parallel blocks
      const Tensor f = randn_as({n}, DType::f32, 1), l = add(randn_as({n}, DType::f32, 2), 1.5).to(low);
      for (auto op : {cpu::BinaryOp::add, cpu::BinaryOp::sub, cpu::BinaryOp::mul, cpu::BinaryOp::div}) {
        SCOPED_TRACE(std::string(dtype_name(low)) + " n=" + std::to_string(n) + " op=" + std::to_string(int(op)));
        const auto run = [&](const Tensor& a, const Tensor& b) {
          switch (op) {
            case cpu::BinaryOp::add: return add(a, b);
            case cpu::BinaryOp::sub: return sub(a, b);
            case cpu::BinaryOp::mul: return mul(a, b);
            default: return div(a, b);
          }
        };
        for (bool low_first : {false, true}) {
          const Tensor a = low_first ? l : f, b = low_first ? f : l;
          const Tensor y = run(a, b);
          ASSERT_EQ(y.dtype(), DType::f32);
          EXPECT_CLOSE(y, cpu::ref::binary(op, a, b), 0.0, 0.0);
        }
      }
    }
}

TEST(LowpDirect, MixedBinaryMakesNoF32CopyAndGradientsFlow) {
  const int64_t n = int64_t{1} << 20;
  const Tensor x = randn_as({n}, DType::f32, 3), h = randn_as({n}, DType::bf16, 4);
  Tensor y;
  const std::size_t peak = peak_delta([&] { y = add(x, h); });
  EXPECT_GE(peak, y.nbytes());
  EXPECT_LE(peak, y.nbytes() + kSlack) << "a widened copy of the bf16 operand would add " << 4 * n << " bytes";
  // Backward through the mixed op: the bf16 input gets its gradient in bf16, equal to the
  // f32 path's gradient rounded once.
  Tensor xs = randn_as({64, 33}, DType::f32, 5).requires_grad_(true);
  Tensor hs = randn_as({64, 33}, DType::bf16, 6).requires_grad_(true);
  Tensor w = randn_as({64, 33}, DType::f32, 7);
  sum(mul(mul(xs, hs), w)).backward();
  Tensor hs32 = hs.detach().to(DType::f32).requires_grad_(true);
  Tensor xs2 = xs.detach().requires_grad_(true);
  sum(mul(mul(xs2, hs32), w)).backward();
  ASSERT_EQ(hs.grad().dtype(), DType::bf16);
  EXPECT_CLOSE(hs.grad(), hs32.grad().to(DType::bf16), 0.0, 0.0);
  EXPECT_CLOSE(xs.grad(), xs2.grad(), 0.0, 0.0);
}

TEST(LowpDirect, LayerNormReadsLowpInputUnderAutocast) {
  const int64_t rows = 300, cols = 193;
  for (DType low : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(low));
    Tensor x = randn_as({rows, cols}, low, 8, 3.0).requires_grad_(true);
    Tensor w = add(randn_as({cols}, DType::f32, 9, 0.2), 1.0).requires_grad_(true);
    Tensor b = randn_as({cols}, DType::f32, 10, 0.2).requires_grad_(true);
    Tensor gy = randn_as({rows, cols}, DType::f32, 11);
    Tensor y;
    {
      autocast ac(low);
      y = layer_norm(x, {cols}, w, b);
    }
    ASSERT_EQ(y.dtype(), DType::f32);
    sum(mul(y, gy)).backward();
    // Naive double reference on the same (exactly widened) input values.
    const auto xd = x.to_vector(), wd = w.to_vector(), bd = b.to_vector(), gd = gy.to_vector();
    std::vector<double> yr(rows * cols), mean(rows), rstd(rows), dx(rows * cols), dw(cols), db(cols);
    cpu::ref::layer_norm_forward<double>(xd.data(), wd.data(), bd.data(), yr.data(), mean.data(), rstd.data(), rows,
                                         cols, 1e-5);
    cpu::ref::layer_norm_backward<double>(gd.data(), xd.data(), wd.data(), mean.data(), rstd.data(), dx.data(),
                                          dw.data(), db.data(), rows, cols);
    EXPECT_CLOSE(y, from_vector(yr, {rows, cols}), 1e-5, 1e-5);  // f32 arithmetic on exact inputs
    ASSERT_EQ(x.grad().dtype(), low);
    const double dx_tol = low == DType::bf16 ? 8e-3 : 1e-3;  // one rounding to 8 (bf16) / 11 (f16) bits
    EXPECT_CLOSE(x.grad(), from_vector(dx, {rows, cols}), 1e-4, dx_tol);
    EXPECT_CLOSE(w.grad(), from_vector(dw, {cols}), 1e-4, 1e-4);
    EXPECT_CLOSE(b.grad(), from_vector(db, {cols}), 1e-4, 1e-4);
  }
}

TEST(LowpDirect, LayerNormMakesNoF32CopyOfLargeInput) {
  const int64_t rows = 2048, cols = 1024;  // bf16 x: 4 MiB; an f32 copy would be 8 MiB
  Tensor x = randn_as({rows, cols}, DType::bf16, 12);
  Tensor w = ones({cols}), b = zeros({cols});
  Tensor y;
  const std::size_t peak = peak_delta([&] {
    autocast ac(DType::bf16);
    y = layer_norm(x, {cols}, w, b);
  });
  ASSERT_EQ(y.dtype(), DType::f32);
  EXPECT_GE(peak, y.nbytes());
  EXPECT_LE(peak, y.nbytes() + kSlack) << "an f32 copy of x would add " << 4 * rows * cols << " bytes";
}

TEST(LowpDirect, GeluOnLowpMatchesReferenceWithoutF32Copy) {
  for (DType low : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(low));
    const Tensor x = randn_as({1 << 20}, low, 13, 2.0);
    Tensor y;
    const std::size_t peak = peak_delta([&] { y = gelu(x, GeluApprox::tanh); });
    ASSERT_EQ(y.dtype(), low);
    EXPECT_GE(peak, y.nbytes());
    EXPECT_LE(peak, y.nbytes() + kSlack);
    const Tensor head = slice(x, 0, 0, 4096), yh = slice(y, 0, 0, 4096);
    EXPECT_CLOSE(yh, cpu::ref::activation_forward(cpu::Activation::gelu_tanh, head), 1e-3,
                 low == DType::bf16 ? 8e-3 : 1e-3);
  }
}

TEST(LowpDirect, AttentionOnBf16MatchesReferenceWithoutF32Copies) {
  // B=2, H=4, T=512, D=64: each bf16 q/k/v is 512 KiB; f32 copies of the three would be 3 MiB.
  const Shape s{2, 4, 512, 64};
  const Tensor q = randn_as(s, DType::bf16, 14), k = randn_as(s, DType::bf16, 15), v = randn_as(s, DType::bf16, 16);
  Tensor o;
  const std::size_t peak = peak_delta([&] { o = scaled_dot_product_attention(q, k, v, true); });
  ASSERT_EQ(o.dtype(), DType::bf16);
  EXPECT_GE(peak, o.nbytes());
  EXPECT_LE(peak, o.nbytes() + std::size_t{2 * 4 * 512 * 4} + kSlack);
  EXPECT_CLOSE(o, cpu::ref::attention(q, k, v, true, 0.125), 2e-3, 8e-3);
}

TEST(LowpDirect, CrossEntropyReadsBf16LogitsUnderAutocast) {
  const int64_t N = 512, C = 1000;  // bf16 logits 1 MB; an f32 copy would be 2 MB
  Tensor logits = randn_as({N, C}, DType::bf16, 17, 3.0).requires_grad_(true);
  Generator g(18);
  Tensor target = randint(0, C, {N}, g);
  Tensor loss;
  const std::size_t peak = peak_delta([&] {
    autocast ac(DType::bf16);
    loss = cross_entropy(logits, target, -100, 0.1);
  });
  ASSERT_EQ(loss.dtype(), DType::f32);
  EXPECT_LT(peak, std::size_t(2 * N * C) / 2) << "no full-size copy of the logits";
  loss.backward();
  ASSERT_EQ(logits.grad().dtype(), DType::bf16);
  // The f32 path on the widened logits (which the kernel tests check against the naive
  // reference) computes exactly the same numbers; dlogits rounds once to bf16.
  Tensor l32 = logits.detach().to(DType::f32).requires_grad_(true);
  Tensor loss32 = cross_entropy(l32, target, -100, 0.1);
  loss32.backward();
  EXPECT_CLOSE(loss, loss32, 0.0, 0.0);
  EXPECT_CLOSE(logits.grad(), l32.grad().to(DType::bf16), 0.0, 0.0);
}

}  // namespace athanor
