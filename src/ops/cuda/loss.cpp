// CUDA kernel of cross_entropy (logits [N, C] or [C] in f32, bf16 or f16;
// src/backend/cuda/kernels.h): the fused log-softmax + NLL of the CPU op
// (src/ops/cross_entropy.cpp), same semantics: ignore_index, label smoothing, reductions
// none / sum / mean (mean over the non-ignored targets; NaN when all are ignored).
// Forward keeps the logits and two f32 numbers per row (max, log-sum-exp); the per-row losses
// and the count of counted rows are summed in f64 in a fixed order on the device (cuda::sum),
// and the mean divides there, so nothing leaves the device.
// No host sync: the targets are validated by a kernel (backend/cuda/loss_targets.h). An id
// out of range is recorded there and raised as an Error naming it and its position at the
// next read from the device (the loss's read-back, so the run cannot go on unnoticed), its
// row left out rather than read out of bounds. Under anomaly mode (the debugging mode) the
// call itself syncs and raises, as the CPU does. A sync per step to validate N ids would
// stall the pipeline of queued kernels, which is the GPU's speed.
// Backward: dlogits = (softmax - (1 - eps) onehot(t) - eps / C) times the upstream gradient
// per row, read on the device (g / count for mean, g for sum, g[n] for none), in one pass.
// 16-bit logits (autocast's lm_head output) are read in place, math in f32, and the gradient
// is written in their dtype: no f32 copy of the logits is made or kept. f64 logits: the math,
// the row statistics, the losses and the result in f64 (the gradchecks' path).
// The fused classifier (issue 22): the forward reads each row of logits once (an online
// softmax), and the backward writes the gradient over the saved logits, so the step never
// holds a second [N, C] buffer (N C times the dtype's size less at the step's peak, the start
// of backward; bench/RESULTS.md, GPU section, for GPT-2's). It does so only when nothing else
// can see the logits: the forward saves its own alias of them, and at backward that alias
// must be the storage's only holder (the model dropped its logits: GPT::loss does), the
// backward must not keep the graph (retain_graph would read the logits again), and
// cuda::fused_classifier_enabled(); otherwise the gradient goes to a new buffer, as before.
// The write bumps the storage's version, so a stale read of the logits raises.
//
// mse_loss (input, target of one shape and dtype: f32, bf16, f16; f64 with its difference and
// squares in f64, the pointwise kernel's f64 path), composed from the pointwise
// kernel and the deterministic sum (ops/cuda/device_ops.h), with the CPU op's roundings
// (src/backend/cpu/cross_entropy.cpp, math in f32): d = a - b in f32 (inputs read in place at
// their strides); none: d^2 rounded once into the dtype; sum / mean: d^2 in f32 summed in f64
// (times 1 / n for mean) and rounded once into the dtype; n = 0 gives 0 (sum) or NaN (mean).
// Backward: da = (2 scale d) g rounded once into the dtype (scale = 1 / n for mean, else 1;
// g a 0-d upstream gradient for sum / mean, broadcast), db = -da.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "athanor/autograd/anomaly.h"
#include "athanor/autograd/function.h"
#include "athanor/autograd/retain_graph.h"
#include "athanor/ops/loss.h"
#include "backend/cuda/candidates.h"
#include "backend/cuda/cross_entropy_vec.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/loss_targets.h"
#include "backend/cuda/runtime.h"
#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_ops.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor::detail {
namespace {

struct CrossEntropyCudaSaved : OpSaved {
  SavedTensor logits, stats, targets, count;  // logits contiguous (their dtype), stats [N, 2] f32 (f64 for f64 logits),
                                              // targets i64, count f64 [0]
  int64_t N = 0, C = 0, ignore_index = -100;
  double label_smoothing = 0;
  Reduction reduction = Reduction::mean;
};

// The vectorized kernels (a candidate: cross_entropy_vec.h) where they take the rows.
bool vectorized_ce(const void* logits, DType dtype, int64_t C, const void* dlogits) {
  return cuda::candidate_enabled(cuda::Candidate::cross_entropy_vectorized) &&
         cuda::cross_entropy_vectorized_supported(logits, dtype, C, dlogits);
}

std::vector<Tensor> cross_entropy_cuda(OpCall& c) {
  const char* op = "cross_entropy";
  const Tensor &logits = c.in(0), &target = c.in(1);
  const auto [ignore_index, label_smoothing, reduction] = c.args<CrossEntropyArgs>();
  const auto [N, C] = check_cross_entropy_args(logits, target, label_smoothing, op);
  const bool batched = logits.dim() == 2;
  check_cuda_dtype_or_f64(op, logits, "logits");
  const bool f64 = logits.dtype() == DType::f64;  // stats, losses and the result in f64

  const Device dev_of = logits.device();
  const int dev = cuda_index(c);
  const TensorOptions f32_on(TensorOptions(DType::f32).with_device(dev_of));
  cuda::DeviceGuard g(dev);
  const cudaStream_t s = cuda::compute_stream(dev);
  // The validated ids as i64 (the backward's private copy: an in-place edit of target after
  // forward cannot change backward) and each row's weight (1 counted, 0 ignored).
  const Tensor tc = cuda_contiguous(target);
  Tensor ids = empty({N}, TensorOptions(DType::i64).with_device(dev_of)), weight = empty({N}, f32_on);
  cuda::prepare_targets(tc.device_data(), tc.dtype(), N, C, ignore_index, static_cast<int64_t*>(ids.device_data()),
                        static_cast<float*>(weight.device_data()), cuda::device_error_record(dev), s);
  if (anomaly_mode_enabled()) cuda::check_device_errors_now(dev);  // the debugging mode: raised at the call, as on the CPU
  const Tensor lc = cuda_contiguous(logits);  // read in place in its dtype (f32 math in the kernel)
  const TensorOptions stat_on = f64 ? TensorOptions(DType::f64).with_device(dev_of) : f32_on;
  Tensor stats = empty({N, 2}, stat_on), rows = empty({N}, stat_on);
  if (C > 0 && N > 0 && f64)
    cuda::cross_entropy_forward_f64(static_cast<const double*>(lc.device_data()),
                                    static_cast<const int64_t*>(ids.device_data()), static_cast<double*>(stats.device_data()),
                                    static_cast<double*>(rows.device_data()), N, C, ignore_index, label_smoothing, s);
  else if (C > 0 && N > 0 && vectorized_ce(lc.device_data(), lc.dtype(), C, nullptr))
    cuda::cross_entropy_forward_vectorized(lc.device_data(), lc.dtype(), static_cast<const int64_t*>(ids.device_data()),
                                           static_cast<float*>(stats.device_data()), static_cast<float*>(rows.device_data()),
                                           N, C, ignore_index, label_smoothing, s);
  else if (C > 0 && N > 0)
    cuda::cross_entropy_forward(lc.device_data(), lc.dtype(), static_cast<const int64_t*>(ids.device_data()),
                                static_cast<float*>(stats.device_data()), static_cast<float*>(rows.device_data()), N, C,
                                ignore_index, label_smoothing, s);
  else
    rows.zero_();
  // acc[0] = count = Σ weight, acc[1] = Σ rows (f64, the fixed order of cuda::sum), then scratch.
  const int64_t scratch = cuda::sum_squares_scratch(std::max<int64_t>(N, 1));
  Tensor acc = empty({2 + scratch}, TensorOptions(DType::f64).with_device(dev_of));
  double* base = static_cast<double*>(acc.device_data());
  Tensor row_sum;  // f64 rows: their sum (reduce.h's fixed order), read by loss_reduce
  if (N > 0) {
    cuda::sum(static_cast<const float*>(weight.device_data()), N, base + 2, base, s);
    if (reduction != Reduction::none && f64) row_sum = cuda_sum_dims(rows, {0}, false, 1.0, DType::f64);
    else if (reduction != Reduction::none) cuda::sum(static_cast<const float*>(rows.device_data()), N, base + 2, base + 1, s);
  } else {
    acc.zero_();
  }
  Tensor out;
  if (reduction == Reduction::none) {
    out = batched ? rows : rows.view({});
  } else if (f64) {
    out = empty({}, stat_on);
    const double* total = row_sum.defined() ? static_cast<const double*>(row_sum.device_data()) : base + 1;
    cuda::loss_reduce(total, base, reduction == Reduction::mean, static_cast<double*>(out.device_data()), s);
  } else {
    out = empty({}, f32_on);
    cuda::loss_reduce(base + 1, base, reduction == Reduction::mean, static_cast<float*>(out.device_data()), s);
  }
  if (c.records()) {
    CrossEntropyCudaSaved& sv = c.save<CrossEntropyCudaSaved>();
    // An alias (the same storage, its own handle): at backward, a storage held by this alias
    // alone is the fused classifier's licence to write the gradient over it.
    sv.logits = save(lc.detach(), "logits"), sv.stats = save(stats, "row_stats");
    sv.targets = save(ids, "targets"), sv.count = save(acc, "count");
    sv.N = N, sv.C = C, sv.ignore_index = ignore_index, sv.label_smoothing = label_smoothing;
    sv.reduction = reduction;
  }
  // f32 for 16-bit logits under autocast (reads_lowp), else the logits' dtype, as on the CPU.
  const bool lowp = logits.dtype() == DType::bf16 || logits.dtype() == DType::f16;
  return {cuda_as(out, c.autocast() && lowp ? DType::f32 : logits.dtype())};
}

Grads cross_entropy_backward_cuda(const Node& nd, const Grads& g, const OpSaved& saved) {
  const CrossEntropyCudaSaved& s = saved.as<CrossEntropyCudaSaved>();
  const Tensor lc = s.logits.unpack(nd), stats = s.stats.unpack(nd), t = s.targets.unpack(nd), count = s.count.unpack(nd);
  const bool f64 = lc.dtype() == DType::f64;
  check_cuda_dtype_or_f64("cross_entropy backward", g[0], "grad");
  if (f64 && g[0].dtype() != DType::f64)
    cuda_unsupported("cross_entropy backward", "f64 logits with a grad of " + g[0].describe());
  const Tensor gc = f64 ? cuda_contiguous(g[0]) : cuda_as(g[0], DType::f32);
  // lc, the saved alias, and the storage's one holder: nobody else reads these logits again.
  const bool in_place = cuda::fused_classifier_enabled() && !backward_retains_graph() && lc.storage().use_count() == 1;
  Tensor dx = in_place ? lc : empty(lc.sizes(), TensorOptions(lc.dtype()).with_device(lc.device()));
  const int dev = lc.device().index;
  cuda::DeviceGuard guard(dev);
  const cudaStream_t cs = cuda::compute_stream(dev);
  if (s.C > 0 && s.N > 0) {
    // Each row's factor: g[n] (none), or one factor for every row, g / count (mean) or g
    // (sum), computed on the device; the kernel multiplies by it before its one rounding.
    Tensor factor = gc;
    if (f64) {
      if (s.reduction != Reduction::none) {
        factor = empty({1}, TensorOptions(DType::f64).with_device(lc.device()).with_tag(MemTag::workspace));
        cuda::loss_grad_factor(static_cast<const double*>(gc.device_data()), static_cast<const double*>(count.device_data()),
                               s.reduction == Reduction::mean, static_cast<double*>(factor.device_data()), cs);
      }
      cuda::cross_entropy_backward_f64(static_cast<const double*>(lc.device_data()),
                                       static_cast<const int64_t*>(t.device_data()),
                                       static_cast<const double*>(stats.device_data()),
                                       static_cast<const double*>(factor.device_data()), s.reduction == Reduction::none ? 1 : 0,
                                       static_cast<double*>(dx.device_data()), s.N, s.C, s.ignore_index, s.label_smoothing, cs);
    } else {
      if (s.reduction != Reduction::none) {
        factor = empty({1}, TensorOptions(DType::f32).with_device(lc.device()).with_tag(MemTag::workspace));
        cuda::loss_grad_factor(static_cast<const float*>(gc.device_data()), static_cast<const double*>(count.device_data()),
                               s.reduction == Reduction::mean, static_cast<float*>(factor.device_data()), cs);
      }
      const auto run = vectorized_ce(lc.device_data(), lc.dtype(), s.C, dx.device_data())
                           ? cuda::cross_entropy_backward_vectorized
                           : cuda::cross_entropy_backward;
      run(lc.device_data(), lc.dtype(), static_cast<const int64_t*>(t.device_data()),
          static_cast<const float*>(stats.device_data()), static_cast<const float*>(factor.device_data()),
          s.reduction == Reduction::none ? 1 : 0, dx.device_data(), s.N, s.C, s.ignore_index, s.label_smoothing, cs);
    }
  }
  if (in_place) dx.bump_version();  // the logits are gone: a stale unpack of them raises
  return {dx, Tensor()};  // targets are class ids: no gradient
}

struct MseCudaSaved : OpSaved {
  SavedTensor input, target;
  Reduction reduction = Reduction::mean;
};

std::vector<Tensor> mse_loss_cuda(OpCall& c) {
  const char* op = "mse_loss";
  const Tensor &input = c.in(0), &target = c.in(1);
  const Reduction reduction = c.args<MseArgs>().reduction;
  check_mse_args(input, target, op);
  check_cuda_dtype_or_f64(op, input, "input");
  check_cuda_dtype_or_f64(op, target, "target");
  const DType dt = input.dtype();
  const DType acc = dt == DType::f64 ? DType::f64 : DType::f32;  // the difference's and squares' dtype
  const int64_t n = input.numel();
  const Shape& shape = input.sizes();
  Tensor out;
  if (reduction != Reduction::none && n == 0) {
    out = full({}, reduction == Reduction::mean ? std::numeric_limits<double>::quiet_NaN() : 0.0,
               TensorOptions(dt).with_device(input.device()));
  } else {
    const Tensor d = cuda_pointwise(cuda::PointwiseOp::sub, {input, target}, shape, acc);
    if (reduction == Reduction::none) {
      out = cuda_pointwise(cuda::PointwiseOp::mul, {d, d}, shape, dt);
    } else {
      const Tensor sq2 = cuda_pointwise(cuda::PointwiseOp::mul, {d, d}, shape, acc);
      const Tensor sq = make_view(sq2, {n}, {1}, sq2.storage_offset());  // contiguous: one dim to sum
      const double scale = reduction == Reduction::mean ? 1.0 / static_cast<double>(n) : 1.0;
      out = cuda_sum_dims(sq, {0}, false, scale, dt);
    }
  }
  if (c.records()) {
    MseCudaSaved& s = c.save<MseCudaSaved>();
    s.input = save(input, "input"), s.target = save(target, "target"), s.reduction = reduction;
  }
  return {out};
}

Grads mse_loss_backward_cuda(const Node& nd, const Grads& g, const OpSaved& saved) {
  const MseCudaSaved& s = saved.as<MseCudaSaved>();
  const Tensor a = s.input.unpack(nd), b = s.target.unpack(nd);
  check_cuda_dtype_or_f64("mse_loss backward", g[0], "grad");
  const int64_t n = a.numel();
  const bool f64 = a.dtype() == DType::f64;
  const DType acc = f64 ? DType::f64 : DType::f32;
  Tensor da, db;
  if (n == 0) {
    if (needs_grad(nd, 0)) da = empty(a.sizes(), TensorOptions(a.dtype()).with_device(a.device()));
    if (needs_grad(nd, 1)) db = empty(b.sizes(), TensorOptions(b.dtype()).with_device(b.device()));
    return {da, db};
  }
  const double scale = s.reduction == Reduction::mean ? 1.0 / static_cast<double>(n) : 1.0;
  // k d with k = 2 scale as an f32 number, then times g: the CPU's (k (a - b)) g in f32 (f64
  // throughout, k exact, for f64 inputs).
  const double k = f64 ? 2.0 * scale : static_cast<float>(2.0 * scale);
  const Tensor d = cuda_pointwise(cuda::PointwiseOp::sub, {a, b}, a.sizes(), acc);
  const Tensor kd = cuda_pointwise(cuda::PointwiseOp::scale, {d}, a.sizes(), acc, k);
  const Tensor v = cuda_pointwise(cuda::PointwiseOp::mul, {kd, g[0]}, a.sizes(), a.dtype());  // g[0]: a's shape or 0-d
  if (needs_grad(nd, 0)) da = v;
  if (needs_grad(nd, 1)) db = cuda_pointwise(cuda::PointwiseOp::scale, {v}, b.sizes(), b.dtype(), -1.0f);  // exact
  return {da, db};
}

}  // namespace

void cuda_loss_ops(std::vector<CudaOpEntry>& out) {
  out.push_back({"cross_entropy", {cross_entropy_cuda, cross_entropy_backward_cuda}});
  out.push_back({"mse_loss", {mse_loss_cuda, mse_loss_backward_cuda}});
}

}  // namespace athanor::detail
