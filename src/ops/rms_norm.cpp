// rms_norm: scales each row (the trailing normalized_shape dims, flattened) to
// unit root-mean-square, then applies the optional weight. No centering, no bias.
// Forward caches per-row rstd (f32; f64 for f64 inputs); backward is one fused
// pass over rows:
//   xhat = x * rstd,  dnorm = g * w
//   dx = rstd * (dnorm - xhat * mean(dnorm * xhat))
//   dw = sum_rows g * xhat
#include "athanor/ops/norm.h"

#include "athanor/ops/autocast.h"
#include "backend/cpu/norm.h"
#include "ops/op_utils.h"

namespace athanor {

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, double eps) {
  const char* op = "rms_norm";
  if (autocast_needs_cast(op, {x, weight}))
    return rms_norm(autocast_input(x, op), normalized_shape, autocast_input(weight, op), eps);
  detail::check_floating(x, op, "x");
  detail::check_normalized_shape(x, normalized_shape, op);
  if (weight.defined()) {
    detail::check_floating(weight, op, "weight");
    detail::check_same_dtype(x, weight, op);
    ATH_CHECK(weight.sizes() == normalized_shape, op, "weight has shape ", shape_str(weight.sizes()),
              " but normalized_shape is ", shape_str(normalized_shape), Hint{"give weight exactly the normalized_shape"});
  }

  const int64_t cols = shape_numel(normalized_shape), rows = cols == 0 ? 0 : x.numel() / cols;
  const DType sdt = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor xc = detail::contiguous_raw(x);
  const Tensor wc = weight.defined() ? detail::contiguous_raw(weight) : Tensor();
  Tensor y = empty(x.sizes(), TensorOptions(x.dtype()));
  Tensor rstd = empty({rows}, TensorOptions(sdt));
  if (x.numel() > 0) {
    dispatch(x.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        using S = cpu::norm_stat_t<T>;
        cpu::rms_norm_forward<T>(static_cast<const T*>(xc.raw_data()),
                                 wc.defined() ? static_cast<const T*>(wc.raw_data()) : nullptr,
                                 static_cast<T*>(y.raw_data()), static_cast<S*>(rstd.raw_data()), rows, cols, eps);
      }
    });
  }
  if (!any_requires_grad({x, weight})) return y;

  SavedTensor sx = save(x, "input"), sw = weight.defined() ? save(weight, "weight") : SavedTensor();
  SavedTensor srstd = save(rstd, "rstd");
  return record(op, {x, weight}, y, [=](const Node& n, const Grads& g) {
    const Tensor xv = detail::contiguous_raw(sx.unpack(n));
    const Tensor wv = sw.defined() ? detail::contiguous_raw(sw.unpack(n)) : Tensor();
    const Tensor gy = detail::to_raw(g[0], xv.dtype());
    const Tensor rv = srstd.unpack(n);
    Tensor dx = needs_grad(n, 0) ? empty(xv.sizes(), TensorOptions(xv.dtype())) : Tensor();
    Tensor dw = wv.defined() && needs_grad(n, 1) ? empty(wv.sizes(), TensorOptions(wv.dtype())) : Tensor();
    if (xv.numel() == 0) {
      if (dw.defined()) dw.zero_();
    } else {
      dispatch(xv.dtype(), [&]<class T>() {
        if constexpr (is_float_type_v<T>) {
          using S = cpu::norm_stat_t<T>;
          cpu::rms_norm_backward<T>(static_cast<const T*>(gy.raw_data()), static_cast<const T*>(xv.raw_data()),
                                    wv.defined() ? static_cast<const T*>(wv.raw_data()) : nullptr,
                                    static_cast<const S*>(rv.raw_data()),
                                    dx.defined() ? static_cast<T*>(dx.raw_data()) : nullptr,
                                    dw.defined() ? static_cast<T*>(dw.raw_data()) : nullptr, rows, cols);
        }
      });
    }
    return Grads{dx, dw};
  });
}

}  // namespace athanor
