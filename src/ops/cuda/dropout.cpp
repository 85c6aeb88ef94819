// CUDA kernel of dropout (f32, bf16, f16; the pointwise kernel's dropout op): the CPU's mask,
// drawn from the same Philox stream — element i kept iff (philox4x32(seed, offset + i / 4)[i
// % 4] >> 8) >= ceil(p 2^24) — after the same gen.reserve(ceil(n / 4)), so a CPU run and a GPU
// run with one seed drop the same elements; kept elements are scaled in f32 and rounded once.
// f64: kernels.h's f64 dropout (the same stream, the scale in f64).
// Backward beside forward: the mask rebuilt from the saved (seed, offset), dx = g keep / (1 - p).
#include <cmath>

#include "athanor/autograd/function.h"
#include "athanor/ops/dropout.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_ops.h"
#include "ops/op_args.h"
#include "ops/op_def.h"

namespace athanor::detail {
namespace {

struct DropoutCudaSaved : OpSaved {
  GeneratorState st;
  uint32_t threshold = 0;
  double scale = 1.0;
  bool all_dropped = false;
};

// f64: the mask over x made contiguous (kernels.h's f64 dropout_apply: the same Philox stream,
// the scale in f64, as the CPU's f64 dropout); the pointwise kernel's dropout op otherwise.
Tensor dropout_mask(const Tensor& x, uint64_t seed, uint64_t offset, uint32_t threshold, double scale) {
  if (x.dtype() != DType::f64) return cuda_dropout_mask(x, seed, offset, threshold, scale);
  const Tensor xc = cuda_contiguous(x);
  Tensor y = empty(x.sizes(), TensorOptions(DType::f64).with_device(x.device()));
  const int dev = x.device().index;
  cuda::DeviceGuard g(dev);
  cuda::dropout_apply(static_cast<const double*>(xc.device_data()), static_cast<double*>(y.device_data()), x.numel(), seed,
                      offset, threshold, scale, cuda::compute_stream(dev));
  return y;
}

std::vector<Tensor> dropout_cuda(OpCall& c) {
  const Tensor& x = c.in(0);
  const auto [p, gen] = c.args<DropoutArgs>();
  check_cuda_dtype_or_f64("dropout", x, "x");
  const GeneratorState st = gen->reserve(static_cast<uint64_t>((x.numel() + 3) / 4));  // as the CPU: one reservation
  DropoutCudaSaved* s = c.records() ? &c.save<DropoutCudaSaved>() : nullptr;
  if (p == 1.0) {
    if (s) s->all_dropped = true;
    return {zeros(x.sizes(), TensorOptions(x.dtype()).with_device(x.device()))};
  }
  const uint32_t threshold = static_cast<uint32_t>(std::ceil(p * 16777216.0));
  const double scale = 1.0 / (1.0 - p);
  if (s) s->st = st, s->threshold = threshold, s->scale = scale;
  return {dropout_mask(x, st.seed, st.offset, threshold, scale)};
}

Grads dropout_backward_cuda(const Node&, const Grads& g, const OpSaved& saved) {
  const DropoutCudaSaved& s = saved.as<DropoutCudaSaved>();
  if (s.all_dropped) return {zeros(g[0].sizes(), TensorOptions(g[0].dtype()).with_device(g[0].device()))};
  check_cuda_dtype_or_f64("dropout backward", g[0], "grad");
  return {dropout_mask(g[0], s.st.seed, s.st.offset, s.threshold, s.scale)};
}

}  // namespace

void cuda_dropout_ops(std::vector<CudaOpEntry>& out) { out.push_back({"dropout", {dropout_cuda, dropout_backward_cuda}}); }

}  // namespace athanor::detail
