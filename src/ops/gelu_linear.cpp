// gelu_linear(x, W, b) = linear(gelu_tanh(x), W, b), the second half of a GPT MLP,
// fused so that gelu(x) is never kept (llm.c's GELU recompute):
//
//   forward   h = gelu(x)              scratch (MemTag::workspace), freed after the GEMM
//             y = h W^T + b           one GEMM, the bias in its epilogue
//   backward  h = gelu(x)              recomputed into scratch for the weight gradient
//             dW = dy^T h,  db = rowsum(dy)
//             dx = (dy W) ⊙ gelu'(x)   the chain rule through the GEMM, then the activation
//
// Only x (and W) are saved, so against the unfused gelu + linear the graph holds one
// [..., in] tensor less per call. Every step rounds where the unfused composition rounds
// (gelu(x) to x's dtype, dy W to x's dtype), so the results equal the composition's.
#include "athanor/ops/gelu_linear.h"

#include "athanor/ops/autocast.h"
#include "backend/cpu/activation.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/reduce.h"
#include "backend/cpu/workspace.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {
constexpr const char* kOp = "gelu_linear";
constexpr cpu::Activation kGelu = cpu::Activation::gelu_tanh;

void check_args(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  detail::check_linear_args(x, weight, bias, kOp,
                            "gelu_linear(x, W, b) is linear(gelu(x), W, b): x's last dim is W's in_features (4 n_embd in a GPT MLP)");
}
using detail::gemm_t;
}  // namespace

Tensor gelu_linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (autocast_needs_cast(kOp, {x, weight, bias}))
    return gelu_linear(autocast_input(x, kOp), autocast_input(weight, kOp), autocast_input(bias, kOp));
  check_args(x, weight, bias);
  const int64_t in = weight.size(1), out_f = weight.size(0), M = x.numel() / std::max<int64_t>(in, 1);
  const Tensor xc = detail::contiguous_raw(x), wc = detail::contiguous_raw(weight);
  Shape out_shape = x.sizes();
  out_shape.back() = out_f;
  Tensor y = empty(out_shape, TensorOptions(x.dtype()));
  dispatch(x.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
      const cpu::Workspace h(static_cast<std::size_t>(M * in) * sizeof(T));  // gelu(x), dropped after the GEMM
      cpu::activation_forward<T>(kGelu, static_cast<const T*>(xc.raw_data()), h.as<T>(), M * in);
      const Tensor bc = bias.defined() ? detail::contiguous_raw(bias) : Tensor();
      detail::linear_gemm_t<T>(M, out_f, in, h.as<T>(), static_cast<const T*>(wc.raw_data()),
                               bc.defined() ? static_cast<const T*>(bc.raw_data()) : nullptr, static_cast<T*>(y.raw_data()));
    }
  });
  if (!any_requires_grad({x, weight, bias})) return y;
  SavedTensor sx = save(xc, "input"), sw = save(wc, "weight");
  return record(kOp, {x, weight, bias}, y, [sx, sw, in, out_f, M](const Node& n, const Grads& g) {
    const Tensor xv = sx.unpack(n), wv = sw.unpack(n);
    const Tensor dy = detail::to_raw(g[0], xv.dtype());
    Tensor dx, dw, db;
    dispatch(dy.dtype(), [&]<class T>() {
      if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
        const T* pdy = static_cast<const T*>(dy.raw_data());
        const T* px = static_cast<const T*>(xv.raw_data());
        if (needs_grad(n, 1)) {  // dW = dy^T gelu(x)     [out, M] @ [M, in], gelu(x) recomputed
          const cpu::Workspace h(static_cast<std::size_t>(M * in) * sizeof(T));
          cpu::activation_forward<T>(kGelu, px, h.as<T>(), M * in);
          dw = empty(wv.sizes(), TensorOptions(dy.dtype()));
          gemm_t<T>(true, false, out_f, in, M, pdy, out_f, h.as<T>(), in, 0.0f, static_cast<T*>(dw.raw_data()), in);
        }
        if (needs_grad(n, 2)) {  // db = sum over rows of dy
          db = empty({out_f}, TensorOptions(dy.dtype()));
          cpu::sum_3d<T>(pdy, static_cast<T*>(db.raw_data()), 1, M, out_f);
        }
        if (needs_grad(n, 0)) {  // dh = dy W  [M, out] @ [out, in]; then dx = dh ⊙ gelu'(x) in place
          dx = empty(xv.sizes(), TensorOptions(dy.dtype()));
          T* pdx = static_cast<T*>(dx.raw_data());
          gemm_t<T>(false, false, M, in, out_f, pdy, out_f, static_cast<const T*>(wv.raw_data()), in, 0.0f, pdx, in);
          // The activation kernel is elementwise (reads g[i], writes dx[i]), so g and dx may alias.
          cpu::activation_backward<T>(kGelu, px, pdx, pdx, M * in);
        }
      }
    });
    return Grads{dx, dw, db};
  });
}

}  // namespace athanor
