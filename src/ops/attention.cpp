// scaled_dot_product_attention and causal_self_attention (the same kernels reading q, k, v out
// of one packed [B, T, 3 d] tensor): checks, the flash-attention kernel (backend/cpu/attention),
// and the backward, which recomputes the softmax per tile from the saved log-sum-exp.
//
// scaled_dot_product_attention takes PyTorch's enable_gqa (grouped-query attention: k and v with
// Hkv heads, Hkv dividing H, read per group, never repeated), reads operands that are transposed
// views of contiguous tensors in place, and writes O in q's memory order.
//
// Saved for backward: q, k, v as the kernels read them (the inputs themselves, or contiguous
// copies of other layouts; resp. qkv), the output O and lse [B, H, Tq] (f32, or f64 for f64
// inputs). Nothing of size Tq x Tk is kept between forward and backward. The gradients dq, dk, dv
// come back in the strides of q, k, v.
#include <algorithm>
#include <cmath>
#include <vector>

#include "athanor/ops/attention.h"
#include "backend/cpu/attention.h"
#include "athanor/ops/shape.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {
constexpr const char* kOp = "scaled_dot_product_attention";

std::string shapes_of(const Tensor& q, const Tensor& k, const Tensor& v) {
  return "q " + q.describe() + ", k " + k.describe() + ", v " + v.describe();
}

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, bool enable_gqa) {
  detail::check_floating(q, kOp, "q");
  detail::check_floating(k, kOp, "k");
  detail::check_floating(v, kOp, "v");
  ATH_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), kOp, "q, k and v must have one dtype, got ",
            shapes_of(q, k, v), Hint{"convert them with .to(...) (or run under autocast)"});
  ATH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, kOp, "expected 4-D tensors [B, H, T, D], got ",
            shapes_of(q, k, v),
            Hint{"split heads first: x.view({B, T, H, D}).transpose(1, 2) gives [B, H, T, D]"});
  ATH_CHECK(q.size(0) == k.size(0) && q.size(0) == v.size(0), kOp, "the batch dims (dim 0) must match, got ",
            shapes_of(q, k, v), Hint{"q is [B, H, Tq, D], k and v are [B, Hkv, Tk, D]"});
  ATH_CHECK(k.size(1) == v.size(1), kOp, "k and v must have the same number of heads (dim 1), got ", shapes_of(q, k, v),
            " (", k.size(1), " != ", v.size(1), ")");
  const int64_t H = q.size(1), Hkv = k.size(1);
  if (enable_gqa) {
    ATH_CHECK(Hkv == 0 ? H == 0 : H % Hkv == 0, kOp, "grouped-query attention needs k and v's head count Hkv = ", Hkv,
              " to divide q's head count H = ", H, ", got ", shapes_of(q, k, v),
              Hint{"n_kv_head must divide n_head (query head h reads kv head h / (H / Hkv))"});
  } else {
    ATH_CHECK(H == Hkv, kOp, "q has ", H, " heads but k and v have ", Hkv, " (dim 1), got ", shapes_of(q, k, v),
              Hint{"for grouped-query attention (Hkv dividing H) pass enable_gqa = true; k and v need not be repeated"});
  }
  ATH_CHECK(q.size(3) == k.size(3), kOp, "q and k must have the same head dim D (dim 3), got ", shapes_of(q, k, v),
            " (", q.size(3), " != ", k.size(3), ")");
  ATH_CHECK(k.size(2) == v.size(2), kOp, "k and v must have the same sequence length (dim 2), got ", shapes_of(q, k, v),
            " (", k.size(2), " != ", v.size(2), ")");
}

// t itself when the kernels can read it in place (detail::dense_rows_layout), else a contiguous copy.
Tensor kernel_operand(const Tensor& t) { return detail::dense_rows_layout(t) ? t : detail::contiguous_raw(t); }
cpu::AttentionStrides strides_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }
// A new tensor of t's shape, dtype and strides (t has a dense_rows_layout or is contiguous).
Tensor empty_like_strided(const Tensor& t, DType dt) {
  return make_view(empty({t.numel()}, TensorOptions(dt)), t.sizes(), t.strides(), 0);
}
using detail::Grads;
using detail::Inputs;

using detail::CsaArgs;  // ops/op_args.h: shared with the CUDA kernels (src/ops/cuda/attention.cpp)
using detail::SdpaArgs;
struct AttentionSaved : OpSaved {
  SavedTensor q, k, v, out, lse;  // causal_self_attention: q holds the packed qkv
  cpu::AttentionDims d{};
  bool causal = false;
  double scale = 1.0;
  DType dtype = DType::f32;
};

std::vector<Tensor> sdpa_cpu(OpCall& c) {
  const Tensor &q_in = c.in(0), &k_in = c.in(1), &v_in = c.in(2);
  const auto& [is_causal, scale_opt, enable_gqa] = c.args<SdpaArgs>();
  check_inputs(q_in, k_in, v_in, enable_gqa);
  const cpu::AttentionDims d{.B = q_in.size(0), .H = q_in.size(1), .Tq = q_in.size(2), .Tk = k_in.size(2),
                             .D = q_in.size(3), .Dv = v_in.size(3), .Hkv = k_in.size(1)};
  const double scale = scale_opt ? *scale_opt : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(d.D, 1)));
  ATH_CHECK(std::isfinite(scale), kOp, "scale must be finite, got ", scale);
  // Transposed views of [B, T, H, D] tensors (the usual case) are read in place; anything else
  // is copied into [B, H, T, D] order first.
  const Tensor q = kernel_operand(q_in), k = kernel_operand(k_in), v = kernel_operand(v_in);
  const DType dt = q.dtype(), acc_dt = dt == DType::f64 ? DType::f64 : DType::f32;
  // O follows q's memory order (as PyTorch's flash kernels): with q a view of [B, T, H, D], O
  // is written as [B, T, H, Dv] and returned as its transpose, so that the model's
  // .transpose(1, 2).reshape({B, T, H Dv}) into o_proj is a view, not a copy.
  const bool time_major = q.stride(1) < q.stride(2) && d.H > 1 && d.Tq > 1;
  Tensor out = time_major ? make_view(empty({d.B, d.Tq, d.H, d.Dv}, TensorOptions(dt)), {d.B, d.H, d.Tq, d.Dv},
                                      {d.Tq * d.H * d.Dv, d.Dv, d.H * d.Dv, 1}, 0)
                          : empty({d.B, d.H, d.Tq, d.Dv}, TensorOptions(dt));
  Tensor lse = empty({d.B, d.H, d.Tq}, TensorOptions(acc_dt));
  const cpu::AttentionLayout layout{strides_of(q), strides_of(k), strides_of(v), strides_of(out)};
  if (out.numel() > 0) {
    dispatch(dt, [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        cpu::attention_forward<T>(q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), out.data_ptr<T>(),
                                  lse.data_ptr<cpu::attn_acc_t<T>>(), d, layout, is_causal, scale);
      }
    });
  }
  if (c.records()) {
    AttentionSaved& s = c.save<AttentionSaved>();
    s.q = save(q, "q"), s.k = save(k, "k"), s.v = save(v, "v"), s.out = save(out, "result"), s.lse = save(lse, "logsumexp");
    s.d = d, s.causal = is_causal, s.scale = scale, s.dtype = dt;
  }
  return {out};
}

Grads sdpa_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const AttentionSaved& s = saved.as<AttentionSaved>();
  const Tensor qv = s.q.unpack(n), kv = s.k.unpack(n), vv = s.v.unpack(n), ov = s.out.unpack(n), lv = s.lse.unpack(n);
  if (!g[0].defined()) return {Tensor(), Tensor(), Tensor()};
  const DType dt = s.dtype;
  // The kernel reads dO in O's layout: the incoming gradient as it is when it has O's strides
  // (the usual case: the transpose of o_proj's input gradient), else copied into them.
  Tensor dout = g[0];
  if (dout.dtype() != dt || dout.strides() != ov.strides()) {
    const Tensor src = detail::to_raw(g[0], dt);
    dout = empty_like_strided(ov, dt);
    copy_into(dout, src);
  }
  // dq, dk, dv in the strides of q, k, v (the kernel writes them in the operands' layouts).
  Tensor dq = empty_like_strided(qv, dt), dk = empty_like_strided(kv, dt), dv = empty_like_strided(vv, dt);
  const cpu::AttentionLayout layout{strides_of(qv), strides_of(kv), strides_of(vv), strides_of(ov)};
  if (qv.numel() > 0 || kv.numel() > 0) {
    dispatch(dt, [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        cpu::attention_backward<T>(qv.data_ptr<T>(), kv.data_ptr<T>(), vv.data_ptr<T>(), ov.data_ptr<T>(), dout.data_ptr<T>(),
                                   lv.data_ptr<cpu::attn_acc_t<T>>(), dq.data_ptr<T>(), dk.data_ptr<T>(), dv.data_ptr<T>(), s.d,
                                   layout, s.causal, s.scale);
      }
    });
  }
  return {needs_grad(n, 0) ? dq : Tensor(), needs_grad(n, 1) ? dk : Tensor(), needs_grad(n, 2) ? dv : Tensor()};
}

// k, v [B, Hkv, T, D] -> [B, H, T, D] with kv head h / (H / Hkv) at head h, in f64 (the reference
// repeats them, which the kernels never do).
Tensor repeat_kv(const Tensor& x64, int64_t H) {
  const Tensor x = x64.contiguous();
  const int64_t B = x.size(0), Hkv = x.size(1), T = x.size(2), D = x.size(3);
  if (Hkv == H) return x;
  const std::vector<double> xv = x.to_vector();
  std::vector<double> out(static_cast<size_t>(B * H * T * D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      std::copy_n(xv.begin() + ((b * Hkv + h / (H / Hkv)) * T * D), T * D, out.begin() + (b * H + h) * T * D);
  return from_vector(out, {B, H, T, D}, TensorOptions(DType::f64));
}

std::vector<Tensor> sdpa_reference(OpCall& c) {
  const auto& [is_causal, scale_opt, enable_gqa] = c.args<SdpaArgs>();
  const Tensor q = detail::ref64(c.in(0));
  const Tensor k = repeat_kv(detail::ref64(c.in(1)), q.size(1)), v = repeat_kv(detail::ref64(c.in(2)), q.size(1));
  const double scale = scale_opt ? *scale_opt : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(q.size(3), 1)));
  return {cpu::ref::attention(q, k, v, is_causal, scale)};
}

std::vector<Tensor> csa_cpu(OpCall& c) {
  constexpr const char* op = "causal_self_attention";
  const Tensor& qkv_in = c.in(0);
  const auto& [n_head, scale_opt] = c.args<CsaArgs>();
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
  if (c.records()) {
    AttentionSaved& s = c.save<AttentionSaved>();
    s.q = save(qkv, "qkv"), s.out = save(out, "result"), s.lse = save(lse, "logsumexp");
    s.d = d, s.causal = true, s.scale = scale, s.dtype = dt;
  }
  return {out};
}

Grads csa_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const AttentionSaved& s = saved.as<AttentionSaved>();
  const Tensor qv = s.q.unpack(n), ov = s.out.unpack(n), lv = s.lse.unpack(n);
  if (!g[0].defined()) return {Tensor()};
  const DType dt = s.dtype;
  const int64_t d_model = s.d.H * s.d.D;
  const Tensor dout = detail::to_raw(g[0], dt);
  Tensor dqkv = empty(qv.sizes(), TensorOptions(dt));  // every element is written: dq, dk, dv blocks
  if (qv.numel() > 0) {
    const cpu::AttentionLayout layout = cpu::AttentionLayout::packed_qkv(s.d);
    dispatch(dt, [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        const T* base = qv.data_ptr<T>();
        T* grad = dqkv.data_ptr<T>();
        cpu::attention_backward<T>(base, base + d_model, base + 2 * d_model, ov.data_ptr<T>(), dout.data_ptr<T>(),
                                   lv.data_ptr<cpu::attn_acc_t<T>>(), grad, grad + d_model, grad + 2 * d_model, s.d, layout,
                                   /*causal=*/true, s.scale);
      }
    });
  }
  return {dqkv};
}

// The reference on q, k, v split out of qkv per head ([B, T, 3, H, D] -> [B, H, T, D] each).
std::vector<Tensor> csa_reference(OpCall& c) {
  const auto& [n_head, scale_opt] = c.args<CsaArgs>();
  const Tensor qkv = detail::ref64(c.in(0)).contiguous();
  const int64_t B = qkv.size(0), T = qkv.size(1), d_model = qkv.size(2) / 3, hd = d_model / n_head;
  const double scale = scale_opt ? *scale_opt : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(hd, 1)));
  auto part = [&](int64_t which) {  // [B, T, H, D] view of q/k/v, then [B, H, T, D] contiguous
    const Tensor v = make_view(qkv, {B, T, n_head, hd}, {T * 3 * d_model, 3 * d_model, hd, 1}, which * d_model);
    return permute(v, {0, 2, 1, 3}).contiguous();
  };
  const Tensor o = cpu::ref::attention(part(0), part(1), part(2), true, scale);  // [B, H, T, D]
  return {permute(o, {0, 2, 1, 3}).contiguous().view({B, T, d_model})};
}

std::vector<OpCase> sdpa_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const SdpaArgs& a) {
    return Inputs{scaled_dot_product_attention(t[0], t[1], t[2], a.is_causal, a.scale, a.enable_gqa)};
  };
  return {
      make_case<SdpaArgs>("q, k, v [1, 2, 5, 4], causal",
                          {case_randn({1, 2 * s, 5, 4}, 1), case_randn({1, 2 * s, 5, 4}, 2), case_randn({1, 2 * s, 5, 4}, 3)},
                          {true, std::nullopt}, call),
      make_case<SdpaArgs>("q [2, 1, 3, 4], k, v [2, 1, 6, 4] transposed (Tk != Tq), scale 0.3",
                          {case_randn({2 * s, 1, 3, 4}, 4), case_randn({2 * s, 1, 6, 4}, 5, CaseLayout::transposed),
                           case_randn({2 * s, 1, 6, 4}, 6, CaseLayout::transposed)},
                          {false, 0.3}, call),
      make_case<SdpaArgs>("q, k [1, 1, 4, 3], v [1, 1, 4, 5] strided (Dv != D)",
                          {case_randn({s, 1, 4, 3}, 7), case_randn({s, 1, 4, 3}, 8), case_randn({s, 1, 4, 5}, 9, CaseLayout::strided)},
                          {false, std::nullopt}, call),
      make_case<SdpaArgs>("GQA: q [1, 4, 5, 4], k, v [1, 2, 5, 4], causal",
                          {case_randn({s, 4, 5, 4}, 10), case_randn({s, 2, 5, 4}, 11), case_randn({s, 2, 5, 4}, 12)},
                          {true, std::nullopt, true}, call),
      make_case<SdpaArgs>("GQA: q [2, 4, 6, 4], k, v [2, 1, 7, 4] (MQA, Tk != Tq), all dims 1, 2 transposed (the model's layout)",
                          {case_randn({2 * s, 4, 6, 4}, 13, CaseLayout::transposed12),
                           case_randn({2 * s, 1, 7, 4}, 14, CaseLayout::transposed12),
                           case_randn({2 * s, 1, 7, 4}, 15, CaseLayout::transposed12)},
                          {false, std::nullopt, true}, call),
      make_case<SdpaArgs>("GQA: q [1, 4, 5, 6], k, v [1, 2, 5, 6], dims 1, 2 transposed, causal",
                          {case_randn({s, 4, 5, 6}, 16, CaseLayout::transposed12),
                           case_randn({s, 2, 5, 6}, 17, CaseLayout::transposed12),
                           case_randn({s, 2, 5, 6}, 18, CaseLayout::transposed12)},
                          {true, std::nullopt, true}, call),
      // Head dim 64, a tile width of the CUDA kernels (the cases above run there zero-padded to 32).
      make_case<SdpaArgs>("GQA: q [1, 2, 5, 64], k, v [1, 1, 7, 64], dims 1, 2 transposed (head dim 64)",
                          {case_randn({s, 2, 5, 64}, 19, CaseLayout::transposed12),
                           case_randn({s, 1, 7, 64}, 20, CaseLayout::transposed12),
                           case_randn({s, 1, 7, 64}, 21, CaseLayout::transposed12)},
                          {false, std::nullopt, true}, call),
  };
}
std::vector<OpCase> csa_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const CsaArgs& a) { return Inputs{causal_self_attention(t[0], a.n_head, a.scale)}; };
  return {
      make_case<CsaArgs>("qkv [2, 5, 12], 2 heads", {case_randn({2 * s, 5, 12}, 1)}, {2, std::nullopt}, call),
      make_case<CsaArgs>("qkv [1, 4, 9] strided, 1 head, scale 0.5", {case_randn({s, 4, 9}, 2, CaseLayout::strided)}, {1, 0.5}, call),
      make_case<CsaArgs>("qkv [1, 5, 384], 2 heads (head dim 64)", {case_randn({s, 5, 384}, 3)}, {2, std::nullopt}, call),
  };
}
}  // namespace

namespace ops {
const OpDef& scaled_dot_product_attention_op() {
  static const OpDef d{.name = "scaled_dot_product_attention", .inputs = {"q", "k", "v"},
                       .category = AutocastCategory::lower_precision, .kernels = detail::cpu_kernels(sdpa_cpu, sdpa_backward),
                       .reference = sdpa_reference, .dtypes = detail::kFloatDTypes, .cases = sdpa_cases,
                       .derivative = "FlashAttention-2 backward from the saved O and lse", .file = "src/ops/attention.cpp"};
  return d;
}
const OpDef& causal_self_attention_op() {
  static const OpDef d{.name = "causal_self_attention", .inputs = {"qkv"}, .category = AutocastCategory::lower_precision,
                       .kernels = detail::cpu_kernels(csa_cpu, csa_backward), .reference = csa_reference,
                       .dtypes = detail::kFloatDTypes, .cases = csa_cases,
                       .derivative = "the flash backward writing d(qkv) [B, T, 3d] in place", .file = "src/ops/attention.cpp"};
  return d;
}
}  // namespace ops

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal,
                                    std::optional<double> scale, bool enable_gqa) {
  return call_op(ops::scaled_dot_product_attention_op(), {q, k, v}, SdpaArgs{is_causal, scale, enable_gqa});
}

Tensor causal_self_attention(const Tensor& qkv, int64_t n_head, std::optional<double> scale) {
  return call_op(ops::causal_self_attention_op(), {qkv}, CsaArgs{n_head, scale});
}

}  // namespace athanor
