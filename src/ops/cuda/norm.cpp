// CUDA kernels of layer_norm, rms_norm and softmax (f32; src/backend/cuda/kernels.h): statistics in
// f32, fixed-order reductions, as the CPU's. Backward beside forward:
//   layer_norm: dx = rstd (dnorm - mean(dnorm) - xhat mean(dnorm xhat)), dnorm = g w;
//               dw = Σ_rows g xhat, db = Σ_rows g   (kernels.h's layer_norm_backward)
//   rms_norm:   dx = rstd (dnorm - xhat mean(dnorm xhat)), xhat = x rstd; dw = Σ_rows g xhat
//   softmax:    dx = y (g - Σ_c g y)                 over the softmax dim
// softmax over a dim other than the last moves that dim last (a strided copy), runs the
// row kernel and hands back a view in the input's dim order. log_softmax, 16-bit inputs
// (autocast's reads_lowp path) and layer_norm's fused autocast paths: "not yet supported on
// cuda".
#include "athanor/autograd/function.h"
#include "athanor/ops/norm.h"
#include "athanor/ops/softmax.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "ops/cuda/cuda_kernels.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor::detail {
namespace {

const float* f32(const Tensor& t) { return t.defined() ? static_cast<const float*>(t.device_data()) : nullptr; }
float* f32_mut(const Tensor& t) { return t.defined() ? static_cast<float*>(t.device_data()) : nullptr; }
Tensor f32_empty(const Shape& s, Device d) { return empty(s, TensorOptions(DType::f32).with_device(d)); }

void check_f32(const char* op, const Tensor& t, const char* name) {
  if (t.defined() && t.dtype() != DType::f32)
    cuda_unsupported(op, std::string(name) + " is " + t.describe() + " (the CUDA kernel takes f32)");
}

// ---- layer_norm
struct LayerNormCudaSaved : OpSaved {
  SavedTensor x, w, mean, rstd;
  Shape normalized_shape;
  bool has_bias = false;
};

std::vector<Tensor> layer_norm_cuda(OpCall& c) {
  const Tensor &x = c.in(0), &w = c.in(1), &b = c.in(2);
  const LayerNormArgs& a = c.args<LayerNormArgs>();
  check_f32("layer_norm", x, "x");
  check_f32("layer_norm", w, "weight");
  check_f32("layer_norm", b, "bias");
  check_normalized_shape(x, a.normalized_shape, "layer_norm");
  for (const Tensor* p : {&w, &b})
    ATH_CHECK(!p->defined() || p->sizes() == a.normalized_shape, "layer_norm", p == &w ? "weight" : "bias", " has shape ",
              shape_str(p->sizes()), " but normalized_shape is ", shape_str(a.normalized_shape),
              Hint{"give weight and bias exactly the normalized_shape"});
  const int64_t cols = shape_numel(a.normalized_shape), rows = cols == 0 ? 0 : x.numel() / cols;
  const Tensor xc = cuda_contiguous(x), wc = cuda_contiguous(w), bc = cuda_contiguous(b);
  Tensor y = f32_empty(x.sizes(), x.device()), mean = f32_empty({rows}, x.device()), rstd = f32_empty({rows}, x.device());
  const int dev = cuda_index(c);
  cuda::DeviceGuard g(dev);
  if (x.numel() > 0)
    cuda::layer_norm_forward(f32(xc), f32(wc), f32(bc), f32_mut(y), f32_mut(mean), f32_mut(rstd), rows, cols, a.eps,
                             cuda::compute_stream(dev));
  if (c.records()) {
    LayerNormCudaSaved& s = c.save<LayerNormCudaSaved>();
    s.x = save(xc, "input"), s.w = w.defined() ? save(wc, "weight") : SavedTensor();
    s.mean = save(mean, "mean"), s.rstd = save(rstd, "rstd");
    s.normalized_shape = a.normalized_shape, s.has_bias = b.defined();
  }
  return {y};
}

Grads layer_norm_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const LayerNormCudaSaved& s = saved.as<LayerNormCudaSaved>();
  const Tensor x = s.x.unpack(n), w = s.w.defined() ? s.w.unpack(n) : Tensor();
  check_f32("layer_norm backward", g[0], "grad");
  const Tensor gy = cuda_contiguous(g[0]);
  const Tensor mean = s.mean.unpack(n), rstd = s.rstd.unpack(n);
  const int64_t cols = shape_numel(s.normalized_shape), rows = cols == 0 ? 0 : x.numel() / cols;
  Tensor dx = needs_grad(n, 0) ? f32_empty(x.sizes(), x.device()) : Tensor();
  Tensor dw = w.defined() && needs_grad(n, 1) ? f32_empty(s.normalized_shape, x.device()) : Tensor();
  Tensor db = s.has_bias && needs_grad(n, 2) ? f32_empty(s.normalized_shape, x.device()) : Tensor();
  if (x.numel() == 0) {  // empty batch: parameter gradients are zero
    if (dw.defined()) dw.zero_();
    if (db.defined()) db.zero_();
  } else {
    const int dev = x.device().index;
    cuda::DeviceGuard guard(dev);
    cuda::layer_norm_backward(f32(gy), f32(x), f32(w), f32(mean), f32(rstd), f32_mut(dx), f32_mut(dw), f32_mut(db), rows,
                              cols, cuda::compute_stream(dev));
  }
  return {dx, dw, db};
}

// ---- rms_norm
struct RmsNormCudaSaved : OpSaved {
  SavedTensor x, w, rstd;
  Shape normalized_shape;
};

std::vector<Tensor> rms_norm_cuda(OpCall& c) {
  const Tensor &x = c.in(0), &w = c.in(1);
  const RmsNormArgs& a = c.args<RmsNormArgs>();
  check_f32("rms_norm", x, "x");
  check_f32("rms_norm", w, "weight");
  check_normalized_shape(x, a.normalized_shape, "rms_norm");
  ATH_CHECK(!w.defined() || w.sizes() == a.normalized_shape, "rms_norm", "weight has shape ", shape_str(w.sizes()),
            " but normalized_shape is ", shape_str(a.normalized_shape), Hint{"give weight exactly the normalized_shape"});
  const int64_t cols = shape_numel(a.normalized_shape), rows = cols == 0 ? 0 : x.numel() / cols;
  const Tensor xc = cuda_contiguous(x), wc = cuda_contiguous(w);
  Tensor y = f32_empty(x.sizes(), x.device()), rstd = f32_empty({rows}, x.device());
  const int dev = cuda_index(c);
  cuda::DeviceGuard g(dev);
  if (x.numel() > 0)
    cuda::rms_norm_forward(f32(xc), f32(wc), f32_mut(y), f32_mut(rstd), rows, cols, a.eps, cuda::compute_stream(dev));
  if (c.records()) {
    RmsNormCudaSaved& s = c.save<RmsNormCudaSaved>();
    s.x = save(xc, "input"), s.w = w.defined() ? save(wc, "weight") : SavedTensor(), s.rstd = save(rstd, "rstd");
    s.normalized_shape = a.normalized_shape;
  }
  return {y};
}

Grads rms_norm_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const RmsNormCudaSaved& s = saved.as<RmsNormCudaSaved>();
  const Tensor x = s.x.unpack(n), w = s.w.defined() ? s.w.unpack(n) : Tensor(), rstd = s.rstd.unpack(n);
  check_f32("rms_norm backward", g[0], "grad");
  const Tensor gy = cuda_contiguous(g[0]);
  const int64_t cols = shape_numel(s.normalized_shape), rows = cols == 0 ? 0 : x.numel() / cols;
  Tensor dx = needs_grad(n, 0) ? f32_empty(x.sizes(), x.device()) : Tensor();
  Tensor dw = w.defined() && needs_grad(n, 1) ? f32_empty(s.normalized_shape, x.device()) : Tensor();
  if (x.numel() == 0) {
    if (dw.defined()) dw.zero_();
  } else {
    const int dev = x.device().index;
    cuda::DeviceGuard guard(dev);
    cuda::rms_norm_backward(f32(gy), f32(x), f32(w), f32(rstd), f32_mut(dx), f32_mut(dw), rows, cols,
                            cuda::compute_stream(dev));
  }
  return {dx, dw};
}

// ---- softmax
// t with dims d and last swapped (a view: sizes and strides only).
Tensor swap_last(const Tensor& t, int64_t d) {
  if (t.dim() == 0 || d == t.dim() - 1) return t;
  Shape sz = t.sizes(), st = t.strides();
  std::swap(sz[d], sz.back());
  std::swap(st[d], st.back());
  return make_view(t, sz, st, t.storage_offset());
}

struct SoftmaxCudaSaved : OpSaved {
  SavedTensor y;  // dim last, contiguous
  int64_t dim = 0;
};

std::vector<Tensor> softmax_cuda(OpCall& c) {
  const Tensor& x = c.in(0);
  check_f32("softmax", x, "x");
  const int64_t dim = wrap_dim(c.args<SoftmaxArgs>().dim, x.dim(), "softmax");
  const Tensor xs = cuda_contiguous(swap_last(x, dim));
  const int64_t cols = x.dim() == 0 ? 1 : xs.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  Tensor y = f32_empty(xs.sizes(), x.device());
  const int dev = cuda_index(c);
  cuda::DeviceGuard g(dev);
  if (x.numel() > 0) cuda::softmax_forward(f32(xs), f32_mut(y), rows, cols, cuda::compute_stream(dev));
  if (c.records()) {
    SoftmaxCudaSaved& s = c.save<SoftmaxCudaSaved>();
    s.y = save(y, "result"), s.dim = dim;
  }
  return {swap_last(y, dim)};
}

Grads softmax_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const SoftmaxCudaSaved& s = saved.as<SoftmaxCudaSaved>();
  const Tensor y = s.y.unpack(n);  // dim last
  check_f32("softmax backward", g[0], "grad");
  const Tensor gs = cuda_contiguous(swap_last(g[0], s.dim));
  const int64_t cols = y.dim() == 0 ? 1 : y.size(-1), rows = cols == 0 ? 0 : y.numel() / cols;
  Tensor dx = f32_empty(y.sizes(), y.device());
  const int dev = y.device().index;
  cuda::DeviceGuard guard(dev);
  if (y.numel() > 0) cuda::softmax_backward(f32(gs), f32(y), f32_mut(dx), rows, cols, cuda::compute_stream(dev));
  return {swap_last(dx, s.dim)};
}

}  // namespace

void cuda_norm_ops(std::vector<CudaOpEntry>& out) {
  out.push_back({"layer_norm", {layer_norm_cuda, layer_norm_backward_cuda}});
  out.push_back({"rms_norm", {rms_norm_cuda, rms_norm_backward_cuda}});
  out.push_back({"softmax", {softmax_cuda, softmax_backward_cuda}});
}

}  // namespace athanor::detail
