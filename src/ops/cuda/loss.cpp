// CUDA kernel of cross_entropy (f32 logits [N, C] or [C]; src/backend/cuda/kernels.h): the
// fused log-softmax + NLL of the CPU op (src/ops/cross_entropy.cpp), same semantics:
// ignore_index, label smoothing, reductions none / sum / mean (mean over the non-ignored
// targets; NaN when all are ignored).
// Forward keeps the logits and two f32 numbers per row (max, log-sum-exp); the per-row losses
// are summed in f64 in a fixed order on the device (cuda::sum), so the loss never leaves the
// device. The targets are copied to the host once per call (N ids, not the logits) to be
// validated and counted, so an out-of-range id is an Error naming it and its position, as on
// the CPU, never an illegal address: that copy is the one host sync of the call.
// Backward: dlogits = (softmax - (1 - eps) onehot(t) - eps / C) / count, then times the
// upstream gradient row by row on the device (a scalar for sum/mean, g[n] for none).
// 16-bit logits (autocast's reads_lowp path): "not yet supported on cuda".
#include <cmath>
#include <limits>
#include <string>

#include "athanor/autograd/function.h"
#include "athanor/ops/loss.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "ops/cuda/cuda_kernels.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor::detail {
namespace {

struct CrossEntropyCudaSaved : OpSaved {
  SavedTensor logits, stats, targets;  // logits contiguous f32, stats [N, 2] f32, targets i64 on the device
  int64_t N = 0, C = 0, count = 0, ignore_index = -100;
  double label_smoothing = 0;
  Reduction reduction = Reduction::mean;
};

std::vector<Tensor> cross_entropy_cuda(OpCall& c) {
  const char* op = "cross_entropy";
  const Tensor &logits = c.in(0), &target = c.in(1);
  const auto [ignore_index, label_smoothing, reduction] = c.args<CrossEntropyArgs>();
  const auto [N, C] = check_cross_entropy_args(logits, target, label_smoothing, op);
  const bool batched = logits.dim() == 2;
  if (logits.dtype() != DType::f32) cuda_unsupported(op, "logits are " + logits.describe() + " (the CUDA kernel takes f32)");

  const Tensor host_t = target.cpu().to(DType::i64).contiguous();
  const int64_t* tv = host_t.data_ptr<int64_t>();
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = tv[n];
    if (t == ignore_index) continue;
    ATH_CHECK(t >= 0 && t < C, op, "target value ", t, " at position ", n, " is out of range for C = ", C,
              " classes (logits ", logits.describe(), "; valid targets are 0 to ", C - 1, ", or ignore_index = ",
              ignore_index, ")", Hint{"check the label preprocessing and that the model's output size matches the number of classes"});
    ++count;
  }
  const Device dev_of = logits.device();
  const TensorOptions f32_on(TensorOptions(DType::f32).with_device(dev_of));
  // The validated ids uploaded as i64: also the backward's private copy (an in-place edit of
  // target after forward cannot change backward).
  const Tensor tdev = host_t.to(dev_of);
  const Tensor lc = cuda_contiguous(logits);
  Tensor stats = empty({N, 2}, f32_on), rows = empty({N}, f32_on);
  const int dev = cuda_index(c);
  cuda::DeviceGuard g(dev);
  const cudaStream_t s = cuda::compute_stream(dev);
  if (C > 0 && N > 0)
    cuda::cross_entropy_forward(static_cast<const float*>(lc.device_data()), static_cast<const int64_t*>(tdev.device_data()),
                                static_cast<float*>(stats.device_data()), static_cast<float*>(rows.device_data()), N, C,
                                ignore_index, label_smoothing, s);
  else
    rows.zero_();
  Tensor out;
  if (reduction == Reduction::none) {
    out = batched ? rows : rows.view({});
  } else {
    out = empty({}, f32_on);
    const double scale = reduction == Reduction::sum ? 1.0
                         : count > 0                 ? 1.0 / static_cast<double>(count)
                                                     : std::numeric_limits<double>::quiet_NaN();
    Tensor acc = empty({1 + cuda::sum_squares_scratch(N)}, TensorOptions(DType::f64).with_device(dev_of));
    double* base = static_cast<double*>(acc.device_data());
    cuda::sum(static_cast<const float*>(rows.device_data()), N, base + 1, base, s);
    cuda::f64_to_f32(base, scale, static_cast<float*>(out.device_data()), 1, s);
  }
  if (c.records()) {
    CrossEntropyCudaSaved& sv = c.save<CrossEntropyCudaSaved>();
    sv.logits = save(lc, "logits"), sv.stats = save(stats, "row_stats");
    sv.targets = save(tdev, "targets");
    sv.N = N, sv.C = C, sv.count = count, sv.ignore_index = ignore_index, sv.label_smoothing = label_smoothing;
    sv.reduction = reduction;
  }
  return {out};
}

Grads cross_entropy_backward_cuda(const Node& nd, const Grads& g, const OpSaved& saved) {
  const CrossEntropyCudaSaved& s = saved.as<CrossEntropyCudaSaved>();
  const Tensor lc = s.logits.unpack(nd), stats = s.stats.unpack(nd), t = s.targets.unpack(nd);
  if (g[0].dtype() != DType::f32) cuda_unsupported("cross_entropy backward", "grad is " + g[0].describe() + " (f32 only)");
  const Tensor gc = cuda_contiguous(g[0]);
  Tensor dx = empty(lc.sizes(), TensorOptions(DType::f32).with_device(lc.device()));
  const int dev = lc.device().index;
  cuda::DeviceGuard guard(dev);
  const cudaStream_t cs = cuda::compute_stream(dev);
  if (s.C > 0 && s.N > 0) {
    const double scale = s.reduction == Reduction::mean ? 1.0 / static_cast<double>(s.count) : 1.0;
    cuda::cross_entropy_backward(static_cast<const float*>(lc.device_data()), static_cast<const int64_t*>(t.device_data()),
                                 static_cast<const float*>(stats.device_data()), scale,
                                 static_cast<float*>(dx.device_data()), s.N, s.C, s.ignore_index, s.label_smoothing, cs);
    cuda::mul_rows(static_cast<float*>(dx.device_data()), static_cast<const float*>(gc.device_data()),
                   s.reduction == Reduction::none ? 1 : 0, s.N, s.C, cs);
  }
  return {dx, Tensor()};  // targets are class ids: no gradient
}

}  // namespace

void cuda_loss_ops(std::vector<CudaOpEntry>& out) {
  out.push_back({"cross_entropy", {cross_entropy_cuda, cross_entropy_backward_cuda}});
}

}  // namespace athanor::detail
