// matmul (batched, broadcasting, transposes handed to the GEMM) and linear
// (one GEMM with the bias added in its epilogue, detail::linear_gemm_t). Under bf16
// autocast with f32 parameters linear records W and b themselves and writes dW, db in f32
// (detail::runs_on_f32_master, op_utils.h).
#include "athanor/ops/linalg.h"

#include "athanor/ops/autocast.h"
#include "athanor/ops/reduction.h"
#include "athanor/ops/shape.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/reduce.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {
using detail::gemm_t;

// How a matrix (last two dims of a tensor) can be handed to the GEMM without a copy.
struct MatLayout {
  bool ok = false, trans = false;
  int64_t ld = 0;
};
MatLayout layout_of(const Tensor& t) {
  const int64_t r = t.size(-2), c = t.size(-1), sr = t.stride(-2), sc = t.stride(-1);
  if ((sc == 1 || c == 1) && sr >= std::max<int64_t>(c, 1)) return {true, false, sr};
  if ((sr == 1 || r == 1) && sc >= std::max<int64_t>(r, 1)) return {true, true, sc};
  return {};
}

// out[batch..., M, N] = A[batch..., M, K] @ B[batch..., K, N] for >= 2-D operands,
// broadcasting batch dims. Not recorded.
Tensor matmul_kernel(const Tensor& a_in, const Tensor& b_in) {
  const int64_t M = a_in.size(-2), K = a_in.size(-1), N = b_in.size(-1);
  const Shape abatch(a_in.sizes().begin(), a_in.sizes().end() - 2), bbatch(b_in.sizes().begin(), b_in.sizes().end() - 2);
  const Shape batch = broadcast_shapes(abatch, bbatch, "matmul");
  Shape out_shape = batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  Tensor out = empty(out_shape, TensorOptions(a_in.dtype()));
  if (out.numel() == 0) return out;
  Tensor a = a_in, b = b_in;
  MatLayout la = layout_of(a), lb = layout_of(b);
  if (!la.ok) a = detail::contiguous_raw(a), la = layout_of(a);
  if (!lb.ok) b = detail::contiguous_raw(b), lb = layout_of(b);
  dispatch(a.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
      const T* pa = static_cast<const T*>(a.raw_data());
      const T* pb = static_cast<const T*>(b.raw_data());
      T* po = static_cast<T*>(out.raw_data());
      // Fold a's batch into M when b is a single matrix and a's rows are evenly spaced.
      if (bbatch.empty() && !la.trans && a.dim() > 2) {
        bool foldable = true;
        int64_t expect = a.stride(-2) * M;
        for (int64_t i = a.dim() - 3; i >= 0; --i) {
          if (a.sizes()[i] != 1 && a.strides()[i] != expect) { foldable = false; break; }
          expect *= a.sizes()[i];
        }
        if (foldable) {
          gemm_t<T>(false, lb.trans, shape_numel(abatch) * M, N, K, pa, la.ld, pb, lb.ld, 0.0f, po, N);
          return;
        }
      }
      const int64_t nb = shape_numel(batch), nd = static_cast<int64_t>(batch.size());
      for (int64_t i = 0; i < nb; ++i) {
        int64_t rem = i, oa = 0, ob = 0;  // element offsets of this batch entry in a and b (stride 0 if broadcast)
        for (int64_t d = nd - 1; d >= 0; --d) {
          const int64_t c = rem % batch[d];
          rem /= batch[d];
          const int64_t ia = d - (nd - static_cast<int64_t>(abatch.size())), ib = d - (nd - static_cast<int64_t>(bbatch.size()));
          if (ia >= 0 && abatch[ia] != 1) oa += c * a.strides()[ia];
          if (ib >= 0 && bbatch[ib] != 1) ob += c * b.strides()[ib];
        }
        gemm_t<T>(la.trans, lb.trans, M, N, K, pa + oa, la.ld, pb + ob, lb.ld, 0.0f, po + i * M * N, N);
      }
    }
  });
  return out;
}

Tensor matmul_nd(const Tensor& a, const Tensor& b) {
  Tensor out = matmul_kernel(a, b);
  if (!any_requires_grad({a, b})) return out;
  SavedTensor sa = save(a, "self"), sb = save(b, "other");
  return record("matmul", {a, b}, out, [sa, sb](const Node& n, const Grads& g) {
    const Tensor av = sa.unpack(n), bv = sb.unpack(n);
    Tensor ga, gb;
    if (needs_grad(n, 0)) ga = sum_to(matmul_nd(g[0], transpose(bv, -1, -2)), av.sizes());  // dA = dC B^T
    if (needs_grad(n, 1)) {
      if (bv.dim() == 2 && av.dim() > 2) {  // dB = sum over batch of A^T dC = A_flat^T dC_flat
        const int64_t K = av.size(-1), N = g[0].size(-1);
        gb = matmul_nd(transpose(reshape(av, {-1, K}), 0, 1), reshape(g[0], {-1, N}));
      } else {
        gb = sum_to(matmul_nd(transpose(av, -1, -2), g[0]), bv.sizes());
      }
    }
    return Grads{ga, gb};
  });
}

// linear under bf16 autocast with f32 W (and b): bf16 GEMMs on the bf16 copies, the graph
// edges to the f32 parameters, dW and db in f32 (see op_utils.h).
Tensor linear_f32_master(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const detail::LowpLinearInputs l = detail::f32_master_inputs("linear", x, weight, bias);
  detail::check_linear_args(l.x, l.weight, l.bias, "linear", "check the layer's in_features against the previous layer's output size");
  const int64_t in = l.weight.size(1), out_f = l.weight.size(0), M = l.x.numel() / std::max<int64_t>(in, 1);
  const Tensor xc = detail::contiguous_raw(l.x), wc = detail::contiguous_raw(l.weight);
  const Tensor bc = l.bias.defined() ? detail::contiguous_raw(l.bias) : Tensor();
  Shape out_shape = l.x.sizes();
  out_shape.back() = out_f;
  Tensor y = empty(out_shape, TensorOptions(DType::bf16));
  detail::linear_gemm_w<bfloat16>(M, out_f, in, static_cast<const bfloat16*>(xc.raw_data()), wc,
                                  bc.defined() ? static_cast<const bfloat16*>(bc.raw_data()) : nullptr, static_cast<bfloat16*>(y.raw_data()));
  if (!any_requires_grad({l.x, weight, bias})) return y;
  SavedTensor sx = save(xc, "input"), sw = save(wc, "weight (bf16 copy)");
  return record("linear", {l.x, weight, bias}, y, [sx, sw, in, out_f, M](const Node& n, const Grads& g) {
    const Tensor dy = detail::to_raw(g[0], DType::bf16);
    const bfloat16* pdy = static_cast<const bfloat16*>(dy.raw_data());
    Tensor dx, dw, db;
    detail::lowp_linear_backward_gemms(n, pdy, sx, sw, M, in, out_f, dx, dw);  // dx = dy W, dW = dy^T x (f32)
    if (needs_grad(n, 2)) {  // db = sum over rows of dy, f32 sums kept in f32
      db = empty({out_f}, TensorOptions(DType::f32));
      cpu::sum_3d_lowp_input<bfloat16>(pdy, static_cast<float*>(db.raw_data()), 1, M, out_f);
    }
    return Grads{dx, dw, db};
  });
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (autocast_needs_cast("matmul", {a, b})) return matmul(autocast_input(a, "matmul"), autocast_input(b, "matmul"));
  detail::check_floating(a, "matmul", "a");
  detail::check_floating(b, "matmul", "b");
  detail::check_same_dtype(a, b, "matmul");
  ATH_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul", "both operands need at least 1 dimension, got ", a.describe(), " and ",
            b.describe());
  const Tensor A = a.dim() == 1 ? unsqueeze(a, 0) : a;
  const Tensor B = b.dim() == 1 ? unsqueeze(b, 1) : b;
  ATH_CHECK(A.size(-1) == B.size(-2), "matmul", "inner dimensions do not match: a is ", a.describe(), ", b is ",
            b.describe(), " (", A.size(-1), " != ", B.size(-2), ")",
            Hint{"matmul(a, b) needs a.size(-1) == b.size(-2); transpose one operand or check the layer sizes"});
  Tensor out = matmul_nd(A, B);
  if (b.dim() == 1) out = squeeze(out, -1);
  if (a.dim() == 1) out = squeeze(out, a.dim() == 1 && b.dim() == 1 ? 0 : -2);
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (detail::runs_on_f32_master("linear", x, weight, bias)) return linear_f32_master(x, weight, bias);
  if (autocast_needs_cast("linear", {x, weight, bias}))
    return linear(autocast_input(x, "linear"), autocast_input(weight, "linear"), autocast_input(bias, "linear"));
  detail::check_linear_args(x, weight, bias, "linear", "check the layer's in_features against the previous layer's output size");
  const int64_t in = weight.size(1), out_f = weight.size(0), M = x.numel() / std::max<int64_t>(in, 1);
  const Tensor xc = detail::contiguous_raw(x), wc = detail::contiguous_raw(weight);
  Shape out_shape = x.sizes();
  out_shape.back() = out_f;
  Tensor y = empty(out_shape, TensorOptions(x.dtype()));
  dispatch(x.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
      const Tensor bc = bias.defined() ? detail::contiguous_raw(bias) : Tensor();
      detail::linear_gemm_w<T>(M, out_f, in, static_cast<const T*>(xc.raw_data()), wc,
                               bc.defined() ? static_cast<const T*>(bc.raw_data()) : nullptr, static_cast<T*>(y.raw_data()));
    }
  });
  if (!any_requires_grad({x, weight, bias})) return y;
  SavedTensor sx = save(xc, "input"), sw = save(wc, "weight");
  return record("linear", {x, weight, bias}, y, [sx, sw, in, out_f, M](const Node& n, const Grads& g) {
    // x is unpacked only for dW: a split backward's input pass (autograd/engine.h) does not
    // need it, and a saved-tensor hook may rebuild it at a cost (sequence parallelism re-gathers it).
    const Tensor wv = sw.unpack(n);
    const Tensor dy = detail::contiguous_raw(g[0]);
    Tensor dx, dw, db;
    dispatch(dy.dtype(), [&]<class T>() {
      if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
        const T* pdy = static_cast<const T*>(dy.raw_data());
        if (needs_grad(n, 0)) {  // dx = dy W            [M, out] @ [out, in]
          dx = empty(n.input_meta[0].sizes, TensorOptions(dy.dtype()));
          detail::input_grad_gemm<T>(M, in, out_f, pdy, wv, static_cast<T*>(dx.raw_data()));
        }
        if (needs_grad(n, 1)) {  // dW = dy^T x          [out, M] @ [M, in]
          const Tensor xv = sx.unpack(n);
          dw = empty(wv.sizes(), TensorOptions(dy.dtype()));
          gemm_t<T>(true, false, out_f, in, M, pdy, out_f, static_cast<const T*>(xv.raw_data()), in, 0.0f,
                    static_cast<T*>(dw.raw_data()), in);
        }
        if (needs_grad(n, 2)) {  // db = sum over rows of dy
          db = empty({out_f}, TensorOptions(dy.dtype()));
          cpu::sum_3d<T>(pdy, static_cast<T*>(db.raw_data()), 1, M, out_f);
        }
      }
    });
    return Grads{dx, dw, db};
  });
}

}  // namespace athanor
