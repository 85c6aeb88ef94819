// Activations (tanh, sigmoid, relu, gelu exact and tanh-approximate, silu):
// derivative conventions at
// special points, forward values vs independent std:: formulas and known
// constants, the ops' f32 results vs the reference kernels, low precision, errors.
// The f64 gradchecks over the op's registered shapes (broadcast, transposed, strided) are the
// op harness's (tests/ops/test_op_harness.cpp); this file keeps what the harness does not do.
#include <cmath>

#include "backend/cpu/activation.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
using Fn = std::function<Tensor(const Tensor&)>;
struct ActCase {
  const char* name;
  Fn fn;
  std::function<double(double)> f;   // the function, by an independent formula
  std::function<double(double)> df;  // its derivative
  cpu::Activation kind;
};
double Phi(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }
constexpr double kK = 0.7978845608028654;  // √(2/π)

const std::vector<ActCase>& cases() {
  static const std::vector<ActCase> c = {
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); },
       [](double x) { return 1.0 / (std::cosh(x) * std::cosh(x)); }, cpu::Activation::tanh},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, sig, [](double x) { return sig(x) * sig(-x); },
       cpu::Activation::sigmoid},
      {"relu", [](const Tensor& x) { return relu(x); }, [](double x) { return x > 0 ? x : 0.0; },
       [](double x) { return x > 0 ? 1.0 : 0.0; }, cpu::Activation::relu},
      {"gelu", [](const Tensor& x) { return gelu(x); }, [](double x) { return x * Phi(x); },
       [](double x) { return Phi(x) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); }, cpu::Activation::gelu},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApprox::tanh); },
       [](double x) { return 0.5 * x * (1 + std::tanh(kK * (x + 0.044715 * x * x * x))); },
       [](double x) {  // product rule on 0.5 x (1 + tanh u), u' = k (1 + 3·0.044715 x²)
         const double t = std::tanh(kK * (x + 0.044715 * x * x * x));
         return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kK * (1 + 3 * 0.044715 * x * x);
       },
       cpu::Activation::gelu_tanh},
      {"silu", [](const Tensor& x) { return silu(x); }, [](double x) { return x * sig(x); },
       [](double x) { return sig(x) + x * sig(x) * (1 - sig(x)); }, cpu::Activation::silu},
  };
  return c;
}

Tensor map(const std::function<double(double)>& f, const Tensor& x) {
  std::vector<double> v = x.to_vector();
  for (double& e : v) e = f(e);
  return from_vector(v, x.sizes(), TensorOptions(DType::f64));
}
}  // namespace

// Forward and gradient against the independent closed forms, in f64, over a wide range.
TEST(Activation, MatchesClosedFormsInDouble) {
  for (const ActCase& c : cases()) {
    SCOPED_TRACE(c.name);
    Tensor x = uniform64({2001}, -12, 12, 3);
    Tensor y = c.fn(x);
    EXPECT_CLOSE(y, map(c.f, x), 1e-14, 1e-13);  // atol: the textbook 1 + tanh u cancels for x << 0
    y.sum().backward();
    EXPECT_CLOSE(x.grad(), map(c.df, x), 1e-13, 1e-12);
  }
}

TEST(Activation, KnownValuesAndKinkConventions) {
  auto at = [](const Fn& fn, double v) {
    Tensor x = from_vector(std::vector<double>{v}, {1}, TensorOptions(DType::f64).with_requires_grad());
    Tensor y = fn(x);
    y.sum().backward();
    return std::pair<double, double>{y.to_vector()[0], x.grad().to_vector()[0]};
  };
  // gelu(1) = Phi(1) = 0.841344746068543; GPT-2's approximation gives 0.841191990607638.
  EXPECT_NEAR(at([](const Tensor& x) { return gelu(x); }, 1.0).first, 0.8413447460685429, 1e-15);
  EXPECT_NEAR(at([](const Tensor& x) { return gelu(x, GeluApprox::tanh); }, 1.0).first, 0.8411919906082768, 1e-15);
  // Derivatives at 0: relu'(0) = 0 (PyTorch's convention), gelu'(0) = silu'(0) = 1/2,
  // sigmoid'(0) = 1/4, tanh'(0) = 1.
  EXPECT_EQ(at([](const Tensor& x) { return relu(x); }, 0.0).second, 0.0);
  EXPECT_EQ(at([](const Tensor& x) { return relu(x); }, 1e-300).second, 1.0);
  EXPECT_EQ(at([](const Tensor& x) { return relu(x); }, -1e-300).second, 0.0);
  EXPECT_DOUBLE_EQ(at([](const Tensor& x) { return gelu(x); }, 0.0).second, 0.5);
  EXPECT_DOUBLE_EQ(at([](const Tensor& x) { return gelu(x, GeluApprox::tanh); }, 0.0).second, 0.5);
  EXPECT_DOUBLE_EQ(at([](const Tensor& x) { return silu(x); }, 0.0).second, 0.5);
  EXPECT_DOUBLE_EQ(at([](const Tensor& x) { return sigmoid(x); }, 0.0).second, 0.25);
  EXPECT_DOUBLE_EQ(at([](const Tensor& x) { return tanh(x); }, 0.0).second, 1.0);
  // Saturated regions: gradients vanish without NaN.
  for (const ActCase& c : cases()) {
    SCOPED_TRACE(c.name);
    const auto lo = at(c.fn, -60.0), hi = at(c.fn, 60.0);
    EXPECT_TRUE(std::isfinite(lo.first) && std::isfinite(lo.second) && std::isfinite(hi.first) && std::isfinite(hi.second));
    EXPECT_NEAR(lo.second, 0.0, 1e-12);
  }
}

// The ops on large f32 inputs (parallel, vectorized path; non-contiguous) vs the reference kernels,
// forward and backward. 2e-6 relative + 1e-6 absolute (see tests/backend/test_unary_kernels.cpp
// for the per-kernel ulp bounds).
TEST(Activation, F32OpsMatchReferenceKernels) {
  Generator g(4);
  Tensor base = mul(randn({160, 300}, {}, g), 4.0);
  Tensor w = randn({300, 160}, {}, g);
  for (const ActCase& c : cases()) {
    SCOPED_TRACE(c.name);
    Tensor x = make_noncontiguous(base);  // same values, transposed memory layout
    x.requires_grad_(true);
    ASSERT_FALSE(x.is_contiguous());
    Tensor y = c.fn(x);
    EXPECT_EQ(y.dtype(), DType::f32);
    EXPECT_CLOSE(y, cpu::ref::activation_forward(c.kind, x.detach()), 1e-6, 2e-6);
    y.backward(w.t());
    const Tensor saved = cpu::activation_backward_uses_output(c.kind) ? y.detach() : x.detach();
    EXPECT_CLOSE(x.grad(), cpu::ref::activation_backward(c.kind, saved, w.t().contiguous()), 1e-6, 1e-5);
  }
}

TEST(Activation, LowPrecisionKeepsDtypeAndDifferentiates) {
  Generator g(5);
  Tensor base = mul(randn({1000}, {}, g), 3.0);
  for (DType dt : {DType::bf16, DType::f16}) {
    for (const ActCase& c : cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      Tensor x = base.to(dt).detach().requires_grad_(true);
      Tensor y = c.fn(x);
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_CLOSE(y, c.fn(x.detach().to(DType::f32)).to(dt), 0, 0);  // f32 math, one rounding
      y.sum().backward();
      ASSERT_TRUE(x.grad().defined());
      EXPECT_EQ(x.grad().dtype(), dt);
      EXPECT_CLOSE(x.grad(), map(c.df, x.detach().to(DType::f64)), 1e-2, 1e-2);  // 16-bit gradient
    }
  }
}

TEST(Activation, ErrorsNameOpShapeAndDtype) {
  for (const ActCase& c : cases()) {
    SCOPED_TRACE(c.name);
    const std::string msg = error_message([&] { c.fn(zeros({2, 5}, TensorOptions(DType::i32))); });
    const std::string op = std::string(c.name) == "gelu_tanh" ? "gelu" : c.name;
    EXPECT_NE(msg.find(op), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 5]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("i32"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
  }
}

}  // namespace athanor
