// CUDA kernels of linear and matmul on cuBLASLt (src/backend/cuda/gemm.h), row-major as on
// the CPU; f32 (TF32 off: exact f32 products, as the CPU), bf16 and f16 (f32 accumulation).
//
// linear: y = x W^T + b over the rows of x [.., in] (W [out, in], b [out]), one GEMM with
// the bias epilogue. Backward beside it:
//   dx = g W            [M, out] x [out, in]
//   dW = g^T x          [out, M] x [M, in]
//   db = 1^T g          the column sums as a [1, M] x [M, out] GEMM (a fixed order, no atomics)
// gelu_linear: y = gelu_tanh(x) W^T + b (f32), h = gelu(x) in a scratch freed after the GEMM, as
//   on the CPU (src/ops/gelu_linear.cpp) only x and W are saved. Backward recomputes h:
//   dx = (g W) ⊙ gelu'(x), dW = g^T h, db = 1^T g. 16-bit x: "not yet supported on cuda"
//   (the GELU kernels are f32; cuBLASLt's GELU epilogue is the speed work's).
// matmul: [..., m, k] x [k, n] (leading dims folded into the rows), or [B, m, k] x [B, k, n]
//   (one strided-batched GEMM); dA = g B^T, dB = A^T g. 1-D operands and broadcast batches:
//   "not yet supported on cuda".
#include "athanor/autograd/function.h"
#include "athanor/ops/linalg.h"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/runtime.h"
#include "ops/cuda/cuda_kernels.h"
#include "ops/op_def.h"

namespace athanor::detail {
namespace {

bool gemm_dtype(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }

void check_operand(const char* op, const Tensor& t, const char* name, DType dtype) {
  if (!gemm_dtype(t.dtype()))
    cuda_unsupported(op, std::string(name) + " is " + t.describe() + " (cuBLASLt takes f32, bf16 and f16)");
  if (t.dtype() != dtype)
    ATH_FAIL(op, name, " is ", t.describe(), " but the first input is ", dtype_name(dtype),
             Hint{"give every input of '" + std::string(op) + "' one dtype (or use autocast)"});
}

// C [m, n] = op(A) op(B) (+ bias) with A, B, C contiguous row-major on `dev`.
void run_gemm(int dev, DType dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const Tensor& a, const Tensor& b,
              const Tensor& c, const Tensor& bias = Tensor(), int64_t batch = 1) {
  cuda::GemmArgs g;
  g.dtype = dt;
  g.trans_a = ta, g.trans_b = tb;
  g.m = m, g.n = n, g.k = k;
  g.a = a.device_data(), g.b = b.device_data(), g.c = c.device_data();
  if (bias.defined()) {
    g.bias = bias.device_data();
    g.epilogue = cuda::GemmEpilogue::bias;
  }
  g.batch = batch;
  g.stride_a = m * k, g.stride_b = k * n, g.stride_c = m * n;
  g.allow_tf32 = false;  // the config's switch is not wired yet: exact f32, as the CPU
  cuda::DeviceGuard guard(dev);
  cuda::gemm(g, dev, cuda::compute_stream(dev));
}

Tensor device_empty(const Shape& s, DType dt, Device d) { return empty(s, TensorOptions(dt).with_device(d)); }

struct LinearSaved : OpSaved {
  SavedTensor x, w;
  bool has_bias = false;
};

std::vector<Tensor> linear_cuda(OpCall& c) {
  const Tensor &x = c.in(0), &w = c.in(1), &b = c.in(2);
  if (c.runs_on_master(1))  // the CPU's dW-in-f32-from-bf16 path (OpDef::f32_master) has no CUDA twin yet
    cuda_unsupported("linear", "bf16 autocast over f32 master weights (run f32, or cast the weights yourself)");
  const DType dt = x.dtype();
  check_operand("linear", x, "x", dt);
  check_operand("linear", w, "weight", dt);
  if (b.defined()) check_operand("linear", b, "bias", dt);
  ATH_CHECK(x.dim() >= 1 && w.dim() == 2 && x.size(-1) == w.size(1), "linear", "x ", x.describe(), " and weight ",
            w.describe(), " do not match: weight must be [out, in] with in = x's last dim");
  const int64_t out = w.size(0), in = w.size(1), M = in == 0 ? 0 : x.numel() / in;
  ATH_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == out), "linear", "bias ", b.describe(), " must be [", out, "]");
  Shape ys = x.sizes();
  ys.back() = out;
  Tensor y = device_empty(ys, dt, x.device());
  const Tensor xc = cuda_contiguous(x), wc = cuda_contiguous(w), bc = cuda_contiguous(b);
  if (M > 0 && out > 0) {
    if (in == 0) y.zero_();
    else run_gemm(cuda_index(c), dt, false, true, M, out, in, xc, wc, y, bc);
  }
  if (c.records()) {
    LinearSaved& s = c.save<LinearSaved>();
    if (c.requires_grad(1)) s.x = save(xc, "x");
    if (c.requires_grad(0)) s.w = save(wc, "weight");
    s.has_bias = b.defined();
  }
  return {y};
}

Grads linear_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const LinearSaved& s = saved.as<LinearSaved>();
  const Tensor gy = cuda_contiguous(g[0]);
  const DType dt = gy.dtype();
  const int dev = gy.device().index;
  const int64_t out = gy.size(-1), M = out == 0 ? 0 : gy.numel() / out;
  Grads r(3);
  if (needs_grad(n, 0)) {
    const Tensor w = s.w.unpack(n);
    const int64_t in = w.size(1);
    Shape xs = gy.sizes();
    xs.back() = in;
    r[0] = device_empty(xs, dt, gy.device());
    if (M * in > 0) {
      if (out == 0) r[0].zero_();
      else run_gemm(dev, dt, false, false, M, in, out, gy, w, r[0]);
    }
  }
  if (needs_grad(n, 1)) {
    const Tensor x = s.x.unpack(n);
    const int64_t in = x.size(-1);
    r[1] = device_empty({out, in}, dt, gy.device());
    if (out * in > 0) {
      if (M == 0) r[1].zero_();
      else run_gemm(dev, dt, true, false, out, in, M, gy, x, r[1]);
    }
  }
  if (s.has_bias && needs_grad(n, 2)) {
    r[2] = device_empty({out}, dt, gy.device());
    if (out > 0) {
      if (M == 0) r[2].zero_();
      else run_gemm(dev, dt, false, false, 1, out, M, ones({M}, TensorOptions(dt).with_device(gy.device())), gy, r[2]);
    }
  }
  return r;
}

// ---- gelu_linear
std::vector<Tensor> gelu_linear_cuda(OpCall& c) {
  const Tensor &x = c.in(0), &w = c.in(1), &b = c.in(2);
  const char* op = "gelu_linear";
  if (c.runs_on_master(1)) cuda_unsupported(op, "bf16 autocast over f32 master weights (run f32)");
  if (x.dtype() != DType::f32) cuda_unsupported(op, "x is " + x.describe() + " (the CUDA GELU kernels take f32)");
  check_operand(op, w, "weight", DType::f32);
  if (b.defined()) check_operand(op, b, "bias", DType::f32);
  ATH_CHECK(x.dim() >= 1 && w.dim() == 2 && x.size(-1) == w.size(1), op, "x ", x.describe(), " and weight ", w.describe(),
            " do not match: weight must be [out, in] with in = x's last dim");
  const int64_t out = w.size(0), in = w.size(1), M = in == 0 ? 0 : x.numel() / in;
  ATH_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == out), op, "bias ", b.describe(), " must be [", out, "]");
  Shape ys = x.sizes();
  ys.back() = out;
  Tensor y = device_empty(ys, DType::f32, x.device());
  const Tensor xc = cuda_contiguous(x), wc = cuda_contiguous(w), bc = cuda_contiguous(b);
  const int dev = cuda_index(c);
  if (in == 0 && y.numel() > 0) cuda_unsupported(op, "an empty input dim (x " + x.describe() + ")");
  if (M > 0 && out > 0) {
    Tensor h = device_empty(xc.sizes(), DType::f32, x.device());  // scratch, freed after the GEMM
    {
      cuda::DeviceGuard guard(dev);
      cuda::gelu_tanh_forward(static_cast<const float*>(xc.device_data()), static_cast<float*>(h.device_data()),
                              xc.numel(), cuda::compute_stream(dev));
    }
    run_gemm(dev, DType::f32, false, true, M, out, in, h, wc, y, bc);
  }
  if (c.records()) {
    LinearSaved& s = c.save<LinearSaved>();
    s.x = save(xc, "x");
    if (c.requires_grad(0)) s.w = save(wc, "weight");
    s.has_bias = b.defined();
  }
  return {y};
}

Grads gelu_linear_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const LinearSaved& s = saved.as<LinearSaved>();
  const Tensor gy = cuda_contiguous(g[0]);
  if (gy.dtype() != DType::f32) cuda_unsupported("gelu_linear backward", "grad is " + gy.describe() + " (f32 only)");
  const int dev = gy.device().index;
  const cudaStream_t st = cuda::compute_stream(dev);
  const Tensor x = s.x.unpack(n);
  const int64_t out = gy.size(-1), in = x.size(-1), M = in == 0 ? 0 : x.numel() / in;
  Grads r(3);
  if (needs_grad(n, 0)) {
    const Tensor w = s.w.unpack(n);
    r[0] = device_empty(x.sizes(), DType::f32, gy.device());
    if (M * in > 0) {
      if (out == 0) {
        r[0].zero_();
      } else {
        Tensor dh = device_empty(x.sizes(), DType::f32, gy.device());
        run_gemm(dev, DType::f32, false, false, M, in, out, gy, w, dh);
        cuda::DeviceGuard guard(dev);
        cuda::gelu_tanh_backward(static_cast<const float*>(dh.device_data()), static_cast<const float*>(x.device_data()),
                                 static_cast<float*>(r[0].device_data()), x.numel(), st);
      }
    }
  }
  if (needs_grad(n, 1)) {
    r[1] = device_empty({out, in}, DType::f32, gy.device());
    if (out * in > 0) {
      if (M == 0) {
        r[1].zero_();
      } else {
        Tensor h = device_empty(x.sizes(), DType::f32, gy.device());
        {
          cuda::DeviceGuard guard(dev);
          cuda::gelu_tanh_forward(static_cast<const float*>(x.device_data()), static_cast<float*>(h.device_data()),
                                  x.numel(), st);
        }
        run_gemm(dev, DType::f32, true, false, out, in, M, gy, h, r[1]);
      }
    }
  }
  if (s.has_bias && needs_grad(n, 2)) {
    r[2] = device_empty({out}, DType::f32, gy.device());
    if (out > 0) {
      if (M == 0) r[2].zero_();
      else run_gemm(dev, DType::f32, false, false, 1, out, M, ones({M}, TensorOptions(DType::f32).with_device(gy.device())), gy, r[2]);
    }
  }
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
    else run_gemm(cuda_index(c), dt, false, false, m, n, k, ac, bc, y, Tensor(), batch);
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
      else run_gemm(dev, dt, false, true, s.m, s.k, s.n, gy, s.b.unpack(nd), r[0], Tensor(), s.batch);
    }
  }
  if (needs_grad(nd, 1)) {
    r[1] = device_empty(s.b_shape, dt, gy.device());
    if (r[1].numel() > 0) {
      if (s.m == 0) r[1].zero_();
      else run_gemm(dev, dt, true, false, s.k, s.n, s.m, s.a.unpack(nd), gy, r[1], Tensor(), s.batch);
    }
  }
  return r;
}

}  // namespace

void cuda_linalg_ops(std::vector<CudaOpEntry>& out) {
  out.push_back({"linear", {linear_cuda, linear_backward_cuda}});
  out.push_back({"matmul", {matmul_cuda, matmul_backward_cuda}});
  out.push_back({"gelu_linear", {gelu_linear_cuda, gelu_linear_backward_cuda}});
}

}  // namespace athanor::detail
