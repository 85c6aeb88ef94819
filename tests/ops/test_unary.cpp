// Unary ops (exp, log, sqrt, rsqrt, abs, square, pow, clamp), where, masked_fill
// and comparisons: pow's and where's broadcast gradchecks, the gradient conventions at kinks, forward values against std:: math in double,
// dtype behaviour, and the errors.
// The f64 gradchecks over the op's registered shapes (broadcast, transposed, strided) are the
// op harness's (tests/ops/test_op_harness.cpp); this file keeps what the harness does not do.
#include <cmath>
#include <limits>

#include "backend/cpu/unary.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
using Fn = std::function<Tensor(const Tensor&)>;


// f64 leaf with |values| in [0.2, 2] and alternating signs (away from kinks at 0).
Tensor positive(const Shape& s, uint64_t seed) { return uniform64(s, 0.5, 2.0, seed); }

struct UnaryCase {
  const char* name;
  Fn fn;
  std::function<double(double)> ref;  // independent std:: formula
  bool needs_positive;                // domain (0, inf), else away from 0
};
const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases = {
      {"exp", [](const Tensor& x) { return exp(x); }, [](double v) { return std::exp(v); }, false},
      {"log", [](const Tensor& x) { return log(x); }, [](double v) { return std::log(v); }, true},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](double v) { return std::sqrt(v); }, true},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double v) { return 1 / std::sqrt(v); }, true},
      {"abs", [](const Tensor& x) { return abs(x); }, [](double v) { return std::fabs(v); }, false},
      {"square", [](const Tensor& x) { return square(x); }, [](double v) { return v * v; }, false},
      {"pow 2.5", [](const Tensor& x) { return pow(x, 2.5); }, [](double v) { return std::pow(v, 2.5); }, true},
      {"pow -1.3", [](const Tensor& x) { return pow(x, -1.3); }, [](double v) { return std::pow(v, -1.3); }, true},
      {"pow 0.5", [](const Tensor& x) { return pow(x, 0.5); }, [](double v) { return std::sqrt(v); }, true},
      {"pow -0.5", [](const Tensor& x) { return pow(x, -0.5); }, [](double v) { return 1 / std::sqrt(v); }, true},
      {"pow -1", [](const Tensor& x) { return pow(x, -1.0); }, [](double v) { return 1 / v; }, false},
      {"pow 3", [](const Tensor& x) { return pow(x, 3.0); }, [](double v) { return v * v * v; }, false},
      {"pow 2", [](const Tensor& x) { return pow(x, 2.0); }, [](double v) { return v * v; }, false},
      {"pow 1", [](const Tensor& x) { return pow(x, 1.0); }, [](double v) { return v; }, false},
      {"pow 0", [](const Tensor& x) { return pow(x, 0.0); }, [](double) { return 1.0; }, false},
      {"clamp", [](const Tensor& x) { return clamp(x, -1.0, 1.1); }, [](double v) { return std::min(std::max(v, -1.0), 1.1); }, false},
      {"clamp lo only", [](const Tensor& x) { return clamp(x, -0.5, kNaN); }, [](double v) { return std::max(v, -0.5); }, false},
      {"clamp hi only", [](const Tensor& x) { return clamp(x, kNaN, 0.5); }, [](double v) { return std::min(v, 0.5); }, false},
  };
  return cases;
}

Tensor apply_ref(const std::function<double(double)>& f, const Tensor& x) {
  std::vector<double> v = x.to_vector();
  for (double& e : v) e = f(e);
  return from_vector(v, x.sizes(), TensorOptions(DType::f64));
}

// Value of the single element's gradient of sum(fn(x)) at x = v.
double grad_at(const Fn& fn, double v) {
  Tensor x = from_vector(std::vector<double>{v}, {1}, TensorOptions(DType::f64).with_requires_grad());
  fn(x).sum().backward();
  return x.grad().to_vector()[0];
}

Tensor bool_tensor(const std::vector<double>& v, const Shape& s) { return from_vector(v, s, TensorOptions(DType::boolean)); }
}  // namespace

TEST(Unary, ForwardMatchesStdMath) {
  for (const UnaryCase& c : unary_cases()) {
    SCOPED_TRACE(c.name);
    // Wider ranges than the gradchecks, incl. the values clamp cuts off.
    Tensor x = c.needs_positive ? uniform64({1000}, 1e-3, 50, 3, false) : uniform64({1000}, -5, 5, 3, false);
    EXPECT_CLOSE(c.fn(x), apply_ref(c.ref, x), 0, 1e-14);
    Tensor xf = x.to(DType::f32);
    EXPECT_EQ(c.fn(xf).dtype(), DType::f32);
    EXPECT_CLOSE(c.fn(xf), apply_ref(c.ref, xf), 1e-30, 2e-6);
    // Non-contiguous f32 input through the op equals the contiguous result.
    EXPECT_CLOSE(c.fn(make_noncontiguous(xf.reshape({25, 40}))), c.fn(xf.reshape({25, 40})), 0, 0);
  }
}

TEST(Unary, LowPrecisionKeepsDtypeAndRoundsOnce) {
  Generator g(4);
  Tensor x = randn({257}, {}, g);
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor xl = x.to(dt);
    for (auto [name, fn] : std::vector<std::pair<const char*, Fn>>{{"exp", [](const Tensor& t) { return exp(t); }},
                                                                    {"square", [](const Tensor& t) { return square(t); }},
                                                                    {"abs", [](const Tensor& t) { return abs(t); }},
                                                                    {"clamp", [](const Tensor& t) { return clamp(t, -0.3, 0.4); }},
                                                                    {"pow", [](const Tensor& t) { return pow(abs(t), 1.7); }}}) {
      SCOPED_TRACE(name);
      Tensor y = fn(xl);
      EXPECT_EQ(y.dtype(), dt);
      // The f32 result on the same (16-bit) inputs, rounded once to dt, is what we expect.
      EXPECT_CLOSE(y, fn(xl.to(DType::f32)).to(dt), 0, 0);
    }
  }
}

// ---- gradient conventions at kinks and singular points (as PyTorch)
TEST(Unary, GradientConventionsAtKinks) {
  EXPECT_EQ(grad_at([](const Tensor& x) { return abs(x); }, 0.0), 0.0);   // abs'(0) = 0
  EXPECT_EQ(grad_at([](const Tensor& x) { return abs(x); }, -2.0), -1.0);
  EXPECT_EQ(grad_at([](const Tensor& x) { return clamp(x, -1.0, 1.0); }, -1.0), 1.0);  // bounds included
  EXPECT_EQ(grad_at([](const Tensor& x) { return clamp(x, -1.0, 1.0); }, 1.0), 1.0);
  EXPECT_EQ(grad_at([](const Tensor& x) { return clamp(x, -1.0, 1.0); }, 1.5), 0.0);
  EXPECT_EQ(grad_at([](const Tensor& x) { return clamp(x, -1.0, 1.0); }, -7.0), 0.0);
  EXPECT_EQ(grad_at([](const Tensor& x) { return clamp(x, kNaN, 1.0); }, -1e30), 1.0);  // NaN lo: unbounded
  EXPECT_EQ(grad_at([](const Tensor& x) { return clamp(x, -1.0, kNaN); }, 1e30), 1.0);
  EXPECT_EQ(grad_at([](const Tensor& x) { return pow(x, 0.0); }, 0.0), 0.0);  // d x^0 = 0, not 0·x^-1
  EXPECT_EQ(grad_at([](const Tensor& x) { return pow(x, 2.0); }, 0.0), 0.0);
  EXPECT_EQ(grad_at([](const Tensor& x) { return square(x); }, -3.0), -6.0);
  EXPECT_TRUE(std::isinf(grad_at([](const Tensor& x) { return sqrt(x); }, 0.0)));  // 1/(2·0)
}

TEST(Unary, ClampForwardNaNAndBounds) {
  Tensor x = from_vector(std::vector<double>{-3, -1, 0.5, 2, kNaN, kInf, -kInf}, {7});
  EXPECT_CLOSE(clamp(x, -1.0, 1.0), from_vector(std::vector<double>{-1, -1, 0.5, 1, kNaN, 1, -1}, {7}), 0, 0);
  EXPECT_CLOSE(clamp(x, kNaN, 1.0), from_vector(std::vector<double>{-3, -1, 0.5, 1, kNaN, 1, -kInf}, {7}), 0, 0);
  EXPECT_CLOSE(clamp(x, -1.0, kNaN), from_vector(std::vector<double>{-1, -1, 0.5, 2, kNaN, kInf, -1}, {7}), 0, 0);
  EXPECT_CLOSE(clamp(x, kNaN, kNaN), x, 0, 0);
  // Integer tensors: integral bounds inside [lo, hi].
  Tensor xi = from_vector(std::vector<int64_t>{-5, -1, 0, 2, 9}, {5});
  Tensor ci = clamp(xi, -1.5, 2.5);
  EXPECT_EQ(ci.dtype(), DType::i64);
  EXPECT_EQ(ci.to_vector(), (std::vector<double>{-1, -1, 0, 2, 2}));
  EXPECT_EQ(abs(xi).to_vector(), (std::vector<double>{5, 1, 0, 2, 9}));
  EXPECT_EQ(square(xi).to_vector(), (std::vector<double>{25, 1, 0, 4, 81}));
}

// ---- pow with a tensor exponent
TEST(Unary, PowTensorGradcheckBroadcast) {
  const std::vector<std::pair<Shape, Shape>> shapes = {{{3, 4}, {3, 4}}, {{3, 4}, {4}},    {{4}, {3, 4}},
                                                       {{2, 3, 1}, {1, 4}}, {{3, 4}, {}}, {{}, {2, 3}}};
  for (auto& [sx, se] : shapes) {
    SCOPED_TRACE(shape_str(sx) + " ^ " + shape_str(se));
    Tensor x = positive(sx, 5), e = uniform64(se, -2, 2, 6);
    EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return pow(in[0], in[1]); }, {x, e}));
    // Only one side requiring grad.
    EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return pow(in[0], in[1]); }, {x, e.detach()}));
    EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return pow(in[0], in[1]); }, {x.detach(), e}));
    // Forward vs the reference kernel (std::pow in double, own broadcasting).
    EXPECT_CLOSE(pow(x, e), cpu::ref::pow(x, e), 0, 1e-15);
  }
  Tensor x = make_noncontiguous(positive({3, 5}, 7)), e = make_noncontiguous(uniform64({3, 5}, -2, 2, 8));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return pow(in[0], in[1]); }, {x, e}));
}

TEST(Unary, PowTensorGradientAtZeroBase) {
  // d x^e/de = x^e ln x, taken as 0 at x = 0 for e >= 0; d x^e/dx = e x^{e-1}, 0 where e = 0.
  Tensor x = from_vector(std::vector<double>{0, 2, 0, 3}, {4}, TensorOptions(DType::f64).with_requires_grad());
  Tensor e = from_vector(std::vector<double>{2, 3, 0, 0}, {4}, TensorOptions(DType::f64).with_requires_grad());
  Tensor y = pow(x, e);
  EXPECT_EQ(y.to_vector(), (std::vector<double>{0, 8, 1, 1}));
  y.sum().backward();
  const auto gx = x.grad().to_vector(), ge = e.grad().to_vector();
  EXPECT_EQ(gx[0], 0.0);
  EXPECT_DOUBLE_EQ(gx[1], 12.0);
  EXPECT_EQ(gx[2], 0.0);
  EXPECT_EQ(gx[3], 0.0);
  EXPECT_EQ(ge[0], 0.0);
  EXPECT_DOUBLE_EQ(ge[1], 8 * std::log(2.0));
  EXPECT_EQ(ge[2], 0.0);
  EXPECT_DOUBLE_EQ(ge[3], std::log(3.0));
}

// ---- where
TEST(Where, GradcheckBroadcastShapes) {
  struct S { Shape c, a, b; };
  const std::vector<S> shapes = {{{3, 4}, {3, 4}, {3, 4}}, {{3, 1}, {3, 4}, {4}}, {{4}, {3, 1}, {1, 4}},
                                 {{2, 3, 4}, {3, 4}, {}},  {{}, {2, 3}, {2, 3}}, {{2, 1, 4}, {3, 1}, {2, 3, 4}}};
  for (const S& s : shapes) {
    SCOPED_TRACE(shape_str(s.c) + " " + shape_str(s.a) + " " + shape_str(s.b));
    Tensor cond = gt(randn64(s.c, 9, false), 0.0);
    Tensor a = randn64(s.a, 10), b = randn64(s.b, 11);
    EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return where(cond, in[0], in[1]); }, {a, b}));
    EXPECT_CLOSE(where(cond, a, b), cpu::ref::where(cond, a, b), 0, 0);
    // u8 condition (any non-zero is true) gives the same.
    Tensor cu8 = mul(cond.to(DType::f32), 3.0).to(DType::u8);
    EXPECT_CLOSE(where(cu8, a, b), where(cond, a, b), 0, 0);
  }
  Tensor cond = gt(randn64({4, 3}, 12, false), 0.0);
  Tensor a = make_noncontiguous(randn64({4, 3}, 13)), b = make_noncontiguous(randn64({4, 3}, 14));
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return where(cond, in[0], in[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return where(make_noncontiguous(cond), in[0], in[1]); }, {a, b}));
}

TEST(Where, ValuesPromotionAndLargeInputs) {
  Tensor c = bool_tensor({1, 0, 1}, {3});
  Tensor a = from_vector(std::vector<double>{1, 2, 3}, {3}, TensorOptions(DType::bf16));
  Tensor b = from_vector(std::vector<double>{-1, -2, -3}, {3}, TensorOptions(DType::f32));
  Tensor y = where(c, a, b);
  EXPECT_EQ(y.dtype(), DType::f32);
  EXPECT_EQ(y.to_vector(), (std::vector<double>{1, -2, 3}));
  // Large f32, bf16 and i64 inputs (parallel path) vs the reference.
  Generator g(15);
  Tensor big_c = gt(randn({300, 257}, {}, g), 0.1);
  for (DType dt : {DType::f32, DType::bf16, DType::i64}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor ba = mul(randn({300, 257}, {}, g), 10.0).to(dt), bb = mul(randn({257}, {}, g), 10.0).to(dt);
    EXPECT_CLOSE(where(big_c, ba, bb), cpu::ref::where(big_c, ba, bb), 0, 0);
  }
}

TEST(Where, MaskedFillGradcheckAndValues) {
  for (auto [sx, sm] : std::vector<std::pair<Shape, Shape>>{{{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{2, 3, 4}, {3, 1}}, {{5}, {}}}) {
    SCOPED_TRACE(shape_str(sx) + " " + shape_str(sm));
    Tensor x = randn64(sx, 16);
    Tensor m = gt(randn64(sm, 17, false), 0.3);
    EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return masked_fill(in[0], m, -7.5); }, {x}));
    EXPECT_CLOSE(masked_fill(x, m, -7.5), cpu::ref::where(m, full({}, -7.5, TensorOptions(DType::f64)), x), 0, 0);
  }
  Tensor x = make_noncontiguous(randn64({4, 6}, 18));
  Tensor m = gt(randn64({4, 6}, 19, false), 0.0);
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return masked_fill(in[0], m, 2.0); }, {x}));
  // -inf fill (attention masks) in f32, and filled positions get no gradient.
  Tensor s = from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2}, TensorOptions(DType::f32).with_requires_grad());
  Tensor causal = bool_tensor({0, 1, 0, 0}, {2, 2});
  Tensor y = masked_fill(s, causal, -kInf);
  EXPECT_EQ(y.to_vector(), (std::vector<double>{1, -kInf, 3, 4}));
  masked_fill(s, causal, -kInf).backward(ones({2, 2}));
  EXPECT_EQ(s.grad().to_vector(), (std::vector<double>{1, 0, 1, 1}));
}

// ---- comparisons
TEST(Compare, ValuesBroadcastAndNoGrad) {
  Tensor a = from_vector(std::vector<double>{1, 2, kNaN, 4, -1, 0}, {2, 3}, TensorOptions(DType::f64).with_requires_grad());
  Tensor b = from_vector(std::vector<double>{1, 5, kNaN}, {3});
  Tensor e = eq(a, b);
  EXPECT_EQ(e.dtype(), DType::boolean);
  EXPECT_FALSE(e.requires_grad());
  EXPECT_EQ(e.to_vector(), (std::vector<double>{1, 0, 0, 0, 0, 0}));  // NaN != NaN
  EXPECT_CLOSE(e, cpu::ref::compare(cpu::CompareOp::eq, a, b), 0, 0);
  EXPECT_EQ(gt(a, 1.0).to_vector(), (std::vector<double>{0, 1, 0, 1, 0, 0}));
  EXPECT_EQ(lt(a, 1.0).to_vector(), (std::vector<double>{0, 0, 0, 0, 1, 1}));
  EXPECT_FALSE(gt(a, 0.0).requires_grad());
  // Mixed dtypes promote before comparing; non-contiguous and large inputs vs the reference.
  Tensor ai = from_vector(std::vector<int64_t>{1, 2, 3}, {3});
  EXPECT_EQ(eq(ai, from_vector(std::vector<double>{1, 2.5, 3}, {3})).to_vector(), (std::vector<double>{1, 0, 1}));
  Generator g(20);
  Tensor x = make_noncontiguous(randint(0, 4, {300, 200}, g).to(DType::f32)), y = randint(0, 4, {200}, g).to(DType::f32);
  EXPECT_CLOSE(eq(x, y), cpu::ref::compare(cpu::CompareOp::eq, x, y), 0, 0);
  EXPECT_CLOSE(gt(x, 1.5), cpu::ref::compare(cpu::CompareOp::gt, x, full({}, 1.5)), 0, 0);
  EXPECT_CLOSE(lt(x.to(DType::bf16), 2.0), cpu::ref::compare(cpu::CompareOp::lt, x, full({}, 2.0)), 0, 0);
}

// ---- errors name the op, the shapes/dtypes, and give a hint
TEST(UnaryErrors, MessagesNameOpShapeAndHint) {
  auto expect_msg = [](const std::function<void()>& fn, std::vector<std::string> parts) {
    const std::string msg = error_message(fn);
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
    EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
  };
  Tensor i64 = zeros({2, 3}, TensorOptions(DType::i64));
  expect_msg([&] { log(i64); }, {"log", "[2, 3]", "i64"});
  expect_msg([&] { exp(i64); }, {"exp", "[2, 3]", "i64"});
  expect_msg([&] { sqrt(i64); }, {"sqrt", "[2, 3]"});
  expect_msg([&] { pow(i64, 2.0); }, {"pow", "[2, 3]"});
  expect_msg([&] { pow(i64, zeros({3}, TensorOptions(DType::i32))); }, {"pow", "[2, 3]", "[3]"});
  expect_msg([&] { pow(zeros({2, 3}), zeros({4})); }, {"pow", "[2, 3]", "[4]"});
  expect_msg([&] { abs(zeros({2, 3}, TensorOptions(DType::boolean))); }, {"abs", "[2, 3]", "bool"});
  expect_msg([&] { where(zeros({3, 4}), zeros({3, 4}), zeros({3, 4})); }, {"where", "condition", "[3, 4]", "f32"});
  expect_msg([&] { where(bool_tensor({1, 0}, {2}), zeros({3, 4}), zeros({3, 4})); }, {"where", "[2]", "[3, 4]"});
  expect_msg([&] { masked_fill(zeros({3, 4}), zeros({3, 4}, TensorOptions(DType::i64)), 1.0); }, {"masked_fill", "mask", "i64"});
  expect_msg([&] { masked_fill(zeros({4}), bool_tensor({1, 0, 1, 0, 1, 0, 1, 0}, {2, 4}), 1.0); }, {"masked_fill", "[4]", "[2, 4]"});
  expect_msg([&] { eq(zeros({2, 3}), zeros({4})); }, {"eq", "[2, 3]", "[4]"});
}

}  // namespace athanor
