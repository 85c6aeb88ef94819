// Activations: tanh, sigmoid, relu, gelu (exact erf form and GPT-2's tanh
// approximation), silu. Each backward is the closure beside its forward and
// runs one fused kernel (cpu::activation_backward) on what the forward saved:
// the output for tanh/sigmoid/relu (their derivatives are functions of y), the
// input for gelu/silu. Kernels: src/backend/cpu/activation.{h,cpp}.
#include "athanor/ops/activation.h"

#include "backend/cpu/activation.h"
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
}  // namespace

// ---- tanh: y = tanh x
Tensor tanh(const Tensor& x) {
  Tensor y = forward_kernel(Activation::tanh, x, "tanh");
  return record("tanh", {x}, y, [ys = save(y, "result")](const Node& n, const Grads& g) {
    return Grads{backward_kernel(Activation::tanh, ys.unpack(n), g[0])};  // d tanh x/dx = 1 - y²
  });
}

// ---- sigmoid: y = 1 / (1 + e^{-x})
Tensor sigmoid(const Tensor& x) {
  Tensor y = forward_kernel(Activation::sigmoid, x, "sigmoid");
  return record("sigmoid", {x}, y, [ys = save(y, "result")](const Node& n, const Grads& g) {
    return Grads{backward_kernel(Activation::sigmoid, ys.unpack(n), g[0])};  // dy/dx = y (1 - y)
  });
}

// ---- relu: y = max(x, 0)
Tensor relu(const Tensor& x) {
  Tensor y = forward_kernel(Activation::relu, x, "relu");
  return record("relu", {x}, y, [ys = save(y, "result")](const Node& n, const Grads& g) {
    return Grads{backward_kernel(Activation::relu, ys.unpack(n), g[0])};  // dy/dx = [y > 0]; 0 at x = 0 (PyTorch)
  });
}

// ---- gelu
//   none: y = x Phi(x) = x/2 (1 + erf(x/√2))
//   tanh: y = x/2 (1 + tanh u), u = √(2/π) (x + 0.044715 x³)
Tensor gelu(const Tensor& x, GeluApprox approx) {
  const Activation a = approx == GeluApprox::tanh ? Activation::gelu_tanh : Activation::gelu;
  Tensor y = forward_kernel(a, x, "gelu");
  return record("gelu", {x}, y, [a, xs = save(x, "self")](const Node& n, const Grads& g) {
    // none: dy/dx = Phi(x) + x phi(x),  phi(x) = e^{-x²/2}/√(2π)
    // tanh: dy/dx = (1 + tanh u)/2 + x/2 (1 - tanh² u) √(2/π) (1 + 3·0.044715 x²)
    return Grads{backward_kernel(a, xs.unpack(n), g[0])};
  });
}

// ---- silu: y = x sigmoid(x)
Tensor silu(const Tensor& x) {
  Tensor y = forward_kernel(Activation::silu, x, "silu");
  return record("silu", {x}, y, [xs = save(x, "self")](const Node& n, const Grads& g) {
    return Grads{backward_kernel(Activation::silu, xs.unpack(n), g[0])};  // dy/dx = s (1 + x (1 - s)), s = sigmoid(x)
  });
}

}  // namespace athanor
