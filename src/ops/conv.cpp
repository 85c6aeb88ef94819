// conv2d: checks, the im2col + GEMM kernel (backend/cpu/conv) and its backward.
// f32 and f64 run natively; bf16/f16 are computed in f32 and rounded once.
#include <sstream>

#include "athanor/ops/conv.h"
#include "backend/cpu/conv.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {
constexpr const char* kOp = "conv2d";

std::string pair_str(Pair p) {
  std::ostringstream s;
  s << "(" << p[0] << ", " << p[1] << ")";
  return s.str();
}

using detail::Grads;
using detail::Inputs;

using detail::ConvArgs;  // ops/op_args.h: shared with the CUDA kernel (src/ops/cuda/)
struct ConvSaved : OpSaved {
  SavedTensor x, w;
  cpu::Conv2dGeom g;
  DType dt = DType::f32, ct = DType::f32;
};

std::vector<Tensor> conv2d_cpu(OpCall& c) {
  const Tensor &x = c.in(0), &weight = c.in(1), &bias = c.in(2);
  const ConvArgs& a = c.args<ConvArgs>();
  const cpu::Conv2dGeom g = detail::conv2d_geometry(x, weight, bias, a.stride, a.padding, a.dilation, a.groups);
  const DType dt = x.dtype(), ct = dt == DType::f64 ? DType::f64 : DType::f32;
  Tensor y = empty({g.N, g.OC, g.OH, g.OW}, TensorOptions(ct));
  {
    const Tensor xc = detail::to_raw(x, ct), wc = detail::to_raw(weight, ct);
    const Tensor bc = bias.defined() ? detail::to_raw(bias, ct) : Tensor();
    dispatch(ct, [&]<class T>() {
      if constexpr (std::is_floating_point_v<T>)
        cpu::conv2d_forward<T>(xc.data_ptr<T>(), wc.data_ptr<T>(), bc.defined() ? bc.data_ptr<T>() : nullptr,
                               y.data_ptr<T>(), g);
    });
  }
  if (dt != ct) y = detail::to_raw(y, dt);
  if (c.records()) {
    ConvSaved& s = c.save<ConvSaved>();
    s.x = save(x, "input"), s.w = save(weight, "weight"), s.g = g, s.dt = dt, s.ct = ct;
  }
  return {y};
}

Grads conv2d_backward(const Node& n, const Grads& grads, const OpSaved& saved) {
  const ConvSaved& s = saved.as<ConvSaved>();
  const DType ct = s.ct, dt = s.dt;
  const cpu::Conv2dGeom& g = s.g;
  const Tensor xv = detail::to_raw(s.x.unpack(n), ct), wv = detail::to_raw(s.w.unpack(n), ct);
  if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor()};
  const Tensor dy = detail::to_raw(grads[0], ct);
  Tensor dx, dw, db;
  if (needs_grad(n, 0)) dx = empty(xv.sizes(), TensorOptions(ct));
  if (needs_grad(n, 1)) dw = empty(wv.sizes(), TensorOptions(ct));
  if (needs_grad(n, 2)) db = empty({g.OC}, TensorOptions(ct));
  dispatch(ct, [&]<class T>() {
    if constexpr (std::is_floating_point_v<T>) {
      auto ptr = [](const Tensor& t) { return t.defined() ? t.data_ptr<T>() : nullptr; };
      // dx = col2im(W^T dy), dw = sum_n dy col^T, db = sum dy (see backend/cpu/conv.h)
      cpu::conv2d_backward<T>(xv.data_ptr<T>(), wv.data_ptr<T>(), dy.data_ptr<T>(), ptr(dx), ptr(dw), ptr(db), g);
    }
  });
  auto back = [dt](const Tensor& t) { return t.defined() && t.dtype() != dt ? detail::to_raw(t, dt) : t; };
  return {back(dx), back(dw), back(db)};
}

std::vector<Tensor> conv2d_reference(OpCall& c) {
  const ConvArgs& a = c.args<ConvArgs>();
  const Tensor x = detail::ref64(c.in(0)), w = detail::ref64(c.in(1));
  const Tensor b = c.in(2).defined() ? detail::ref64(c.in(2)) : Tensor();
  return {cpu::ref::conv2d(x, w, b, detail::conv2d_geometry(x, w, b, a.stride, a.padding, a.dilation, a.groups))};
}

std::vector<OpCase> conv2d_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const ConvArgs& a) { return Inputs{conv2d(t[0], t[1], t[2], a.stride, a.padding, a.dilation, a.groups)}; };
  return {
      make_case<ConvArgs>("x [2, 3, 5, 5], w [4, 3, 3, 3], b [4]",
                          {case_randn({2 * s, 3, 5, 5}, 1), case_randn({4, 3, 3, 3}, 2), case_randn({4}, 3)}, {}, call),
      make_case<ConvArgs>("x [1, 4, 6, 5] transposed, w [2, 2, 2, 3], stride 2, padding 1, groups 2, no bias",
                          {case_randn({s, 4, 6, 5}, 4, CaseLayout::transposed), case_randn({2, 2, 2, 3}, 5), case_none()},
                          {{2, 2}, {1, 1}, {1, 1}, 2}, call),
      make_case<ConvArgs>("x [1, 2, 7, 7] strided, w [3, 2, 2, 2] strided, dilation 2, b [3]",
                          {case_randn({s, 2, 7, 7}, 6, CaseLayout::strided), case_randn({3, 2, 2, 2}, 7, CaseLayout::strided),
                           case_randn({3}, 8)},
                          {{1, 1}, {0, 0}, {2, 2}, 1}, call),
      make_case<ConvArgs>("x [2, 3, 4, 4], w [5, 3, 1, 1] (1x1)", {case_randn({2 * s, 3, 4, 4}, 9), case_randn({5, 3, 1, 1}, 10), case_none()},
                          {}, call),
  };
}
}  // namespace

namespace detail {
cpu::Conv2dGeom conv2d_geometry(const Tensor& x, const Tensor& w, const Tensor& b, Pair stride, Pair padding, Pair dilation,
                          int64_t groups) {
  detail::check_floating(x, "conv2d", "input");
  detail::check_floating(w, "conv2d", "weight");
  detail::check_same_dtype(x, w, "conv2d");
  ATH_CHECK(x.dim() == 4, "conv2d", "input must be 4-D [N, C_in, H, W], got ", x.describe(),
            Hint{"add a batch dim with unsqueeze(x, 0) for a single image"});
  ATH_CHECK(w.dim() == 4, "conv2d", "weight must be 4-D [C_out, C_in / groups, kH, kW], got ", w.describe());
  ATH_CHECK(stride[0] >= 1 && stride[1] >= 1 && dilation[0] >= 1 && dilation[1] >= 1 && padding[0] >= 0 &&
                padding[1] >= 0,
            "conv2d", "stride and dilation must be >= 1 and padding >= 0, got stride ", pair_str(stride), ", padding ",
            pair_str(padding), ", dilation ", pair_str(dilation));
  ATH_CHECK(groups >= 1, "conv2d", "groups must be >= 1, got ", groups);
  const int64_t C = x.size(1), OC = w.size(0);
  ATH_CHECK(C % groups == 0 && OC % groups == 0, "conv2d", "input channels (", C, ") and output channels (", OC,
            ") must both be divisible by groups = ", groups, "; input ", x.describe(), ", weight ", w.describe());
  ATH_CHECK(w.size(1) * groups == C, "conv2d", "input ", x.describe(), " has ", C, " channels but weight ", w.describe(),
            " with groups = ", groups, " expects ", w.size(1) * groups, " (weight.size(1) * groups)",
            Hint{"weight is [C_out, C_in / groups, kH, kW]; check in_channels of the layer against the input"});
  if (b.defined()) {
    detail::check_same_dtype(x, b, "conv2d");
    ATH_CHECK(b.dim() == 1 && b.size(0) == OC, "conv2d", "bias ", b.describe(), " must be 1-D of size C_out = ", OC,
              " (weight ", w.describe(), ")");
  }
  cpu::Conv2dGeom g;
  g.N = x.size(0), g.C = C, g.H = x.size(2), g.W = x.size(3), g.OC = OC, g.KH = w.size(2), g.KW = w.size(3);
  g.sh = stride[0], g.sw = stride[1], g.ph = padding[0], g.pw = padding[1], g.dh = dilation[0], g.dw = dilation[1];
  g.groups = groups;
  g.OH = cpu::conv_out_size(g.H, g.KH, g.sh, g.ph, g.dh);
  g.OW = cpu::conv_out_size(g.W, g.KW, g.sw, g.pw, g.dw);
  ATH_CHECK(g.OH > 0 && g.OW > 0, "conv2d", "kernel ", g.KH, "x", g.KW, " with dilation ", pair_str(dilation),
            " is larger than the padded input: input ", x.describe(), " with padding ", pair_str(padding),
            ", weight ", w.describe(), Hint{"use a smaller kernel or dilation, more padding, or a larger input"});
  return g;
}
}  // namespace detail

namespace ops {
const OpDef& conv2d_op() {
  static const OpDef d{.name = "conv2d", .inputs = {"x", "weight", "bias"}, .category = AutocastCategory::lower_precision,
                       .kernels = detail::cpu_kernels(conv2d_cpu, conv2d_backward), .reference = conv2d_reference,
                       .dtypes = detail::kFloatDTypes, .cases = conv2d_cases,
                       .derivative = "dx = col2im(W^T dY), dW = dY col^T, db = sum(dY)", .file = "src/ops/conv.cpp"};
  return d;
}
}  // namespace ops

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Pair stride, Pair padding, Pair dilation,
              int64_t groups) {
  return call_op(ops::conv2d_op(), {x, weight, bias}, ConvArgs{stride, padding, dilation, groups});
}

}  // namespace athanor
