// Unary elementwise ops (exp, log, sqrt, rsqrt, abs, square, pow, clamp) and
// comparisons (eq, gt, lt); each op's backward sits right below its forward, and its
// registry entry (ops::*_op) at the end.
// Kernels: src/backend/cpu/unary.{h,cpp}. where / masked_fill: src/ops/where.cpp.
//
// Invariants: outputs are new contiguous tensors of the input's dtype
// (comparisons: bool); non-contiguous inputs are made contiguous before the
// kernel; floating-only ops raise an Error naming the op and the tensor on
// integer/bool inputs. Backward closures run with grad mode off and are built
// from differentiable ops (mul, div, pow, …) or, where a mask is needed, from a
// fused kernel (abs, clamp). Under autocast exp, log, rsqrt and pow are f32-category
// ops: the dispatch point hands them f32 copies of bf16/f16 inputs.
#include <cmath>

#include "athanor/ops/elementwise.h"
#include "athanor/ops/shape.h"
#include "backend/cpu/unary.h"
#include "ops/op_def.h"
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

// ---- the ops: forward and backward per op (kernels take the inputs after autocast)
namespace {
using detail::Grads;
using detail::SavedOne;

std::vector<Tensor> exp_cpu(OpCall& c) {
  Tensor y = unary_kernel(UnaryOp::exp, c.in(0), false);
  if (c.records()) c.save<SavedOne>().t = save(y, "result");
  return {y};
}
Grads exp_backward(const Node& n, const Grads& g, const OpSaved& s) {
  return {mul(g[0], s.as<SavedOne>().t.unpack(n))};  // d e^x/dx = e^x = y
}

std::vector<Tensor> log_cpu(OpCall& c) {
  Tensor y = unary_kernel(UnaryOp::log, c.in(0), false);
  if (c.records()) c.save<SavedOne>().t = save(c.in(0), "self");
  return {y};
}
Grads log_backward(const Node& n, const Grads& g, const OpSaved& s) {
  return {div(g[0], s.as<SavedOne>().t.unpack(n))};  // d ln x/dx = 1/x
}

std::vector<Tensor> sqrt_cpu(OpCall& c) {
  Tensor y = unary_kernel(UnaryOp::sqrt, c.in(0), false);
  if (c.records()) c.save<SavedOne>().t = save(y, "result");
  return {y};
}
Grads sqrt_backward(const Node& n, const Grads& g, const OpSaved& s) {
  return {div(g[0], mul(s.as<SavedOne>().t.unpack(n), 2.0))};  // d √x/dx = 1/(2√x) = 1/(2y)  (inf at x = 0)
}

std::vector<Tensor> rsqrt_cpu(OpCall& c) {
  Tensor y = unary_kernel(UnaryOp::rsqrt, c.in(0), false);
  if (c.records()) c.save<SavedOne>().t = save(y, "result");
  return {y};
}
Grads rsqrt_backward(const Node& n, const Grads& g, const OpSaved& s) {
  const Tensor yv = s.as<SavedOne>().t.unpack(n);
  return {mul(g[0], mul(pow(yv, 3.0), -0.5))};  // d x^{-1/2}/dx = -x^{-3/2}/2 = -y³/2
}

std::vector<Tensor> abs_cpu(OpCall& c) {
  Tensor y = unary_kernel(UnaryOp::abs, c.in(0), true);
  if (c.records()) c.save<SavedOne>().t = save(c.in(0), "self");
  return {y};
}
Grads abs_backward(const Node& n, const Grads& g, const OpSaved& s) {
  // d|x|/dx = sign(x), with sign(0) = 0 at the kink (as PyTorch)
  return {fused_grad(s.as<SavedOne>().t.unpack(n), g[0], []<class T>(const T* xv, const T* gv, T* o, int64_t m) {
    cpu::abs_backward<T>(xv, gv, o, m);
  })};
}

std::vector<Tensor> square_cpu(OpCall& c) {
  Tensor y = unary_kernel(UnaryOp::square, c.in(0), true);
  if (c.records()) c.save<SavedOne>().t = save(c.in(0), "self");
  return {y};
}
Grads square_backward(const Node& n, const Grads& g, const OpSaved& s) {
  return {mul(g[0], mul(s.as<SavedOne>().t.unpack(n), 2.0))};  // d x²/dx = 2x
}

template <UnaryOp U> std::vector<Tensor> unary_reference(OpCall& c) { return {cpu::ref::unary(U, detail::ref64(c.in(0)))}; }

// ---- pow: y = x^p (scalar exponent: args) or x^e (tensor exponent, broadcasting)
struct PowArgs {
  double p = 1.0;  // the exponent when input 1 is undefined
};
struct PowSaved : OpSaved {
  SavedTensor x, e, y;
  Shape x_shape, e_shape;
  double p = 1.0;
  bool tensor_exponent = false;
};

std::vector<Tensor> pow_cpu(OpCall& c) {
  const Tensor& x_in = c.in(0);
  const Tensor& e_in = c.in(1);
  if (!e_in.defined()) {  // scalar exponent
    const double p = c.args<PowArgs>().p;
    detail::check_floating(x_in, "pow", "x");
    const Tensor x = detail::contiguous_raw(x_in);
    Tensor y = empty(x.sizes(), TensorOptions(x.dtype()));
    dispatch(x.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>)
        cpu::pow_scalar<T>(static_cast<const T*>(x.raw_data()), p, static_cast<T*>(y.raw_data()), x.numel());
    });
    if (c.records()) {
      PowSaved& s = c.save<PowSaved>();
      s.x = save(x_in, "self");
      s.p = p;
    }
    return {y};
  }
  detail::check_defined(x_in, "pow", "x");
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
  if (c.records()) {
    PowSaved& s = c.save<PowSaved>();
    s.tensor_exponent = true;
    s.x = save(x_in, "self"), s.e = save(e_in, "exponent");
    if (c.requires_grad(1)) s.y = save(y, "result");
    s.x_shape = x_in.sizes(), s.e_shape = e_in.sizes();
  }
  return {y};
}

Grads pow_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const PowSaved& s = saved.as<PowSaved>();
  const Tensor xv = s.x.unpack(n);
  if (!s.tensor_exponent) {
    if (s.p == 0.0) return {zeros_like(xv), Tensor()};  // d x^0/dx = 0 (also at x = 0)
    return {mul(g[0], mul(pow(xv, s.p - 1.0), s.p)), Tensor()};  // d x^p/dx = p x^{p-1}
  }
  const Tensor ev = s.e.unpack(n);
  const Tensor zero = zero_like_scalar(g[0]);
  Tensor gx, ge;
  if (needs_grad(n, 0)) {
    // d x^e/dx = e x^{e-1}; 0 where e = 0 (also at x = 0, where 0·0^{-1} would be NaN), as PyTorch
    const Tensor d = where(eq(ev, zero), zero, mul(ev, pow(xv, sub(ev, 1.0))));
    gx = sum_to(mul(g[0], d), s.x_shape);
  }
  if (needs_grad(n, 1)) {
    // d x^e/de = x^e ln x = y ln x; 0 where x = 0 and e >= 0 (the limit, not 0·(-inf)), as PyTorch
    const Tensor x_zero_e_nonneg = where(lt(ev, 0.0), scalar_tensor(0.0, TensorOptions(DType::boolean)), eq(xv, zero));
    const Tensor d = where(x_zero_e_nonneg, zero, mul(s.y.unpack(n), log(xv)));
    ge = sum_to(mul(g[0], d), s.e_shape);
  }
  return {gx, ge};
}

std::vector<Tensor> pow_reference(OpCall& c) {
  if (!c.in(1).defined()) return {cpu::ref::pow(detail::ref64(c.in(0)), c.args<PowArgs>().p)};
  return {cpu::ref::pow(detail::ref64(c.in(0)), detail::ref64(c.in(1)))};
}

std::vector<OpCase> pow_cases(int scale) {
  const int64_t s = scale;
  auto scalar = [](double p) {
    return [p](const detail::Inputs& t, const PowArgs&) { return std::vector<Tensor>{pow(t[0], p)}; };
  };
  auto tensor = [](const detail::Inputs& t, const PowArgs&) { return std::vector<Tensor>{pow(t[0], t[1])}; };
  return {
      make_case<PowArgs>("x [4, 3] in [0.5, 2], p 2.5", {case_uniform({4 * s, 3}, 0.5, 2, 1), case_none()}, {2.5}, scalar(2.5)),
      make_case<PowArgs>("x [5] N(0, 1), p 3", {case_randn({5 * s}, 2), case_none()}, {3.0}, scalar(3.0)),
      make_case<PowArgs>("x [2, 3] transposed, p -1.5", {case_uniform({2 * s, 3}, 0.5, 2, 3, CaseLayout::transposed), case_none()},
                         {-1.5}, scalar(-1.5)),
      make_case<PowArgs>("x [3, 4] ^ e [4] (broadcast)", {case_uniform({3 * s, 4}, 0.5, 2, 4), case_uniform({4}, -1.5, 1.5, 5)},
                         {}, tensor),
      make_case<PowArgs>("x [2, 1, 3] strided ^ e [4, 3] (both broadcast)",
                         {case_uniform({2 * s, 1, 3}, 0.5, 2, 6, CaseLayout::strided), case_uniform({4, 3}, -1, 2, 7)}, {}, tensor),
  };
}

// ---- clamp: y = min(max(x, lo), hi); a NaN bound is no bound
struct ClampArgs {
  double lo, hi;
};
struct ClampSaved : OpSaved {
  SavedTensor x;
  double lo = 0, hi = 0;
};

std::vector<Tensor> clamp_cpu(OpCall& c) {
  const Tensor& x_in = c.in(0);
  const auto [lo, hi] = c.args<ClampArgs>();
  detail::check_defined(x_in, "clamp", "x");
  ATH_CHECK(is_float_or_int(x_in.dtype()), "clamp", "argument 'x' must be a number tensor, got ", x_in.describe(),
            Hint{"convert the bool tensor with .to(DType::f32) first"});
  const Tensor x = detail::contiguous_raw(x_in);
  Tensor y = empty(x.sizes(), TensorOptions(x.dtype()));
  dispatch(x.dtype(), [&]<class T>() {
    if constexpr (!std::is_same_v<T, bool>)
      cpu::clamp<T>(static_cast<const T*>(x.raw_data()), lo, hi, static_cast<T*>(y.raw_data()), x.numel());
  });
  if (c.records()) {
    ClampSaved& s = c.save<ClampSaved>();
    s.x = save(x_in, "self"), s.lo = lo, s.hi = hi;
  }
  return {y};
}
Grads clamp_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const ClampSaved& s = saved.as<ClampSaved>();
  // dy/dx = 1 where lo <= x <= hi (bounds included, as PyTorch), else 0
  return {fused_grad(s.x.unpack(n), g[0], [lo = s.lo, hi = s.hi]<class T>(const T* xv, const T* gv, T* o, int64_t m) {
    cpu::clamp_backward<T>(xv, lo, hi, gv, o, m);
  })};
}
std::vector<Tensor> clamp_reference(OpCall& c) {
  return {cpu::ref::clamp(detail::ref64(c.in(0)), c.args<ClampArgs>().lo, c.args<ClampArgs>().hi)};
}
std::vector<OpCase> clamp_cases(int scale) {
  std::vector<OpCase> out;
  for (OpCase& k : detail::unary_cases(scale, nullptr, -3, 3, {-1.0, 1.5}, 0.05)) {
    out.push_back(make_case<ClampArgs>(k.label + ", [-1, 1.5]", k.inputs, {-1.0, 1.5}, [](const detail::Inputs& t, const ClampArgs& a) {
      return std::vector<Tensor>{clamp(t[0], a.lo, a.hi)};
    }));
  }
  out.push_back(make_case<ClampArgs>("x [6], [NaN, 0.5] (no lower bound)", {case_away_from({6}, -3, 3, {0.5}, 0.05, 9)},
                                     {std::nan(""), 0.5},
                                     [](const detail::Inputs& t, const ClampArgs& a) { return std::vector<Tensor>{clamp(t[0], a.lo, a.hi)}; }));
  return out;
}

template <Tensor (*F)(const Tensor&)> std::vector<Tensor> call1(const detail::Inputs& t) { return {F(t[0])}; }
}  // namespace

namespace ops {
const OpDef& exp_op() {
  static const OpDef d{.name = "exp", .inputs = {"x"}, .category = AutocastCategory::f32,
                       .kernels = detail::cpu_kernels(exp_cpu, exp_backward), .reference = unary_reference<UnaryOp::exp>,
                       .dtypes = detail::kFloatDTypes,
                       .cases = [](int s) { return detail::unary_cases(s, call1<exp>, -3, 3); },
                       .derivative = "g * y", .file = "src/ops/unary.cpp"};
  return d;
}
const OpDef& log_op() {
  static const OpDef d{.name = "log", .inputs = {"x"}, .category = AutocastCategory::f32,
                       .kernels = detail::cpu_kernels(log_cpu, log_backward), .reference = unary_reference<UnaryOp::log>,
                       .dtypes = detail::kFloatDTypes,
                       .cases = [](int s) { return detail::unary_cases(s, call1<log>, 0.2, 4); },
                       .derivative = "g / x", .file = "src/ops/unary.cpp"};
  return d;
}
const OpDef& sqrt_op() {
  static const OpDef d{.name = "sqrt", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(sqrt_cpu, sqrt_backward), .reference = unary_reference<UnaryOp::sqrt>,
                       .dtypes = detail::kFloatDTypes,
                       .cases = [](int s) { return detail::unary_cases(s, call1<sqrt>, 0.2, 4); },
                       .derivative = "g / (2 y)", .file = "src/ops/unary.cpp"};
  return d;
}
const OpDef& rsqrt_op() {
  static const OpDef d{.name = "rsqrt", .inputs = {"x"}, .category = AutocastCategory::f32,
                       .kernels = detail::cpu_kernels(rsqrt_cpu, rsqrt_backward), .reference = unary_reference<UnaryOp::rsqrt>,
                       .dtypes = detail::kFloatDTypes,
                       .cases = [](int s) { return detail::unary_cases(s, call1<rsqrt>, 0.2, 4); },
                       .derivative = "-g y^3 / 2", .file = "src/ops/unary.cpp"};
  return d;
}
const OpDef& abs_op() {
  static const OpDef d{.name = "abs", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(abs_cpu, abs_backward), .reference = unary_reference<UnaryOp::abs>,
                       .dtypes = detail::kFloatDTypes,
                       .cases = [](int s) { return detail::unary_cases(s, call1<abs>, -3, 3, {0.0}); },
                       .derivative = "g sign(x), sign(0) = 0", .file = "src/ops/unary.cpp"};
  return d;
}
const OpDef& square_op() {
  static const OpDef d{.name = "square", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(square_cpu, square_backward), .reference = unary_reference<UnaryOp::square>,
                       .dtypes = detail::kFloatDTypes,
                       .cases = [](int s) { return detail::unary_cases(s, call1<square>, -3, 3); },
                       .derivative = "2 x g", .file = "src/ops/unary.cpp"};
  return d;
}
const OpDef& pow_op() {
  static const OpDef d{.name = "pow", .inputs = {"x", "exponent"}, .category = AutocastCategory::f32,
                       .kernels = detail::cpu_kernels(pow_cpu, pow_backward), .reference = pow_reference,
                       .dtypes = detail::kFloatDTypes, .cases = pow_cases,
                       .derivative = "g p x^(p-1); d/de = y ln x", .file = "src/ops/unary.cpp"};
  return d;
}
const OpDef& clamp_op() {
  static const OpDef d{.name = "clamp", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(clamp_cpu, clamp_backward), .reference = clamp_reference,
                       .dtypes = detail::kFloatDTypes, .cases = clamp_cases,
                       .derivative = "g where lo <= x <= hi", .file = "src/ops/unary.cpp"};
  return d;
}
}  // namespace ops

Tensor exp(const Tensor& x) { return call_op(ops::exp_op(), {x}); }
Tensor log(const Tensor& x) { return call_op(ops::log_op(), {x}); }
Tensor sqrt(const Tensor& x) { return call_op(ops::sqrt_op(), {x}); }
Tensor rsqrt(const Tensor& x) { return call_op(ops::rsqrt_op(), {x}); }
Tensor abs(const Tensor& x) { return call_op(ops::abs_op(), {x}); }
Tensor square(const Tensor& x) { return call_op(ops::square_op(), {x}); }
Tensor pow(const Tensor& x, double exponent) { return call_op(ops::pow_op(), {x, Tensor()}, PowArgs{exponent}); }
Tensor pow(const Tensor& x, const Tensor& exponent) { return call_op(ops::pow_op(), {x, exponent}, PowArgs{}); }
Tensor clamp(const Tensor& x, double lo, double hi) { return call_op(ops::clamp_op(), {x}, ClampArgs{lo, hi}); }

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
