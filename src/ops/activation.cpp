// Activations: tanh, sigmoid, relu, gelu (exact erf form and GPT-2's tanh
// approximation), silu. One forward and one backward serve all five (the activation
// picks the kernel); the backward runs one fused kernel (cpu::activation_backward) on what the forward saved:
// the output for tanh/sigmoid/relu (their derivatives are functions of y), the
// input for gelu/silu. Kernels: src/backend/cpu/activation.{h,cpp}.
#include "athanor/ops/activation.h"

#include "backend/cpu/activation.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {
using cpu::Activation;

namespace {
// y = f(x) through the fast kernel (x made contiguous first).
Tensor forward_kernel(Activation a, const Tensor& x_in, const char* name) {
  detail::check_floating(x_in, name, "x");
  const Tensor x = detail::contiguous_raw(x_in);
  Tensor y = empty(x.sizes(), TensorOptions(x.dtype()));
  dispatch(x.dtype(), [&]<class T>() {
    if constexpr (is_float_type_v<T>)
      cpu::activation_forward<T>(a, static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()), x.numel());
  });
  return y;
}

// dx = g * f'(.) by the fused kernel, from the saved tensor (y or x, per activation).
Tensor backward_kernel(Activation a, const Tensor& saved_in, const Tensor& g_in) {
  if (!g_in.defined()) return Tensor();
  ATH_ASSERT(g_in.sizes() == saved_in.sizes());
  const Tensor saved = detail::contiguous_raw(saved_in);
  const Tensor g = detail::to_raw(g_in, saved.dtype());
  Tensor dx = empty(saved.sizes(), TensorOptions(saved.dtype()));
  dispatch(saved.dtype(), [&]<class T>() {
    if constexpr (is_float_type_v<T>)
      cpu::activation_backward<T>(a, static_cast<const T*>(saved.raw_data()), static_cast<const T*>(g.raw_data()),
                                  static_cast<T*>(dx.raw_data()), saved.numel());
  });
  return dx;
}

using detail::Grads;
using detail::Inputs;

// Saved for backward: the activation and what its derivative is a function of.
struct ActSaved : OpSaved {
  Activation a = Activation::relu;
  SavedTensor t;
};

// y = f(x); the derivative of tanh, sigmoid and relu is a function of y, of gelu and silu
// of x: the forward saves that one.
template <Activation A> std::vector<Tensor> act_cpu(OpCall& c) {
  const char* name = c.name();
  Activation a = A;
  if constexpr (A == Activation::gelu)
    if (c.args<GeluApprox>() == GeluApprox::tanh) a = Activation::gelu_tanh;
  Tensor y = forward_kernel(a, c.in(0), name);
  if (c.records()) {
    ActSaved& s = c.save<ActSaved>();
    s.a = a;
    const bool saves_y = A == Activation::tanh || A == Activation::sigmoid || A == Activation::relu;
    s.t = saves_y ? save(y, "result") : save(c.in(0), "self");
  }
  return {y};
}
// tanh:    dy/dx = 1 - y²
// sigmoid: dy/dx = y (1 - y)
// relu:    dy/dx = [y > 0]; 0 at x = 0 (PyTorch)
// gelu:    none: dy/dx = Phi(x) + x phi(x),  phi(x) = e^{-x²/2}/√(2π)
//          tanh: dy/dx = (1 + tanh u)/2 + x/2 (1 - tanh² u) √(2/π) (1 + 3·0.044715 x²)
// silu:    dy/dx = s (1 + x (1 - s)), s = sigmoid(x)
Grads act_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const ActSaved& s = saved.as<ActSaved>();
  return {backward_kernel(s.a, s.t.unpack(n), g[0])};
}
template <Activation A> std::vector<Tensor> act_reference(OpCall& c) {
  Activation a = A;
  if constexpr (A == Activation::gelu)
    if (c.args<GeluApprox>() == GeluApprox::tanh) a = Activation::gelu_tanh;
  return {cpu::ref::activation_forward(a, detail::ref64(c.in(0)))};
}

template <Tensor (*F)(const Tensor&)> Inputs call1(const Inputs& t) { return {F(t[0])}; }

std::vector<OpCase> gelu_cases(int scale) {
  std::vector<OpCase> out;
  for (GeluApprox approx : {GeluApprox::none, GeluApprox::tanh})
    for (OpCase& k : detail::unary_cases(scale, nullptr, -4, 4))
      out.push_back(make_case<GeluApprox>(k.label + (approx == GeluApprox::tanh ? ", tanh form" : ", erf form"), k.inputs, approx,
                                          [](const Inputs& t, const GeluApprox& a) { return Inputs{gelu(t[0], a)}; }));
  return out;
}

OpDef act_def(const char* name, ForwardFn fwd, ForwardFn ref, CasesFn cases, const char* derivative) {
  return OpDef{.name = name, .inputs = {"x"}, .category = AutocastCategory::passthrough,
               .kernels = detail::cpu_kernels(fwd, act_backward), .reference = ref, .dtypes = detail::kFloatDTypes,
               .cases = cases, .derivative = derivative, .file = "src/ops/activation.cpp"};
}
}  // namespace

namespace ops {
const OpDef& tanh_op() {
  static const OpDef d = act_def("tanh", act_cpu<Activation::tanh>, act_reference<Activation::tanh>,
                                 [](int s) { return detail::unary_cases(s, call1<tanh>, -4, 4); }, "g (1 - y^2)");
  return d;
}
const OpDef& sigmoid_op() {
  static const OpDef d = act_def("sigmoid", act_cpu<Activation::sigmoid>, act_reference<Activation::sigmoid>,
                                 [](int s) { return detail::unary_cases(s, call1<sigmoid>, -6, 6); }, "g y (1 - y)");
  return d;
}
const OpDef& relu_op() {
  // Values kept 0.05 away from the kink at 0, where the finite difference would straddle it.
  static const OpDef d = act_def("relu", act_cpu<Activation::relu>, act_reference<Activation::relu>,
                                 [](int s) { return detail::unary_cases(s, call1<relu>, -4, 4, {0.0}); }, "g [y > 0]");
  return d;
}
const OpDef& gelu_op() {
  static const OpDef d = act_def("gelu", act_cpu<Activation::gelu>, act_reference<Activation::gelu>, gelu_cases,
                                 "g (Phi(x) + x phi(x)); tanh form: its derivative");
  return d;
}
const OpDef& silu_op() {
  static const OpDef d = act_def("silu", act_cpu<Activation::silu>, act_reference<Activation::silu>,
                                 [](int s) { return detail::unary_cases(s, call1<silu>, -6, 6); }, "g s (1 + x (1 - s))");
  return d;
}
}  // namespace ops

Tensor tanh(const Tensor& x) { return call_op(ops::tanh_op(), {x}); }
Tensor sigmoid(const Tensor& x) { return call_op(ops::sigmoid_op(), {x}); }
Tensor relu(const Tensor& x) { return call_op(ops::relu_op(), {x}); }
Tensor gelu(const Tensor& x, GeluApprox approx) { return call_op(ops::gelu_op(), {x}, approx); }
Tensor silu(const Tensor& x) { return call_op(ops::silu_op(), {x}); }

}  // namespace athanor
