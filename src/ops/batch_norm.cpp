// batch_norm over x [N, C] or [N, C, *] (viewed as [N, C, L]), per channel c.
//  training (or no running stats given): batch statistics over (N, L), the biased
//    variance for normalizing; running_mean/running_var (if given) are updated in
//    place, under NoGrad, with the unbiased variance:
//      running = (1 - momentum) * running + momentum * batch_stat    (PyTorch)
//  eval: the running statistics, which are constants for autograd.
// Forward saves the per-channel mean and rstd it used (f32; f64 for f64 inputs).
// Backward (xhat = (x - mean) * rstd, M = N * L):
//   training: dx = w * rstd * (g - mean(g) - xhat * mean(g * xhat))
//   eval:     dx = w * rstd * g
//   dw = sum g * xhat,  db = sum g        (both modes)
#include <cmath>

#include "athanor/autograd/grad_mode.h"
#include "athanor/ops/norm.h"
#include "backend/cpu/batch_norm.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {
using detail::Grads;
constexpr const char* kOp = "batch_norm";

void check_channel_vector(const Tensor& t, const char* which, int64_t C, const Tensor& x, bool same_dtype) {
  if (!t.defined()) return;
  detail::check_floating(t, kOp, which);
  if (same_dtype) detail::check_same_dtype(x, t, kOp);
  ATH_CHECK(t.dim() == 1 && t.size(0) == C, kOp, which, " must be 1-D of size C = ", C, " for input ", x.describe(),
            ", got ", t.describe(), Hint{"give the layer num_features equal to the input's channel dim (dim 1)"});
}

template <class T> const T* ptr_or_null(const Tensor& t) { return t.defined() ? static_cast<const T*>(t.raw_data()) : nullptr; }
template <class T> T* mut_or_null(const Tensor& t) { return t.defined() ? static_cast<T*>(t.raw_data()) : nullptr; }

using detail::BatchNormArgs;  // ops/op_args.h: shared with the CUDA kernel (src/ops/cuda/)
struct BatchNormSaved : OpSaved {
  SavedTensor x, w, mean, rstd;
  Shape bias_shape;
  bool batch_stats = true;
};

std::vector<Tensor> batch_norm_cpu(OpCall& c) {
  const Tensor& x = c.in(0);
  Tensor running_mean = c.in(1), running_var = c.in(2);
  const Tensor &weight = c.in(3), &bias = c.in(4);
  const auto [training, momentum, eps] = c.args<BatchNormArgs>();
  detail::check_floating(x, kOp, "x");
  ATH_CHECK(x.dim() >= 2, kOp, "expected input [N, C] or [N, C, *], got ", x.describe(),
            Hint{"add a batch dimension with unsqueeze(x, 0)"});
  const int64_t N = x.size(0), C = x.size(1), L = N * C == 0 ? 0 : x.numel() / (N * C);
  check_channel_vector(weight, "weight", C, x, true);
  check_channel_vector(bias, "bias", C, x, true);
  check_channel_vector(running_mean, "running_mean", C, x, false);
  check_channel_vector(running_var, "running_var", C, x, false);
  ATH_CHECK(running_mean.defined() == running_var.defined(), kOp,
            "running_mean and running_var must be both given or both undefined");
  const bool batch_stats = training || !running_mean.defined();
  const int64_t M = N * L;  // values per channel
  ATH_CHECK(!batch_stats || M > 1 || x.numel() == 0, kOp, "expected more than 1 value per channel when training, got input ",
            x.describe(), Hint{"use a batch size > 1, or eval mode (running statistics)"});

  const DType sdt = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor xc = detail::contiguous_raw(x);
  const Tensor wc = weight.defined() ? detail::contiguous_raw(weight) : Tensor();
  const Tensor bc = bias.defined() ? detail::contiguous_raw(bias) : Tensor();
  Tensor mean = empty({C}, TensorOptions(sdt)), rstd = empty({C}, TensorOptions(sdt));
  Tensor y = empty(x.sizes(), TensorOptions(x.dtype()));

  if (batch_stats) {
    Tensor var = empty({C}, TensorOptions(sdt));
    if (M > 0) {
      dispatch(x.dtype(), [&]<class T>() {
        if constexpr (is_float_type_v<T>) {
          using S = cpu::norm_stat_t<T>;
          cpu::batch_norm_stats<T>(static_cast<const T*>(xc.raw_data()), static_cast<S*>(mean.raw_data()),
                                   static_cast<S*>(var.raw_data()), N, C, L);
        }
      });
    } else {
      mean.fill_(NAN);
      var.fill_(NAN);
    }
    const std::vector<double> mv = mean.to_vector(), vv = var.to_vector();
    std::vector<double> rs(C);
    for (int64_t c = 0; c < C; ++c) rs[c] = 1.0 / std::sqrt(vv[c] + eps);
    copy_into(rstd, from_vector(rs, {C}, TensorOptions(DType::f64)));
    if (training && running_mean.defined() && M > 0) {
      NoGradGuard no_grad;
      std::vector<double> rm = running_mean.to_vector(), rv = running_var.to_vector();
      const double bessel = static_cast<double>(M) / static_cast<double>(M - 1);
      for (int64_t c = 0; c < C; ++c) {
        rm[c] = (1.0 - momentum) * rm[c] + momentum * mv[c];
        rv[c] = (1.0 - momentum) * rv[c] + momentum * vv[c] * bessel;  // unbiased variance
      }
      running_mean.copy_(from_vector(rm, {C}, TensorOptions(DType::f64)));  // converts dtype, bumps the version
      running_var.copy_(from_vector(rv, {C}, TensorOptions(DType::f64)));
    }
  } else {
    copy_into(mean, running_mean);
    std::vector<double> rv = running_var.to_vector();
    for (double& v : rv) v = 1.0 / std::sqrt(v + eps);
    copy_into(rstd, from_vector(rv, {C}, TensorOptions(DType::f64)));
  }

  if (x.numel() > 0) {
    dispatch(x.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        using S = cpu::norm_stat_t<T>;
        cpu::batch_norm_forward<T>(static_cast<const T*>(xc.raw_data()), static_cast<const S*>(mean.raw_data()),
                                   static_cast<const S*>(rstd.raw_data()), ptr_or_null<T>(wc), ptr_or_null<T>(bc),
                                   static_cast<T*>(y.raw_data()), N, C, L);
      }
    });
  }
  if (c.records()) {
    BatchNormSaved& s = c.save<BatchNormSaved>();
    s.x = save(x, "input"), s.w = weight.defined() ? save(weight, "weight") : SavedTensor();
    s.mean = save(mean, "mean"), s.rstd = save(rstd, "rstd");
    s.bias_shape = bias.defined() ? bias.sizes() : Shape{};
    s.batch_stats = batch_stats;
  }
  return {y};
}

Grads batch_norm_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const BatchNormSaved& s = saved.as<BatchNormSaved>();
  const Tensor xv = detail::contiguous_raw(s.x.unpack(n));
  const Tensor wv = s.w.defined() ? detail::contiguous_raw(s.w.unpack(n)) : Tensor();
  const Tensor gy = detail::to_raw(g[0], xv.dtype());
  const Tensor mv = s.mean.unpack(n), rv = s.rstd.unpack(n);
  const int64_t N = xv.size(0), C = xv.size(1), L = N * C == 0 ? 0 : xv.numel() / (N * C);
  Tensor dx = needs_grad(n, 0) ? empty(xv.sizes(), TensorOptions(xv.dtype())) : Tensor();
  Tensor dw = wv.defined() && needs_grad(n, 3) ? zeros(wv.sizes(), TensorOptions(wv.dtype())) : Tensor();
  Tensor db = needs_grad(n, 4) ? zeros(s.bias_shape, TensorOptions(xv.dtype())) : Tensor();
  if (xv.numel() > 0) {
    dispatch(xv.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        using S = cpu::norm_stat_t<T>;
        cpu::batch_norm_backward<T>(static_cast<const T*>(gy.raw_data()), static_cast<const T*>(xv.raw_data()),
                                    static_cast<const S*>(mv.raw_data()), static_cast<const S*>(rv.raw_data()),
                                    ptr_or_null<T>(wv), mut_or_null<T>(dx), mut_or_null<T>(dw), mut_or_null<T>(db), N, C, L,
                                    s.batch_stats);
      }
    });
  }
  return {dx, Tensor(), Tensor(), dw, db};  // the running statistics are constants
}

// The reference in double: batch statistics (biased variance) or the running ones, then
// (x - mean) rstd w + b per channel. The running statistics are not updated.
std::vector<Tensor> batch_norm_reference(OpCall& c) {
  const BatchNormArgs& a = c.args<BatchNormArgs>();
  const Tensor x = detail::ref64(c.in(0)).contiguous();
  const Tensor w = c.in(3).defined() ? detail::ref64(c.in(3)).contiguous() : Tensor();
  const Tensor b = c.in(4).defined() ? detail::ref64(c.in(4)).contiguous() : Tensor();
  const int64_t N = x.size(0), C = x.size(1), L = N * C == 0 ? 0 : x.numel() / (N * C);
  std::vector<double> mean(static_cast<size_t>(C)), var(static_cast<size_t>(C)), rstd(static_cast<size_t>(C));
  if (a.training || !c.in(1).defined()) {
    cpu::ref::batch_norm_stats<double>(x.data_ptr<double>(), mean.data(), var.data(), N, C, L);
  } else {
    mean = c.in(1).to_vector();
    var = c.in(2).to_vector();
  }
  for (int64_t k = 0; k < C; ++k) rstd[k] = 1.0 / std::sqrt(var[k] + a.eps);
  Tensor y = empty(x.sizes(), TensorOptions(DType::f64));
  cpu::ref::batch_norm_forward<double>(x.data_ptr<double>(), mean.data(), rstd.data(), ptr_or_null<double>(w),
                                       ptr_or_null<double>(b), y.data_ptr<double>(), N, C, L);
  return {y};
}

std::vector<OpCase> batch_norm_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const detail::Inputs& t, const BatchNormArgs& a) {
    return detail::Inputs{batch_norm(t[0], t[1], t[2], t[3], t[4], a.training, a.momentum, a.eps)};
  };
  auto stats = [](int64_t C, uint64_t seed) {
    return std::pair{case_fixed(case_randn({C}, seed).value), case_fixed(case_uniform({C}, 0.5, 2, seed + 1).value)};
  };
  const auto [m3, v3] = stats(3, 10);
  const auto [m2, v2] = stats(2, 20);
  return {
      make_case<BatchNormArgs>("training, x [4, 3], running stats, weight, bias",
                               {case_randn({4 * s, 3}, 1), m3, v3, case_randn({3}, 2), case_randn({3}, 3)}, {true, 0.1, 1e-5}, call),
      make_case<BatchNormArgs>("training, x [2, 3, 5] transposed, no running stats, no weight",
                               {case_randn({2 * s, 3, 5}, 4, CaseLayout::transposed), case_none(), case_none(), case_none(),
                                case_randn({3}, 5)},
                               {true, 0.1, 1e-5}, call),
      make_case<BatchNormArgs>("eval, x [3, 2, 4] strided, running stats, weight, bias",
                               {case_randn({3 * s, 2, 4}, 6, CaseLayout::strided), m2, v2, case_randn({2}, 7), case_randn({2}, 8)},
                               {false, 0.1, 1e-5}, call),
  };
}
}  // namespace

namespace ops {
const OpDef& batch_norm_op() {
  // The running statistics are updated in place: they reach the kernel as they are, never as
  // an autocast copy (reads_lowp bits 1 and 2).
  static const OpDef d{.name = "batch_norm", .inputs = {"x", "running_mean", "running_var", "weight", "bias"},
                       .category = AutocastCategory::f32, .reads_lowp = 0b110u,
                       .kernels = detail::cpu_kernels(batch_norm_cpu, batch_norm_backward), .reference = batch_norm_reference,
                       .dtypes = detail::kFloatDTypes, .cases = batch_norm_cases,
                       .derivative = "w rstd (g - mean(g) - xhat mean(g xhat)); eval: w rstd g", .file = "src/ops/batch_norm.cpp"};
  return d;
}
}  // namespace ops

Tensor batch_norm(const Tensor& x, Tensor running_mean, Tensor running_var, const Tensor& weight, const Tensor& bias,
                  bool training, double momentum, double eps) {
  return call_op(ops::batch_norm_op(), {x, running_mean, running_var, weight, bias}, BatchNormArgs{training, momentum, eps});
}

}  // namespace athanor
