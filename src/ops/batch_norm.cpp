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
#include "ops/op_utils.h"

namespace athanor {
namespace {
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
}  // namespace

Tensor batch_norm(const Tensor& x, Tensor running_mean, Tensor running_var, const Tensor& weight, const Tensor& bias,
                  bool training, double momentum, double eps) {
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
  if (!any_requires_grad({x, weight, bias})) return y;

  SavedTensor sx = save(x, "input"), sw = weight.defined() ? save(weight, "weight") : SavedTensor();
  SavedTensor smean = save(mean, "mean"), srstd = save(rstd, "rstd");
  const Shape bias_shape = bias.defined() ? bias.sizes() : Shape{};
  return record(kOp, {x, weight, bias}, y, [=](const Node& n, const Grads& g) {
    const Tensor xv = detail::contiguous_raw(sx.unpack(n));
    const Tensor wv = sw.defined() ? detail::contiguous_raw(sw.unpack(n)) : Tensor();
    const Tensor gy = detail::to_raw(g[0], xv.dtype());
    const Tensor mv = smean.unpack(n), rv = srstd.unpack(n);
    Tensor dx = needs_grad(n, 0) ? empty(xv.sizes(), TensorOptions(xv.dtype())) : Tensor();
    Tensor dw = wv.defined() && needs_grad(n, 1) ? zeros(wv.sizes(), TensorOptions(wv.dtype())) : Tensor();
    Tensor db = needs_grad(n, 2) ? zeros(bias_shape, TensorOptions(xv.dtype())) : Tensor();
    if (xv.numel() > 0) {
      dispatch(xv.dtype(), [&]<class T>() {
        if constexpr (is_float_type_v<T>) {
          using S = cpu::norm_stat_t<T>;
          cpu::batch_norm_backward<T>(static_cast<const T*>(gy.raw_data()), static_cast<const T*>(xv.raw_data()),
                                      static_cast<const S*>(mv.raw_data()), static_cast<const S*>(rv.raw_data()),
                                      ptr_or_null<T>(wv), mut_or_null<T>(dx), mut_or_null<T>(dw), mut_or_null<T>(db), N,
                                      C, L, batch_stats);
        }
      });
    }
    return Grads{dx, dw, db};
  });
}

}  // namespace athanor
