// CUDA kernels of sum and mean over every dim (f32 in, f32 out; src/backend/cuda/kernels.h's
// cuda::sum): the sum is taken in f64 in a fixed order (fixed blocks, then one block over the
// partials in index order), so it is the same bits every run, and mean's 1/count is applied in
// f64 before the one rounding to f32, as on the CPU.
// Backward beside it: dx = g / count broadcast over x's shape, g read on the device (no host
// sync). Reducing over a subset of the dims and 16-bit inputs (autocast's reads_lowp path):
// "not yet supported on cuda".
#include <cmath>
#include <string>

#include "athanor/autograd/function.h"
#include "athanor/ops/reduction.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "ops/cuda/cuda_kernels.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor::detail {
namespace {

struct ReduceCudaSaved : OpSaved {
  Shape in;
  double scale = 1.0;
};

template <bool Mean> std::vector<Tensor> reduce_cuda(OpCall& c) {
  const Tensor& x = c.in(0);
  const char* op = c.name();
  const ReduceArgs& a = c.args<ReduceArgs>();
  check_floating(x, op, "x");
  if (x.dtype() != DType::f32) cuda_unsupported(op, "x is " + x.describe() + " (the CUDA kernel takes f32)");
  const std::vector<int64_t> dims = normalize_dims(a.dims, x.dim(), op);
  if (x.dim() > 0 && static_cast<int64_t>(dims.size()) != x.dim())
    cuda_unsupported(op, "reducing " + std::to_string(dims.size()) + " of the " + std::to_string(x.dim()) + " dims of " +
                             x.describe() + " (the CUDA kernel reduces over every dim)");
  const int64_t count = x.numel();
  // The mean over nothing is NaN (0/0), as on the CPU and in PyTorch.
  const double scale = !Mean ? 1.0 : count > 0 ? 1.0 / static_cast<double>(count) : std::nan("");
  const TensorOptions f32_on(TensorOptions(DType::f32).with_device(x.device()));
  Tensor out = empty(reduced_shape(x.sizes(), dims, a.keepdim), f32_on);
  const int dev = cuda_index(c);
  cuda::DeviceGuard g(dev);
  if (count == 0) {
    out.fill_(Mean ? std::nan("") : 0.0);
  } else {
    const Tensor xc = cuda_contiguous(x);
    Tensor acc = empty({1 + cuda::sum_squares_scratch(count)}, TensorOptions(DType::f64).with_device(x.device()));
    double* base = static_cast<double*>(acc.device_data());
    const cudaStream_t s = cuda::compute_stream(dev);
    cuda::sum(static_cast<const float*>(xc.device_data()), count, base + 1, base, s);
    cuda::f64_to_f32(base, scale, static_cast<float*>(out.device_data()), 1, s);
  }
  if (c.records()) {
    ReduceCudaSaved& sv = c.save<ReduceCudaSaved>();
    sv.in = x.sizes(), sv.scale = scale;
  }
  return {out};
}

Grads reduce_backward_cuda(const Node&, const Grads& g, const OpSaved& saved) {
  const ReduceCudaSaved& s = saved.as<ReduceCudaSaved>();
  if (g[0].dtype() != DType::f32) cuda_unsupported("sum backward", "grad is " + g[0].describe() + " (f32 only)");
  const Tensor gc = cuda_contiguous(g[0]);  // one element
  Tensor dx = empty(s.in, TensorOptions(DType::f32).with_device(gc.device()));
  const int dev = gc.device().index;
  cuda::DeviceGuard guard(dev);
  cuda::fill_rows(static_cast<const float*>(gc.device_data()), 0, s.scale, static_cast<float*>(dx.device_data()), 1,
                  dx.numel(), cuda::compute_stream(dev));
  return {dx};
}

}  // namespace

void cuda_reduction_ops(std::vector<CudaOpEntry>& out) {
  out.push_back({"sum", {reduce_cuda<false>, reduce_backward_cuda}});
  out.push_back({"mean", {reduce_cuda<true>, reduce_backward_cuda}});
}

}  // namespace athanor::detail
