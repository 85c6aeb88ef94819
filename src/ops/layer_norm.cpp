// layer_norm: normalizes each row (the trailing normalized_shape dims, flattened)
// to zero mean and unit variance, then applies the optional weight and bias.
// Forward caches per-row mean and rstd (f32; f64 for f64 inputs) for backward;
// the backward is one fused pass over rows computing dx, dweight and dbias:
//   xhat = (x - mean) * rstd,  dnorm = g * w
//   dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
//   dw = sum_rows g * xhat,    db = sum_rows g
// Under autocast (layer_norm is an f32-category op that reads bf16/f16 itself,
// OpDef::reads_lowp) a bf16/f16 x is read directly by the kernel with f32 weight/bias and an f32 output, rather than cast to f32 first:
// the same numbers without a full-size f32 copy of the activation; dx comes back in
// x's dtype.
// Under bf16/f16 autocast an f32 x that is an activation (requires grad: the residual
// stream of a transformer, f32 because add promotes) is not saved itself: backward keeps
// xhat = (x - mean) * rstd rounded to the autocast dtype, half the bytes. y is the plain
// f32 result; dx, dw, db are computed in f32 from the rounded xhat, the same precision as
// the bf16 copy of y that the next lower_precision op saves. That copy is written by the
// same kernel pass and offered to autocast (autocast_offer_cast): the next op that would
// cast y takes it instead of a cast pass over y (same "cast" node, same numbers).
// The f32/f64 backward adds dx straight into the gradient x already holds from its other
// uses when autograd offers it (a transformer's residual stream; see input_grad below).
#include "athanor/ops/norm.h"

#include "athanor/ops/autocast.h"
#include "backend/cpu/norm.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {
using detail::Grads;
using detail::Inputs;

DType stat_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

void check_param(const Tensor& p, const char* which, const Tensor& x, const Shape& normalized_shape) {
  if (!p.defined()) return;
  detail::check_floating(p, "layer_norm", which);
  detail::check_same_dtype(x, p, "layer_norm");
  ATH_CHECK(p.sizes() == normalized_shape, "layer_norm", which, " has shape ", shape_str(p.sizes()),
            " but normalized_shape is ", shape_str(normalized_shape),
            Hint{std::string("give ") + which + " exactly the normalized_shape"});
}

template <class T> const T* ptr_or_null(const Tensor& t) { return t.defined() ? static_cast<const T*>(t.raw_data()) : nullptr; }
template <class T> T* mut_or_null(const Tensor& t) { return t.defined() ? static_cast<T*>(t.raw_data()) : nullptr; }

bool is_lowp(DType d) { return d == DType::bf16 || d == DType::f16; }

// x's gradient buffer (detail::norm_input_grad): the f32/f64 kernels add into the residual
// stream's waiting sum (accumulate_dx). One pass over the stream's gradient fewer per layer norm
// (2 MB each in the tiny GPT's step).
detail::InputGrad input_grad(const Node& n, const Shape& sizes, DType dtype) {
  return detail::norm_input_grad(n, sizes, TensorOptions(dtype), dtype == DType::f32 || dtype == DType::f64);
}

using detail::LayerNormArgs;  // shared with the CUDA kernel (ops/op_args.h)
// What the backward reads, by path: plain (x, mean, rstd in x's precision), lowp_input (a
// bf16/f16 x read directly, f32 statistics) or keep_xhat (xhat in the autocast dtype).
enum class LayerNormPath : uint8_t { plain, lowp_input, keep_xhat };
struct LayerNormSaved : OpSaved {
  LayerNormPath path = LayerNormPath::plain;
  SavedTensor x, w, mean, rstd;  // keep_xhat: x holds xhat
  Shape normalized_shape;
  bool has_bias = false;
};

template <class Fn> void with_lowp(const Tensor& t, Fn&& fn) {  // fn(L*) for t's 16-bit storage type
  if (t.dtype() == DType::bf16) fn(static_cast<bfloat16*>(t.raw_data()));
  else fn(static_cast<float16*>(t.raw_data()));
}

// x bf16/f16, weight/bias f32 (or absent), y f32: see the file comment.
Tensor lowp_input_forward(OpCall& c, const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                          double eps) {
  const char* op = "layer_norm";
  detail::check_normalized_shape(x, normalized_shape, op);
  for (const Tensor* p : {&weight, &bias})
    if (p->defined())
      ATH_CHECK(p->sizes() == normalized_shape, op, p == &weight ? "weight" : "bias", " has shape ",
                shape_str(p->sizes()), " but normalized_shape is ", shape_str(normalized_shape),
                Hint{"give weight and bias exactly the normalized_shape"});
  const int64_t cols = shape_numel(normalized_shape), rows = cols == 0 ? 0 : x.numel() / cols;
  const Tensor xc = detail::contiguous_raw(x);
  const Tensor wc = weight.defined() ? detail::contiguous_raw(weight) : Tensor();
  const Tensor bc = bias.defined() ? detail::contiguous_raw(bias) : Tensor();
  Tensor y = empty(x.sizes(), TensorOptions(DType::f32));
  Tensor mean = empty({rows}, TensorOptions(DType::f32)), rstd = empty({rows}, TensorOptions(DType::f32));
  if (x.numel() > 0)
    with_lowp(xc, [&](auto* xp) {
      cpu::layer_norm_forward_lowp_input(xp, ptr_or_null<float>(wc), ptr_or_null<float>(bc), y.data_ptr<float>(),
                                         mean.data_ptr<float>(), rstd.data_ptr<float>(), rows, cols, eps);
    });
  if (c.records()) {
    LayerNormSaved& s = c.save<LayerNormSaved>();
    s.path = LayerNormPath::lowp_input;
    s.x = save(x, "input"), s.w = weight.defined() ? save(weight, "weight") : SavedTensor();
    s.mean = save(mean, "mean"), s.rstd = save(rstd, "rstd");
    s.normalized_shape = normalized_shape, s.has_bias = bias.defined();
  }
  return y;
}

Grads lowp_input_backward(const Node& n, const Grads& g, const LayerNormSaved& s) {
  const Tensor xv = detail::contiguous_raw(s.x.unpack(n));
  const Tensor wv = s.w.defined() ? detail::contiguous_raw(s.w.unpack(n)) : Tensor();
  const Tensor gy = detail::to_raw(g[0], DType::f32);
  const Tensor mv = s.mean.unpack(n), rv = s.rstd.unpack(n);
  const int64_t cols = shape_numel(s.normalized_shape), rows = cols == 0 ? 0 : xv.numel() / cols;
  Tensor dx = needs_grad(n, 0) ? empty(xv.sizes(), TensorOptions(xv.dtype())) : Tensor();
  Tensor dw = wv.defined() && needs_grad(n, 1) ? empty(wv.sizes(), TensorOptions(DType::f32)) : Tensor();
  Tensor db = s.has_bias && needs_grad(n, 2) ? empty(Shape(s.normalized_shape), TensorOptions(DType::f32)) : Tensor();
  if (xv.numel() == 0) {
    if (dw.defined()) dw.zero_();
    if (db.defined()) db.zero_();
  } else {
    with_lowp(xv, [&](auto* xp) {
      using L = std::remove_cv_t<std::remove_pointer_t<decltype(xp)>>;
      cpu::layer_norm_backward_lowp_input<L>(gy.data_ptr<float>(), xp, ptr_or_null<float>(wv), mv.data_ptr<float>(),
                                             rv.data_ptr<float>(), dx.defined() ? static_cast<L*>(dx.raw_data()) : nullptr,
                                             mut_or_null<float>(dw), mut_or_null<float>(db), rows, cols);
    });
  }
  return {dx, dw, db};
}

// x, weight, bias f32 (checked by the caller), x requires grad, autocast dtype `low`: see the file comment.
Tensor keep_xhat_forward(OpCall& c, const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                         double eps, DType low) {
  const int64_t cols = shape_numel(normalized_shape), rows = cols == 0 ? 0 : x.numel() / cols;
  const Tensor xc = detail::contiguous_raw(x);
  const Tensor wc = weight.defined() ? detail::contiguous_raw(weight) : Tensor();
  const Tensor bc = bias.defined() ? detail::contiguous_raw(bias) : Tensor();
  Tensor y = empty(x.sizes(), TensorOptions(DType::f32));
  Tensor xhat = empty(x.sizes(), TensorOptions(low));
  Tensor y_low = empty(x.sizes(), TensorOptions(low));  // offered to the next lower_precision op: see below
  Tensor mean = empty({rows}, TensorOptions(DType::f32)), rstd = empty({rows}, TensorOptions(DType::f32));
  if (x.numel() > 0)
    with_lowp(xhat, [&](auto* hp) {
      using L = std::remove_pointer_t<decltype(hp)>;
      cpu::layer_norm_forward_keep_xhat(xc.data_ptr<float>(), ptr_or_null<float>(wc), ptr_or_null<float>(bc),
                                        y.data_ptr<float>(), hp, mean.data_ptr<float>(), rstd.data_ptr<float>(), rows,
                                        cols, eps, static_cast<L*>(y_low.raw_data()));
    });
  // xhat and rstd are private to this node (no version to check); the weight is saved as usual.
  LayerNormSaved& s = c.save<LayerNormSaved>();
  s.path = LayerNormPath::keep_xhat;
  s.x = save(xhat, "input_normalized"), s.w = weight.defined() ? save(weight, "weight") : SavedTensor();
  s.rstd = save(rstd, "rstd");
  s.normalized_shape = normalized_shape, s.has_bias = bias.defined();
  // In a transformer y feeds a linear, which under autocast would cast it to `low` in a pass
  // of its own; the kernel wrote that copy while y was in registers. (y is the tensor the
  // dispatch point returns, its node attached.)
  autocast_offer_cast(y, y_low);
  return y;
}

Grads keep_xhat_backward(const Node& n, const Grads& g, const LayerNormSaved& s) {
  const Tensor hv = s.x.unpack(n);
  const Tensor wv = s.w.defined() ? detail::contiguous_raw(s.w.unpack(n)) : Tensor();
  const Tensor gy = detail::to_raw(g[0], DType::f32);
  const Tensor rv = s.rstd.unpack(n);
  const int64_t cols = shape_numel(s.normalized_shape), rows = cols == 0 ? 0 : hv.numel() / cols;
  const detail::InputGrad dx = input_grad(n, hv.sizes(), DType::f32);
  Tensor dw = wv.defined() && needs_grad(n, 1) ? empty(wv.sizes(), TensorOptions(DType::f32)) : Tensor();
  Tensor db = s.has_bias && needs_grad(n, 2) ? empty(Shape(s.normalized_shape), TensorOptions(DType::f32)) : Tensor();
  if (hv.numel() == 0) {
    if (dw.defined()) dw.zero_();
    if (db.defined()) db.zero_();
  } else {
    with_lowp(hv, [&](auto* hp) {
      cpu::layer_norm_backward_from_xhat(gy.data_ptr<float>(), hp, ptr_or_null<float>(wv), rv.data_ptr<float>(),
                                         mut_or_null<float>(dx.t), mut_or_null<float>(dw), mut_or_null<float>(db), rows, cols,
                                         dx.accumulate);
    });
  }
  return {dx.t, dw, db};
}

std::vector<Tensor> layer_norm_cpu(OpCall& c) {
  const char* op = "layer_norm";
  const Tensor &x = c.in(0), &weight = c.in(1), &bias = c.in(2);
  const LayerNormArgs& a = c.args<LayerNormArgs>();
  const Shape& normalized_shape = a.normalized_shape;
  // Under autocast a bf16/f16 x reaches the kernel as it is (OpDef::reads_lowp), with f32
  // parameters (the dispatch point made them f32).
  if (c.autocast() && x.defined() && is_lowp(x.dtype()) && (!weight.defined() || weight.dtype() == DType::f32) &&
      (!bias.defined() || bias.dtype() == DType::f32))
    return {lowp_input_forward(c, x, normalized_shape, weight, bias, a.eps)};
  detail::check_floating(x, op, "x");
  detail::check_normalized_shape(x, normalized_shape, op);
  check_param(weight, "weight", x, normalized_shape);
  check_param(bias, "bias", x, normalized_shape);

  if (x.dtype() == DType::f32 && c.autocast() && is_lowp(*c.autocast()) && c.requires_grad(0))
    return {keep_xhat_forward(c, x, normalized_shape, weight, bias, a.eps, *c.autocast())};

  const int64_t cols = shape_numel(normalized_shape), rows = cols == 0 ? 0 : x.numel() / cols;
  const Tensor xc = detail::contiguous_raw(x);
  const Tensor wc = weight.defined() ? detail::contiguous_raw(weight) : Tensor();
  const Tensor bc = bias.defined() ? detail::contiguous_raw(bias) : Tensor();
  Tensor y = empty(x.sizes(), TensorOptions(x.dtype()));
  Tensor mean = empty({rows}, TensorOptions(stat_dtype(x.dtype())));
  Tensor rstd = empty({rows}, TensorOptions(stat_dtype(x.dtype())));
  if (x.numel() > 0) {
    dispatch(x.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        using S = cpu::norm_stat_t<T>;
        cpu::layer_norm_forward<T>(static_cast<const T*>(xc.raw_data()), ptr_or_null<T>(wc), ptr_or_null<T>(bc),
                                   static_cast<T*>(y.raw_data()), static_cast<S*>(mean.raw_data()),
                                   static_cast<S*>(rstd.raw_data()), rows, cols, a.eps);
      }
    });
  }
  if (c.records()) {
    LayerNormSaved& s = c.save<LayerNormSaved>();
    s.x = save(x, "input"), s.w = weight.defined() ? save(weight, "weight") : SavedTensor();
    s.mean = save(mean, "mean"), s.rstd = save(rstd, "rstd");
    s.normalized_shape = normalized_shape, s.has_bias = bias.defined();
  }
  return {y};
}

Grads layer_norm_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const LayerNormSaved& s = saved.as<LayerNormSaved>();
  if (s.path == LayerNormPath::lowp_input) return lowp_input_backward(n, g, s);
  if (s.path == LayerNormPath::keep_xhat) return keep_xhat_backward(n, g, s);
  const Tensor xv = detail::contiguous_raw(s.x.unpack(n));
  const Tensor wv = s.w.defined() ? detail::contiguous_raw(s.w.unpack(n)) : Tensor();
  const Tensor gy = detail::to_raw(g[0], xv.dtype());
  const Tensor mv = s.mean.unpack(n), rv = s.rstd.unpack(n);
  const int64_t cols = shape_numel(s.normalized_shape), rows = cols == 0 ? 0 : xv.numel() / cols;
  const detail::InputGrad dx = input_grad(n, xv.sizes(), xv.dtype());
  Tensor dw = wv.defined() && needs_grad(n, 1) ? empty(wv.sizes(), TensorOptions(wv.dtype())) : Tensor();
  Tensor db = s.has_bias && needs_grad(n, 2)
                  ? empty(wv.defined() ? wv.sizes() : Shape(s.normalized_shape), TensorOptions(xv.dtype()))
                  : Tensor();
  if (xv.numel() == 0) {  // empty batch: parameter gradients are zero
    if (dw.defined()) dw.zero_();
    if (db.defined()) db.zero_();
  } else {
    dispatch(xv.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        using S = cpu::norm_stat_t<T>;
        cpu::layer_norm_backward<T>(static_cast<const T*>(gy.raw_data()), static_cast<const T*>(xv.raw_data()),
                                    ptr_or_null<T>(wv), static_cast<const S*>(mv.raw_data()),
                                    static_cast<const S*>(rv.raw_data()), mut_or_null<T>(dx.t), mut_or_null<T>(dw),
                                    mut_or_null<T>(db), rows, cols, dx.accumulate);
      }
    });
  }
  return {dx.t, dw, db};
}

// The reference kernel in double (f32 parameters under autocast are widened like x).
std::vector<Tensor> layer_norm_reference(OpCall& c) {
  const LayerNormArgs& a = c.args<LayerNormArgs>();
  const Tensor x = detail::ref64(c.in(0)).contiguous();
  const Tensor w = c.in(1).defined() ? detail::ref64(c.in(1)).contiguous() : Tensor();
  const Tensor b = c.in(2).defined() ? detail::ref64(c.in(2)).contiguous() : Tensor();
  const int64_t cols = shape_numel(a.normalized_shape), rows = cols == 0 ? 0 : x.numel() / cols;
  Tensor y = empty(x.sizes(), TensorOptions(DType::f64));
  std::vector<double> mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
  cpu::ref::layer_norm_forward<double>(x.data_ptr<double>(), ptr_or_null<double>(w), ptr_or_null<double>(b), y.data_ptr<double>(),
                                       mean.data(), rstd.data(), rows, cols, a.eps);
  return {y};
}

std::vector<OpCase> layer_norm_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const LayerNormArgs& a) {
    return Inputs{layer_norm(t[0], a.normalized_shape, t[1], t[2], a.eps)};
  };
  return {
      make_case<LayerNormArgs>("x [4, 6], weight [6], bias [6]", {case_randn({4 * s, 6}, 1), case_randn({6}, 2), case_randn({6}, 3)},
                               {{6}, 1e-5}, call),
      make_case<LayerNormArgs>("x [2, 3, 4] transposed over [3, 4], no weight or bias",
                               {case_randn({2 * s, 3, 4}, 4, CaseLayout::transposed), case_none(), case_none()}, {{3, 4}, 1e-5}, call),
      make_case<LayerNormArgs>("x [3, 5] strided, weight [5] strided, no bias, eps 1e-2",
                               {case_randn({3 * s, 5}, 5, CaseLayout::strided), case_randn({5}, 6, CaseLayout::strided), case_none()},
                               {{5}, 1e-2}, call),
  };
}
}  // namespace

namespace ops {
const OpDef& layer_norm_op() {
  static const OpDef d{.name = "layer_norm", .inputs = {"x", "weight", "bias"}, .category = AutocastCategory::f32,
                       .reads_lowp = 1u, .kernels = detail::cpu_kernels(layer_norm_cpu, layer_norm_backward),
                       .reference = layer_norm_reference, .dtypes = detail::kFloatDTypes, .cases = layer_norm_cases,
                       .derivative = "rstd (dn - mean(dn) - xhat mean(dn xhat)), dn = g w", .file = "src/ops/layer_norm.cpp"};
  return d;
}
}  // namespace ops

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias, double eps) {
  return call_op(ops::layer_norm_op(), {x, weight, bias}, LayerNormArgs{normalized_shape, eps});
}

}  // namespace athanor
