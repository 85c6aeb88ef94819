// CUDA kernels of sum and mean over any set of dims (src/backend/cuda/reduce.h): the sum is
// taken in f64 in a fixed order (each output's elements in chunks of a size fixed by the
// shapes, the chunks then added in order), so it is the same bits every run with no atomics,
// and mean's 1/count is applied in f64 before the one rounding, as on the CPU. x is read in
// place at its strides, in f32, bf16 or f16; the result has x's dtype, or f32 under
// autocast for a 16-bit x (the op's reads_lowp: no f32 copy of x is made); f64 x sums in f64
// into an f64 result.
// Backward beside it: dx = g scale broadcast over x's shape, in x's dtype (one pointwise
// pass; g read on the device, no host sync); f64: reduce.h's broadcast_scale, the scale in f64.
#include <cmath>
#include <string>

#include "athanor/autograd/function.h"
#include "athanor/ops/reduction.h"
#include "backend/cuda/reduce.h"
#include "backend/cuda/runtime.h"
#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_ops.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor::detail {
namespace {

struct ReduceCudaSaved : OpSaved {
  Shape in, kept;
  double scale = 1.0;
  DType x_dtype = DType::f32;
};

bool is_lowp(DType d) { return d == DType::bf16 || d == DType::f16; }

template <bool Mean> std::vector<Tensor> reduce_cuda(OpCall& c) {
  const Tensor& x = c.in(0);
  const char* op = c.name();
  const ReduceArgs& a = c.args<ReduceArgs>();
  check_floating(x, op, "x");
  check_cuda_dtype_or_f64(op, x, "x");
  const std::vector<int64_t> dims = normalize_dims(a.dims, x.dim(), op);
  int64_t count = 1;
  for (int64_t d : dims) count *= x.size(d);
  // The mean over nothing is NaN (0/0), as on the CPU and in PyTorch.
  const double scale = !Mean ? 1.0 : count > 0 ? 1.0 / static_cast<double>(count) : std::nan("");
  const DType out_dtype = c.autocast() && is_lowp(x.dtype()) ? DType::f32 : x.dtype();
  Tensor out = cuda_sum_dims(x, dims, a.keepdim, scale, out_dtype);
  if (c.records()) {
    ReduceCudaSaved& sv = c.save<ReduceCudaSaved>();
    sv.in = x.sizes(), sv.kept = reduced_shape(x.sizes(), dims, true), sv.scale = scale, sv.x_dtype = x.dtype();
  }
  return {out};
}

Grads reduce_backward_cuda(const Node&, const Grads& g, const OpSaved& saved) {
  const ReduceCudaSaved& s = saved.as<ReduceCudaSaved>();
  check_cuda_dtype_or_f64("sum backward", g[0], "grad");
  // g [kept with 1s] broadcast over x's shape: a view with the reduced dims at stride 0.
  if (s.x_dtype == DType::f64 || g[0].dtype() == DType::f64) {
    // f64: the broadcast with the scale applied in f64 (reduce.h), both sides f64.
    if (s.x_dtype != DType::f64 || g[0].dtype() != DType::f64)
      cuda_unsupported("sum backward", "a gradient of " + g[0].describe() + " for an x of " + dtype_name(s.x_dtype));
    const Tensor gc = cuda_contiguous(g[0]);
    const Shape kept_strides = contiguous_strides(s.kept);
    cuda::BroadcastArgs b;
    b.ndim = static_cast<int>(s.in.size());
    ATH_CHECK(b.ndim <= cuda::kMaxIndexDims, "sum backward", "a ", b.ndim, "-D x on cuda (at most ", cuda::kMaxIndexDims,
              " dims)", Hint{"reshape to fewer dims first"});
    for (int d = 0; d < b.ndim; ++d) b.sizes[d] = s.in[d], b.g_strides[d] = s.kept[d] == 1 ? 0 : kept_strides[d];
    Tensor dx = empty(s.in, TensorOptions(DType::f64).with_device(gc.device()));
    const int dev = gc.device().index;
    cuda::DeviceGuard guard(dev);
    cuda::broadcast_scale(static_cast<const double*>(gc.device_data()), b, s.scale, static_cast<double*>(dx.device_data()),
                          cuda::compute_stream(dev));
    return {dx};
  }
  const Tensor gc = cuda_as(g[0], g[0].dtype());
  const Tensor gk = make_view(gc, s.kept, contiguous_strides(s.kept), gc.storage_offset());
  return {cuda_pointwise(cuda::PointwiseOp::scale, {gk}, s.in, s.x_dtype, static_cast<float>(s.scale))};
}

}  // namespace

void cuda_reduction_ops(std::vector<CudaOpEntry>& out) {
  out.push_back({"sum", {reduce_cuda<false>, reduce_backward_cuda}});
  out.push_back({"mean", {reduce_cuda<true>, reduce_backward_cuda}});
}

}  // namespace athanor::detail
