// bf16/f16 activations read and written directly by the kernels (issue 4): each op on
// 16-bit inputs is compared with the naive double reference (or with the f32 path on
// the same widened values, which is bit-identical by construction), and the allocator's
// peak shows that no full-size f32 copy of a large 16-bit input is made. layer_norm on an
// f32 activation under autocast keeps xhat in the autocast dtype for backward (half the
// bytes of x): its gradients are checked against the f32 path within that rounding.
#include <algorithm>
#include <cmath>
#include <optional>

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
#include "athanor/ops/reduction.h"
#include "athanor/ops/softmax.h"
#include "backend/cpu/isa.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
Tensor randn_as(const Shape& s, DType dt, uint64_t seed, double scale = 1.0) {
  Generator g(seed);
  return mul(randn(s, {}, g), scale).to(dt);
}
double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector()) m = std::max(m, std::fabs(v));
  return m;
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
  const std::size_t peak = peak_alloc_delta([&] { y = add(x, h); });
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
  const std::size_t peak = peak_alloc_delta([&] {
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
    const std::size_t peak = peak_alloc_delta([&] { y = gelu(x, GeluApprox::tanh); });
    ASSERT_EQ(y.dtype(), low);
    EXPECT_GE(peak, y.nbytes());
    EXPECT_LE(peak, y.nbytes() + kSlack);
    const Tensor head = slice(x, 0, 0, 4096), yh = slice(y, 0, 0, 4096);
    EXPECT_CLOSE(yh, cpu::ref::activation_forward(cpu::Activation::gelu_tanh, head), 1e-3,
                 low == DType::bf16 ? 8e-3 : 1e-3);
  }
}

// The bound depends on the level (isa.h). At the avx512 levels the bf16 tile kernels (vdpbf16ps,
// or its sums in f32 FMAs without AVX512_BF16) keep their packs in bf16 inside the slack. At
// avx2 there are no bf16 tile kernels: each thread widens the (b, h) slice it works on, its
// K^T and V (2 T D floats), and four 64 x 64 f32 tiles (scores, accumulator, q and k tiles).
// Neither makes f32 copies of the tensors themselves (3 MiB here).
TEST(LowpDirect, AttentionOnBf16MatchesReferenceWithoutF32Copies) {
  // B=2, H=4, T=512, D=64: each bf16 q/k/v is 512 KiB; f32 copies of the three would be 3 MiB.
  constexpr int64_t T = 512, D = 64;
  const Shape s{2, 4, T, D};
  const Tensor q = randn_as(s, DType::bf16, 14), k = randn_as(s, DType::bf16, 15), v = randn_as(s, DType::bf16, 16);
  const bool bf16_tiles = cpu::active_isa() != cpu::Isa::avx2;
  const std::size_t per_thread = bf16_tiles ? 0 : sizeof(float) * (2 * T * D + 4 * 64 * 64 + 4 * 64);
  note_isa(bf16_tiles ? "bf16 tile kernels" : "f32 tiles: " + std::to_string(per_thread) + " bytes of scratch per thread");
  Tensor o;
  const std::size_t peak = peak_alloc_delta([&] { o = scaled_dot_product_attention(q, k, v, true); });
  ASSERT_EQ(o.dtype(), DType::bf16);
  EXPECT_GE(peak, o.nbytes());
  EXPECT_LE(peak, o.nbytes() + std::size_t{2 * 4 * 512 * 4} + omp_get_max_threads() * per_thread + kSlack);
  EXPECT_CLOSE(o, cpu::ref::attention(q, k, v, true, 0.125), 2e-3, 8e-3);
}

TEST(LowpDirect, CrossEntropyReadsBf16LogitsUnderAutocast) {
  const int64_t N = 512, C = 1000;  // bf16 logits 1 MB; an f32 copy would be 2 MB
  Tensor logits = randn_as({N, C}, DType::bf16, 17, 3.0).requires_grad_(true);
  Generator g(18);
  Tensor target = randint(0, C, {N}, g);
  Tensor loss;
  const std::size_t peak = peak_alloc_delta([&] {
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

TEST(LowpDirect, LayerNormOnF32ActivationKeepsLowpXhatUnderAutocast) {
  // An f32 activation (the residual stream) under bf16/f16 autocast: y is the f32 path's
  // exactly; backward works from xhat rounded to the autocast dtype, so the gradients
  // match the f32 path's within that rounding. Offset 4: xhat must not lose x - mean.
  const int64_t rows = 300, cols = 193;
  const Tensor x0 = add(randn_as({rows, cols}, DType::f32, 20, 2.0), 4.0);
  const Tensor w0 = add(randn_as({cols}, DType::f32, 21, 0.2), 1.0), b0 = randn_as({cols}, DType::f32, 22, 0.2);
  const Tensor gy = randn_as({rows, cols}, DType::f32, 23);
  auto run = [&](std::optional<DType> ac_dtype) {
    Tensor x = x0.detach().requires_grad_(true), w = w0.detach().requires_grad_(true), b = b0.detach().requires_grad_(true);
    Tensor y;
    {
      std::optional<autocast> ac;
      if (ac_dtype) ac.emplace(*ac_dtype);
      y = layer_norm(x, {cols}, w, b);
    }
    sum(mul(y, gy)).backward();
    return std::vector<Tensor>{y, x.grad(), w.grad(), b.grad()};
  };
  const auto f32 = run(std::nullopt);
  for (DType low : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(low));
    const auto r = run(low);
    ASSERT_EQ(r[0].dtype(), DType::f32);
    ASSERT_EQ(r[1].dtype(), DType::f32);
    EXPECT_CLOSE(r[0], f32[0], 0.0, 0.0);
    // xhat has unit RMS; one rounding to 8 (bf16) / 11 (f16) bits perturbs each term.
    const double tol = low == DType::bf16 ? 1e-2 : 2e-3;
    const double dx_scale = max_abs(f32[1]), dw_scale = max_abs(f32[2]);
    EXPECT_CLOSE(r[1], f32[1], tol * dx_scale, 0.0);
    EXPECT_CLOSE(r[2], f32[2], tol * dw_scale, 0.0);
    EXPECT_CLOSE(r[3], f32[3], 1e-4, 1e-5);  // db does not involve xhat
  }
}

TEST(LowpDirect, LayerNormOnF32ActivationSavesHalfTheBytesUnderAutocast) {
  // x is an intermediate (add saves nothing), dropped after the call: what stays live
  // besides y is what layer_norm saved. Plain f32: x itself (8 MiB); under bf16 autocast:
  // xhat in bf16 (4 MiB) plus per-row statistics.
  const int64_t rows = 2048, cols = 1024;
  const Tensor w = ones({cols}), b = zeros({cols});
  auto held = [&](bool use_autocast) {
    Allocator& a = Allocator::cpu();
    const std::size_t before = a.stats().current_total;
    Tensor s = ones({1}).requires_grad_(true), y;
    {
      Tensor x = add(randn_as({rows, cols}, DType::f32, 24), s);
      std::optional<autocast> ac;
      if (use_autocast) ac.emplace(DType::bf16);
      y = layer_norm(x, {cols}, w, b);
    }
    return a.stats().current_total - before - y.nbytes() - s.nbytes();
  };
  const std::size_t x_bytes = 4 * rows * cols;
  EXPECT_GE(held(false), x_bytes);
  EXPECT_LE(held(true), x_bytes / 2 + kSlack);
}

TEST(LowpDirect, SoftmaxReadsLowpInputUnderAutocast) {
  // softmax/log_softmax (f32 category) on bf16/f16 x, last and non-last dim: the f32 result
  // and the gradient in x's dtype equal the cast-then-f32 composition (which the kernel
  // tests check against the naive reference) exactly, and no f32 copy of x is made.
  for (DType low : {DType::bf16, DType::f16})
    for (bool log : {false, true})
      for (int64_t dim : {int64_t{-1}, int64_t{0}}) {
        SCOPED_TRACE(std::string(dtype_name(low)) + (log ? " log_softmax" : " softmax") + " dim=" + std::to_string(dim));
        Tensor x = randn_as({67, 131}, low, 30, 4.0).requires_grad_(true);
        const Tensor gy = randn_as({67, 131}, DType::f32, 31);
        Tensor y;
        {
          autocast ac(low);
          y = log ? log_softmax(x, dim) : softmax(x, dim);
        }
        ASSERT_EQ(y.dtype(), DType::f32);
        sum(mul(y, gy)).backward();
        ASSERT_EQ(x.grad().dtype(), low);
        Tensor x32 = x.detach().to(DType::f32).requires_grad_(true);
        Tensor y32 = log ? log_softmax(x32, dim) : softmax(x32, dim);
        sum(mul(y32, gy)).backward();
        EXPECT_CLOSE(y, y32, 0.0, 0.0);
        EXPECT_CLOSE(x.grad(), x32.grad().to(low), 0.0, 0.0);
      }
  const int64_t rows = 1024, cols = 1024;  // bf16 x: 2 MiB; an f32 copy would be 4 MiB more
  const Tensor x = randn_as({rows, cols}, DType::bf16, 32);
  Tensor y;
  const std::size_t peak = peak_alloc_delta([&] {
    autocast ac(DType::bf16);
    y = softmax(x, -1);
  });
  ASSERT_EQ(y.dtype(), DType::f32);
  EXPECT_GE(peak, y.nbytes());
  EXPECT_LE(peak, y.nbytes() + kSlack) << "an f32 copy of x would add " << 4 * rows * cols << " bytes";
}

TEST(LowpDirect, RmsNormReadsLowpInputUnderAutocast) {
  const int64_t rows = 300, cols = 193;
  for (DType low : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(low));
    Tensor x = randn_as({rows, cols}, low, 40, 3.0).requires_grad_(true);
    Tensor w = add(randn_as({cols}, DType::f32, 41, 0.2), 1.0).requires_grad_(true);
    const Tensor gy = randn_as({rows, cols}, DType::f32, 42);
    Tensor y;
    {
      autocast ac(low);
      y = rms_norm(x, {cols}, w);
    }
    ASSERT_EQ(y.dtype(), DType::f32);
    sum(mul(y, gy)).backward();
    // Naive double reference on the same (exactly widened) input values.
    const auto xd = x.to_vector(), wd = w.to_vector(), gd = gy.to_vector();
    std::vector<double> yr(rows * cols), rstd(rows), dx(rows * cols), dw(cols);
    cpu::ref::rms_norm_forward<double>(xd.data(), wd.data(), yr.data(), rstd.data(), rows, cols, 1e-5);
    cpu::ref::rms_norm_backward<double>(gd.data(), xd.data(), wd.data(), rstd.data(), dx.data(), dw.data(), rows, cols);
    EXPECT_CLOSE(y, from_vector(yr, {rows, cols}), 1e-5, 1e-5);  // f32 arithmetic on exact inputs
    ASSERT_EQ(x.grad().dtype(), low);
    ASSERT_EQ(w.grad().dtype(), DType::f32);
    const double dx_tol = low == DType::bf16 ? 8e-3 : 1e-3;  // one rounding to 8 (bf16) / 11 (f16) bits
    EXPECT_CLOSE(x.grad(), from_vector(dx, {rows, cols}), 1e-4, dx_tol);
    EXPECT_CLOSE(w.grad(), from_vector(dw, {cols}), 1e-4, 1e-4);
  }
  const int64_t big_rows = 2048, big_cols = 1024;  // bf16 x: 4 MiB; an f32 copy would be 8 MiB
  const Tensor xb = randn_as({big_rows, big_cols}, DType::bf16, 43);
  const Tensor wb = ones({big_cols});
  Tensor yb;
  const std::size_t peak = peak_alloc_delta([&] {
    autocast ac(DType::bf16);
    yb = rms_norm(xb, {big_cols}, wb);
  });
  ASSERT_EQ(yb.dtype(), DType::f32);
  EXPECT_GE(peak, yb.nbytes());
  EXPECT_LE(peak, yb.nbytes() + kSlack) << "an f32 copy of x would add " << 4 * big_rows * big_cols << " bytes";
}

TEST(LowpDirect, SumAndMeanReadLowpInputUnderAutocast) {
  // sum/mean (f32 category) of bf16/f16 x over a row, a middle dim and everything: the f32
  // result equals the cast-then-f32 path within f32 summation order (the SIMD grouping
  // may differ between instantiations) and the naive double sum; the gradient, in x's
  // dtype, equals the f32 path's rounded once; no f32 copy of x is made.
  for (DType low : {DType::bf16, DType::f16})
    for (bool is_mean : {false, true})
      for (const std::vector<int64_t>& dims : {std::vector<int64_t>{-1}, std::vector<int64_t>{1}, std::vector<int64_t>{}}) {
        SCOPED_TRACE(std::string(dtype_name(low)) + (is_mean ? " mean" : " sum") + " ndims=" + std::to_string(dims.size()));
        Tensor x = randn_as({6, 35, 19}, low, 50, 2.0).requires_grad_(true);
        Tensor y;
        {
          autocast ac(low);
          y = is_mean ? mean(x, dims) : sum(x, dims);
        }
        ASSERT_EQ(y.dtype(), DType::f32);
        const Tensor gy = randn_as(y.sizes(), DType::f32, 51);
        sum(mul(y, gy)).backward();
        ASSERT_EQ(x.grad().dtype(), low);
        Tensor x32 = x.detach().to(DType::f32).requires_grad_(true);
        Tensor y32 = is_mean ? mean(x32, dims) : sum(x32, dims);
        sum(mul(y32, gy)).backward();
        EXPECT_CLOSE(y, y32, 1e-5, 1e-6);
        Tensor xd = x.detach().to(DType::f64);
        EXPECT_CLOSE(y, is_mean ? mean(xd, dims) : sum(xd, dims), 1e-4, 1e-5);
        EXPECT_CLOSE(x.grad(), x32.grad().to(low), 0.0, 0.0);
      }
  const Tensor xb = randn_as({1024, 1024}, DType::bf16, 52);  // bf16 2 MiB; an f32 copy would be 4 MiB
  Tensor yb;
  const std::size_t peak = peak_alloc_delta([&] {
    autocast ac(DType::bf16);
    yb = sum(xb, {-1});
  });
  ASSERT_EQ(yb.dtype(), DType::f32);
  EXPECT_LE(peak, yb.nbytes() + kSlack) << "an f32 copy of x would add " << 4 * 1024 * 1024 << " bytes";
}

}  // namespace athanor
