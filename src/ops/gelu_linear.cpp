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
// f32 (AVX-512) backward: one parallel region, each thread on its rows: dh = dy W (sgemm),
// then h = gelu(x) and dx = dh ⊙ gelu'(x) in one pass (no s buffer; blocked_dx_and_gelu);
// then dW over all rows. With out < in (fc2), dW (f32, also from bf16 under autocast) is
// computed as (h^T dy)^T. Tiny GPT fc2 backward (2048 x 1024 -> 256), 2 threads, against
// the previous path (HEAD f3e6d83), same process, interleaved, median of 31 paired
// differences: f32 7.6 -> 6.6-7.1 ms (3 runs), bf16 autocast 4.40 -> 4.27 ms; small GPT
// (1536 -> 384) f32 15.4 -> 14.8, bf16 10.36 -> 10.20. (The forward as row blocks of gelu +
// sgemm measured slower: tiny fc2, 3.83-5.13 ms against 3.40-3.46 for the gelu pass + the
// matmul primitive; bench_gpt_ops exp.)
// f64 (and builds without AVX-512) take the plain path: recompute, GEMM, gelu backward.
// Under bf16 autocast with f32 W (and b) the op records W and b themselves and writes dW
// and db in f32 (detail::runs_on_f32_master, op_utils.h).
#include "athanor/ops/gelu_linear.h"

#include <omp.h>

#include <algorithm>

#include "athanor/ops/autocast.h"
#include "backend/cpu/activation.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_row_blocks.h"
#include "backend/cpu/reduce.h"
#include "backend/cpu/unary.h"
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

template <class T>
constexpr bool kFusedSlope = ATHANOR_CPU_AVX512 && !std::is_same_v<T, double>;

#if ATHANOR_CPU_AVX512
struct GeluValueSlope {
  __m512 value, slope;
};
// gelu_tanh(x) and gelu_tanh'(x) for 16 lanes from one logistic. The operations are those of
// the gelu_tanh forward and backward kernels (backend/cpu/activation.cpp: x sigmoid(2u);
// s + 2x u' s(1 - s)), so h and s ⊙ g are bit-identical to theirs.
inline GeluValueSlope gelu_tanh_value_slope16(__m512 xv) {
  constexpr float kSqrt2OverPi = float(0.79788456080286535588), kC = float(0.044715), k3C = float(3 * 0.044715);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 x2 = _mm512_mul_ps(xv, xv);
  const __m512 u = _mm512_mul_ps(_mm512_set1_ps(kSqrt2OverPi), _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(kC), x2), xv, xv));
  const __m512 du = _mm512_mul_ps(_mm512_set1_ps(kSqrt2OverPi), _mm512_fmadd_ps(_mm512_set1_ps(k3C), x2, one));
  const cpu::vec::Logistic l = cpu::vec::logistic(_mm512_add_ps(u, u));
  const __m512 ope = _mm512_add_ps(one, l.e);
  const __m512 sig = _mm512_div_ps(l.num, ope);
  const __m512 q = _mm512_div_ps(l.e, _mm512_mul_ps(ope, ope));  // sig (1 - sig)
  return {_mm512_div_ps(_mm512_mul_ps(xv, l.num), ope), _mm512_fmadd_ps(_mm512_mul_ps(_mm512_add_ps(xv, xv), du), q, sig)};
}

// h[i] = gelu_tanh(x[i]) (rounded to T) and s[i] = gelu_tanh'(x[i]) (f32), in parallel.
template <class T> void gelu_tanh_value_and_slope(const T* x, T* h, float* s, int64_t n) {
  cpu::vec::parallel_blocks(n, cpu::vec::kGrainTranscendental, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i += 16) {
      const __mmask16 m = cpu::vec::tail_mask(e - i);
      const GeluValueSlope v = gelu_tanh_value_slope16(cpu::vec::load16(x + i, m));
      cpu::vec::store16(h + i, m, v.value);
      cpu::vec::store16(s + i, m, v.slope);
    }
  });
}

// g[i] = g[i] s[i], rounded to T (the last step of the gelu backward kernel).
template <class T> void multiply_by_slope(T* g, const float* s, int64_t n) {
  cpu::vec::parallel_blocks(n, cpu::vec::kGrainCheap, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i += 16) {
      const __mmask16 m = cpu::vec::tail_mask(e - i);
      cpu::vec::store16(g + i, m, _mm512_mul_ps(cpu::vec::load16(g + i, m), cpu::vec::load16(s + i, m)));
    }
  });
}

// f32, on one thread: h[i] = gelu_tanh(x[i]) (skipped when h is null) and g[i] *= gelu_tanh'(x[i]).
void gelu_tanh_value_and_apply_slope(const float* x, float* h, float* g, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = cpu::vec::tail_mask(n - i);
    const GeluValueSlope v = gelu_tanh_value_slope16(cpu::vec::load16(x + i, m));
    if (h) cpu::vec::store16(h + i, m, v.value);
    cpu::vec::store16(g + i, m, _mm512_mul_ps(cpu::vec::load16(g + i, m), v.slope));
  }
}

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
      [&](int64_t r0, int64_t n) { gelu_tanh_value_and_apply_slope(x + r0 * in, h ? h + r0 * in : nullptr, dx + r0 * in, n * in); },
      pw ? &pw.layout : nullptr, static_cast<const float*>(pw.data));
}

#endif

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
#if ATHANOR_CPU_AVX512
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
    return Grads{dx, dw, db};
  } else if constexpr (kFusedSlope<T>) {
    const cpu::Workspace slope(static_cast<std::size_t>(M * in) * sizeof(float));  // gelu'(x), f32
    {
      const cpu::Workspace h(static_cast<std::size_t>(M * in) * sizeof(T));  // gelu(x)
      gelu_tanh_value_and_slope<T>(px, h.as<T>(), slope.as<float>(), M * in);
      if (needs_grad(n, 1)) weight_grad(h.as<T>());
    }
    if (needs_grad(n, 0)) {  // dh = dy W  [M, out] @ [out, in]; then dx = dh ⊙ gelu'(x) in place
      dx = empty(xv.sizes(), TensorOptions(dy.dtype()));
      T* pdx = static_cast<T*>(dx.raw_data());
      detail::input_grad_gemm<T>(M, in, out_f, pdy, wv, pdx);
      multiply_by_slope<T>(pdx, slope.as<float>(), M * in);
    }
    return Grads{dx, dw, db};
  }
#endif
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

// gelu_linear under bf16 autocast with f32 W (and b): see op_utils.h.
Tensor gelu_linear_f32_master(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const detail::LowpLinearInputs l = detail::f32_master_inputs(kOp, x, weight, bias);
  check_args(l.x, l.weight, l.bias);
  const int64_t in = l.weight.size(1), out_f = l.weight.size(0), M = l.x.numel() / std::max<int64_t>(in, 1);
  const Tensor xc = detail::contiguous_raw(l.x), wc = detail::contiguous_raw(l.weight);
  const Tensor y = forward<bfloat16>(xc, wc, l.bias, M, in, out_f);
  if (!any_requires_grad({l.x, weight, bias})) return y;
  SavedTensor sx = save(xc, "input"), sw = save(wc, "weight (bf16 copy)");
  return record(kOp, {l.x, weight, bias}, y, [sx, sw, in, out_f, M](const Node& n, const Grads& g) {
    return backward<bfloat16, float>(n, sx.unpack(n), sw.unpack(n), detail::to_raw(g[0], DType::bf16), M, in, out_f);
  });
}
}  // namespace

Tensor gelu_linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (detail::runs_on_f32_master(kOp, x, weight, bias)) return gelu_linear_f32_master(x, weight, bias);
  if (autocast_needs_cast(kOp, {x, weight, bias}))
    return gelu_linear(autocast_input(x, kOp), autocast_input(weight, kOp), autocast_input(bias, kOp));
  check_args(x, weight, bias);
  const int64_t in = weight.size(1), out_f = weight.size(0), M = x.numel() / std::max<int64_t>(in, 1);
  const Tensor xc = detail::contiguous_raw(x), wc = detail::contiguous_raw(weight);
  Tensor y;
  dispatch(x.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>) y = forward<T>(xc, wc, bias, M, in, out_f);
  });
  if (!any_requires_grad({x, weight, bias})) return y;
  SavedTensor sx = save(xc, "input"), sw = save(wc, "weight");
  return record(kOp, {x, weight, bias}, y, [sx, sw, in, out_f, M](const Node& n, const Grads& g) {
    const Tensor xv = sx.unpack(n), wv = sw.unpack(n);
    const Tensor dy = detail::to_raw(g[0], xv.dtype());
    Grads grads;
    dispatch(dy.dtype(), [&]<class T>() {
      if constexpr (std::is_floating_point_v<T> || is_half_v<T>) grads = backward<T, T>(n, xv, wv, dy, M, in, out_f);
    });
    return grads;
  });
}

}  // namespace athanor
