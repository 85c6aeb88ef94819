// scaled_dot_product_attention and causal_self_attention (the same kernels reading q, k, v out
// of one packed [B, T, 3 d] tensor): checks, the flash-attention kernel (backend/cpu/attention),
// and the backward, which recomputes the softmax per tile from the saved log-sum-exp.
//
// Saved for backward: contiguous q, k, v (resp. qkv), the output O and lse [B, H, Tq] (f32, or
// f64 for f64 inputs). Nothing of size Tq x Tk is kept between forward and backward.
#include <cmath>

#include "athanor/ops/attention.h"
#include "athanor/ops/autocast.h"
#include "backend/cpu/attention.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {
constexpr const char* kOp = "scaled_dot_product_attention";

std::string shapes_of(const Tensor& q, const Tensor& k, const Tensor& v) {
  return "q " + q.describe() + ", k " + k.describe() + ", v " + v.describe();
}

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v) {
  detail::check_floating(q, kOp, "q");
  detail::check_floating(k, kOp, "k");
  detail::check_floating(v, kOp, "v");
  ATH_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), kOp, "q, k and v must have one dtype, got ",
            shapes_of(q, k, v), Hint{"convert them with .to(...) (or run under autocast)"});
  ATH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, kOp, "expected 4-D tensors [B, H, T, D], got ",
            shapes_of(q, k, v),
            Hint{"split heads first: x.view({B, T, H, D}).transpose(1, 2) gives [B, H, T, D]"});
  ATH_CHECK(q.size(0) == k.size(0) && q.size(0) == v.size(0) && q.size(1) == k.size(1) && q.size(1) == v.size(1),
            kOp, "batch and head dims (0 and 1) must match, got ", shapes_of(q, k, v),
            Hint{"q is [B, H, Tq, D], k and v are [B, H, Tk, D]"});
  ATH_CHECK(q.size(3) == k.size(3), kOp, "q and k must have the same head dim D (dim 3), got ", shapes_of(q, k, v),
            " (", q.size(3), " != ", k.size(3), ")");
  ATH_CHECK(k.size(2) == v.size(2), kOp, "k and v must have the same sequence length (dim 2), got ", shapes_of(q, k, v),
            " (", k.size(2), " != ", v.size(2), ")");
}
}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, bool is_causal,
                                    std::optional<double> scale_opt) {
  if (const char* ac = "scaled_dot_product_attention"; autocast_needs_cast(ac, {q_in, k_in, v_in}))
    return scaled_dot_product_attention(autocast_input(q_in, ac), autocast_input(k_in, ac), autocast_input(v_in, ac),
                                        is_causal, scale_opt);
  check_inputs(q_in, k_in, v_in);
  const cpu::AttentionDims d{q_in.size(0), q_in.size(1), q_in.size(2), k_in.size(2), q_in.size(3), v_in.size(3)};
  const double scale = scale_opt ? *scale_opt : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(d.D, 1)));
  ATH_CHECK(std::isfinite(scale), kOp, "scale must be finite, got ", scale);
  // The common case is a transposed view of [B, T, H, D]: one copy into [B, H, T, D] order.
  const Tensor q = detail::contiguous_raw(q_in), k = detail::contiguous_raw(k_in), v = detail::contiguous_raw(v_in);
  const DType dt = q.dtype(), acc_dt = dt == DType::f64 ? DType::f64 : DType::f32;
  Tensor out = empty({d.B, d.H, d.Tq, d.Dv}, TensorOptions(dt));
  Tensor lse = empty({d.B, d.H, d.Tq}, TensorOptions(acc_dt));
  dispatch(dt, [&]<class T>() {
    if constexpr (is_float_type_v<T>) {
      cpu::attention_forward<T>(q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), out.data_ptr<T>(),
                                lse.data_ptr<cpu::attn_acc_t<T>>(), d, is_causal, scale);
    }
  });
  if (!any_requires_grad({q_in, k_in, v_in})) return out;
  SavedTensor sq = save(q, "q"), sk = save(k, "k"), sv = save(v, "v"), so = save(out, "result"),
              sl = save(lse, "logsumexp");
  return record(kOp, {q_in, k_in, v_in}, out, [=](const Node& n, const Grads& g) {
    const Tensor qv = sq.unpack(n), kv = sk.unpack(n), vv = sv.unpack(n), ov = so.unpack(n), lv = sl.unpack(n);
    if (!g[0].defined()) return Grads{Tensor(), Tensor(), Tensor()};
    const Tensor dout = detail::to_raw(g[0], dt);
    Tensor dq = empty(qv.sizes(), TensorOptions(dt)), dk = empty(kv.sizes(), TensorOptions(dt)),
           dv = empty(vv.sizes(), TensorOptions(dt));
    dispatch(dt, [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        cpu::attention_backward<T>(qv.data_ptr<T>(), kv.data_ptr<T>(), vv.data_ptr<T>(), ov.data_ptr<T>(),
                                   dout.data_ptr<T>(), lv.data_ptr<cpu::attn_acc_t<T>>(), dq.data_ptr<T>(),
                                   dk.data_ptr<T>(), dv.data_ptr<T>(), d, is_causal, scale);
      }
    });
    return Grads{needs_grad(n, 0) ? dq : Tensor(), needs_grad(n, 1) ? dk : Tensor(), needs_grad(n, 2) ? dv : Tensor()};
  });
}

Tensor causal_self_attention(const Tensor& qkv_in, int64_t n_head, std::optional<double> scale_opt) {
  constexpr const char* op = "causal_self_attention";
  if (autocast_needs_cast(op, {qkv_in})) return causal_self_attention(autocast_input(qkv_in, op), n_head, scale_opt);
  detail::check_floating(qkv_in, op, "qkv");
  ATH_CHECK(qkv_in.dim() == 3, op, "expected qkv of shape [B, T, 3 d] (q, k, v side by side), got ",
            qkv_in.describe(), Hint{"pass the output of the packed projection c_attn(x), x of shape [B, T, d]"});
  ATH_CHECK(n_head > 0, op, "n_head must be > 0, got ", n_head, " (qkv ", qkv_in.describe(), ")");
  const int64_t B = qkv_in.size(0), T = qkv_in.size(1), width3 = qkv_in.size(2);
  ATH_CHECK(width3 % (3 * n_head) == 0, op, "the last dim of qkv ", qkv_in.describe(),
            " must be 3 * n_head * head_dim with n_head = ", n_head, ", but ", width3, " is not a multiple of ",
            3 * n_head, Hint{"qkv holds q, k and v of width d = n_head * head_dim each: last dim 3 d"});
  const int64_t d_model = width3 / 3, hd = d_model / n_head;
  const cpu::AttentionDims d{B, n_head, T, T, hd, hd};
  const double scale = scale_opt ? *scale_opt : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(hd, 1)));
  ATH_CHECK(std::isfinite(scale), op, "scale must be finite, got ", scale);
  const Tensor qkv = detail::contiguous_raw(qkv_in);
  const DType dt = qkv.dtype(), acc_dt = dt == DType::f64 ? DType::f64 : DType::f32;
  Tensor out = empty({B, T, d_model}, TensorOptions(dt));
  Tensor lse = empty({B, n_head, T}, TensorOptions(acc_dt));
  if (qkv.numel() > 0) {
    const cpu::AttentionLayout layout = cpu::AttentionLayout::packed_qkv(d);
    dispatch(dt, [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        const T* base = qkv.data_ptr<T>();
        cpu::attention_forward<T>(base, base + d_model, base + 2 * d_model, out.data_ptr<T>(),
                                  lse.data_ptr<cpu::attn_acc_t<T>>(), d, layout, /*causal=*/true, scale);
      }
    });
  }
  if (!any_requires_grad({qkv_in})) return out;
  SavedTensor sqkv = save(qkv, "qkv"), so = save(out, "result"), sl = save(lse, "logsumexp");
  return record(op, {qkv_in}, out, [=](const Node& n, const Grads& g) {
    const Tensor qv = sqkv.unpack(n), ov = so.unpack(n), lv = sl.unpack(n);
    if (!g[0].defined()) return Grads{Tensor()};
    const Tensor dout = detail::to_raw(g[0], dt);
    Tensor dqkv = empty(qv.sizes(), TensorOptions(dt));  // every element is written: dq, dk, dv blocks
    if (qv.numel() > 0) {
      const cpu::AttentionLayout layout = cpu::AttentionLayout::packed_qkv(d);
      dispatch(dt, [&]<class T>() {
        if constexpr (is_float_type_v<T>) {
          const T* base = qv.data_ptr<T>();
          T* grad = dqkv.data_ptr<T>();
          cpu::attention_backward<T>(base, base + d_model, base + 2 * d_model, ov.data_ptr<T>(), dout.data_ptr<T>(),
                                     lv.data_ptr<cpu::attn_acc_t<T>>(), grad, grad + d_model, grad + 2 * d_model, d,
                                     layout, /*causal=*/true, scale);
        }
      });
    }
    return Grads{dqkv};
  });
}

}  // namespace athanor
