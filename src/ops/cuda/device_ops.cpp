// The CUDA forwards' building blocks (device_ops.h).
#include "ops/cuda/device_ops.h"

#include <algorithm>
#include <string>

#include "athanor/core/error.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/reduce.h"
#include "backend/cuda/runtime.h"
#include "ops/cuda/cuda_kernels.h"

namespace athanor::detail {

bool cuda_pointwise_dtype(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }

void check_cuda_dtype(const char* op, const Tensor& t, const char* name) {
  if (t.defined() && !cuda_pointwise_dtype(t.dtype()))
    cuda_unsupported(op, std::string(name) + " is " + t.describe() + " (the CUDA kernels take f32, bf16 and f16)");
}

void check_cuda_dtype_or_f64(const char* op, const Tensor& t, const char* name) {
  if (t.defined() && !cuda_pointwise_dtype(t.dtype()) && t.dtype() != DType::f64)
    cuda_unsupported(op, std::string(name) + " is " + t.describe() + " (the CUDA kernels take f32, bf16, f16 and f64)");
}

namespace {

void check_rank(const char* what, int64_t ndim) {
  ATH_CHECK(ndim <= cuda::kMaxIndexDims, what, "a ", ndim, "-D tensor on cuda (the CUDA kernels index at most ",
            cuda::kMaxIndexDims, " dims)", Hint{"reshape to fewer dims first"});
}

// t's strides broadcast to `shape` (right-aligned; size-1 and missing dims get stride 0).
cuda::PointwiseOperand operand(const Tensor& t, const Shape& shape) {
  cuda::PointwiseOperand o;
  o.data = t.device_data();
  o.dtype = t.dtype();
  const int64_t nd = static_cast<int64_t>(shape.size()), off = nd - t.dim();
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t td = d - off;
    o.strides[d] = td < 0 || t.size(td) == 1 ? 0 : t.stride(td);
  }
  o.contiguous = t.sizes() == shape && t.is_contiguous();
  return o;
}

}  // namespace

Tensor cuda_pointwise(cuda::PointwiseOp op, const std::vector<Tensor>& inputs, const Shape& shape, DType out_dtype,
                      double alpha) {
  ATH_ASSERT(!inputs.empty() && inputs.size() <= 3);
  check_rank("cuda pointwise", static_cast<int64_t>(shape.size()));
  // An op built from the pointwise kernel (mse_loss, batch_norm, swiglu, ...) called with a
  // dtype that kernel does not take: "not yet supported on cuda", before any work.
  for (const Tensor& t : inputs) check_cuda_dtype_or_f64("cuda pointwise", t, "an operand");
  if (!cuda_pointwise_dtype(out_dtype) && out_dtype != DType::f64)
    cuda_unsupported("cuda pointwise", std::string("the result dtype ") + dtype_name(out_dtype));
  const Device dev = inputs[0].device();
  Tensor y = empty(shape, TensorOptions(out_dtype).with_device(dev));
  if (y.numel() == 0) return y;
  cuda::PointwiseArgs a;
  a.op = op;
  a.ndim = static_cast<int>(shape.size());
  for (int d = 0; d < a.ndim; ++d) a.sizes[d] = shape[d];
  a.n_in = static_cast<int>(inputs.size());
  for (std::size_t k = 0; k < inputs.size(); ++k) a.in[k] = operand(inputs[k], shape);
  a.out = y.device_data();
  a.out_dtype = out_dtype;
  a.alpha = alpha;
  cuda::DeviceGuard g(dev.index);
  cuda::pointwise(a, cuda::compute_stream(dev.index));
  return y;
}

Tensor cuda_dropout_mask(const Tensor& x, uint64_t seed, uint64_t offset, uint32_t threshold, double scale) {
  check_rank("dropout", x.dim());
  Tensor y = empty(x.sizes(), TensorOptions(x.dtype()).with_device(x.device()));
  if (y.numel() == 0) return y;
  cuda::PointwiseArgs a;
  a.op = cuda::PointwiseOp::dropout;
  a.ndim = static_cast<int>(x.dim());
  for (int d = 0; d < a.ndim; ++d) a.sizes[d] = x.size(d);
  a.n_in = 1;
  a.in[0] = operand(x, x.sizes());
  a.out = y.device_data();
  a.out_dtype = x.dtype();
  a.alpha = scale;  // rounded to f32 in the kernel when x is not f64
  a.seed = seed, a.offset = offset, a.threshold = threshold;
  cuda::DeviceGuard g(x.device().index);
  cuda::pointwise(a, cuda::compute_stream(x.device().index));
  return y;
}

Tensor cuda_sum_dims(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, double scale, DType out_dtype) {
  check_rank("sum", x.dim());
  Shape out_shape = x.sizes();
  cuda::ReduceSumArgs a;
  a.x = x.device_data();
  a.x_dtype = x.dtype();
  a.scale = scale;
  a.out_dtype = out_dtype;
  int64_t outputs = 1, reduced = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const bool red = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (red) {
      a.red_sizes[a.red_ndim] = x.size(d), a.red_strides[a.red_ndim++] = x.stride(d);
      reduced *= x.size(d);
    } else {
      a.kept_sizes[a.kept_ndim] = x.size(d), a.kept_strides[a.kept_ndim++] = x.stride(d);
      outputs *= x.size(d);
    }
  }
  Shape os;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const bool red = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!red) os.push_back(x.size(d));
    else if (keepdim) os.push_back(1);
  }
  const Device dev = x.device();
  Tensor y = empty(os, TensorOptions(out_dtype).with_device(dev));
  if (outputs == 0) return y;
  a.out = y.device_data();
  Tensor scratch = empty({std::max<int64_t>(cuda::reduce_sum_scratch(outputs, reduced), 1)},
                         TensorOptions(DType::f64).with_device(dev).with_tag(MemTag::workspace));
  cuda::DeviceGuard g(dev.index);
  cuda::reduce_sum(a, static_cast<double*>(scratch.device_data()), cuda::compute_stream(dev.index));
  return y;
}

// C [m, n] = op(A) op(B) (+ bias, epilogue) with A, B, C contiguous row-major on `dev`; C in
// f32 from 16-bit A, B when c_f32.
void cuda_gemm(int dev, DType dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const Tensor& a, const Tensor& b,
               const Tensor& c, const Tensor& bias, int64_t batch, cuda::GemmEpilogue epi, bool c_f32) {
  cuda::GemmArgs g;
  g.dtype = dt;
  g.trans_a = ta, g.trans_b = tb;
  g.m = m, g.n = n, g.k = k;
  g.a = a.device_data(), g.b = b.device_data(), g.c = c.device_data();
  g.epilogue = epi;
  if (bias.defined()) {
    g.bias = bias.device_data();
    if (epi == cuda::GemmEpilogue::none) g.epilogue = cuda::GemmEpilogue::bias;
    if (epi == cuda::GemmEpilogue::relu) g.epilogue = cuda::GemmEpilogue::bias_relu;
  }
  if (dt == DType::f64 && g.epilogue != cuda::GemmEpilogue::none) {
    // f64 GEMMs take no epilogue (gemm.h): C = the bias broadcast over the rows (core's copy
    // of a stride-0 view), then C = op(A) op(B) + 1 C in one f64 GEMM.
    ATH_CHECK(g.epilogue == cuda::GemmEpilogue::bias && batch == 1, "cuda gemm",
              "an f64 GEMM takes a bias only (no activation epilogue, batch 1)",
              Hint{"apply the activation as its own op after the f64 GEMM"});
    const Tensor c2 = make_view(c, {m, n}, {n, 1}, c.storage_offset());
    copy_into(c2, make_view(bias, {m, n}, {0, 1}, bias.storage_offset()));
    g.bias = nullptr, g.epilogue = cuda::GemmEpilogue::none, g.beta = 1.0f;
  }
  g.batch = batch;
  g.stride_a = m * k, g.stride_b = k * n, g.stride_c = m * n;
  g.allow_tf32 = false;  // the config's switch is not wired yet: exact f32, as the CPU
  g.c_f32 = c_f32 && (dt == DType::bf16 || dt == DType::f16);  // f32 and f64 C are their operands' dtype
  cuda::DeviceGuard guard(dev);
  cuda::gemm(g, dev, cuda::compute_stream(dev));
}

Tensor cuda_as(const Tensor& t, DType dtype) {
  if (!t.defined() || t.dtype() == dtype) return cuda_contiguous(t);
  return cuda_pointwise(cuda::PointwiseOp::copy, {t}, t.sizes(), dtype);
}

}  // namespace athanor::detail
