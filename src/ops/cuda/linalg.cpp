// CUDA kernels of linear, gelu_linear, linear_relu and matmul on cuBLASLt
// (src/backend/cuda/gemm.h), row-major as on the CPU; f32 (TF32 off: exact f32 products, as
// the CPU), bf16 and f16 (f32 accumulation), f64 (f64 throughout: no epilogue, the bias through
// beta = 1, a ReLU after the GEMM; device_ops.h's cuda_gemm).
//
// linear: y = x W^T + b over the rows of x [.., in] (W [out, in], b [out]), one GEMM with
// the bias epilogue. Backward beside it:
//   dx = g W            [M, out] x [out, in]
//   dW = g^T x          [out, M] x [M, in]
//   db = Σ_rows g       the deterministic f64 column sums (reduce.h; no atomics)
// Under bf16 autocast over f32 master weights (OpDef::f32_master) the GEMMs read the bf16
// copies and dW, db come out in f32 (cuBLASLt writing its f32 accumulators), as on the CPU.
// gelu_linear and linear_relu: see their sections below.
// The backward epilogues (issue 22; cuda::fused_epilogues_enabled, 16-bit operands only: f32
// stays the exact mode the CPU parity checks rely on; where cuBLASLt offers them):
// dW = g^T x computes db = Σ_rows g in the same GEMM (bias_grad: one read of g fewer, one
// launch fewer; f32 accumulation in the GEMM instead of the f64 column sums), and gelu_linear's
// dx = (g W) ⊙ gelu'(x) is one GEMM (dgelu: no f32 [M, in] intermediate written and read
// back). Where cuBLASLt declines (a dtype, an odd width) the unfused path runs.
// matmul: [..., m, k] x [k, n] (leading dims folded into the rows), or [B, m, k] x [B, k, n]
//   (one strided-batched GEMM); dA = g B^T, dB = A^T g. 1-D operands and broadcast batches:
//   "not yet supported on cuda".
#include <array>

#include "athanor/autograd/function.h"
#include "athanor/ops/linalg.h"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/runtime.h"
#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_ops.h"
#include "ops/op_def.h"

namespace athanor::detail {
namespace {

bool gemm_dtype(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16 || d == DType::f64; }
bool is_lowp(DType d) { return d == DType::bf16 || d == DType::f16; }

void check_operand(const char* op, const Tensor& t, const char* name, DType dtype) {
  if (!gemm_dtype(t.dtype()))
    cuda_unsupported(op, std::string(name) + " is " + t.describe() + " (cuBLASLt takes f32, bf16, f16 and f64)");
  if (t.dtype() != dtype)
    ATH_FAIL(op, name, " is ", t.describe(), " but the first input is ", dtype_name(dtype),
             Hint{"give every input of '" + std::string(op) + "' one dtype (or use autocast)"});
}

Tensor device_empty(const Shape& s, DType dt, Device d) { return empty(s, TensorOptions(dt).with_device(d)); }

// The linear-shaped ops (linear, gelu_linear, linear_relu). Under bf16 autocast over f32
// master weights (OpDef::f32_master) the GEMMs read the bf16 copies and dW, db are written
// in f32 from the f32 accumulators (cuBLASLt's C in f32), as on the CPU.
struct LinearSaved : OpSaved {
  SavedTensor x, w, y;  // x: the GEMM's input (gelu_linear: before the GELU); y: linear_relu's output
  bool has_bias = false, master = false;
};

// x [.., in], W [out, in], b [out] (b may be undefined): checked, {M, out, in}.
std::array<int64_t, 3> linear_dims(const char* op, const Tensor& x, const Tensor& w, const Tensor& b) {
  const DType dt = x.dtype();
  check_operand(op, x, "x", dt);
  check_operand(op, w, "weight", dt);
  if (b.defined()) check_operand(op, b, "bias", dt);
  ATH_CHECK(x.dim() >= 1 && w.dim() == 2 && x.size(-1) == w.size(1), op, "x ", x.describe(), " and weight ", w.describe(),
            " do not match: weight must be [out, in] with in = x's last dim");
  const int64_t out = w.size(0), in = w.size(1), M = in == 0 ? 0 : x.numel() / in;
  ATH_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == out), op, "bias ", b.describe(), " must be [", out, "]");
  return {M, out, in};
}

Shape with_last(const Shape& s, int64_t last) {
  Shape r = s;
  r.back() = last;
  return r;
}

// y = act(h W^T + b) over the rows of h, the activation in the GEMM's epilogue.
Tensor linear_forward(int dev, const Tensor& h, const Tensor& wc, const Tensor& bc, int64_t M, int64_t out, int64_t in,
                      cuda::GemmEpilogue epi) {
  Tensor y = device_empty(with_last(h.sizes(), out), h.dtype(), h.device());
  if (M > 0 && out > 0) {
    if (in == 0) {
      y.zero_();  // an empty inner dim: x W^T is 0 (then the bias, through the pointwise add)
      if (bc.defined()) y = cuda_pointwise(cuda::PointwiseOp::add, {y, bc}, y.sizes(), y.dtype());
      if (epi == cuda::GemmEpilogue::relu) y = cuda_pointwise(cuda::PointwiseOp::relu, {y}, y.sizes(), y.dtype());
    } else if (h.dtype() == DType::f64 && epi == cuda::GemmEpilogue::relu) {
      // f64 GEMMs take no activation epilogue (gemm.h): the GEMM (bias through beta), then the ReLU.
      cuda_gemm(dev, h.dtype(), false, true, M, out, in, h, wc, y, bc, 1, cuda::GemmEpilogue::none);
      y = cuda_pointwise(cuda::PointwiseOp::relu, {y}, y.sizes(), y.dtype());
    } else {
      cuda_gemm(dev, h.dtype(), false, true, M, out, in, h, wc, y, bc, 1, epi);
    }
  }
  return y;
}

// The GEMM gradients of y = h W^T + b (h [.., in]) from dz [.., out] (contiguous): dh = dz W
// (f32 when dh_f32, else dz's dtype), dW = dz^T h, db = Σ_rows dz (dW, db in f32 when
// master). W is read only for dh, h only for dW (a callable, so that gelu_linear recomputes
// its GELU only then).
template <class H>
void linear_grads(const Tensor& dz, int64_t in, const Tensor& w, H&& h_for_dw, bool master, bool dh_f32, Tensor* dh,
                  Tensor* dw, Tensor* db) {
  const DType dt = dz.dtype();
  const int dev = dz.device().index;
  const int64_t out = dz.size(-1), M = out == 0 ? 0 : dz.numel() / out;
  if (dh) {
    const bool dh32 = dh_f32 && dt != DType::f64;  // f64 stays f64
    *dh = device_empty(with_last(dz.sizes(), in), dh32 ? DType::f32 : dt, dz.device());
    if (M * in > 0) {
      if (out == 0) dh->zero_();
      else cuda_gemm(dev, dt, false, false, M, in, out, dz, w, *dh, Tensor(), 1, cuda::GemmEpilogue::none, dh32);
    }
  }
  const DType pdt = master ? DType::f32 : dt;
  bool db_done = false;
  if (dw) {
    *dw = device_empty({out, in}, pdt, dz.device());
    if (out * in > 0) {
      if (M == 0) {
        dw->zero_();
      } else if (db && is_lowp(dt) && cuda::fused_epilogues_enabled()) {
        // dW and db from one read of dz: bias_grad's db[o] = Σ_rows dz[:, o] (op(A) = dz^T).
        *db = device_empty({out}, pdt, dz.device());
        const Tensor h = h_for_dw();
        cuda::GemmArgs ga;
        ga.dtype = dt, ga.trans_a = true, ga.trans_b = false, ga.m = out, ga.n = in, ga.k = M;
        ga.a = dz.device_data(), ga.b = h.device_data(), ga.c = dw->device_data(), ga.bias = db->device_data();
        ga.epilogue = cuda::GemmEpilogue::bias_grad;
        ga.c_f32 = master && dt != DType::f32;
        cuda::DeviceGuard guard(dev);
        db_done = cuda::try_gemm(ga, dev, cuda::compute_stream(dev));
        if (!db_done) {
          *db = Tensor();
          cuda_gemm(dev, dt, true, false, out, in, M, dz, h, *dw, Tensor(), 1, cuda::GemmEpilogue::none, master);
        }
      } else {
        cuda_gemm(dev, dt, true, false, out, in, M, dz, h_for_dw(), *dw, Tensor(), 1, cuda::GemmEpilogue::none, master);
      }
    }
  }
  if (db && !db_done) {  // the column sums, deterministic, in f64 (reduce.h)
    std::vector<int64_t> rows;
    for (int64_t d = 0; d + 1 < dz.dim(); ++d) rows.push_back(d);
    *db = cuda_sum_dims(dz, rows, false, 1.0, pdt);
  }
}

std::vector<Tensor> linear_cuda(OpCall& c) {
  const Tensor &x = c.in(0), &w = c.in(1), &b = c.in(2);
  const auto [M, out, in] = linear_dims("linear", x, w, b);
  const Tensor xc = cuda_contiguous(x), wc = cuda_contiguous(w), bc = cuda_contiguous(b);
  Tensor y = linear_forward(cuda_index(c), xc, wc, bc, M, out, in, cuda::GemmEpilogue::none);
  if (c.records()) {
    LinearSaved& s = c.save<LinearSaved>();
    s.master = c.runs_on_master(1);
    if (c.requires_grad(1)) s.x = save(xc, "x");
    if (c.requires_grad(0)) s.w = save(wc, s.master ? "weight (bf16 copy)" : "weight");
    s.has_bias = b.defined();
  }
  return {y};
}

Grads linear_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const LinearSaved& s = saved.as<LinearSaved>();
  const Tensor gy = cuda_contiguous(g[0]);
  Grads r(3);
  // dx needs W (saved when x requires grad), dW needs x (saved when W requires grad).
  const Tensor w = needs_grad(n, 0) ? s.w.unpack(n) : Tensor();
  const int64_t in = n.input_meta[0].sizes.back();
  linear_grads(gy, in, w, [&] { return s.x.unpack(n); }, s.master, false, needs_grad(n, 0) ? &r[0] : nullptr,
               needs_grad(n, 1) ? &r[1] : nullptr, s.has_bias && needs_grad(n, 2) ? &r[2] : nullptr);
  return r;
}

// ---- gelu_linear: y = gelu_tanh(x) W^T + b; h = gelu(x) in a scratch freed after the GEMM
// (only x and W are saved, as on the CPU). Backward recomputes h for dW:
//   dx = (g W) ⊙ gelu'(x)  (g W in f32, then one rounding), dW = g^T h, db = Σ_rows g.
std::vector<Tensor> gelu_linear_cuda(OpCall& c) {
  const char* op = "gelu_linear";
  const Tensor &x = c.in(0), &w = c.in(1), &b = c.in(2);
  const auto [M, out, in] = linear_dims(op, x, w, b);
  if (in == 0 && M > 0 && out > 0) cuda_unsupported(op, "an empty input dim (x " + x.describe() + ")");
  const Tensor xc = cuda_contiguous(x), wc = cuda_contiguous(w), bc = cuda_contiguous(b);
  Tensor y;
  {
    const Tensor h = cuda_pointwise(cuda::PointwiseOp::gelu_tanh, {xc}, xc.sizes(), xc.dtype());
    y = linear_forward(cuda_index(c), h, wc, bc, M, out, in, cuda::GemmEpilogue::none);
  }
  if (c.records()) {
    LinearSaved& s = c.save<LinearSaved>();
    s.master = c.runs_on_master(1);
    s.x = save(xc, "x");
    if (c.requires_grad(0)) s.w = save(wc, s.master ? "weight (bf16 copy)" : "weight");
    s.has_bias = b.defined();
  }
  return {y};
}

// dx = (g W) ⊙ gelu'(x) in one GEMM with cuBLASLt's dgelu epilogue (x as its GELU input, dx
// in x's dtype, rounded once from the f32 accumulators as the unfused path does); false when
// cuBLASLt declines (then nothing was written).
bool gelu_linear_dx_fused(const Tensor& gy, const Tensor& w, const Tensor& x, Tensor* dx) {
  const int64_t out = gy.size(-1), in = x.size(-1), M = out == 0 ? 0 : gy.numel() / out;
  if (!cuda::fused_epilogues_enabled() || !is_lowp(gy.dtype()) || x.dtype() != gy.dtype() || w.dtype() != gy.dtype() ||
      M == 0 || in == 0 || out == 0)
    return false;
  const int dev = gy.device().index;
  Tensor r = device_empty(x.sizes(), x.dtype(), x.device());
  cuda::GemmArgs ga;
  ga.dtype = gy.dtype(), ga.trans_a = false, ga.trans_b = false, ga.m = M, ga.n = in, ga.k = out;
  ga.a = gy.device_data(), ga.b = w.device_data(), ga.c = r.device_data();
  ga.aux = x.device_data(), ga.aux_ld = in;
  ga.epilogue = cuda::GemmEpilogue::dgelu;
  cuda::DeviceGuard guard(dev);
  if (!cuda::try_gemm(ga, dev, cuda::compute_stream(dev))) return false;
  *dx = r;
  return true;
}

Grads gelu_linear_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const LinearSaved& s = saved.as<LinearSaved>();
  const Tensor gy = cuda_contiguous(g[0]);
  const Tensor x = s.x.unpack(n);
  const Tensor w = needs_grad(n, 0) ? s.w.unpack(n) : Tensor();
  Grads r(3);
  const bool dx_fused = needs_grad(n, 0) && gelu_linear_dx_fused(gy, w, x, &r[0]);
  Tensor dh;
  linear_grads(
      gy, x.size(-1), w, [&] { return cuda_pointwise(cuda::PointwiseOp::gelu_tanh, {x}, x.sizes(), x.dtype()); }, s.master, true,
      needs_grad(n, 0) && !dx_fused ? &dh : nullptr, needs_grad(n, 1) ? &r[1] : nullptr,
      s.has_bias && needs_grad(n, 2) ? &r[2] : nullptr);
  if (dh.defined()) r[0] = cuda_pointwise(cuda::PointwiseOp::gelu_tanh_backward, {dh, x}, x.sizes(), x.dtype());
  return r;
}

// ---- linear_relu: y = relu(x W^T + b), the ReLU in cuBLASLt's epilogue. Backward from y:
//   dz = g [y > 0], dx = dz W, dW = dz^T x, db = Σ_rows dz.
std::vector<Tensor> linear_relu_cuda(OpCall& c) {
  const Tensor &x = c.in(0), &w = c.in(1), &b = c.in(2);
  const auto [M, out, in] = linear_dims("linear_relu", x, w, b);
  const Tensor xc = cuda_contiguous(x), wc = cuda_contiguous(w), bc = cuda_contiguous(b);
  Tensor y = linear_forward(cuda_index(c), xc, wc, bc, M, out, in, cuda::GemmEpilogue::relu);
  if (c.records()) {
    LinearSaved& s = c.save<LinearSaved>();
    s.master = c.runs_on_master(1);
    s.x = save(xc, "x");
    s.w = save(wc, s.master ? "weight (bf16 copy)" : "weight");
    s.y = save(y, "result");
    s.has_bias = b.defined();
  }
  return {y};
}

Grads linear_relu_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const LinearSaved& s = saved.as<LinearSaved>();
  const Tensor y = s.y.unpack(n);
  const Tensor dz = cuda_pointwise(cuda::PointwiseOp::relu_backward, {g[0], y}, y.sizes(), y.dtype());
  Grads r(3);
  linear_grads(dz, s.x.unpack(n).size(-1), s.w.unpack(n), [&] { return s.x.unpack(n); }, s.master, false,
               needs_grad(n, 0) ? &r[0] : nullptr,
               needs_grad(n, 1) ? &r[1] : nullptr, s.has_bias && needs_grad(n, 2) ? &r[2] : nullptr);
  return r;
}

struct MatmulSaved : OpSaved {
  SavedTensor a, b;
  Shape a_shape, b_shape;
  int64_t batch = 1, m = 0, k = 0, n = 0;
};

// a [..., m, k] x b [k, n] folds a's leading dims into the rows (one GEMM of M = Π a's
// dims but the last); a [B, m, k] x b [B, k, n] is one strided-batched GEMM.
std::vector<Tensor> matmul_cuda(OpCall& c) {
  const Tensor &a = c.in(0), &b = c.in(1);
  const DType dt = a.dtype();
  check_operand("matmul", a, "a", dt);
  check_operand("matmul", b, "b", dt);
  const bool folded = a.dim() >= 2 && b.dim() == 2;
  const bool batched = a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0);
  if (!folded && !batched)
    cuda_unsupported("matmul", "a " + a.describe() + " x b " + b.describe() +
                                   " (the CUDA kernel takes [..., m, k] x [k, n], or [B, m, k] x [B, k, n])");
  ATH_CHECK(a.size(-1) == b.size(-2), "matmul", "inner dimensions differ: a ", a.describe(), ", b ", b.describe());
  const int64_t k = a.size(-1), n = b.size(-1);
  const int64_t batch = folded ? 1 : a.size(0);
  const int64_t m = folded ? shape_numel(Shape(a.sizes().begin(), a.sizes().end() - 1)) : a.size(1);
  Shape ys = a.sizes();
  ys.back() = n;
  Tensor y = device_empty(ys, dt, a.device());
  const Tensor ac = cuda_contiguous(a), bc = cuda_contiguous(b);
  if (y.numel() > 0) {
    if (k == 0) y.zero_();
    else cuda_gemm(cuda_index(c), dt, false, false, m, n, k, ac, bc, y, Tensor(), batch);
  }
  if (c.records()) {
    MatmulSaved& s = c.save<MatmulSaved>();
    if (c.requires_grad(1)) s.a = save(ac, "a");
    if (c.requires_grad(0)) s.b = save(bc, "b");
    s.a_shape = a.sizes(), s.b_shape = b.sizes();
    s.batch = batch, s.m = m, s.k = k, s.n = n;
  }
  return {y};
}

// dA [m, k] = g [m, n] B^T;  dB [k, n] = A^T [k, m] g [m, n] (folded: summed over a's leading
// dims by the GEMM itself).
Grads matmul_backward_cuda(const Node& nd, const Grads& g, const OpSaved& saved) {
  const MatmulSaved& s = saved.as<MatmulSaved>();
  const Tensor gy = cuda_contiguous(g[0]);
  const DType dt = gy.dtype();
  const int dev = gy.device().index;
  Grads r(2);
  if (needs_grad(nd, 0)) {
    r[0] = device_empty(s.a_shape, dt, gy.device());
    if (r[0].numel() > 0) {
      if (s.n == 0) r[0].zero_();
      else cuda_gemm(dev, dt, false, true, s.m, s.k, s.n, gy, s.b.unpack(nd), r[0], Tensor(), s.batch);
    }
  }
  if (needs_grad(nd, 1)) {
    r[1] = device_empty(s.b_shape, dt, gy.device());
    if (r[1].numel() > 0) {
      if (s.m == 0) r[1].zero_();
      else cuda_gemm(dev, dt, true, false, s.k, s.n, s.m, s.a.unpack(nd), gy, r[1], Tensor(), s.batch);
    }
  }
  return r;
}

}  // namespace

void cuda_linalg_ops(std::vector<CudaOpEntry>& out) {
  out.push_back({"linear", {linear_cuda, linear_backward_cuda}});
  out.push_back({"matmul", {matmul_cuda, matmul_backward_cuda}});
  out.push_back({"gelu_linear", {gelu_linear_cuda, gelu_linear_backward_cuda}});
  out.push_back({"linear_relu", {linear_relu_cuda, linear_relu_backward_cuda}});
}

}  // namespace athanor::detail
