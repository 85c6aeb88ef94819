// Dynamic loss scaling. See include/athanor/amp/grad_scaler.h.
#include "athanor/amp/grad_scaler.h"

#include <algorithm>
#include <cmath>

#include "athanor/autograd/function.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/core/convert.h"
#include "athanor/core/error.h"
#include "athanor/ops/elementwise.h"

namespace athanor {
namespace {

// g /= s in place over a contiguous or strided gradient; returns true if any
// element is non-finite (checked on the unscaled value, which is non-finite iff
// the scaled one was, as s is finite and > 0).
bool unscale_inplace(Tensor& g, double inv) {
  bool bad = false;
  const Tensor gc = g.is_contiguous() ? g : g.contiguous();
  const int64_t n = gc.numel();
  dispatch(gc.dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, double>) {
      double* p = static_cast<double*>(gc.raw_data());
      for (int64_t i = 0; i < n; ++i) {
        p[i] *= inv;
        bad |= !std::isfinite(p[i]);
      }
    } else if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
      T* p = static_cast<T*>(gc.raw_data());
      const float f = static_cast<float>(inv);
      bool b = false;
#pragma omp parallel for reduction(|| : b) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) {
        const float v = static_cast<float>(p[i]) * f;
        p[i] = T(v);
        b = b || !std::isfinite(v);
      }
      bad = b;
    }
  });
  if (!gc.is_same(g)) g.copy_(gc);
  g.bump_version();
  return bad;
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions opts) : opts_(opts), scale_(opts.init_scale) {
  ATH_CHECK(opts_.init_scale > 0 && std::isfinite(opts_.init_scale), "GradScaler", "init_scale must be finite and > 0, got ",
            opts_.init_scale);
  ATH_CHECK(opts_.growth_factor > 1.0, "GradScaler", "growth_factor must be > 1, got ", opts_.growth_factor);
  ATH_CHECK(opts_.backoff_factor > 0.0 && opts_.backoff_factor < 1.0, "GradScaler", "backoff_factor must be in (0, 1), got ",
            opts_.backoff_factor);
  ATH_CHECK(opts_.growth_interval >= 1, "GradScaler", "growth_interval must be >= 1, got ", opts_.growth_interval);
}

Tensor GradScaler::scale(const Tensor& loss) {
  ATH_CHECK(loss.defined(), "GradScaler.scale", "loss is undefined");
  loss_nonfinite_ = !all_finite(loss);
  if (!opts_.enabled) return loss;
  return mul(loss, scale_);
}

bool GradScaler::unscale(const NamedTensors& named_params) {
  ATH_CHECK(!unscaled_, "GradScaler.unscale", "unscale() was already called since the last update()",
            Hint{"call unscale() once per optimizer step (before clipping), then update(found_inf)"});
  unscaled_ = true;
  nonfinite_params_.clear();
  const double inv = opts_.enabled ? 1.0 / scale_ : 1.0;
  NoGradGuard no_grad;
  for (const auto& [name, p] : named_params) {
    if (!p.defined()) continue;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (unscale_inplace(g, inv)) nonfinite_params_.push_back(name);
  }
  return !nonfinite_params_.empty();
}

bool GradScaler::unscale(const std::vector<Tensor>& params) {
  NamedTensors named;
  named.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i)
    named.emplace_back(params[i].defined() && !params[i].name().empty() ? params[i].name() : "param." + std::to_string(i),
                       params[i]);
  return unscale(named);
}

void GradScaler::update(bool found_inf) {
  unscaled_ = false;
  last_step_skipped_ = found_inf;
  if (found_inf) ++skipped_steps_;
  if (!opts_.enabled) return;
  if (found_inf) {
    scale_ = std::max(scale_ * opts_.backoff_factor, opts_.min_scale);
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= opts_.growth_interval) {
    scale_ = std::min(scale_ * opts_.growth_factor, opts_.max_scale);
    growth_tracker_ = 0;
  }
}

GradScaler::NamedTensors GradScaler::state_dict() const {
  return {{"scale", scalar_tensor(scale_, DType::f64)},
          {"growth_tracker", scalar_tensor(static_cast<double>(growth_tracker_), DType::f64)}};
}

void GradScaler::load_state_dict(const NamedTensors& state) {
  bool have_scale = false, have_tracker = false;
  for (const auto& [k, v] : state) {
    if (k == "scale") scale_ = v.item<double>(), have_scale = true;
    else if (k == "growth_tracker") growth_tracker_ = static_cast<int64_t>(v.item<double>()), have_tracker = true;
    else ATH_CHECK(false, "GradScaler.load_state_dict", "unexpected key '", k, "'", Hint{"expected 'scale' and 'growth_tracker'"});
  }
  ATH_CHECK(have_scale && have_tracker, "GradScaler.load_state_dict", "missing ", !have_scale ? "'scale'" : "'growth_tracker'");
  ATH_CHECK(scale_ > 0 && std::isfinite(scale_), "GradScaler.load_state_dict", "scale must be finite and > 0, got ", scale_);
  unscaled_ = false;
}

}  // namespace athanor
