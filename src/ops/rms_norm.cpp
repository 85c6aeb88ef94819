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

#include "backend/cpu/norm.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {
using detail::Grads;

bool is_lowp(DType d) { return d == DType::bf16 || d == DType::f16; }
template <class Fn> void with_lowp(const Tensor& t, Fn&& fn) {  // fn(L*) for t's 16-bit storage type
  if (t.dtype() == DType::bf16) fn(static_cast<bfloat16*>(t.raw_data()));
  else fn(static_cast<float16*>(t.raw_data()));
}

using detail::RmsNormArgs;  // ops/op_args.h: shared with the CUDA kernel (src/ops/cuda/)
struct RmsNormSaved : OpSaved {
  bool lowp_input = false;  // x bf16/f16 read directly, f32 weight and statistics
  SavedTensor x, w, rstd;
  Shape normalized_shape;
};

std::vector<Tensor> rms_norm_cpu(OpCall& c) {
  const char* op = "rms_norm";
  const Tensor &x = c.in(0), &weight = c.in(1);
  const RmsNormArgs& a = c.args<RmsNormArgs>();
  const Shape& normalized_shape = a.normalized_shape;
  // Under autocast a bf16/f16 x reaches the kernel as it is (OpDef::reads_lowp), with an f32
  // weight (the dispatch point made it f32): see the file comment.
  const bool lowp_input = c.autocast() && x.defined() && is_lowp(x.dtype()) && (!weight.defined() || weight.dtype() == DType::f32);
  if (!lowp_input) detail::check_floating(x, op, "x");
  detail::check_normalized_shape(x, normalized_shape, op);
  if (weight.defined()) {
    if (!lowp_input) {
      detail::check_floating(weight, op, "weight");
      detail::check_same_dtype(x, weight, op);
    }
    ATH_CHECK(weight.sizes() == normalized_shape, op, "weight has shape ", shape_str(weight.sizes()),
              " but normalized_shape is ", shape_str(normalized_shape), Hint{"give weight exactly the normalized_shape"});
  }
  const int64_t cols = shape_numel(normalized_shape), rows = cols == 0 ? 0 : x.numel() / cols;
  const Tensor xc = detail::contiguous_raw(x);
  const Tensor wc = weight.defined() ? detail::contiguous_raw(weight) : Tensor();
  Tensor y, rstd;
  if (lowp_input) {
    y = empty(x.sizes(), TensorOptions(DType::f32));
    rstd = empty({rows}, TensorOptions(DType::f32));
    if (x.numel() > 0)
      with_lowp(xc, [&](auto* xp) {
        cpu::rms_norm_forward_lowp_input(xp, wc.defined() ? wc.data_ptr<float>() : nullptr, y.data_ptr<float>(),
                                         rstd.data_ptr<float>(), rows, cols, a.eps);
      });
  } else {
    y = empty(x.sizes(), TensorOptions(x.dtype()));
    rstd = empty({rows}, TensorOptions(x.dtype() == DType::f64 ? DType::f64 : DType::f32));
    if (x.numel() > 0) {
      dispatch(x.dtype(), [&]<class T>() {
        if constexpr (is_float_type_v<T>) {
          using S = cpu::norm_stat_t<T>;
          cpu::rms_norm_forward<T>(static_cast<const T*>(xc.raw_data()),
                                   wc.defined() ? static_cast<const T*>(wc.raw_data()) : nullptr,
                                   static_cast<T*>(y.raw_data()), static_cast<S*>(rstd.raw_data()), rows, cols, a.eps);
        }
      });
    }
  }
  if (c.records()) {
    RmsNormSaved& s = c.save<RmsNormSaved>();
    s.lowp_input = lowp_input;
    s.x = save(x, "input"), s.w = weight.defined() ? save(weight, "weight") : SavedTensor(), s.rstd = save(rstd, "rstd");
    s.normalized_shape = normalized_shape;
  }
  return {y};
}

Grads rms_norm_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const RmsNormSaved& s = saved.as<RmsNormSaved>();
  const Tensor xv = detail::contiguous_raw(s.x.unpack(n));
  const Tensor wv = s.w.defined() ? detail::contiguous_raw(s.w.unpack(n)) : Tensor();
  const Tensor rv = s.rstd.unpack(n);
  const int64_t cols = shape_numel(s.normalized_shape), rows = cols == 0 ? 0 : xv.numel() / cols;
  if (s.lowp_input) {
    const Tensor gy = detail::to_raw(g[0], DType::f32);
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
    return {dx, dw};
  }
  const Tensor gy = detail::to_raw(g[0], xv.dtype());
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
                                  static_cast<const S*>(rv.raw_data()), dx.defined() ? static_cast<T*>(dx.raw_data()) : nullptr,
                                  dw.defined() ? static_cast<T*>(dw.raw_data()) : nullptr, rows, cols);
      }
    });
  }
  return {dx, dw};
}

std::vector<Tensor> rms_norm_reference(OpCall& c) {
  const RmsNormArgs& a = c.args<RmsNormArgs>();
  const Tensor x = detail::ref64(c.in(0)).contiguous();
  const Tensor w = c.in(1).defined() ? detail::ref64(c.in(1)).contiguous() : Tensor();
  const int64_t cols = shape_numel(a.normalized_shape), rows = cols == 0 ? 0 : x.numel() / cols;
  Tensor y = empty(x.sizes(), TensorOptions(DType::f64));
  std::vector<double> rstd(static_cast<size_t>(rows));
  cpu::ref::rms_norm_forward<double>(x.data_ptr<double>(), w.defined() ? w.data_ptr<double>() : nullptr, y.data_ptr<double>(),
                                     rstd.data(), rows, cols, a.eps);
  return {y};
}

std::vector<OpCase> rms_norm_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const detail::Inputs& t, const RmsNormArgs& a) { return detail::Inputs{rms_norm(t[0], a.normalized_shape, t[1], a.eps)}; };
  return {
      make_case<RmsNormArgs>("x [4, 6], weight [6]", {case_randn({4 * s, 6}, 1), case_randn({6}, 2)}, {{6}, 1e-6}, call),
      make_case<RmsNormArgs>("x [2, 3, 4] transposed over [3, 4], no weight",
                             {case_randn({2 * s, 3, 4}, 3, CaseLayout::transposed), case_none()}, {{3, 4}, 1e-6}, call),
      make_case<RmsNormArgs>("x [3, 5] strided, weight [5] strided, eps 1e-2",
                             {case_randn({3 * s, 5}, 4, CaseLayout::strided), case_randn({5}, 5, CaseLayout::strided)}, {{5}, 1e-2},
                             call),
  };
}
}  // namespace

namespace ops {
const OpDef& rms_norm_op() {
  static const OpDef d{.name = "rms_norm", .inputs = {"x", "weight"}, .category = AutocastCategory::f32, .reads_lowp = 1u,
                       .kernels = detail::cpu_kernels(rms_norm_cpu, rms_norm_backward), .reference = rms_norm_reference,
                       .dtypes = detail::kFloatDTypes, .cases = rms_norm_cases,
                       .derivative = "rstd (dn - xhat mean(dn xhat)), dn = g w", .file = "src/ops/rms_norm.cpp"};
  return d;
}
}  // namespace ops

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, double eps) {
  return call_op(ops::rms_norm_op(), {x, weight}, RmsNormArgs{normalized_shape, eps});
}

}  // namespace athanor
