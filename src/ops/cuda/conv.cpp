// CUDA kernels of the ConvNet ops: conv2d, max_pool2d and batch_norm, in f32, bf16 and f16;
// conv2d and max_pool2d in f64 too (f64 math, f64 column buffers, the NCHW moves through core's
// copy; the conv bias through the f64 GEMM's beta, device_ops.h); batch_norm on f64 keeps its
// statistics and xhat in f64 with exact constants (the pointwise kernel's f64 path).
//
// conv2d: im2col + one cuBLASLt GEMM per group (backend/cuda/conv.h; no cuDNN):
//   cols [P, K] (P = N OH OW, K = C/g KH KW), out [P, OC/g] = cols W_g^T (+ b in the epilogue),
//   then out moved to NCHW. Backward beside it:
//   dW_g = dy_g^T cols,  db = Σ_{n,oh,ow} dy (deterministic f64, reduce.h),
//   dcols = dy_g W_g (f32), dx = col2im(dcols): a gather in (kh, kw) order, no atomics.
// max_pool2d: the window maxima and their argmax (the CPU's first-max rule, a NaN wins);
//   backward gathers dy over the windows whose argmax is the element (no atomics).
// batch_norm over x [N, C, *] (viewed [N, C, L]), from the pointwise and reduction kernels:
//   training: mean and biased var per channel (f64 fixed-order sums of x and (x - mean)^2),
//   rstd = 1 / sqrt(var + eps); running_mean/var updated in place with momentum and the
//   unbiased variance (PyTorch's); eval: the running statistics.
//   y = xhat w + b, xhat = (x - mean) rstd. Backward (M = N L):
//   training: dx = w rstd (g - mean(g) - xhat mean(g xhat)); eval: dx = w rstd g;
//   dw = Σ g xhat, db = Σ g — every sum the deterministic f64 reduction.
//   Statistics and xhat in f32 whatever x's dtype, as the CPU's norm_stat_t.
#include <algorithm>

#include "athanor/autograd/function.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/ops/conv.h"
#include "athanor/ops/norm.h"
#include "backend/cuda/conv.h"
#include "backend/cuda/runtime.h"
#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_ops.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor::detail {
namespace {
using cuda::PointwiseOp;

Tensor dev_empty(const Shape& s, DType dt, Device d) { return empty(s, TensorOptions(dt).with_device(d)); }
// rows x cols of t's storage starting `offset` elements past t's (a contiguous block).
Tensor block(const Tensor& t, const Shape& s, int64_t offset) {
  return make_view(t, s, contiguous_strides(s), t.storage_offset() + offset);
}

cuda::ConvGeom group_geom(const cpu::Conv2dGeom& g) {
  cuda::ConvGeom c;
  c.N = g.N, c.C = g.C / g.groups, c.H = g.H, c.W = g.W, c.KH = g.KH, c.KW = g.KW;
  c.sh = g.sh, c.sw = g.sw, c.ph = g.ph, c.pw = g.pw, c.dh = g.dh, c.dw = g.dw, c.OH = g.OH, c.OW = g.OW;
  return c;
}

struct ConvCudaSaved : OpSaved {
  SavedTensor x, w;
  cpu::Conv2dGeom g;
  bool has_bias = false;
};

std::vector<Tensor> conv2d_cuda(OpCall& c) {
  const Tensor &x = c.in(0), &w = c.in(1), &b = c.in(2);
  const ConvArgs& a = c.args<ConvArgs>();
  const cpu::Conv2dGeom g = conv2d_geometry(x, w, b, a.stride, a.padding, a.dilation, a.groups);
  check_cuda_dtype_or_f64("conv2d", x, "input");
  const DType dt = x.dtype();
  const bool f64 = dt == DType::f64;
  const Device d = x.device();
  const int dev = d.index;
  const Tensor xc = cuda_contiguous(x), wc = cuda_contiguous(w), bc = cuda_contiguous(b);
  const cuda::ConvGeom cg = group_geom(g);
  const int64_t P = g.N * g.OH * g.OW, K = cg.C * g.KH * g.KW, OCg = g.OC / g.groups;
  Tensor y = dev_empty({g.N, g.OC, g.OH, g.OW}, dt, d);
  if (y.numel() > 0) {
    Tensor cols = dev_empty({P, K}, dt, d), out = dev_empty({P, OCg}, dt, d);
    cuda::DeviceGuard guard(dev);
    for (int64_t gi = 0; gi < g.groups; ++gi) {
      if (K == 0) {
        out.zero_();
        if (bc.defined()) out = cuda_pointwise(PointwiseOp::add, {out, block(bc, {OCg}, gi * OCg)}, {P, OCg}, dt);
      } else {
        cuda::im2col(xc.device_data(), dt, cg, g.C, gi * cg.C, cols.device_data(), cuda::compute_stream(dev));
        cuda_gemm(dev, dt, false, true, P, OCg, K, cols, block(wc, {OCg, K}, gi * OCg * K), out,
                  bc.defined() ? block(bc, {OCg}, gi * OCg) : Tensor());
      }
      // out [N, OH OW, OCg] -> y[:, gi OCg .. (gi + 1) OCg] (NCHW)
      const Tensor nchw = make_view(out, {g.N, OCg, g.OH * g.OW}, {g.OH * g.OW * OCg, 1, OCg}, out.storage_offset());
      const Tensor yg = f64 ? cuda_contiguous(nchw) : cuda_pointwise(PointwiseOp::copy, {nchw}, {g.N, OCg, g.OH * g.OW}, dt);
      if (g.groups == 1) {
        y = make_view(yg, y.sizes(), contiguous_strides(y.sizes()), yg.storage_offset());
      } else {
        copy_into(make_view(y, {g.N, OCg, g.OH * g.OW}, {g.OC * g.OH * g.OW, g.OH * g.OW, 1},
                            y.storage_offset() + gi * OCg * g.OH * g.OW),
                  yg);
      }
    }
  }
  if (c.records()) {
    ConvCudaSaved& s = c.save<ConvCudaSaved>();
    s.x = save(xc, "input"), s.w = save(wc, "weight"), s.g = g, s.has_bias = b.defined();
  }
  return {y};
}

Grads conv2d_backward_cuda(const Node& n, const Grads& gr, const OpSaved& saved) {
  const ConvCudaSaved& s = saved.as<ConvCudaSaved>();
  const cpu::Conv2dGeom& g = s.g;
  const Tensor x = s.x.unpack(n), w = s.w.unpack(n);
  const DType dt = x.dtype();
  const Device d = x.device();
  const int dev = d.index;
  const bool f64 = dt == DType::f64;
  const Tensor dy = cuda_as(gr[0], dt);
  const cuda::ConvGeom cg = group_geom(g);
  const int64_t P = g.N * g.OH * g.OW, K = cg.C * g.KH * g.KW, OCg = g.OC / g.groups, HW = g.OH * g.OW;
  Grads r(3);
  const bool want_x = needs_grad(n, 0), want_w = needs_grad(n, 1);
  if (want_x) r[0] = dev_empty(x.sizes(), dt, d);
  if (want_w) r[1] = dev_empty(w.sizes(), dt, d);
  if (s.has_bias && needs_grad(n, 2)) r[2] = cuda_sum_dims(dy, {0, 2, 3}, false, 1.0, dt);
  if (!want_x && !want_w) return r;
  if (P == 0 || K == 0 || OCg == 0) {
    if (want_x) r[0].zero_();
    if (want_w) r[1].zero_();
    return r;
  }
  Tensor cols = want_w ? dev_empty({P, K}, dt, d) : Tensor();
  Tensor dcols = want_x ? dev_empty({P, K}, f64 ? DType::f64 : DType::f32, d) : Tensor();
  cuda::DeviceGuard guard(dev);
  const cudaStream_t st = cuda::compute_stream(dev);
  for (int64_t gi = 0; gi < g.groups; ++gi) {
    // dy's group as rows [P, OCg] (NCHW -> rows of output positions)
    const Tensor rows_view = make_view(dy, {g.N, HW, OCg}, {g.OC * HW, 1, HW}, dy.storage_offset() + gi * OCg * HW);
    const Tensor dyr = f64 ? cuda_contiguous(rows_view) : cuda_pointwise(PointwiseOp::copy, {rows_view}, {g.N, HW, OCg}, dt);
    const Tensor dyr2 = block(dyr, {P, OCg}, 0);
    if (want_w) {
      cuda::im2col(x.device_data(), dt, cg, g.C, gi * cg.C, cols.device_data(), st);
      cuda_gemm(dev, dt, true, false, OCg, K, P, dyr2, cols, block(r[1], {OCg, K}, gi * OCg * K));
    }
    if (want_x) {
      cuda_gemm(dev, dt, false, false, P, K, OCg, dyr2, block(w, {OCg, K}, gi * OCg * K), dcols, Tensor(), 1,
                cuda::GemmEpilogue::none, dt != DType::f32 && !f64);
      if (f64)
        cuda::col2im(static_cast<const double*>(dcols.device_data()), cg, g.C, gi * cg.C,
                     static_cast<double*>(r[0].device_data()), st);
      else
        cuda::col2im(static_cast<const float*>(dcols.device_data()), cg, g.C, gi * cg.C, r[0].device_data(), dt, st);
    }
  }
  return r;
}

// ---- max_pool2d
struct PoolCudaSaved : OpSaved {
  SavedTensor idx;
  cuda::ConvGeom g;
  DType dtype = DType::f32;
};

std::vector<Tensor> max_pool2d_cuda(OpCall& c) {
  const Tensor& x = c.in(0);
  const PoolArgs& a = c.args<PoolArgs>();
  const cpu::Pool2dGeom pg = pool2d_geometry(c.name(), x, a.kernel, a.stride, a.padding);
  check_cuda_dtype_or_f64("max_pool2d", x, "input");
  cuda::ConvGeom g;
  g.N = pg.N, g.C = pg.C, g.H = pg.H, g.W = pg.W, g.KH = pg.KH, g.KW = pg.KW;
  g.sh = pg.sh, g.sw = pg.sw, g.ph = pg.ph, g.pw = pg.pw, g.OH = pg.OH, g.OW = pg.OW;
  const Tensor xc = cuda_contiguous(x);
  Tensor y = dev_empty({g.N, g.C, g.OH, g.OW}, x.dtype(), x.device());
  Tensor idx = dev_empty({g.N, g.C, g.OH, g.OW}, DType::i64, x.device());
  const int dev = x.device().index;
  cuda::DeviceGuard guard(dev);
  cuda::max_pool2d_forward(xc.device_data(), x.dtype(), g, y.device_data(), static_cast<int64_t*>(idx.device_data()),
                           cuda::compute_stream(dev));
  if (c.records()) {
    PoolCudaSaved& s = c.save<PoolCudaSaved>();
    s.idx = save(idx, "indices"), s.g = g, s.dtype = x.dtype();
  }
  return {y};
}

Grads max_pool2d_backward_cuda(const Node& n, const Grads& gr, const OpSaved& saved) {
  const PoolCudaSaved& s = saved.as<PoolCudaSaved>();
  const Tensor idx = s.idx.unpack(n);
  const Tensor dy = cuda_as(gr[0], s.dtype);
  Tensor dx = dev_empty({s.g.N, s.g.C, s.g.H, s.g.W}, s.dtype, dy.device());
  const int dev = dy.device().index;
  cuda::DeviceGuard guard(dev);
  cuda::max_pool2d_backward(dy.device_data(), static_cast<const int64_t*>(idx.device_data()), s.dtype, s.g, dx.device_data(),
                            cuda::compute_stream(dev));
  return {dx};
}

// ---- batch_norm
struct BatchNormCudaSaved : OpSaved {
  SavedTensor xhat, rstd, w;  // xhat f32 [N, C, L], rstd f32 [C]
  Shape x_shape;
  DType x_dtype = DType::f32, w_dtype = DType::f32, b_dtype = DType::f32;
  bool batch_stats = true, has_bias = false;
};

Tensor per_channel(const Tensor& v, int64_t C) { return make_view(v, {1, C, 1}, {0, v.stride(0), 0}, v.storage_offset()); }

std::vector<Tensor> batch_norm_cuda(OpCall& c) {
  const char* op = "batch_norm";
  const Tensor& x = c.in(0);
  Tensor running_mean = c.in(1), running_var = c.in(2);
  const Tensor &weight = c.in(3), &bias = c.in(4);
  const auto [training, momentum, eps] = c.args<BatchNormArgs>();
  check_floating(x, op, "x");
  check_cuda_dtype_or_f64(op, x, "x");
  ATH_CHECK(x.dim() >= 2, op, "expected input [N, C] or [N, C, *], got ", x.describe(),
            Hint{"add a batch dimension with unsqueeze(x, 0)"});
  const int64_t N = x.size(0), C = x.size(1), L = N * C == 0 ? 0 : x.numel() / (N * C), M = N * L;
  for (const auto& [t, name] : {std::pair{weight, "weight"}, {bias, "bias"}, {running_mean, "running_mean"}, {running_var, "running_var"}}) {
    if (!t.defined()) continue;
    check_cuda_dtype_or_f64(op, t, name);
    ATH_CHECK(t.dim() == 1 && t.size(0) == C, op, name, " must be 1-D of size C = ", C, " for input ", x.describe(), ", got ",
              t.describe(), Hint{"give the layer num_features equal to the input's channel dim (dim 1)"});
  }
  ATH_CHECK(running_mean.defined() == running_var.defined(), op, "running_mean and running_var must be both given or both undefined");
  const bool batch_stats = training || !running_mean.defined();
  ATH_CHECK(!batch_stats || M > 1 || x.numel() == 0, op, "expected more than 1 value per channel when training, got input ",
            x.describe(), Hint{"use a batch size > 1, or eval mode (running statistics)"});
  const Device d = x.device();
  // The statistics' dtype: f32 (the CPU's norm_stat_t for f32, bf16, f16), f64 for f64 x; the
  // constants exact in f64, rounded to f32 as before otherwise.
  const bool f64 = x.dtype() == DType::f64;
  const DType st = f64 ? DType::f64 : DType::f32;
  auto k = [f64](double v) -> double { return f64 ? v : static_cast<float>(v); };
  const Tensor x32 = cuda_as(x, st);
  const Tensor x3 = make_view(x32, {N, C, L}, contiguous_strides({N, C, L}), x32.storage_offset());
  const Shape s3{N, C, L};
  Tensor xhat, rstd;
  if (batch_stats) {
    const Tensor mean = cuda_sum_dims(x3, {0, 2}, false, M > 0 ? 1.0 / static_cast<double>(M) : NAN, st);
    const Tensor diff = cuda_pointwise(PointwiseOp::sub, {x3, per_channel(mean, C)}, s3, st);
    const Tensor var = cuda_sum_dims(cuda_pointwise(PointwiseOp::mul, {diff, diff}, s3, st), {0, 2}, false,
                                     M > 0 ? 1.0 / static_cast<double>(M) : NAN, st);
    rstd = cuda_pointwise(PointwiseOp::rsqrt_add, {var}, {C}, st, k(eps));
    xhat = cuda_pointwise(PointwiseOp::mul, {diff, per_channel(rstd, C)}, s3, st);
    if (training && running_mean.defined() && M > 0) {
      NoGradGuard no_grad;
      const double bessel = static_cast<double>(M) / static_cast<double>(M - 1);
      const double keep = k(1.0 - momentum);
      auto blend = [&](Tensor& run, const Tensor& stat, double factor) {
        const Tensor a = cuda_pointwise(PointwiseOp::scale, {run}, {C}, st, keep);
        const Tensor b = cuda_pointwise(PointwiseOp::scale, {stat}, {C}, st, k(momentum * factor));
        run.copy_(cuda_pointwise(PointwiseOp::add, {a, b}, {C}, st));  // converts dtype, bumps the version
      };
      blend(running_mean, mean, 1.0);
      blend(running_var, var, bessel);  // the unbiased variance
    }
  } else {
    rstd = cuda_pointwise(PointwiseOp::rsqrt_add, {running_var}, {C}, st, k(eps));
    const Tensor diff = cuda_pointwise(PointwiseOp::sub, {x3, per_channel(running_mean, C)}, s3, st);
    xhat = cuda_pointwise(PointwiseOp::mul, {diff, per_channel(rstd, C)}, s3, st);
  }
  Tensor y = xhat;
  if (weight.defined()) y = cuda_pointwise(PointwiseOp::mul, {y, per_channel(weight, C)}, s3, bias.defined() ? st : x.dtype());
  if (bias.defined()) y = cuda_pointwise(PointwiseOp::add, {y, per_channel(bias, C)}, s3, x.dtype());
  y = cuda_as(y, x.dtype());
  y = make_view(y, x.sizes(), contiguous_strides(x.sizes()), y.storage_offset());
  if (c.records()) {
    BatchNormCudaSaved& s = c.save<BatchNormCudaSaved>();
    s.xhat = save(xhat, "input_normalized"), s.rstd = save(rstd, "rstd");
    s.w = weight.defined() ? save(weight, "weight") : SavedTensor();
    s.x_shape = x.sizes(), s.x_dtype = x.dtype();
    s.w_dtype = weight.defined() ? weight.dtype() : DType::f32, s.b_dtype = bias.defined() ? bias.dtype() : DType::f32;
    s.batch_stats = batch_stats, s.has_bias = bias.defined();
  }
  (void)d;
  return {y};
}

Grads batch_norm_backward_cuda(const Node& n, const Grads& gr, const OpSaved& saved) {
  const BatchNormCudaSaved& s = saved.as<BatchNormCudaSaved>();
  const Tensor xhat = s.xhat.unpack(n), rstd = s.rstd.unpack(n);
  const Tensor w = s.w.defined() ? s.w.unpack(n) : Tensor();
  const int64_t N = xhat.size(0), C = xhat.size(1), L = xhat.size(2), M = N * L;
  const Shape s3{N, C, L};
  const DType st = xhat.dtype();  // the statistics' dtype (f64 for f64 x)
  const bool f64 = st == DType::f64;
  const Tensor g32 = cuda_as(gr[0], st);
  const Tensor g3 = make_view(g32, s3, contiguous_strides(s3), g32.storage_offset());
  Grads r(5);
  const bool want_w = w.defined() && needs_grad(n, 3), want_b = s.has_bias && needs_grad(n, 4);
  const Tensor db = cuda_sum_dims(g3, {0, 2}, false, 1.0, st);
  const Tensor dw = cuda_sum_dims(cuda_pointwise(PointwiseOp::mul, {g3, xhat}, s3, st), {0, 2}, false, 1.0, st);
  if (needs_grad(n, 0)) {
    const Tensor k = w.defined() ? cuda_pointwise(PointwiseOp::mul, {rstd, w}, {C}, st) : rstd;
    Tensor v = g3;
    if (s.batch_stats && M > 0) {
      const double inv = f64 ? 1.0 / static_cast<double>(M) : static_cast<float>(1.0 / static_cast<double>(M));
      const Tensor mg = cuda_pointwise(PointwiseOp::scale, {db}, {C}, st, inv);
      const Tensor mgx = cuda_pointwise(PointwiseOp::scale, {dw}, {C}, st, inv);
      const Tensor t = cuda_pointwise(PointwiseOp::sub, {g3, per_channel(mg, C)}, s3, st);
      const Tensor u = cuda_pointwise(PointwiseOp::mul, {xhat, per_channel(mgx, C)}, s3, st);
      v = cuda_pointwise(PointwiseOp::sub, {t, u}, s3, st);
    }
    const Tensor dx = cuda_pointwise(PointwiseOp::mul, {v, per_channel(k, C)}, s3, s.x_dtype);
    r[0] = make_view(dx, s.x_shape, contiguous_strides(s.x_shape), dx.storage_offset());
  }
  if (want_w) r[3] = cuda_as(dw, s.w_dtype);
  if (want_b) r[4] = cuda_as(db, s.b_dtype);
  return r;
}

}  // namespace

void cuda_conv_ops(std::vector<CudaOpEntry>& out) {
  out.push_back({"conv2d", {conv2d_cuda, conv2d_backward_cuda}});
  out.push_back({"max_pool2d", {max_pool2d_cuda, max_pool2d_backward_cuda}});
  out.push_back({"batch_norm", {batch_norm_cuda, batch_norm_backward_cuda}});
}

}  // namespace athanor::detail
