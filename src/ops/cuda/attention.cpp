// CUDA kernels of scaled_dot_product_attention and causal_self_attention on the flash
// attention of src/backend/cuda/attention.h (f32, bf16, f16; head dims 1..256; GQA), with
// the CPU op's semantics (src/ops/attention.cpp):
//  - sdpa reads q, k, v in place when their rows are contiguous and their elements fill one
//    dense block (a transposed view of a [B, T, H, D] projection), else a contiguous copy; O
//    follows q's memory order; dq, dk, dv come back in the strides of the operands read;
//  - causal_self_attention reads q, k, v straight out of the packed [B, T, 3 d] projection
//    (AttentionLayout::packed_qkv) and writes O as [B, T, d]; dqkv is one [B, T, 3 d] tensor.
// Saved for backward: the operands as read, O and lse [B, H, Tq] (f32). Nothing of size
// Tq x Tk exists at any time. The backward is deterministic (no atomics; attention.h).
// Head dims above 256 and D != Dv: "not yet supported on cuda", before any work.
// f64 runs on its own plain kernel (attention_f64.h: any head dims, lse in f64), the exact
// path of the f64 gradchecks.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "athanor/autograd/function.h"
#include "athanor/ops/attention.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/attention_f64.h"
#include "backend/cuda/runtime.h"
#include "ops/cuda/cuda_kernels.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor::detail {
namespace {

void check_kernel_takes(const char* op, DType dt, int64_t D, int64_t Dv) {
  if (dt == DType::f64) {  // attention_f64.h: any head dims >= 1
    if (D < 1 || Dv < 1)
      cuda_unsupported(op, "head dims D = " + std::to_string(D) + ", Dv = " + std::to_string(Dv) + " (at least 1)");
    return;
  }
  if (dt != DType::f32 && dt != DType::bf16 && dt != DType::f16)
    cuda_unsupported(op, std::string("dtype ") + dtype_name(dt) + " (the CUDA attention kernels take f32, bf16, f16, f64)");
  if (D != Dv)
    cuda_unsupported(op, "head dims D = " + std::to_string(D) + " != Dv = " + std::to_string(Dv) +
                             " (the CUDA attention kernels need D == Dv)");
  if (cuda::attention_padded_head_dim(D) == 0)
    cuda_unsupported(op, "head dim " + std::to_string(D) + " (the CUDA attention kernels take head dims 1 to " +
                             std::to_string(cuda::kAttentionMaxHeadDim) + ")");
}

Tensor kernel_operand(const Tensor& t) { return dense_rows_layout(t) ? t : cuda_contiguous(t); }
cuda::AttentionStrides strides_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }
Tensor empty_like_strided(const Tensor& t) {
  return make_view(empty({t.numel()}, TensorOptions(t.dtype()).with_device(t.device())), t.sizes(), t.strides(), 0);
}
// lse's dtype: f32 for the flash kernels, f64 for the f64 kernel.
DType lse_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }
const double* f64p(const Tensor& t) { return static_cast<const double*>(t.device_data()); }
double* f64p_mut(const Tensor& t) { return static_cast<double*>(t.device_data()); }
// The f64 kernel's Delta scratch: B H Tq doubles.
Tensor delta_for(const cuda::AttentionDims& d, Device dev) {
  return empty({std::max<int64_t>(d.B * d.H * d.Tq, 1)}, TensorOptions(DType::f64).with_device(dev).with_tag(MemTag::workspace));
}
Tensor workspace_for(const cuda::AttentionDims& d, Device dev) {
  const int64_t floats = (cuda::attention_backward_workspace(d) + 3) / 4;
  return empty({std::max<int64_t>(floats, 4)}, TensorOptions(DType::f32).with_device(dev));
}
double default_scale(const std::optional<double>& s, int64_t D) {
  return s ? *s : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(D, 1)));
}

struct AttentionCudaSaved : OpSaved {
  SavedTensor q, k, v, out, lse;  // causal_self_attention: q holds the packed qkv
  cuda::AttentionDims d{};
  bool causal = false;
  double scale = 1.0;
  DType dtype = DType::f32;
};

std::vector<Tensor> sdpa_cuda(OpCall& c) {
  constexpr const char* op = "scaled_dot_product_attention";
  const Tensor &q_in = c.in(0), &k_in = c.in(1), &v_in = c.in(2);
  const auto& [is_causal, scale_opt, enable_gqa] = c.args<SdpaArgs>();
  for (const Tensor* t : {&q_in, &k_in, &v_in}) check_floating(*t, op, "q, k, v");
  ATH_CHECK(q_in.dtype() == k_in.dtype() && q_in.dtype() == v_in.dtype(), op, "q, k and v must have one dtype, got q ",
            q_in.describe(), ", k ", k_in.describe(), ", v ", v_in.describe());
  ATH_CHECK(q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4, op, "expected 4-D tensors [B, H, T, D], got q ",
            q_in.describe(), ", k ", k_in.describe(), ", v ", v_in.describe(),
            Hint{"split heads first: x.view({B, T, H, D}).transpose(1, 2) gives [B, H, T, D]"});
  const int64_t H = q_in.size(1), Hkv = k_in.size(1);
  ATH_CHECK(q_in.size(0) == k_in.size(0) && q_in.size(0) == v_in.size(0) && k_in.size(1) == v_in.size(1) &&
                q_in.size(3) == k_in.size(3) && k_in.size(2) == v_in.size(2),
            op, "shapes do not fit q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv]: q ", q_in.describe(), ", k ",
            k_in.describe(), ", v ", v_in.describe());
  ATH_CHECK(enable_gqa ? (Hkv > 0 && H % Hkv == 0) : H == Hkv, op, "q has ", H, " heads and k, v have ", Hkv,
            enable_gqa ? ", which does not divide it" : " (dim 1)",
            Hint{"for grouped-query attention (Hkv dividing H) pass enable_gqa = true"});
  const cuda::AttentionDims d{.B = q_in.size(0), .H = H, .Tq = q_in.size(2), .Tk = k_in.size(2), .D = q_in.size(3),
                              .Dv = v_in.size(3), .Hkv = Hkv};
  check_kernel_takes(op, q_in.dtype(), d.D, d.Dv);
  const double scale = default_scale(scale_opt, d.D);
  ATH_CHECK(std::isfinite(scale), op, "scale must be finite, got ", scale);
  const Tensor q = kernel_operand(q_in), k = kernel_operand(k_in), v = kernel_operand(v_in);
  const DType dt = q.dtype();
  const TensorOptions on(TensorOptions(dt).with_device(q.device()));
  const bool time_major = q.stride(1) < q.stride(2) && d.H > 1 && d.Tq > 1;  // O in q's memory order
  Tensor out = time_major ? make_view(empty({d.B, d.Tq, d.H, d.Dv}, on), {d.B, d.H, d.Tq, d.Dv},
                                      {d.Tq * d.H * d.Dv, d.Dv, d.H * d.Dv, 1}, 0)
                          : empty({d.B, d.H, d.Tq, d.Dv}, on);
  Tensor lse = empty({d.B, d.H, d.Tq}, TensorOptions(lse_dtype(dt)).with_device(q.device()));
  const int dev = cuda_index(c);
  cuda::DeviceGuard g(dev);
  if (dt == DType::f64) cuda::attention_f64_check(d, op);
  if (out.numel() > 0 && d.Tk > 0 && dt == DType::f64)
    cuda::attention_f64_forward(f64p(q), f64p(k), f64p(v), f64p_mut(out), f64p_mut(lse), d,
                                {strides_of(q), strides_of(k), strides_of(v), strides_of(out)}, is_causal, scale,
                                cuda::compute_stream(dev));
  else if (out.numel() > 0 && d.Tk > 0)
    cuda::attention_forward(q.device_data(), k.device_data(), v.device_data(), out.device_data(),
                            static_cast<float*>(lse.device_data()), d,
                            {strides_of(q), strides_of(k), strides_of(v), strides_of(out)}, is_causal, scale, dt,
                            cuda::compute_stream(dev));
  else if (out.numel() > 0)
    cuda_unsupported(op, "an empty key sequence (Tk = 0)");
  if (c.records()) {
    AttentionCudaSaved& s = c.save<AttentionCudaSaved>();
    s.q = save(q, "q"), s.k = save(k, "k"), s.v = save(v, "v"), s.out = save(out, "result"), s.lse = save(lse, "logsumexp");
    s.d = d, s.causal = is_causal, s.scale = scale, s.dtype = dt;
  }
  return {out};
}

// dO in O's layout (the kernel reads it so): g itself when it already has O's strides.
Tensor dout_like(const Tensor& g, const Tensor& o) {
  if (g.dtype() == o.dtype() && g.strides() == o.strides()) return g;
  Tensor d = empty_like_strided(o);
  copy_into(d, g);  // casts as it copies
  return d;
}

Grads sdpa_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const AttentionCudaSaved& s = saved.as<AttentionCudaSaved>();
  if (!g[0].defined()) return {Tensor(), Tensor(), Tensor()};
  const Tensor qv = s.q.unpack(n), kv = s.k.unpack(n), vv = s.v.unpack(n), ov = s.out.unpack(n), lv = s.lse.unpack(n);
  const Tensor dout = dout_like(g[0], ov);
  Tensor dq = empty_like_strided(qv), dk = empty_like_strided(kv), dv = empty_like_strided(vv);
  const int dev = qv.device().index;
  cuda::DeviceGuard guard(dev);
  if (qv.numel() > 0 && kv.numel() > 0 && s.dtype == DType::f64) {
    const Tensor delta = delta_for(s.d, qv.device());
    cuda::attention_f64_backward(f64p(qv), f64p(kv), f64p(vv), f64p(ov), f64p(dout), f64p(lv), f64p_mut(dq), f64p_mut(dk),
                                 f64p_mut(dv), s.d, {strides_of(qv), strides_of(kv), strides_of(vv), strides_of(ov)},
                                 s.causal, s.scale, f64p_mut(delta), cuda::compute_stream(dev));
  } else if (qv.numel() > 0 && kv.numel() > 0) {
    Tensor ws = workspace_for(s.d, qv.device());
    cuda::attention_backward(qv.device_data(), kv.device_data(), vv.device_data(), ov.device_data(), dout.device_data(),
                             static_cast<const float*>(lv.device_data()), dq.device_data(), dk.device_data(),
                             dv.device_data(), s.d, {strides_of(qv), strides_of(kv), strides_of(vv), strides_of(ov)},
                             s.causal, s.scale, s.dtype, ws.device_data(), cuda::compute_stream(dev));
  } else {  // no queries or no keys: nothing depends on the other side (the kernels ran on none)
    dq.zero_(), dk.zero_(), dv.zero_();
  }
  return {needs_grad(n, 0) ? dq : Tensor(), needs_grad(n, 1) ? dk : Tensor(), needs_grad(n, 2) ? dv : Tensor()};
}

std::vector<Tensor> csa_cuda(OpCall& c) {
  constexpr const char* op = "causal_self_attention";
  const Tensor& qkv_in = c.in(0);
  const auto& [n_head, scale_opt] = c.args<CsaArgs>();
  check_floating(qkv_in, op, "qkv");
  ATH_CHECK(qkv_in.dim() == 3, op, "expected qkv of shape [B, T, 3 d] (q, k, v side by side), got ", qkv_in.describe(),
            Hint{"pass the output of the packed projection c_attn(x), x of shape [B, T, d]"});
  ATH_CHECK(n_head > 0, op, "n_head must be > 0, got ", n_head, " (qkv ", qkv_in.describe(), ")");
  const int64_t B = qkv_in.size(0), T = qkv_in.size(1), width3 = qkv_in.size(2);
  ATH_CHECK(width3 % (3 * n_head) == 0, op, "the last dim of qkv ", qkv_in.describe(),
            " must be 3 * n_head * head_dim with n_head = ", n_head, ", but ", width3, " is not a multiple of ", 3 * n_head,
            Hint{"qkv holds q, k and v of width d = n_head * head_dim each: last dim 3 d"});
  const int64_t d_model = width3 / 3, hd = d_model / n_head;
  check_kernel_takes(op, qkv_in.dtype(), hd, hd);
  const cuda::AttentionDims d{.B = B, .H = n_head, .Tq = T, .Tk = T, .D = hd, .Dv = hd, .Hkv = n_head};
  const double scale = default_scale(scale_opt, hd);
  ATH_CHECK(std::isfinite(scale), op, "scale must be finite, got ", scale);
  const Tensor qkv = cuda_contiguous(qkv_in);
  const DType dt = qkv.dtype();
  Tensor out = empty({B, T, d_model}, TensorOptions(dt).with_device(qkv.device()));
  Tensor lse = empty({B, n_head, T}, TensorOptions(lse_dtype(dt)).with_device(qkv.device()));
  const int dev = cuda_index(c);
  cuda::DeviceGuard g(dev);
  if (dt == DType::f64) cuda::attention_f64_check(d, op);
  if (qkv.numel() > 0 && dt == DType::f64) {
    const double* base = f64p(qkv);
    cuda::attention_f64_forward(base, base + d_model, base + 2 * d_model, f64p_mut(out), f64p_mut(lse), d,
                                cuda::AttentionLayout::packed_qkv(d), /*causal=*/true, scale, cuda::compute_stream(dev));
  } else if (qkv.numel() > 0) {
    const std::size_t es = dtype_size(dt);
    const char* base = static_cast<const char*>(qkv.device_data());
    cuda::attention_forward(base, base + d_model * es, base + 2 * d_model * es, out.device_data(),
                            static_cast<float*>(lse.device_data()), d, cuda::AttentionLayout::packed_qkv(d),
                            /*causal=*/true, scale, dt, cuda::compute_stream(dev));
  }
  if (c.records()) {
    AttentionCudaSaved& s = c.save<AttentionCudaSaved>();
    s.q = save(qkv, "qkv"), s.out = save(out, "result"), s.lse = save(lse, "logsumexp");
    s.d = d, s.causal = true, s.scale = scale, s.dtype = dt;
  }
  return {out};
}

Grads csa_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const AttentionCudaSaved& s = saved.as<AttentionCudaSaved>();
  if (!g[0].defined()) return {Tensor()};
  const Tensor qv = s.q.unpack(n), ov = s.out.unpack(n), lv = s.lse.unpack(n);
  const Tensor dout = dout_like(g[0], ov);
  Tensor dqkv = empty(qv.sizes(), TensorOptions(s.dtype).with_device(qv.device()));  // every element written
  const int dev = qv.device().index;
  cuda::DeviceGuard guard(dev);
  if (qv.numel() > 0 && s.dtype == DType::f64) {
    const int64_t off = s.d.H * s.d.D;  // elements between q's, k's and v's columns
    const double* base = f64p(qv);
    double* grad = f64p_mut(dqkv);
    const Tensor delta = delta_for(s.d, qv.device());
    cuda::attention_f64_backward(base, base + off, base + 2 * off, f64p(ov), f64p(dout), f64p(lv), grad, grad + off,
                                 grad + 2 * off, s.d, cuda::AttentionLayout::packed_qkv(s.d), /*causal=*/true, s.scale,
                                 f64p_mut(delta), cuda::compute_stream(dev));
  } else if (qv.numel() > 0) {
    const std::size_t es = dtype_size(s.dtype);
    const int64_t off = s.d.H * s.d.D * static_cast<int64_t>(es);
    const char* base = static_cast<const char*>(qv.device_data());
    char* grad = static_cast<char*>(dqkv.device_data());
    Tensor ws = workspace_for(s.d, qv.device());
    cuda::attention_backward(base, base + off, base + 2 * off, ov.device_data(), dout.device_data(),
                             static_cast<const float*>(lv.device_data()), grad, grad + off, grad + 2 * off, s.d,
                             cuda::AttentionLayout::packed_qkv(s.d), /*causal=*/true, s.scale, s.dtype, ws.device_data(),
                             cuda::compute_stream(dev));
  }
  return {dqkv};
}

}  // namespace

void cuda_attention_ops(std::vector<CudaOpEntry>& out) {
  out.push_back({"scaled_dot_product_attention", {sdpa_cuda, sdpa_backward_cuda}});
  out.push_back({"causal_self_attention", {csa_cuda, csa_backward_cuda}});
}

}  // namespace athanor::detail
