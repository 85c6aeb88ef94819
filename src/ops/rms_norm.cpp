// rms_norm: scales each row (the trailing normalized_shape dims, flattened) to
// unit root-mean-square, then applies the optional weight. No centering, no bias.
// Forward caches per-row rstd (f32; f64 for f64 inputs); backward is one fused
// pass over rows:
//   xhat = x * rstd,  dnorm = g * w
//   dx = rstd * (dnorm - xhat * mean(dnorm * xhat))
//   dw = sum_rows g * xhat
// Under autocast (rms_norm is an f32-category op) a bf16/f16 x is read directly by the
// kernel with an f32 weight and an f32 output, rather than cast to a full f32 copy
// first: the same numbers; x is saved in its own dtype and dx comes back in it.
#include "athanor/ops/norm.h"

#include <type_traits>

#include "athanor/ops/autocast.h"
#include "backend/cpu/norm.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {

bool is_lowp(DType d) { return d == DType::bf16 || d == DType::f16; }
template <class Fn> void with_lowp(const Tensor& t, Fn&& fn) {  // fn(L*) for t's 16-bit storage type
  if (t.dtype() == DType::bf16) fn(static_cast<bfloat16*>(t.raw_data()));
  else fn(static_cast<float16*>(t.raw_data()));
}

// x bf16/f16, weight f32 (or absent), y f32: see the file comment.
Tensor rms_norm_lowp_input(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, double eps) {
  const char* op = "rms_norm";
  detail::check_normalized_shape(x, normalized_shape, op);
  if (weight.defined())
    ATH_CHECK(weight.sizes() == normalized_shape, op, "weight has shape ", shape_str(weight.sizes()),
              " but normalized_shape is ", shape_str(normalized_shape), Hint{"give weight exactly the normalized_shape"});
  const int64_t cols = shape_numel(normalized_shape), rows = cols == 0 ? 0 : x.numel() / cols;
  const Tensor xc = detail::contiguous_raw(x);
  const Tensor wc = weight.defined() ? detail::contiguous_raw(weight) : Tensor();
  Tensor y = empty(x.sizes(), TensorOptions(DType::f32));
  Tensor rstd = empty({rows}, TensorOptions(DType::f32));
  if (x.numel() > 0)
    with_lowp(xc, [&](auto* xp) {
      cpu::rms_norm_forward_lowp_input(xp, wc.defined() ? wc.data_ptr<float>() : nullptr, y.data_ptr<float>(),
                                       rstd.data_ptr<float>(), rows, cols, eps);
    });
  if (!any_requires_grad({x, weight})) return y;

  SavedTensor sx = save(x, "input"), sw = weight.defined() ? save(weight, "weight") : SavedTensor();
  SavedTensor srstd = save(rstd, "rstd");
  return record(op, {x, weight}, y, [=](const Node& n, const Grads& g) {
    const Tensor xv = detail::contiguous_raw(sx.unpack(n));
    const Tensor wv = sw.defined() ? detail::contiguous_raw(sw.unpack(n)) : Tensor();
    const Tensor gy = detail::to_raw(g[0], DType::f32);
    const Tensor rv = srstd.unpack(n);
    Tensor dx = needs_grad(n, 0) ? empty(xv.sizes(), TensorOptions(xv.dtype())) : Tensor();
    Tensor dw = wv.defined() && needs_grad(n, 1) ? empty(wv.sizes(), TensorOptions(DType::f32)) : Tensor();
    if (xv.numel() == 0) {
      if (dw.defined()) dw.zero_();
    } else {
      with_lowp(xv, [&](auto* xp) {
        using L = std::remove_cv_t<std::remove_pointer_t<decltype(xp)>>;
        cpu::rms_norm_backward_lowp_input<L>(gy.data_ptr<float>(), xp, wv.defined() ? wv.data_ptr<float>() : nullptr,
                                             rv.data_ptr<float>(), dx.defined() ? static_cast<L*>(dx.raw_data()) : nullptr,
                                             dw.defined() ? dw.data_ptr<float>() : nullptr, rows, cols);
      });
    }
    return Grads{dx, dw};
  });
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, double eps) {
  const char* op = "rms_norm";
  if (autocast_enabled() && x.defined() && is_lowp(x.dtype())) {
    const Tensor w = autocast_input(weight, op);  // an f32 parameter stays as it is
    if (!w.defined() || w.dtype() == DType::f32) return rms_norm_lowp_input(x, normalized_shape, w, eps);
  }
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
