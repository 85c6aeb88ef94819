// CUDA kernels of layer_norm, rms_norm and softmax (f32; src/backend/cuda/kernels.h): statistics in
// f32, fixed-order reductions, as the CPU's. Backward beside forward:
//   layer_norm: dx = rstd (dnorm - mean(dnorm) - xhat mean(dnorm xhat)), dnorm = g w;
//               dw = Σ_rows g xhat, db = Σ_rows g   (kernels.h's layer_norm_backward)
//   rms_norm:   dx = rstd (dnorm - xhat mean(dnorm xhat)), xhat = x rstd; dw = Σ_rows g xhat
//   softmax:    dx = y (g - Σ_c g y)                 over the softmax dim
// softmax over a dim other than the last moves that dim last (a strided copy), runs the
// row kernel and hands back a view in the input's dim order.
// 16-bit inputs: widened to f32 on the device, the f32 kernels run, the results rounded once
// into the input's dtype (the parameters' for dw, db) — or kept in f32 for a 16-bit x under
// autocast, as the CPU's reads_lowp path returns. A 16-bit x is saved as it is (no f32 copy
// kept for the backward). Reading 16-bit rows inside the kernels is the speed work's.
// softmax on f64: the f64 row kernels (math and sums in double), no f32 step.
// f64 (layer_norm, rms_norm): x, weight and bias all f64, the kernels' f64 instantiation
// (statistics in f64), for gradchecks on the GPU.
// Under bf16/f16 autocast with the lowp_copies candidate on (backend/cuda/candidates.h), an f32
// x that requires grad (the CPU layer_norm's condition for its offer: a transformer's residual
// stream) gets the autocast-dtype copy of the f32 output written by the same kernel and offered
// to autocast (autocast_offer_cast): the next linear takes it instead of a cast pass over y
// (the same "cast" node; the copy is cast(y) bit for bit).
// Under the candidate norm_accumulate_dx the backward adds dx into the gradient already waiting
// at x (input_grad below), as the CPU layer_norm does: bit for bit the sum autograd would form.
#include <initializer_list>
#include <string>
#include <utility>

#include "athanor/autograd/function.h"
#include "athanor/ops/autocast.h"
#include "athanor/ops/norm.h"
#include "athanor/ops/softmax.h"
#include "backend/cuda/candidates.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/norm_kernels.h"
#include "backend/cuda/runtime.h"
#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_ops.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor::detail {
namespace {

const float* f32(const Tensor& t) { return t.defined() ? static_cast<const float*>(t.device_data()) : nullptr; }
float* f32_mut(const Tensor& t) { return t.defined() ? static_cast<float*>(t.device_data()) : nullptr; }
Tensor f32_empty(const Shape& s, Device d) { return empty(s, TensorOptions(DType::f32).with_device(d)); }
template <class T> const T* cptr(const Tensor& t) { return t.defined() ? static_cast<const T*>(t.device_data()) : nullptr; }
template <class T> T* mptr(const Tensor& t) { return t.defined() ? static_cast<T*>(t.device_data()) : nullptr; }

bool is_lowp(DType d) { return d == DType::bf16 || d == DType::f16; }
// The dtype a norm/softmax returns for x: x's, or f32 for a 16-bit x under autocast (reads_lowp).
DType result_dtype(const OpCall& c, const Tensor& x) { return c.autocast() && is_lowp(x.dtype()) ? DType::f32 : x.dtype(); }
DType dtype_or(const Tensor& t) { return t.defined() ? t.dtype() : DType::f32; }
// x as the backward keeps it: a 16-bit x as it is, an f32 one as its contiguous f32 copy.
Tensor kept(const Tensor& x, const Tensor& x32) { return is_lowp(x.dtype()) ? x : x32; }
Tensor as_dtype(const Tensor& t, DType d) { return t.defined() ? cuda_as(t, d) : t; }

// The parameter gradients' scratch (kernels.h: norm_backward_workspace_bytes) for kernels in
// `dtype` (f32 or f64), from the caching allocator; undefined when no parameter gradient is asked for.
Tensor norm_workspace(int64_t rows, int64_t cols, bool wanted, Device d, DType dtype = DType::f32) {
  if (!wanted || rows == 0) return Tensor();
  const int64_t floats = cuda::norm_backward_workspace_bytes(rows, cols, dtype) / static_cast<int64_t>(sizeof(float));
  return empty({std::max<int64_t>(floats, 1)}, TensorOptions(DType::f32).with_device(d).with_tag(MemTag::workspace));
}

// layer_norm / rms_norm take f64 besides check_cuda_dtype's f32, bf16 and f16: all of x, weight and
// bias f64 (the CPU's same-dtype rule), or none. Errors before any work.
void check_norm_dtypes(const char* op, std::initializer_list<std::pair<const Tensor*, const char*>> ts) {
  bool any64 = false, all64 = true;
  for (const auto& [t, name] : ts) {
    if (!t->defined()) continue;
    if (t->dtype() != DType::f64) check_cuda_dtype(op, *t, name);
    any64 = any64 || t->dtype() == DType::f64;
    all64 = all64 && t->dtype() == DType::f64;
  }
  if (!any64 || all64) return;
  std::string got;
  for (const auto& [t, name] : ts)
    if (t->defined()) got += std::string(got.empty() ? "" : ", ") + name + " " + t->describe();
  ATH_FAIL(op, "f64 mixed with other dtypes on cuda: ", got,
           Hint{"give x, weight and bias one dtype (all f64 for an f64 gradcheck)"});
}
// The dtype the kernels run in: f64 for f64 inputs, else f32.
DType kernel_dtype(const Tensor& x) { return x.dtype() == DType::f64 ? DType::f64 : DType::f32; }
// t contiguous in the kernels' dtype `kd` (f64: no conversion, check_norm_dtypes made it f64 already).
Tensor as_kernel(const Tensor& t, DType kd) { return kd == DType::f64 ? cuda_contiguous(t) : as_dtype(t, kd); }
// The gradient of an f64 output must be f64 (no f32 -> f64 conversion on the device).
void check_f64_grad(const char* op, const Tensor& g) {
  ATH_CHECK(g.dtype() == DType::f64, op, "the gradient of an f64 output is ", g.describe(),
            Hint{"keep the whole f64 graph in f64"});
}
// x's gradient buffer (norm_input_grad): under the candidate norm_accumulate_dx the gradient
// waiting at x when x is in the kernels' dtype (the residual stream's f32 sum), which the kernels
// add into; else a fresh one.
InputGrad input_grad(const Node& n, const Tensor& x, DType x_dtype, DType kd) {
  return norm_input_grad(n, x.sizes(), TensorOptions(kd).with_device(x.device()),
                         x_dtype == kd && cuda::candidate_enabled(cuda::Candidate::norm_accumulate_dx));
}

// The offered copy of an f32 norm output (see the file comment): its buffer, or undefined.
Tensor offered_copy_buffer(const OpCall& c, const Tensor& x) {
  if (x.dtype() != DType::f32 || !c.autocast() || !is_lowp(*c.autocast()) || !c.requires_grad(0)) return Tensor();
  if (!cuda::candidate_enabled(cuda::Candidate::lowp_copies)) return Tensor();
  return empty(x.sizes(), TensorOptions(*c.autocast()).with_device(x.device()));
}

// ---- layer_norm
struct LayerNormCudaSaved : OpSaved {
  SavedTensor x, w, mean, rstd;
  Shape normalized_shape;
  bool has_bias = false;
  DType x_dtype = DType::f32, b_dtype = DType::f32;
};

std::vector<Tensor> layer_norm_cuda(OpCall& c) {
  const Tensor &x = c.in(0), &w = c.in(1), &b = c.in(2);
  const LayerNormArgs& a = c.args<LayerNormArgs>();
  check_norm_dtypes("layer_norm", {{&x, "x"}, {&w, "weight"}, {&b, "bias"}});
  check_normalized_shape(x, a.normalized_shape, "layer_norm");
  for (const Tensor* p : {&w, &b})
    ATH_CHECK(!p->defined() || p->sizes() == a.normalized_shape, "layer_norm", p == &w ? "weight" : "bias", " has shape ",
              shape_str(p->sizes()), " but normalized_shape is ", shape_str(a.normalized_shape),
              Hint{"give weight and bias exactly the normalized_shape"});
  const int64_t cols = shape_numel(a.normalized_shape), rows = cols == 0 ? 0 : x.numel() / cols;
  const DType kd = kernel_dtype(x);
  const Tensor xc = as_kernel(x, kd), wc = as_kernel(w, kd), bc = as_kernel(b, kd);
  const TensorOptions o = TensorOptions(kd).with_device(x.device());
  Tensor y = empty(x.sizes(), o), mean = empty({rows}, o), rstd = empty({rows}, o);
  const Tensor y_low = offered_copy_buffer(c, x);
  const int dev = cuda_index(c);
  cuda::DeviceGuard g(dev);
  if (x.numel() > 0 && kd == DType::f64)
    cuda::layer_norm_forward(cptr<double>(xc), cptr<double>(wc), cptr<double>(bc), mptr<double>(y), mptr<double>(mean),
                             mptr<double>(rstd), rows, cols, a.eps, cuda::compute_stream(dev));
  else if (x.numel() > 0)
    cuda::layer_norm_forward(f32(xc), f32(wc), f32(bc), f32_mut(y), f32_mut(mean), f32_mut(rstd), rows, cols, a.eps,
                             cuda::compute_stream(dev), y_low.defined() ? y_low.device_data() : nullptr,
                             y_low.defined() ? y_low.dtype() : DType::bf16);
  if (y_low.defined()) autocast_offer_cast(y, y_low);  // y is what the dispatch point returns (f32 x: no cast below)
  if (c.records()) {
    LayerNormCudaSaved& s = c.save<LayerNormCudaSaved>();
    s.x = save(kept(x, xc), "input"), s.w = w.defined() ? save(kept(w, wc), "weight") : SavedTensor();
    s.mean = save(mean, "mean"), s.rstd = save(rstd, "rstd");
    s.normalized_shape = a.normalized_shape, s.has_bias = b.defined();
    s.x_dtype = x.dtype(), s.b_dtype = dtype_or(b);
  }
  return {cuda_as(y, result_dtype(c, x))};
}

Grads layer_norm_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const LayerNormCudaSaved& s = saved.as<LayerNormCudaSaved>();
  const Tensor x16 = s.x.unpack(n), w16 = s.w.defined() ? s.w.unpack(n) : Tensor();
  const DType kd = kernel_dtype(x16);
  const Tensor x = as_kernel(x16, kd), w = as_kernel(w16, kd);
  if (kd == DType::f64) check_f64_grad("layer_norm backward", g[0]);
  else check_cuda_dtype("layer_norm backward", g[0], "grad");
  const Tensor gy = as_kernel(g[0], kd);
  const Tensor mean = s.mean.unpack(n), rstd = s.rstd.unpack(n);
  const int64_t cols = shape_numel(s.normalized_shape), rows = cols == 0 ? 0 : x.numel() / cols;
  const TensorOptions o = TensorOptions(kd).with_device(x.device());
  const InputGrad in = input_grad(n, x, s.x_dtype, kd);
  const Tensor& dx = in.t;
  Tensor dw = w.defined() && needs_grad(n, 1) ? empty(s.normalized_shape, o) : Tensor();
  Tensor db = s.has_bias && needs_grad(n, 2) ? empty(s.normalized_shape, o) : Tensor();
  if (x.numel() == 0) {  // empty batch: parameter gradients are zero
    if (dw.defined()) dw.zero_();
    if (db.defined()) db.zero_();
  } else {
    const int dev = x.device().index;
    cuda::DeviceGuard guard(dev);
    const Tensor ws = norm_workspace(rows, cols, dw.defined() || db.defined(), x.device(), kd);
    void* wsp = ws.defined() ? ws.device_data() : nullptr;
    if (kd == DType::f64)
      cuda::layer_norm_backward(cptr<double>(gy), cptr<double>(x), cptr<double>(w), cptr<double>(mean), cptr<double>(rstd),
                                mptr<double>(dx), mptr<double>(dw), mptr<double>(db), rows, cols, wsp,
                                cuda::compute_stream(dev), in.accumulate);
    else
      cuda::layer_norm_backward(f32(gy), f32(x), f32(w), f32(mean), f32(rstd), f32_mut(dx), f32_mut(dw), f32_mut(db), rows,
                                cols, wsp, cuda::compute_stream(dev), in.accumulate);
  }
  return {as_dtype(dx, s.x_dtype), as_dtype(dw, dtype_or(w16)), as_dtype(db, s.b_dtype)};
}

// ---- rms_norm
struct RmsNormCudaSaved : OpSaved {
  SavedTensor x, w, rstd;
  Shape normalized_shape;
  DType x_dtype = DType::f32;
};

std::vector<Tensor> rms_norm_cuda(OpCall& c) {
  const Tensor &x = c.in(0), &w = c.in(1);
  const RmsNormArgs& a = c.args<RmsNormArgs>();
  check_norm_dtypes("rms_norm", {{&x, "x"}, {&w, "weight"}});
  check_normalized_shape(x, a.normalized_shape, "rms_norm");
  ATH_CHECK(!w.defined() || w.sizes() == a.normalized_shape, "rms_norm", "weight has shape ", shape_str(w.sizes()),
            " but normalized_shape is ", shape_str(a.normalized_shape), Hint{"give weight exactly the normalized_shape"});
  const int64_t cols = shape_numel(a.normalized_shape), rows = cols == 0 ? 0 : x.numel() / cols;
  const DType kd = kernel_dtype(x);
  const Tensor xc = as_kernel(x, kd), wc = as_kernel(w, kd);
  const TensorOptions o = TensorOptions(kd).with_device(x.device());
  Tensor y = empty(x.sizes(), o), rstd = empty({rows}, o);
  const Tensor y_low = offered_copy_buffer(c, x);
  const int dev = cuda_index(c);
  cuda::DeviceGuard g(dev);
  if (x.numel() > 0 && kd == DType::f64)
    cuda::rms_norm_forward(cptr<double>(xc), cptr<double>(wc), mptr<double>(y), mptr<double>(rstd), rows, cols, a.eps,
                           cuda::compute_stream(dev));
  else if (x.numel() > 0)
    cuda::rms_norm_forward(f32(xc), f32(wc), f32_mut(y), f32_mut(rstd), rows, cols, a.eps, cuda::compute_stream(dev),
                           y_low.defined() ? y_low.device_data() : nullptr, y_low.defined() ? y_low.dtype() : DType::bf16);
  if (y_low.defined()) autocast_offer_cast(y, y_low);  // y is what the dispatch point returns (f32 x: no cast below)
  if (c.records()) {
    RmsNormCudaSaved& s = c.save<RmsNormCudaSaved>();
    s.x = save(kept(x, xc), "input"), s.w = w.defined() ? save(kept(w, wc), "weight") : SavedTensor();
    s.rstd = save(rstd, "rstd");
    s.normalized_shape = a.normalized_shape, s.x_dtype = x.dtype();
  }
  return {cuda_as(y, result_dtype(c, x))};
}

Grads rms_norm_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const RmsNormCudaSaved& s = saved.as<RmsNormCudaSaved>();
  const Tensor w16 = s.w.defined() ? s.w.unpack(n) : Tensor(), rstd = s.rstd.unpack(n);
  const Tensor x16 = s.x.unpack(n);
  const DType kd = kernel_dtype(x16);
  const Tensor x = as_kernel(x16, kd), w = as_kernel(w16, kd);
  if (kd == DType::f64) check_f64_grad("rms_norm backward", g[0]);
  else check_cuda_dtype("rms_norm backward", g[0], "grad");
  const Tensor gy = as_kernel(g[0], kd);
  const int64_t cols = shape_numel(s.normalized_shape), rows = cols == 0 ? 0 : x.numel() / cols;
  const TensorOptions o = TensorOptions(kd).with_device(x.device());
  const InputGrad in = input_grad(n, x, s.x_dtype, kd);
  const Tensor& dx = in.t;
  Tensor dw = w.defined() && needs_grad(n, 1) ? empty(s.normalized_shape, o) : Tensor();
  if (x.numel() == 0) {
    if (dw.defined()) dw.zero_();
  } else {
    const int dev = x.device().index;
    cuda::DeviceGuard guard(dev);
    const Tensor ws = norm_workspace(rows, cols, dw.defined(), x.device(), kd);
    void* wsp = ws.defined() ? ws.device_data() : nullptr;
    if (kd == DType::f64)
      cuda::rms_norm_backward(cptr<double>(gy), cptr<double>(x), cptr<double>(w), cptr<double>(rstd), mptr<double>(dx),
                              mptr<double>(dw), rows, cols, wsp, cuda::compute_stream(dev), in.accumulate);
    else
      cuda::rms_norm_backward(f32(gy), f32(x), f32(w), f32(rstd), f32_mut(dx), f32_mut(dw), rows, cols, wsp,
                              cuda::compute_stream(dev), in.accumulate);
  }
  return {as_dtype(dx, s.x_dtype), as_dtype(dw, dtype_or(w16))};
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
  SavedTensor y;  // dim last, contiguous, in the result's dtype
  int64_t dim = 0;
  DType x_dtype = DType::f32;
};

const double* f64p(const Tensor& t) { return static_cast<const double*>(t.device_data()); }
double* f64p_mut(const Tensor& t) { return static_cast<double*>(t.device_data()); }

std::vector<Tensor> softmax_cuda(OpCall& c) {
  const Tensor& x = c.in(0);
  check_cuda_dtype_or_f64("softmax", x, "x");
  const int64_t dim = wrap_dim(c.args<SoftmaxArgs>().dim, x.dim(), "softmax");
  if (x.dtype() == DType::f64) {  // the f64 kernel on x's rows (dim last), math in f64
    const Tensor xs = cuda_contiguous(swap_last(x, dim));
    const int64_t cols = x.dim() == 0 ? 1 : xs.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
    Tensor y = empty(xs.sizes(), TensorOptions(DType::f64).with_device(x.device()));
    const int dev = cuda_index(c);
    cuda::DeviceGuard g(dev);
    if (x.numel() > 0) cuda::softmax_forward(f64p(xs), f64p_mut(y), rows, cols, cuda::compute_stream(dev));
    if (c.records()) {
      SoftmaxCudaSaved& s = c.save<SoftmaxCudaSaved>();
      s.y = save(y, "result"), s.dim = dim, s.x_dtype = DType::f64;
    }
    return {swap_last(y, dim)};
  }
  const Tensor xs = cuda_as(swap_last(x, dim), DType::f32);
  const int64_t cols = x.dim() == 0 ? 1 : xs.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  Tensor y = f32_empty(xs.sizes(), x.device());
  const int dev = cuda_index(c);
  cuda::DeviceGuard g(dev);
  if (x.numel() > 0) cuda::softmax_forward(f32(xs), f32_mut(y), rows, cols, cuda::compute_stream(dev));
  const Tensor yr = cuda_as(y, result_dtype(c, x));  // the result as returned (rounded once)
  if (c.records()) {
    SoftmaxCudaSaved& s = c.save<SoftmaxCudaSaved>();
    s.y = save(yr, "result"), s.dim = dim, s.x_dtype = x.dtype();
  }
  return {swap_last(yr, dim)};
}

Grads softmax_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const SoftmaxCudaSaved& s = saved.as<SoftmaxCudaSaved>();
  if (s.x_dtype == DType::f64) {
    check_cuda_dtype_or_f64("softmax backward", g[0], "grad");
    if (g[0].dtype() != DType::f64) cuda_unsupported("softmax backward", "an f64 softmax with a grad of " + g[0].describe());
    const Tensor y = s.y.unpack(n);  // dim last, contiguous f64
    const Tensor gs = cuda_contiguous(swap_last(g[0], s.dim));
    const int64_t cols = y.dim() == 0 ? 1 : y.size(-1), rows = cols == 0 ? 0 : y.numel() / cols;
    Tensor dx = empty(y.sizes(), TensorOptions(DType::f64).with_device(y.device()));
    const int dev = y.device().index;
    cuda::DeviceGuard guard(dev);
    if (y.numel() > 0) cuda::softmax_backward(f64p(gs), f64p(y), f64p_mut(dx), rows, cols, cuda::compute_stream(dev));
    return {swap_last(dx, s.dim)};
  }
  const Tensor y = cuda_as(s.y.unpack(n), DType::f32);  // dim last
  check_cuda_dtype("softmax backward", g[0], "grad");
  const Tensor gs = cuda_as(swap_last(g[0], s.dim), DType::f32);
  const int64_t cols = y.dim() == 0 ? 1 : y.size(-1), rows = cols == 0 ? 0 : y.numel() / cols;
  Tensor dx = f32_empty(y.sizes(), y.device());
  const int dev = y.device().index;
  cuda::DeviceGuard guard(dev);
  if (y.numel() > 0) cuda::softmax_backward(f32(gs), f32(y), f32_mut(dx), rows, cols, cuda::compute_stream(dev));
  return {swap_last(cuda_as(dx, s.x_dtype), s.dim)};
}

}  // namespace

void cuda_norm_ops(std::vector<CudaOpEntry>& out) {
  out.push_back({"layer_norm", {layer_norm_cuda, layer_norm_backward_cuda}});
  out.push_back({"rms_norm", {rms_norm_cuda, rms_norm_backward_cuda}});
  out.push_back({"softmax", {softmax_cuda, softmax_backward_cuda}});
}

}  // namespace athanor::detail
