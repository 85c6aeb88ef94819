#include "athanor/observe/health.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace athanor::observe {
namespace {

struct MeanStd {
  double mean = 0, std = 0;
};
MeanStd mean_std(const std::deque<double>& v) {
  MeanStd r;
  for (double x : v) r.mean += x;
  r.mean /= static_cast<double>(v.size());
  double ss = 0;
  for (double x : v) ss += (x - r.mean) * (x - r.mean);
  r.std = std::sqrt(ss / static_cast<double>(std::max<size_t>(1, v.size() - 1)));
  return r;
}

std::string fmt(double v) {
  std::ostringstream o;
  o.precision(4);
  o << v;
  return o.str();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string join(const std::vector<std::string>& v, size_t max_items = 5) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max_items; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > max_items) s += " (+" + std::to_string(v.size() - max_items) + " more)";
  return s;
}

void push(std::deque<double>& w, double v, int64_t window) {
  if (!std::isfinite(v)) return;
  w.push_back(v);
  while (static_cast<int64_t>(w.size()) > window) w.pop_front();
}

const std::vector<std::string> kInstabilityFixes = {
    "lower optimizer.lr (e.g. divide by 3-10)", "add or lengthen schedule.warmup_steps",
    "enable gradient clipping (optimizer.grad_clip: 1.0) or lower it",
    "check the batch at this step for bad or unusual samples"};

}  // namespace

HealthMonitor::HealthMonitor(HealthOptions options) : options_(options) {}

bool HealthMonitor::cooling_down(const std::string& kind, int64_t step) const {
  auto it = last_fired_.find(kind);
  return it != last_fired_.end() && step - it->second < options_.cooldown_steps;
}

void HealthMonitor::emit(std::vector<HealthEvent>& out, HealthEvent e) {
  if (cooling_down(e.kind, e.step)) return;
  last_fired_[e.kind] = e.step;
  out.push_back(std::move(e));
}

std::vector<HealthEvent> HealthMonitor::check(const StepMetrics& m, const std::map<std::string, std::string>& context) {
  std::vector<HealthEvent> out;
  auto event = [&](const char* kind, const char* severity) {
    HealthEvent e;
    e.step = m.step;
    e.kind = kind;
    e.severity = severity;
    e.details = context;
    return e;
  };

  if (m.skipped) {
    HealthEvent e = event("skipped_step", "warning");
    e.message = "step " + std::to_string(m.step) + " was skipped: " +
                (m.loss_nonfinite ? std::string("the loss was not finite") : std::string("a gradient was not finite")) +
                (m.nonfinite_params.empty() ? "" : " (in " + join(m.nonfinite_params) + ")") + "; " +
                std::to_string(m.skipped_total) + " skipped so far";
    if (!m.nonfinite_params.empty()) e.details["nonfinite_params"] = join(m.nonfinite_params, 100);
    e.suggestions = {"an occasional skip with the f16 loss scaler is normal; many in a row are not",
                     "lower optimizer.lr or enable gradient clipping (optimizer.grad_clip: 1.0)",
                     "use trainer.precision: bf16 if training in f16"};
    emit(out, std::move(e));
  }

  const int64_t window = std::max<int64_t>(2, options_.spike_window);
  // Loss spike, against the window before this step.
  if (std::isfinite(m.loss) && static_cast<int64_t>(losses_.size()) >= options_.min_samples) {
    const MeanStd s = mean_std(losses_);
    const double sd = std::max(s.std, 0.01 * std::fabs(s.mean) + 1e-12);
    const double z = (m.loss - s.mean) / sd;
    if (z > options_.loss_spike_z) {
      HealthEvent e = event("loss_spike", "warning");
      e.message = "loss jumped to " + fmt(m.loss) + " at step " + std::to_string(m.step) + ", " + fmt(z) +
                  " standard deviations above the recent mean " + fmt(s.mean) +
                  ": the learning rate may be too high for this point of training, or the batch is unusual";
      e.details["loss"] = fmt(m.loss);
      e.details["window_mean"] = fmt(s.mean);
      e.details["z"] = fmt(z);
      e.details["lr"] = fmt(m.lr);
      e.suggestions = kInstabilityFixes;
      emit(out, std::move(e));
    }
  }
  // Gradient norm: orders of magnitude above the window = exploding, else a z-score spike.
  if (std::isfinite(m.grad_norm) && static_cast<int64_t>(grad_norms_.size()) >= options_.min_samples) {
    const MeanStd s = mean_std(grad_norms_);
    const double sd = std::max(s.std, 0.01 * std::fabs(s.mean) + 1e-12);
    const double z = (m.grad_norm - s.mean) / sd;
    if (s.mean > 0 && m.grad_norm >= options_.explode_factor * s.mean) {
      HealthEvent e = event("exploding_gradients", "error");
      e.message = "the gradient norm is " + fmt(m.grad_norm) + " at step " + std::to_string(m.step) + ", " +
                  fmt(m.grad_norm / s.mean) + "x its recent mean " + fmt(s.mean) + ": gradients are exploding";
      e.details["grad_norm"] = fmt(m.grad_norm);
      e.details["window_mean"] = fmt(s.mean);
      e.suggestions = kInstabilityFixes;
      emit(out, std::move(e));
    } else if (z > options_.grad_spike_z && m.grad_norm >= options_.grad_spike_min_ratio * s.mean &&
               !cooling_down("exploding_gradients", m.step)) {  // same story, told once
      HealthEvent e = event("grad_spike", "warning");
      e.message = "the gradient norm jumped to " + fmt(m.grad_norm) + " at step " + std::to_string(m.step) + ", " +
                  fmt(z) + " standard deviations above the recent mean " + fmt(s.mean);
      e.details["grad_norm"] = fmt(m.grad_norm);
      e.details["window_mean"] = fmt(s.mean);
      e.details["z"] = fmt(z);
      e.suggestions = kInstabilityFixes;
      emit(out, std::move(e));
    }
  }
  push(losses_, m.loss, window);
  push(grad_norms_, m.grad_norm, window);

  // Per-layer grad/param ratios: one layer far above the others, or layers far below.
  std::vector<std::pair<std::string, double>> ratios;
  for (const LayerNorms& l : m.layers)
    if (l.param_norm > 0 && std::isfinite(l.grad_norm) && std::isfinite(l.param_norm))
      ratios.emplace_back(l.name, l.grad_norm / l.param_norm);
  if (ratios.size() >= 3) {
    std::vector<std::string> high, low;
    std::vector<double> all;
    for (auto& [n, r] : ratios) all.push_back(r);
    const double med = median(all);
    for (size_t i = 0; i < ratios.size(); ++i) {
      std::vector<double> others;
      for (size_t j = 0; j < ratios.size(); ++j)
        if (j != i) others.push_back(ratios[j].second);
      const double med_others = median(others);
      if (med_others > 0 && ratios[i].second >= options_.layer_ratio_factor * med_others) high.push_back(ratios[i].first);
      else if (med > 0 && ratios[i].second <= med / options_.layer_ratio_factor) low.push_back(ratios[i].first);
    }
    if (!high.empty()) {
      HealthEvent e = event("exploding_gradients", "error");
      e.message = "layer " + join(high) + " has a gradient/parameter norm ratio over " + fmt(options_.layer_ratio_factor) +
                  "x the other layers' (median " + fmt(med) + ") at step " + std::to_string(m.step) +
                  ": its gradients are exploding";
      e.details["layers"] = join(high, 100);
      e.details["median_ratio"] = fmt(med);
      e.suggestions = {"enable gradient clipping (optimizer.grad_clip: 1.0)", "lower optimizer.lr (e.g. divide by 3-10)",
                       "check this layer's initialization and the normalization before it"};
      emit(out, std::move(e));
    }
    if (!low.empty()) {
      HealthEvent e = event("vanishing_gradients", "warning");
      e.message = "layer(s) " + join(low) + " get gradients under 1/" + fmt(options_.layer_ratio_factor) +
                  " of the other layers' (relative to their weights) at step " + std::to_string(m.step) +
                  ": they are barely learning";
      e.details["layers"] = join(low, 100);
      e.details["median_ratio"] = fmt(med);
      e.suggestions = {"check for saturated activations or dead ReLUs before these layers",
                       "check that these parameters are actually used in the forward pass",
                       "use residual connections / normalization, or a better initialization"};
      emit(out, std::move(e));
    }
  }

  // f16 loss scale: repeated halvings within the window.
  if (m.loss_scale > 0) {
    if (last_scale_ > 0 && m.loss_scale < last_scale_) scale_drop_steps_.push_back(m.step);
    last_scale_ = m.loss_scale;
    while (!scale_drop_steps_.empty() && m.step - scale_drop_steps_.front() >= window) scale_drop_steps_.pop_front();
    if (static_cast<int64_t>(scale_drop_steps_.size()) >= options_.scale_drops || m.loss_scale < 1) {
      HealthEvent e = event("scale_collapse", "warning");
      e.message = "the f16 loss scale fell to " + fmt(m.loss_scale) + " (" + std::to_string(scale_drop_steps_.size()) +
                  " drops in the last " + std::to_string(window) +
                  " steps): f16 keeps overflowing, so many steps are skipped and the gradients lose precision";
      e.details["loss_scale"] = fmt(m.loss_scale);
      e.suggestions = {"use trainer.precision: bf16 (same range as f32, no loss scaling needed)",
                       "lower optimizer.lr or enable gradient clipping (optimizer.grad_clip: 1.0)"};
      emit(out, std::move(e));
      scale_drop_steps_.clear();
    }
  }
  return out;
}

}  // namespace athanor::observe
