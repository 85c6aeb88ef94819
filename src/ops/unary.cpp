// Unary elementwise ops (exp, log, sqrt, rsqrt, abs, square, pow, clamp) and
// comparisons (eq, gt, lt); each backward is the closure beside its forward.
// Kernels: src/backend/cpu/unary.{h,cpp}. where / masked_fill: src/ops/where.cpp.
//
// Invariants: outputs are new contiguous tensors of the input's dtype
// (comparisons: bool); non-contiguous inputs are made contiguous before the
// kernel; floating-only ops raise an Error naming the op and the tensor on
// integer/bool inputs. Backward closures run with grad mode off and are built
// from differentiable ops (mul, div, pow, …) or, where a mask is needed, from a
// fused kernel (abs, clamp).
#include "athanor/ops/elementwise.h"
#include "athanor/ops/shape.h"
#include "backend/cpu/unary.h"
#include "ops/op_utils.h"

namespace athanor {
using cpu::CompareOp;
using cpu::UnaryOp;

namespace {
bool is_float_or_int(DType dt) { return dt != DType::boolean; }

// out = op(x) through the fast kernel. `allow_int`: abs and square also take i32/i64/u8.
Tensor unary_kernel(UnaryOp op, const Tensor& x_in, bool allow_int) {
  const char* name = cpu::unary_op_name(op);
  if (allow_int) {
    detail::check_defined(x_in, name, "x");
    ATH_CHECK(is_float_or_int(x_in.dtype()), name, "argument 'x' must be a number tensor, got ", x_in.describe(),
              Hint{"convert the bool tensor with .to(DType::f32) first"});
  } else {
    detail::check_floating(x_in, name, "x");
  }
  const Tensor x = detail::contiguous_raw(x_in);
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype()));
  dispatch(x.dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, bool>) {
      ATH_ASSERT(false);
    } else {
      cpu::unary<T>(op, static_cast<const T*>(x.raw_data()), static_cast<T*>(out.raw_data()), x.numel());
    }
  });
  return out;
}

// Runs a fused backward kernel kernel(x, g, out) on contiguous buffers of x's dtype.
template <class Kernel> Tensor fused_grad(const Tensor& x_saved, const Tensor& g, const Kernel& kernel) {
  ATH_ASSERT(g.sizes() == x_saved.sizes());
  const Tensor x = detail::contiguous_raw(x_saved);
  const Tensor gc = detail::to_raw(g, x.dtype());
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype()));
  dispatch(x.dtype(), [&]<class T>() {
    if constexpr (is_float_type_v<T>) {
      kernel(static_cast<const T*>(x.raw_data()), static_cast<const T*>(gc.raw_data()), static_cast<T*>(out.raw_data()), x.numel());
    } else {
      ATH_ASSERT(false);
    }
  });
  return out;
}

Tensor zero_like_scalar(const Tensor& t) { return scalar_tensor(0.0, TensorOptions(t.dtype())); }
}  // namespace

// ---- exp: y = e^x
Tensor exp(const Tensor& x) {
  Tensor y = unary_kernel(UnaryOp::exp, x, false);
  return record("exp", {x}, y, [ys = save(y, "result")](const Node& n, const Grads& g) {
    return Grads{mul(g[0], ys.unpack(n))};  // d e^x/dx = e^x = y
  });
}

// ---- log: y = ln x
Tensor log(const Tensor& x) {
  Tensor y = unary_kernel(UnaryOp::log, x, false);
  return record("log", {x}, y, [xs = save(x, "self")](const Node& n, const Grads& g) {
    return Grads{div(g[0], xs.unpack(n))};  // d ln x/dx = 1/x
  });
}

// ---- sqrt: y = √x
Tensor sqrt(const Tensor& x) {
  Tensor y = unary_kernel(UnaryOp::sqrt, x, false);
  return record("sqrt", {x}, y, [ys = save(y, "result")](const Node& n, const Grads& g) {
    return Grads{div(g[0], mul(ys.unpack(n), 2.0))};  // d √x/dx = 1/(2√x) = 1/(2y)  (inf at x = 0)
  });
}

// ---- rsqrt: y = 1/√x
Tensor rsqrt(const Tensor& x) {
  Tensor y = unary_kernel(UnaryOp::rsqrt, x, false);
  return record("rsqrt", {x}, y, [ys = save(y, "result")](const Node& n, const Grads& g) {
    const Tensor yv = ys.unpack(n);
    return Grads{mul(g[0], mul(pow(yv, 3.0), -0.5))};  // d x^{-1/2}/dx = -x^{-3/2}/2 = -y³/2
  });
}

// ---- abs: y = |x|
Tensor abs(const Tensor& x) {
  Tensor y = unary_kernel(UnaryOp::abs, x, true);
  return record("abs", {x}, y, [xs = save(x, "self")](const Node& n, const Grads& g) {
    // d|x|/dx = sign(x), with sign(0) = 0 at the kink (as PyTorch)
    return Grads{fused_grad(xs.unpack(n), g[0], []<class T>(const T* xv, const T* gv, T* o, int64_t m) {
      cpu::abs_backward<T>(xv, gv, o, m);
    })};
  });
}

// ---- square: y = x²
Tensor square(const Tensor& x) {
  Tensor y = unary_kernel(UnaryOp::square, x, true);
  return record("square", {x}, y, [xs = save(x, "self")](const Node& n, const Grads& g) {
    return Grads{mul(g[0], mul(xs.unpack(n), 2.0))};  // d x²/dx = 2x
  });
}

// ---- pow with a scalar exponent: y = x^p
Tensor pow(const Tensor& x_in, double p) {
  detail::check_floating(x_in, "pow", "x");
  const Tensor x = detail::contiguous_raw(x_in);
  Tensor y = empty(x.sizes(), TensorOptions(x.dtype()));
  dispatch(x.dtype(), [&]<class T>() {
    if constexpr (is_float_type_v<T>)
      cpu::pow_scalar<T>(static_cast<const T*>(x.raw_data()), p, static_cast<T*>(y.raw_data()), x.numel());
  });
  return record("pow", {x_in}, y, [xs = save(x_in, "self"), p](const Node& n, const Grads& g) {
    const Tensor xv = xs.unpack(n);
    if (p == 0.0) return Grads{zeros_like(xv)};  // d x^0/dx = 0 (also at x = 0)
    return Grads{mul(g[0], mul(pow(xv, p - 1.0), p))};  // d x^p/dx = p x^{p-1}
  });
}

// ---- pow with a tensor exponent (broadcasting): y = x^e
Tensor pow(const Tensor& x_in, const Tensor& e_in) {
  detail::check_defined(x_in, "pow", "x");
  detail::check_defined(e_in, "pow", "exponent");
  const Shape out_shape = broadcast_shapes(x_in.sizes(), e_in.sizes(), "pow");
  const DType dt = promote_types(x_in.dtype(), e_in.dtype());
  ATH_CHECK(is_floating(dt), "pow", "pow(", x_in.describe(), ", ", e_in.describe(), ") needs a floating base or exponent",
            Hint{"convert the base with .to(DType::f32) first"});
  auto materialize = [&](const Tensor& t) {
    if (t.sizes() == out_shape) return detail::to_raw(t, dt);
    Tensor m = empty(out_shape, TensorOptions(dt));
    copy_into(m, t);  // broadcasts and converts
    return m;
  };
  const Tensor x = materialize(x_in), e = materialize(e_in);
  Tensor y = empty(out_shape, TensorOptions(dt));
  dispatch(dt, [&]<class T>() {
    if constexpr (is_float_type_v<T>)
      cpu::pow_tensor<T>(static_cast<const T*>(x.raw_data()), static_cast<const T*>(e.raw_data()), static_cast<T*>(y.raw_data()),
                         y.numel());
  });
  if (!any_requires_grad({x_in, e_in})) return y;
  const Shape xs_shape = x_in.sizes(), es_shape = e_in.sizes();
  SavedTensor xs = save(x_in, "self"), es = save(e_in, "exponent");
  SavedTensor ys = e_in.requires_grad() ? save(y, "result") : SavedTensor();
  return record("pow", {x_in, e_in}, y, [xs, es, ys, xs_shape, es_shape](const Node& n, const Grads& g) {
    const Tensor xv = xs.unpack(n), ev = es.unpack(n);
    const Tensor zero = zero_like_scalar(g[0]);
    Tensor gx, ge;
    if (needs_grad(n, 0)) {
      // d x^e/dx = e x^{e-1}; 0 where e = 0 (also at x = 0, where 0·0^{-1} would be NaN), as PyTorch
      const Tensor d = where(eq(ev, zero), zero, mul(ev, pow(xv, sub(ev, 1.0))));
      gx = sum_to(mul(g[0], d), xs_shape);
    }
    if (needs_grad(n, 1)) {
      // d x^e/de = x^e ln x = y ln x; 0 where x = 0 and e >= 0 (the limit, not 0·(-inf)), as PyTorch
      const Tensor x_zero_e_nonneg = where(lt(ev, 0.0), scalar_tensor(0.0, TensorOptions(DType::boolean)), eq(xv, zero));
      const Tensor d = where(x_zero_e_nonneg, zero, mul(ys.unpack(n), log(xv)));
      ge = sum_to(mul(g[0], d), es_shape);
    }
    return Grads{gx, ge};
  });
}

// ---- clamp: y = min(max(x, lo), hi); a NaN bound is no bound
Tensor clamp(const Tensor& x_in, double lo, double hi) {
  detail::check_defined(x_in, "clamp", "x");
  ATH_CHECK(is_float_or_int(x_in.dtype()), "clamp", "argument 'x' must be a number tensor, got ", x_in.describe(),
            Hint{"convert the bool tensor with .to(DType::f32) first"});
  const Tensor x = detail::contiguous_raw(x_in);
  Tensor y = empty(x.sizes(), TensorOptions(x.dtype()));
  dispatch(x.dtype(), [&]<class T>() {
    if constexpr (!std::is_same_v<T, bool>)
      cpu::clamp<T>(static_cast<const T*>(x.raw_data()), lo, hi, static_cast<T*>(y.raw_data()), x.numel());
  });
  return record("clamp", {x_in}, y, [xs = save(x_in, "self"), lo, hi](const Node& n, const Grads& g) {
    // dy/dx = 1 where lo <= x <= hi (bounds included, as PyTorch), else 0
    return Grads{fused_grad(xs.unpack(n), g[0], [lo, hi]<class T>(const T* xv, const T* gv, T* o, int64_t m) {
      cpu::clamp_backward<T>(xv, lo, hi, gv, o, m);
    })};
  });
}

// ---- comparisons: bool results, no gradient
namespace {
Tensor compare_tensors(CompareOp op, const char* name, const Tensor& a_in, const Tensor& b_in) {
  detail::check_defined(a_in, name, "a");
  detail::check_defined(b_in, name, "b");
  const Shape out_shape = broadcast_shapes(a_in.sizes(), b_in.sizes(), name);
  const DType dt = promote_types(a_in.dtype(), b_in.dtype());
  Tensor out = empty(out_shape, TensorOptions(DType::boolean));
  if (out.numel() == 0) return out;
  auto materialize = [&](const Tensor& t) {
    if (t.sizes() == out_shape) return detail::to_raw(t, dt);
    Tensor m = empty(out_shape, TensorOptions(dt));
    copy_into(m, t);
    return m;
  };
  const Tensor a = materialize(a_in);
  const bool b_scalar = b_in.numel() == 1;
  const Tensor b = b_scalar ? detail::to_raw(b_in, dt) : materialize(b_in);
  dispatch(dt, [&]<class T>() {
    cpu::compare<T>(op, static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()), b_scalar,
                    out.data_ptr<bool>(), out.numel());
  });
  return out;
}

Tensor compare_scalar(CompareOp op, const char* name, const Tensor& a_in, double s) {
  detail::check_defined(a_in, name, "a");
  const Tensor a = detail::contiguous_raw(a_in);
  Tensor out = empty(a.sizes(), TensorOptions(DType::boolean));
  dispatch(a.dtype(), [&]<class T>() {
    cpu::compare_scalar<T>(op, static_cast<const T*>(a.raw_data()), s, out.data_ptr<bool>(), out.numel());
  });
  return out;
}
}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return compare_tensors(CompareOp::eq, "eq", a, b); }
Tensor gt(const Tensor& a, double b) { return compare_scalar(CompareOp::gt, "gt", a, b); }
Tensor lt(const Tensor& a, double b) { return compare_scalar(CompareOp::lt, "lt", a, b); }

}  // namespace athanor
