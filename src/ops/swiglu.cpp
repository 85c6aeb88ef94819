// swiglu(x, W_gate, W_up) = silu(x W_gate^T) * (x W_up^T): Llama's gated MLP up to down_proj,
// as one op.
//
//   forward   g = x W_gate^T, u = x W_up^T     two GEMMs on linear's path (packed weights too)
//             y = silu(g) u                    one elementwise pass
//   backward  dg = dy u silu'(g), du = dy silu(g)   one pass (cpu::swiglu_backward)
//             dx = dg W_gate + du W_up        two GEMMs into one dx (the second accumulates)
//             dW_gate = dg^T x,  dW_up = du^T x
//
// Under bf16 autocast with f32 weights the GEMMs run on the weights' bf16 copies and dW is
// written in f32 from the f32 accumulators (OpDef::f32_master, as linear and gelu_linear).
//
// Saved: x, g and u (and the weights). Against recomputing g and u in the backward (saving
// only x), that keeps 2 [..., I] tensors for the whole step but spares two of the backward's
// six GEMMs; against the unfused linear, linear, silu, mul composition (x, g, silu(g) and u
// kept), it keeps one [..., I] tensor less. g and u have x's dtype, rounded where the
// composition rounds them (the GEMMs' outputs).
#include "athanor/ops/swiglu.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/gemm.h"
#include "backend/cpu/swiglu.h"
#include "backend/cpu/workspace.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {
using detail::Grads;
using detail::gemm_t;
constexpr const char* kOp = "swiglu";

void check_args(const Tensor& x, const Tensor& wg, const Tensor& wu) {
  detail::check_floating(x, kOp, "x");
  detail::check_floating(wg, kOp, "w_gate");
  detail::check_floating(wu, kOp, "w_up");
  ATH_CHECK(x.dtype() == wg.dtype() && x.dtype() == wu.dtype(), kOp, "x, w_gate and w_up must have one dtype, got x ",
            x.describe(), ", w_gate ", wg.describe(), ", w_up ", wu.describe(),
            Hint{"convert them with .to(...) (or run under autocast)"});
  ATH_CHECK(wg.dim() == 2 && wu.dim() == 2, kOp, "w_gate and w_up must be 2-D [intermediate, d], got w_gate ",
            wg.describe(), ", w_up ", wu.describe());
  ATH_CHECK(wg.sizes() == wu.sizes(), kOp, "w_gate and w_up must have the same shape [intermediate, d], got w_gate ",
            wg.describe(), " and w_up ", wu.describe(), Hint{"gate_proj and up_proj both map d to intermediate_size"});
  ATH_CHECK(x.dim() >= 1 && x.size(-1) == wg.size(1), kOp, "x ", x.describe(), " does not match w_gate ", wg.describe(),
            ": x's last dim must be d = ", wg.size(1),
            Hint{"x is [..., d] and the weights are [intermediate, d] (nn::Linear's [out, in] layout)"});
}

struct SwigluSaved : OpSaved {
  SavedTensor x, wg, wu, g, u;  // contiguous; g and u are [M, I]; under the f32-master rule the bf16 copies of W
  int64_t M = 0, d = 0, I = 0;
  bool master_g = false, master_u = false;  // W_gate, W_up: bf16 copies of f32 parameters
};

template <class T> void forward(const Tensor& xc, const Tensor& wg, const Tensor& wu, Tensor& g, Tensor& u, Tensor& y, int64_t M,
                                int64_t d, int64_t I) {
  if (M == 0 || I == 0) return;
  if (d == 0) {  // empty sums: g = u = 0, y = 0
    g.zero_(), u.zero_(), y.zero_();
    return;
  }
  const T* px = static_cast<const T*>(xc.raw_data());
  T *pg = static_cast<T*>(g.raw_data()), *pu = static_cast<T*>(u.raw_data());
  detail::linear_gemm_w<T>(M, I, d, px, wg, nullptr, pg);
  detail::linear_gemm_w<T>(M, I, d, px, wu, nullptr, pu);
  cpu::swiglu_forward<T>(pg, pu, static_cast<T*>(y.raw_data()), M * I);
}

std::vector<Tensor> swiglu_cpu(OpCall& c) {
  const Tensor &x = c.in(0), &w_gate = c.in(1), &w_up = c.in(2);
  check_args(x, w_gate, w_up);
  const int64_t d = w_gate.size(1), I = w_gate.size(0);
  const int64_t rows = shape_numel(Shape(x.sizes().begin(), x.sizes().end() - 1));  // x's leading dims
  const Tensor xc = detail::contiguous_raw(x), wg = detail::contiguous_raw(w_gate), wu = detail::contiguous_raw(w_up);
  const TensorOptions opts(x.dtype());
  Tensor g = empty({rows, I}, opts), u = empty({rows, I}, opts);
  Shape out_shape = x.sizes();
  out_shape.back() = I;
  Tensor y = empty(out_shape, opts);
  dispatch(x.dtype(), [&]<class T>() {
    if constexpr (is_float_type_v<T>) forward<T>(xc, wg, wu, g, u, y, rows, d, I);
  });
  if (c.records()) {
    SwigluSaved& s = c.save<SwigluSaved>();
    s.x = save(xc, "input"), s.wg = save(wg, "w_gate"), s.wu = save(wu, "w_up");
    s.g = save(g, "gate (x W_gate^T)"), s.u = save(u, "up (x W_up^T)");
    s.M = rows, s.d = d, s.I = I;
    // Under bf16 autocast with f32 weights: bf16 GEMMs on their copies, dW in f32 (OpDef::f32_master).
    s.master_g = c.runs_on_master(1), s.master_u = c.runs_on_master(2);
  }
  return {y};
}

template <class T> Grads backward(const Node& n, const SwigluSaved& s, const Tensor& dy) {
  const Tensor xv = s.x.unpack(n), wg = s.wg.unpack(n), wu = s.wu.unpack(n), gv = s.g.unpack(n), uv = s.u.unpack(n);
  const int64_t M = s.M, d = s.d, I = s.I;
  const TensorOptions opts(xv.dtype());
  Tensor dx = needs_grad(n, 0) ? empty(xv.sizes(), opts) : Tensor();
  Tensor dwg = needs_grad(n, 1) ? empty(wg.sizes(), opts) : Tensor();
  Tensor dwu = needs_grad(n, 2) ? empty(wu.sizes(), opts) : Tensor();
  // f32 parameters get their gradients in f32
  if (s.master_g && dwg.defined()) dwg = empty(wg.sizes(), TensorOptions(DType::f32));
  if (s.master_u && dwu.defined()) dwu = empty(wu.sizes(), TensorOptions(DType::f32));
  if (M == 0 || I == 0 || d == 0) {  // some sum is empty: every gradient is zero
    for (Tensor* t : {&dx, &dwg, &dwu})
      if (t->defined()) t->zero_();
    return {dx, dwg, dwu};
  }
  const cpu::Workspace dgw(static_cast<std::size_t>(M * I) * sizeof(T)), duw(static_cast<std::size_t>(M * I) * sizeof(T));
  T *dg = dgw.as<T>(), *du = duw.as<T>();
  cpu::swiglu_backward<T>(static_cast<const T*>(dy.raw_data()), static_cast<const T*>(gv.raw_data()),
                          static_cast<const T*>(uv.raw_data()), dg, du, M * I);
  const T* px = static_cast<const T*>(xv.raw_data());
  if (dx.defined()) {  // dx = dg W_gate + du W_up     [M, I] @ [I, d], twice
    // Two plain GEMMs (on the weights' packed copies when current) and a sum: the second GEMM
    // accumulating into dx (beta 1) measured ~1.3-2x a plain one (bench_llama_ops, f32).
    T* pdx = static_cast<T*>(dx.raw_data());
    detail::input_grad_gemm<T>(M, d, I, dg, wg, pdx);
    const cpu::Workspace tmp(static_cast<std::size_t>(M * d) * sizeof(T));
    detail::input_grad_gemm<T>(M, d, I, du, wu, tmp.as<T>());
    cpu::swiglu_sum_into<T>(pdx, tmp.as<T>(), M * d);
  }
  // dW = d(g|u)^T x    [I, M] @ [M, d]; on f32 masters from the f32 accumulators
  auto weight_grad = [&](const T* dz, Tensor& dw) {
    if (!dw.defined()) return;
    if constexpr (std::is_same_v<T, bfloat16>) {
      if (dw.dtype() == DType::f32) {
        cpu::gemm_bf16_f32out(true, false, I, d, M, 1.0f, dz, I, px, d, 0.0f, static_cast<float*>(dw.raw_data()), d);
        return;
      }
    }
    gemm_t<T>(true, false, I, d, M, dz, I, px, d, 0.0f, static_cast<T*>(dw.raw_data()), d);
  };
  weight_grad(dg, dwg);
  weight_grad(du, dwu);
  return {dx, dwg, dwu};
}

Grads swiglu_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const SwigluSaved& s = saved.as<SwigluSaved>();
  if (!g[0].defined()) return {Tensor(), Tensor(), Tensor()};
  const DType dt = s.g.unpack(n).dtype();  // bf16 under the f32-master rule
  const Tensor dy = detail::to_raw(g[0], dt);
  Grads grads;
  dispatch(dt, [&]<class T>() {
    if constexpr (is_float_type_v<T>) grads = backward<T>(n, s, dy);
  });
  return grads;
}

// silu(x W_gate^T) * (x W_up^T) in double: two reference GEMMs, then the product per element.
std::vector<Tensor> swiglu_reference(OpCall& c) {
  const Tensor x = detail::ref64(c.in(0)).contiguous(), wg = detail::ref64(c.in(1)).contiguous(),
               wu = detail::ref64(c.in(2)).contiguous();
  const int64_t d = wg.size(1), I = wg.size(0), M = shape_numel(Shape(x.sizes().begin(), x.sizes().end() - 1));
  Shape out = x.sizes();
  out.back() = I;
  std::vector<double> g(static_cast<size_t>(M * I), 0.0), u(g.size(), 0.0);
  if (M > 0 && d > 0) {
    cpu::ref::gemm<double>(false, true, M, I, d, 1.0, x.data_ptr<double>(), d, wg.data_ptr<double>(), d, 0.0, g.data(), I);
    cpu::ref::gemm<double>(false, true, M, I, d, 1.0, x.data_ptr<double>(), d, wu.data_ptr<double>(), d, 0.0, u.data(), I);
  }
  std::vector<double> y(g.size());
  for (size_t i = 0; i < y.size(); ++i) y[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  if (y.empty()) return {zeros(out, TensorOptions(DType::f64))};
  return {from_vector(y, out, TensorOptions(DType::f64))};
}

std::vector<OpCase> swiglu_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const detail::Inputs& t) { return detail::Inputs{swiglu(t[0], t[1], t[2])}; };
  return {
      make_case("x [2, 3, 4], w_gate, w_up [5, 4]", {case_randn({2 * s, 3, 4}, 1), case_randn({5, 4}, 2), case_randn({5, 4}, 3)},
                call),
      make_case("x [3, 6] transposed, w_gate [4, 6] transposed, w_up [4, 6] strided",
                {case_randn({3 * s, 6}, 4, CaseLayout::transposed), case_randn({4, 6}, 5, CaseLayout::transposed),
                 case_randn({4, 6}, 6, CaseLayout::strided)},
                call),
      make_case("x [5] (1-D), w_gate, w_up [3, 5]", {case_randn({5}, 7), case_randn({3, 5}, 8), case_randn({3, 5}, 9)}, call),
  };
}
}  // namespace

namespace ops {
const OpDef& swiglu_op() {
  static const OpDef d{.name = "swiglu", .inputs = {"x", "w_gate", "w_up"}, .category = AutocastCategory::lower_precision,
                       .f32_master = 0b110u, .kernels = detail::cpu_kernels(swiglu_cpu, swiglu_backward), .reference = swiglu_reference,
                       .dtypes = detail::kFloatDTypes, .cases = swiglu_cases,
                       .derivative = "dg = dy u silu'(g), du = dy silu(g); dx = dg Wg + du Wu, dWg = dg^T x, dWu = du^T x",
                       .file = "src/ops/swiglu.cpp"};
  return d;
}
}  // namespace ops

Tensor swiglu(const Tensor& x, const Tensor& w_gate, const Tensor& w_up) {
  return call_op(ops::swiglu_op(), {x, w_gate, w_up});
}

}  // namespace athanor
