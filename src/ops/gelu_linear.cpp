// gelu_linear(x, W, b) = linear(gelu_tanh(x), W, b), the second half of a GPT MLP,
// fused so that gelu(x) is never kept (llm.c's GELU recompute):
//
//   forward   h = gelu(x)              scratch (MemTag::workspace), freed after the GEMM
//             y = h W^T + b           one GEMM, the bias in its epilogue
//   backward  h = gelu(x), s = gelu'(x)  one pass over x (one exp per element), into scratch:
//                                     h in x's dtype, s in f32
//             dW = dy^T h,  db = rowsum(dy)
//             dx = (dy W) ⊙ s          the GEMM, then a multiply pass
//
// Only x (and W) are saved, so against the unfused gelu + linear the graph holds one
// [..., in] tensor less per call. Every step rounds where the unfused composition rounds
// (gelu(x) to x's dtype, dy W to x's dtype), with the f32 formulas of the gelu kernels, so
// the results equal the composition's. Against recomputing gelu(x) and then running the
// gelu backward kernel (two exps per element), the backward's elementwise work falls from
// ~1.43 to ~1.05 ms (2 threads, quiet machine) per 2048 x 1024 bf16 x. (The multiply as a
// oneDNN binary post-op of the dx GEMM measured slower than the separate pass: ~+0.8 ms
// of CPU time against ~+0.4; a bf16 s was slower than f32.)
// f32 backward (avx512 levels): one parallel region, each thread on its rows: dh = dy W (sgemm),
// then h = gelu(x) and dx = dh ⊙ gelu'(x) in one pass (no s buffer; blocked_dx_and_gelu);
// then dW over all rows. With out < in (fc2), dW (f32, also from bf16 under autocast) is
// computed as (h^T dy)^T. Tiny GPT fc2 backward (2048 x 1024 -> 256), 2 threads, against
// the previous path (HEAD f3e6d83), same process, interleaved, median of 31 paired
// differences: f32 7.6 -> 6.6-7.1 ms (3 runs), bf16 autocast 4.40 -> 4.27 ms; small GPT
// (1536 -> 384) f32 15.4 -> 14.8, bf16 10.36 -> 10.20. (The forward as row blocks of gelu +
// sgemm measured slower: tiny fc2, 3.83-5.13 ms against 3.40-3.46 for the gelu pass + the
// matmul primitive; bench_gpt_ops exp.)
// f64 (and the avx2 level) take the plain path: recompute, GEMM, gelu backward.
// Under bf16 autocast with f32 W (and b) the op records W and b themselves and writes dW
// and db in f32 (OpDef::f32_master).
#include "athanor/ops/gelu_linear.h"

#include <omp.h>

#include <algorithm>

#include "backend/cpu/activation.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_row_blocks.h"
#include "backend/cpu/reduce.h"
#include "backend/cpu/unary.h"  // vec::kGrainTranscendental
#include "backend/cpu/workspace.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {
using detail::Grads;
constexpr const char* kOp = "gelu_linear";
constexpr cpu::Activation kGelu = cpu::Activation::gelu_tanh;

void check_args(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  detail::check_linear_args(x, weight, bias, kOp,
                            "gelu_linear(x, W, b) is linear(gelu(x), W, b): x's last dim is W's in_features (4 n_embd in a GPT MLP)");
}
using detail::gemm_t;

// The f32 backward's dx (and h = gelu(x) for dW, when h is not null) in one parallel region,
// each thread on its share of the rows: dh = dy W on those rows (a single-threaded sgemm,
// cpu::gemm_tile), then h and dx = dh ⊙ gelu'(x) in one pass over them. Against the GEMM
// over all rows (a matmul primitive) followed by the two elementwise passes, that drops the
// [M, in] f32 slope buffer (written, then read) and two parallel regions: tiny GPT fc2
// (2048 x 1024 x 256), 2 threads, dx and dW: 7.19-7.49 ms against 7.74-8.35 (bench_gpt_ops
// exp; blocks of 128 or 256 rows, sized for L2, measured 7.41-7.67: each sgemm packs all
// of W again).
void blocked_dx_and_gelu(const float* x, const Tensor& wv, const float* dy, float* h, float* dx, int64_t M, int64_t in,
                         int64_t out_f) {
  const int64_t threads = M * in > cpu::vec::kGrainTranscendental ? omp_get_max_threads() : 1;
  const detail::PackedWeight pw = detail::input_grad_packed(wv, M, in, out_f);
  cpu::gemm_row_blocks(
      M, in, out_f, dy, out_f, static_cast<const float*>(wv.raw_data()), in, dx, in, threads,
      [&](int64_t r0, int64_t n) {
        cpu::gelu_tanh_value_and_apply_slope(x + r0 * in, h ? h + r0 * in : nullptr, dx + r0 * in, n * in);
      },
      pw ? &pw.layout : nullptr, static_cast<const float*>(pw.data));
}

// y = gelu(x) W^T + b on contiguous x, W (and b) of dtype T; y is [..., out] of x's shape.
template <class T> Tensor forward(const Tensor& xc, const Tensor& wc, const Tensor& bias, int64_t M, int64_t in, int64_t out_f) {
  Shape out_shape = xc.sizes();
  out_shape.back() = out_f;
  Tensor y = empty(out_shape, TensorOptions(xc.dtype()));
  const cpu::Workspace h(static_cast<std::size_t>(M * in) * sizeof(T));  // gelu(x), dropped after the GEMM
  cpu::activation_forward<T>(kGelu, static_cast<const T*>(xc.raw_data()), h.as<T>(), M * in);
  const Tensor bc = bias.defined() ? detail::contiguous_raw(bias) : Tensor();
  detail::linear_gemm_w<T>(M, out_f, in, h.as<T>(), wc,
                           bc.defined() ? static_cast<const T*>(bc.raw_data()) : nullptr, static_cast<T*>(y.raw_data()));
  return y;
}

// The backward's dx (into dx) and dW (weight_grad) on the fused kernels (the avx512 levels; see
// cpu::gelu_tanh_fused_slope).
template <class T, class WeightGrad>
void fused_backward(const Node& n, const T* px, const Tensor& wv, const T* pdy, const Tensor& xv, const Tensor& dy,
                    int64_t M, int64_t in, int64_t out_f, const WeightGrad& weight_grad, Tensor& dx) {
  if constexpr (std::is_same_v<T, float>) {
    // dx and h on each thread's rows (blocked_dx_and_gelu); then dW from h.
    const cpu::Workspace h(needs_grad(n, 1) ? static_cast<std::size_t>(M * in) * sizeof(float) : 0);  // gelu(x)
    if (needs_grad(n, 0)) {
      dx = empty(xv.sizes(), TensorOptions(dy.dtype()));
      blocked_dx_and_gelu(px, wv, pdy, h.as<float>(), static_cast<float*>(dx.raw_data()), M, in, out_f);
    } else {
      cpu::activation_forward<float>(kGelu, px, h.as<float>(), M * in);
    }
    if (needs_grad(n, 1)) weight_grad(h.as<float>());
  } else {
    const cpu::Workspace slope(static_cast<std::size_t>(M * in) * sizeof(float));  // gelu'(x), f32
    {
      const cpu::Workspace h(static_cast<std::size_t>(M * in) * sizeof(T));  // gelu(x)
      cpu::gelu_tanh_value_and_slope<T>(px, h.as<T>(), slope.as<float>(), M * in);
      if (needs_grad(n, 1)) weight_grad(h.as<T>());
    }
    if (needs_grad(n, 0)) {  // dh = dy W  [M, out] @ [out, in]; then dx = dh ⊙ gelu'(x) in place
      dx = empty(xv.sizes(), TensorOptions(dy.dtype()));
      T* pdx = static_cast<T*>(dx.raw_data());
      detail::input_grad_gemm<T>(M, in, out_f, pdy, wv, pdx);
      cpu::multiply_by_slope<T>(pdx, slope.as<float>(), M * in);
    }
  }
}

// The backward on contiguous x, W (dtype T) and dy: dx in T; dW and db in TP (T, or f32 for
// bf16 T on f32 parameters: written from the f32 accumulators).
template <class T, class TP>
Grads backward(const Node& n, const Tensor& xv, const Tensor& wv, const Tensor& dy, int64_t M, int64_t in, int64_t out_f) {
  const T* pdy = static_cast<const T*>(dy.raw_data());
  const T* px = static_cast<const T*>(xv.raw_data());
  constexpr DType grad_dt = dtype_of<TP>;
  Tensor dx, dw, db;
  auto weight_grad = [&](const T* h) {  // dW = dy^T h     [out, M] @ [M, in]
    if (M == 0) {  // no rows: the scratch h is null, which the GEMM rejects
      dw = zeros(wv.sizes(), TensorOptions(grad_dt));
      return;
    }
    dw = empty(wv.sizes(), TensorOptions(grad_dt));
    if constexpr (std::is_same_v<TP, float>) {
      if (out_f < in) {
        // f32 dW with out < in (a GPT's fc2): dW^T = h^T dy [in, out], then transposed into
        // dW. oneDNN runs that orientation faster there: tiny GPT fc2 (256 x 1024, K 2048),
        // 2 threads, f32: 3.9 ms with the transpose against 4.9 for dW = dy^T h; same or
        // slower for out >= in (bench_gpt_ops orient).
        const cpu::Workspace dwt(static_cast<std::size_t>(in * out_f) * sizeof(float));
        if constexpr (std::is_same_v<T, float>) gemm_t<float>(true, false, in, out_f, M, h, in, pdy, out_f, 0.0f, dwt.as<float>(), out_f);
        else cpu::gemm_bf16_f32out(true, false, in, out_f, M, 1.0f, h, in, pdy, out_f, 0.0f, dwt.as<float>(), out_f);
        detail::transpose_2d(dwt.as<float>(), in, out_f, static_cast<float*>(dw.raw_data()));
        return;
      }
    }
    if constexpr (std::is_same_v<T, TP>) gemm_t<T>(true, false, out_f, in, M, pdy, out_f, h, in, 0.0f, static_cast<T*>(dw.raw_data()), in);
    else cpu::gemm_bf16_f32out(true, false, out_f, in, M, 1.0f, pdy, out_f, h, in, 0.0f, static_cast<float*>(dw.raw_data()), in);
  };
  if (needs_grad(n, 2)) {  // db = sum over rows of dy
    db = empty({out_f}, TensorOptions(grad_dt));
    if constexpr (std::is_same_v<T, TP>) cpu::sum_3d<T>(pdy, static_cast<T*>(db.raw_data()), 1, M, out_f);
    else cpu::sum_3d_lowp_input<T>(pdy, static_cast<float*>(db.raw_data()), 1, M, out_f);
  }
  if (!needs_grad(n, 0) && !needs_grad(n, 1)) return Grads{dx, dw, db};
  // The fused paths where the level computes gelu and its slope in one pass (the avx512
  // levels); elsewhere the plain one (recompute, GEMM, gelu backward), which rounds the same.
  if constexpr (!std::is_same_v<T, double>) {
    if (cpu::gelu_tanh_fused_slope()) {
      fused_backward<T>(n, px, wv, pdy, xv, dy, M, in, out_f, weight_grad, dx);
      return Grads{dx, dw, db};
    }
  }
  if (needs_grad(n, 1)) {  // gelu(x) recomputed for the weight gradient
    const cpu::Workspace h(static_cast<std::size_t>(M * in) * sizeof(T));
    cpu::activation_forward<T>(kGelu, px, h.as<T>(), M * in);
    weight_grad(h.as<T>());
  }
  if (needs_grad(n, 0)) {  // dh = dy W  [M, out] @ [out, in]; then dx = dh ⊙ gelu'(x) in place
    dx = empty(xv.sizes(), TensorOptions(dy.dtype()));
    T* pdx = static_cast<T*>(dx.raw_data());
    detail::input_grad_gemm<T>(M, in, out_f, pdy, wv, pdx);
    // The activation kernel is elementwise (reads g[i], writes dx[i]), so g and dx may alias.
    cpu::activation_backward<T>(kGelu, px, pdx, pdx, M * in);
  }
  return Grads{dx, dw, db};
}

struct GeluLinearSaved : OpSaved {
  SavedTensor x, w;  // contiguous; under the f32-master rule the bf16 x and the bf16 copy of W
  int64_t in = 0, out_f = 0, M = 0;
  bool master = false;
};

std::vector<Tensor> gelu_linear_cpu(OpCall& c) {
  const Tensor &x = c.in(0), &weight = c.in(1), &bias = c.in(2);
  check_args(x, weight, bias);
  const int64_t in = weight.size(1), out_f = weight.size(0), M = x.numel() / std::max<int64_t>(in, 1);
  const Tensor xc = detail::contiguous_raw(x), wc = detail::contiguous_raw(weight);
  Tensor y;
  dispatch(x.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>) y = forward<T>(xc, wc, bias, M, in, out_f);
  });
  if (c.records()) {
    GeluLinearSaved& s = c.save<GeluLinearSaved>();
    // Under bf16 autocast with f32 W (and b): bf16 GEMMs on the copies, dW and db in f32 (OpDef::f32_master).
    s.master = c.runs_on_master(1);
    s.x = save(xc, "input"), s.w = save(wc, s.master ? "weight (bf16 copy)" : "weight");
    s.in = in, s.out_f = out_f, s.M = M;
  }
  return {y};
}

Grads gelu_linear_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const GeluLinearSaved& s = saved.as<GeluLinearSaved>();
  const Tensor xv = s.x.unpack(n), wv = s.w.unpack(n);
  if (s.master) return backward<bfloat16, float>(n, xv, wv, detail::to_raw(g[0], DType::bf16), s.M, s.in, s.out_f);
  const Tensor dy = detail::to_raw(g[0], xv.dtype());
  Grads grads;
  dispatch(dy.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>) grads = backward<T, T>(n, xv, wv, dy, s.M, s.in, s.out_f);
  });
  return grads;
}

// gelu_tanh(x) W^T + b: the reference activation, then the reference GEMM, in double.
std::vector<Tensor> gelu_linear_reference(OpCall& c) {
  const Tensor h = cpu::ref::activation_forward(kGelu, detail::ref64(c.in(0)));
  const Tensor w = detail::ref64(c.in(1)).contiguous();
  const int64_t in = w.size(1), out_f = w.size(0), M = h.numel() / std::max<int64_t>(in, 1);
  Shape out = h.sizes();
  out.back() = out_f;
  Tensor y = zeros(out, TensorOptions(DType::f64));
  if (c.in(2).defined()) copy_into(y, detail::ref64(c.in(2)));
  cpu::ref::gemm<double>(false, true, M, out_f, in, 1.0, h.contiguous().data_ptr<double>(), in, w.data_ptr<double>(), in, 1.0,
                         y.data_ptr<double>(), out_f);
  return {y};
}
}  // namespace

namespace ops {
const OpDef& gelu_linear_op() {
  static const OpDef d{.name = "gelu_linear", .inputs = {"x", "weight", "bias"}, .category = AutocastCategory::lower_precision,
                       .f32_master = 0b110u, .kernels = detail::cpu_kernels(gelu_linear_cpu, gelu_linear_backward),
                       .reference = gelu_linear_reference, .dtypes = detail::kFloatDTypes,
                       .cases = [](int s) { return detail::linear_like_cases(s, gelu_linear); },
                       .derivative = "gelu(x) recomputed; dW = dy^T gelu(x), db = rowsum(dy), dx = (dy W) gelu'(x)",
                       .file = "src/ops/gelu_linear.cpp"};
  return d;
}
}  // namespace ops

Tensor gelu_linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return call_op(ops::gelu_linear_op(), {x, weight, bias});
}

}  // namespace athanor
