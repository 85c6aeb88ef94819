// CUDA kernels of the Llama ops rope and swiglu (grouped-query attention is the attention
// file's scaled_dot_product_attention with enable_gqa).
//
// rope (src/ops/rope.cpp's op on the device): the cos/sin table is the CPU's own
//   (cpu::rope_inv_freq and cpu::rope_table in f32, f64 for f64 data: theta, Llama 3 scaling, position offset),
//   uploaded once per (T, D, options, device) and reused, as the CPU reuses its table; the
//   rotation runs in backend/cuda/rope.h, x read in place at its strides. Backward: the same
//   rotation with -sin (the rotation is orthogonal). Nothing is saved but the options.
// swiglu: y = silu(x W_gate^T) * (x W_up^T): two cuBLASLt GEMMs and one pointwise pass (f64:
//   f64 GEMMs, sums and the pointwise kernel's f64 path).
//   Backward: dg = dy u silu'(g), du = dy silu(g) (pointwise), dx = dg W_gate + du W_up,
//   dW_gate = dg^T x, dW_up = du^T x (in f32 from bf16 GEMMs under the f32-master rule).
//   Saved: x, g, u and the weights, as on the CPU.
#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>

#include "athanor/autograd/function.h"
#include "athanor/ops/rope.h"
#include "athanor/ops/swiglu.h"
#include "backend/cpu/rope.h"
#include "backend/cuda/rope.h"
#include "backend/cuda/runtime.h"
#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_ops.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor::detail {
namespace {

// ---- rope
struct RopeCudaTable {
  int64_t T = 0, D = 0;
  RopeOptions opt;
  Device device = Device::cpu();
  Tensor cos_sin;  // f32 [2, T, D/2] on the device (f64 for f64 data)
};

bool same_options(const RopeOptions& a, const RopeOptions& b) {
  const bool l3 = a.llama3.has_value() == b.llama3.has_value() &&
                  (!a.llama3 || (a.llama3->factor == b.llama3->factor && a.llama3->low_freq_factor == b.llama3->low_freq_factor &&
                                 a.llama3->high_freq_factor == b.llama3->high_freq_factor &&
                                 a.llama3->original_max_position == b.llama3->original_max_position));
  return l3 && a.theta == b.theta && a.position_offset == b.position_offset;
}

// The table of (T, D, o) on `device`: the last one made is kept (q and k of every layer and
// the backward share it).
Tensor rope_table_on(int64_t T, int64_t D, const RopeOptions& o, Device device, DType dt) {
  static std::mutex mu;
  static std::shared_ptr<const RopeCudaTable> last;
  {
    const std::lock_guard<std::mutex> lock(mu);
    if (last && last->T == T && last->D == D && last->device == device && last->cos_sin.dtype() == dt &&
        same_options(last->opt, o))
      return last->cos_sin;
  }
  std::optional<cpu::RopeLlama3> l3;
  if (o.llama3) l3 = cpu::RopeLlama3{o.llama3->factor, o.llama3->low_freq_factor, o.llama3->high_freq_factor,
                                     o.llama3->original_max_position};
  const int64_t half = D / 2;
  Tensor host = empty({2, T, half}, TensorOptions(dt));
  if (dt == DType::f64) {
    double* p = host.data_ptr<double>();
    cpu::rope_table<double>(cpu::rope_inv_freq(D, o.theta, l3), T, o.position_offset, p, p + T * half);
  } else {
    float* p = host.data_ptr<float>();
    cpu::rope_table<float>(cpu::rope_inv_freq(D, o.theta, l3), T, o.position_offset, p, p + T * half);
  }
  auto t = std::make_shared<RopeCudaTable>();
  t->T = T, t->D = D, t->opt = o, t->device = device, t->cos_sin = host.to(device);
  const std::lock_guard<std::mutex> lock(mu);
  last = t;
  return t->cos_sin;
}

Tensor rope_rotate(const Tensor& x, const RopeOptions& o, int sign) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype()).with_device(x.device()));
  if (x.numel() == 0) return out;
  const bool f64 = x.dtype() == DType::f64;
  const Tensor table = rope_table_on(T, D, o, x.device(), f64 ? DType::f64 : DType::f32);
  cuda::RopeArgs a;
  a.x = x.device_data(), a.dtype = x.dtype();
  a.B = B, a.T = T, a.H = H, a.D = D;
  a.sb = x.stride(0), a.st = x.stride(1), a.sh = x.stride(2), a.sd = x.stride(3);
  if (f64) {
    a.cos64 = static_cast<const double*>(table.device_data());
    a.sin64 = a.cos64 + T * (D / 2);
  } else {
    a.cos = static_cast<const float*>(table.device_data());
    a.sin = a.cos + T * (D / 2);
  }
  a.sign = sign;
  a.out = out.device_data();
  const int dev = x.device().index;
  cuda::DeviceGuard g(dev);
  cuda::rope_apply(a, cuda::compute_stream(dev));
  return out;
}

struct RopeCudaSaved : OpSaved {
  RopeOptions opt;
  DType dtype = DType::f32;
};

std::vector<Tensor> rope_cuda(OpCall& c) {
  const Tensor& x = c.in(0);
  const RopeOptions& o = c.args<RopeOptions>();
  check_floating(x, "rope", "x");
  check_cuda_dtype_or_f64("rope", x, "x");
  ATH_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, "rope", "expected x of shape [B, T, H, D] with D even, got ", x.describe(),
            Hint{"apply rope to the heads before the transpose: q_proj(x).view({B, T, H, D})"});
  ATH_CHECK(std::isfinite(o.theta) && o.theta > 0 && o.position_offset >= 0, "rope", "theta must be finite and > 0 and ",
            "position_offset >= 0, got theta ", o.theta, ", position_offset ", o.position_offset);
  Tensor y = rope_rotate(x, o, +1);
  if (c.records()) {
    RopeCudaSaved& s = c.save<RopeCudaSaved>();
    s.opt = o, s.dtype = x.dtype();
  }
  return {y};
}

Grads rope_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const RopeCudaSaved& s = saved.as<RopeCudaSaved>();
  if (!g[0].defined() || !needs_grad(n, 0)) return {Tensor()};
  return {rope_rotate(cuda_as(g[0], s.dtype), s.opt, -1)};
}

// ---- swiglu
struct SwigluCudaSaved : OpSaved {
  SavedTensor x, wg, wu, g, u;  // x, g, u contiguous [M, d] / [M, I]
  bool master = false;
};

std::vector<Tensor> swiglu_cuda(OpCall& c) {
  const char* op = "swiglu";
  const Tensor &x = c.in(0), &w_gate = c.in(1), &w_up = c.in(2);
  check_cuda_dtype_or_f64(op, x, "x");
  ATH_CHECK(x.dtype() == w_gate.dtype() && x.dtype() == w_up.dtype(), op, "x, w_gate and w_up must have one dtype, got x ",
            x.describe(), ", w_gate ", w_gate.describe(), ", w_up ", w_up.describe(),
            Hint{"convert them with .to(...) (or run under autocast)"});
  ATH_CHECK(w_gate.dim() == 2 && w_up.sizes() == w_gate.sizes() && x.dim() >= 1 && x.size(-1) == w_gate.size(1), op,
            "x [..., d] and w_gate, w_up [intermediate, d] do not fit: x ", x.describe(), ", w_gate ", w_gate.describe(),
            ", w_up ", w_up.describe());
  const int64_t d = w_gate.size(1), I = w_gate.size(0), M = shape_numel(Shape(x.sizes().begin(), x.sizes().end() - 1));
  const DType dt = x.dtype();
  const Device dev = x.device();
  const Tensor xc = cuda_contiguous(x), wg = cuda_contiguous(w_gate), wu = cuda_contiguous(w_up);
  Tensor g = empty({M, I}, TensorOptions(dt).with_device(dev)), u = empty({M, I}, TensorOptions(dt).with_device(dev));
  if (M > 0 && I > 0) {
    if (d == 0) {
      g.zero_(), u.zero_();
    } else {
      cuda_gemm(dev.index, dt, false, true, M, I, d, xc, wg, g);
      cuda_gemm(dev.index, dt, false, true, M, I, d, xc, wu, u);
    }
  }
  Shape ys = x.sizes();
  ys.back() = I;
  Tensor y = cuda_pointwise(cuda::PointwiseOp::silu_mul, {g, u}, {M, I}, dt);
  y = make_view(y, ys, contiguous_strides(ys), 0);
  if (c.records()) {
    SwigluCudaSaved& s = c.save<SwigluCudaSaved>();
    s.master = c.runs_on_master(1);
    s.x = save(xc, "x"), s.wg = save(wg, "w_gate"), s.wu = save(wu, "w_up"), s.g = save(g, "gate"), s.u = save(u, "up");
  }
  return {y};
}

Grads swiglu_backward_cuda(const Node& n, const Grads& gr, const OpSaved& saved) {
  const SwigluCudaSaved& s = saved.as<SwigluCudaSaved>();
  const Tensor x = s.x.unpack(n), wg = s.wg.unpack(n), wu = s.wu.unpack(n), g = s.g.unpack(n), u = s.u.unpack(n);
  const int64_t M = g.size(0), I = g.size(1), d = wg.size(1);
  const DType dt = g.dtype();
  const int dev = g.device().index;
  const Tensor dy = cuda_as(gr[0], dt);
  const Tensor dy2 = make_view(dy, {M, I}, contiguous_strides({M, I}), dy.storage_offset());
  const Tensor dg = cuda_pointwise(cuda::PointwiseOp::silu_mul_grad_gate, {g, u, dy2}, {M, I}, dt);
  const Tensor du = cuda_pointwise(cuda::PointwiseOp::silu_mul_grad_up, {g, u, dy2}, {M, I}, dt);
  Grads r(3);
  if (needs_grad(n, 0)) {
    Tensor a = empty(x.sizes(), TensorOptions(dt).with_device(x.device())), b = empty(x.sizes(), TensorOptions(dt).with_device(x.device()));
    if (M * d > 0) {
      if (I == 0) {
        a.zero_(), b.zero_();
      } else {  // dx = dg W_gate + du W_up: two GEMMs in f32 (f64 for f64), one sum rounded once
        const DType sum_dt = dt == DType::f64 ? DType::f64 : DType::f32;
        a = empty(x.sizes(), TensorOptions(sum_dt).with_device(x.device()));
        b = empty(x.sizes(), TensorOptions(sum_dt).with_device(x.device()));
        cuda_gemm(dev, dt, false, false, M, d, I, dg, wg, a, Tensor(), 1, cuda::GemmEpilogue::none, true);
        cuda_gemm(dev, dt, false, false, M, d, I, du, wu, b, Tensor(), 1, cuda::GemmEpilogue::none, true);
      }
    }
    r[0] = cuda_pointwise(cuda::PointwiseOp::add, {a, b}, x.sizes(), dt);
  }
  const DType pdt = s.master ? DType::f32 : dt;
  for (int k : {1, 2}) {
    if (!needs_grad(n, k)) continue;
    Tensor dw = empty({I, d}, TensorOptions(pdt).with_device(x.device()));
    if (I * d > 0) {
      if (M == 0) dw.zero_();
      else cuda_gemm(dev, dt, true, false, I, d, M, k == 1 ? dg : du, x, dw, Tensor(), 1, cuda::GemmEpilogue::none, s.master);
    }
    r[k] = dw;
  }
  return r;
}

}  // namespace

void cuda_llama_ops(std::vector<CudaOpEntry>& out) {
  out.push_back({"rope", {rope_cuda, rope_backward_cuda}});
  out.push_back({"swiglu", {swiglu_cuda, swiglu_backward_cuda}});
}

}  // namespace athanor::detail
