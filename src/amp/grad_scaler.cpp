// Dynamic loss scaling. See include/athanor/amp/grad_scaler.h.
#include "athanor/amp/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "athanor/autograd/function.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/core/convert.h"
#include "athanor/core/error.h"
#include "athanor/ops/elementwise.h"
#include "amp/grad_scaler_device.h"

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
  if (!loss.device().is_cpu()) {  // checked when asked (loss_nonfinite()), not now: no host read
    pending_loss_ = loss.detach();
    if (!opts_.enabled) return loss;
    return mul(loss, scale_tensor(loss.device()));
  }
  loss_nonfinite_ = !all_finite(loss);
  if (!opts_.enabled) return loss;
  return mul(loss, get_scale());
}

Tensor GradScaler::scale_tensor(Device device) {
  if (!dev_scale_.defined()) {
    dev_scale_ = full({}, scale_, TensorOptions(DType::f32).with_device(device));
    dev_counters_ = from_vector(std::vector<double>{static_cast<double>(growth_tracker_), static_cast<double>(skipped_steps_)},
                                {2}, TensorOptions(DType::f64))
                        .to(device);
  }
  ATH_CHECK(dev_scale_.device() == device, "GradScaler", "the scale lives on ", dev_scale_.device().str(),
            " but this call is on ", device.str(), Hint{"use one GradScaler per device"});
  return dev_scale_;
}

void GradScaler::sync_from_device() const {
  if (dev_scale_.defined()) {
    scale_ = dev_scale_.item<double>();
    const std::vector<double> c = dev_counters_.cpu().to_vector();
    growth_tracker_ = static_cast<int64_t>(c[0]);
    skipped_steps_ = static_cast<int64_t>(c[1]);
  }
  if (pending_loss_.defined()) {
    // The loss scale() kept lives on the device: all_finite reads host memory, so it reads a
    // host copy (this is the sync the caller asked for).
    loss_nonfinite_ = !all_finite(pending_loss_.cpu());
    pending_loss_ = Tensor();
  }
  if (pending_found_.defined()) {
    last_step_skipped_ = pending_found_.item<double>() != 0.0;
    pending_found_ = Tensor();
  }
  if (pending_flags_.defined()) {
    const std::vector<double> f = pending_flags_.cpu().to_vector();
    for (std::size_t i = 0; i < f.size(); ++i)
      if (f[i] != 0.0) nonfinite_params_.push_back(pending_names_[i]);
    pending_flags_ = Tensor();
    pending_names_.clear();
  }
}

double GradScaler::get_scale() const {
  if (!opts_.enabled) return 1.0;
  sync_from_device();
  return scale_;
}
int64_t GradScaler::growth_tracker() const {
  sync_from_device();
  return growth_tracker_;
}
const std::vector<std::string>& GradScaler::nonfinite_params() const {
  sync_from_device();
  return nonfinite_params_;
}
bool GradScaler::loss_nonfinite() const {
  sync_from_device();
  return loss_nonfinite_;
}
bool GradScaler::last_step_skipped() const {
  sync_from_device();
  return last_step_skipped_;
}
int64_t GradScaler::skipped_steps() const {
  sync_from_device();
  return skipped_steps_;
}

// Counts a call made from outside (the forms call each other: only the outermost counts).
struct GradScaler::Entry {
  GradScaler& s;
  Entry(GradScaler& scaler, int64_t GradScalerCalls::*which) : s(scaler) {
    if (s.depth_++ == 0) ++(s.calls_.*which);
  }
  ~Entry() { --s.depth_; }
};

Tensor GradScaler::unscale_async(const NamedTensors& named_params) {
  const Entry entry(*this, &GradScalerCalls::unscale_async);
  ATH_CHECK(!unscaled_, "GradScaler.unscale", "unscale() was already called since the last update()",
            Hint{"call unscale() once per optimizer step (before clipping), then update(found_inf)"});
  // The CUDA gradients go to one multi-tensor kernel; CPU ones (if any) through the host path.
  NamedTensors host;
  std::vector<Tensor> dev_grads;
  std::vector<std::string> dev_names;
  std::optional<Device> dev;
  for (const auto& [name, p] : named_params) {
    if (!p.defined() || !p.grad().defined()) continue;
    Tensor g = p.grad();
    if (g.device().is_cpu()) {
      host.emplace_back(name, p);
      continue;
    }
    ATH_CHECK(!dev || *dev == g.device(), "GradScaler.unscale", "gradients on ", dev->str(), " and ", g.device().str(),
              " (", name, ")", Hint{"use one GradScaler per device"});
    ATH_CHECK(g.is_contiguous(), "GradScaler.unscale", "the gradient of ", name, " (", g.describe(), ") is not contiguous",
              Hint{"gradients are made contiguous by the engine; a hook that replaced one must keep it contiguous"});
    dev = g.device();
    dev_grads.push_back(g), dev_names.push_back(name);
  }
  if (!dev) return scalar_tensor(unscale(named_params) ? 1.0 : 0.0, TensorOptions(DType::f32));
  const bool host_bad = !host.empty() && unscale(host);  // sets unscaled_ and the host names
  unscaled_ = true;
  if (host.empty()) nonfinite_params_.clear();
  Tensor found = zeros({}, TensorOptions(DType::f32).with_device(*dev));
  Tensor flags = zeros({static_cast<int64_t>(dev_grads.size())}, TensorOptions(DType::i32).with_device(*dev));
  detail::unscale_on_device(dev_grads, opts_.enabled ? scale_tensor(*dev) : Tensor(), found, flags);
  for (Tensor& g : dev_grads) g.bump_version();
  if (host_bad) found.fill_(1.0);
  pending_flags_ = flags, pending_names_ = std::move(dev_names);
  return found;
}

bool GradScaler::unscale(const NamedTensors& named_params) {
  const Entry entry(*this, &GradScalerCalls::unscale);
  for (const auto& [name, p] : named_params)  // CUDA gradients: the device path, then its flag read here
    if (p.defined() && p.grad().defined() && !p.grad().device().is_cpu()) return unscale_async(named_params).item<double>() != 0.0;
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
  const Entry entry(*this, &GradScalerCalls::unscale);
  NamedTensors named;
  named.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i)
    named.emplace_back(params[i].defined() && !params[i].name().empty() ? params[i].name() : "param." + std::to_string(i),
                       params[i]);
  return unscale(named);
}

void GradScaler::update(const Tensor& found_inf) {
  const Entry entry(*this, &GradScalerCalls::update_tensor);
  ATH_CHECK(found_inf.defined() && found_inf.numel() == 1, "GradScaler.update", "found_inf must be one element, got ",
            found_inf.defined() ? found_inf.describe() : std::string("undefined"));
  if (found_inf.device().is_cpu() && !dev_scale_.defined()) {
    update(found_inf.item<double>() != 0.0);
    return;
  }
  unscaled_ = false;
  const Device d = dev_scale_.defined() ? dev_scale_.device() : found_inf.device();
  Tensor f = found_inf.to(d).to(DType::f32).contiguous();
  detail::update_scale_on_device(scale_tensor(d), dev_counters_, f, opts_);
  pending_found_ = f;
}

void GradScaler::update(bool found_inf) {
  const Entry entry(*this, &GradScalerCalls::update_bool);
  if (dev_scale_.defined()) {  // the scale lives on the device: update it there
    update(full({}, found_inf ? 1.0 : 0.0, TensorOptions(DType::f32).with_device(dev_scale_.device())));
    return;
  }
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
  sync_from_device();
  return {{"scale", scalar_tensor(scale_, DType::f64)},
          {"growth_tracker", scalar_tensor(static_cast<double>(growth_tracker_), DType::f64)}};
}

void GradScaler::load_state_dict(const NamedTensors& state) {
  sync_from_device();  // the pending reads first: they belong to the steps before the load
  bool have_scale = false, have_tracker = false;
  for (const auto& [k, v] : state) {
    if (k == "scale") scale_ = v.item<double>(), have_scale = true;
    else if (k == "growth_tracker") growth_tracker_ = static_cast<int64_t>(v.item<double>()), have_tracker = true;
    else ATH_CHECK(false, "GradScaler.load_state_dict", "unexpected key '", k, "'", Hint{"expected 'scale' and 'growth_tracker'"});
  }
  ATH_CHECK(have_scale && have_tracker, "GradScaler.load_state_dict", "missing ", !have_scale ? "'scale'" : "'growth_tracker'");
  ATH_CHECK(scale_ > 0 && std::isfinite(scale_), "GradScaler.load_state_dict", "scale must be finite and > 0, got ", scale_);
  unscaled_ = false;
  if (dev_scale_.defined()) {  // the device copy takes the loaded values
    dev_scale_.fill_(scale_);
    dev_counters_.copy_(from_vector(std::vector<double>{static_cast<double>(growth_tracker_), static_cast<double>(skipped_steps_)},
                                    {2}, TensorOptions(DType::f64)));
  }
}

}  // namespace athanor
