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

std::string pct(double f) {
  std::ostringstream o;
  o.precision(3);
  o << 100 * f << "%";
  return o.str();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
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

// The usual remedies for instability, as they apply to this run's config.
void add_instability_remedies(HealthEvent& e, const RunSettings& s, double lr_now) {
  const double lr = lr_now > 0 ? lr_now : s.number("optimizer.lr", -1);
  if (lr > 0)
    if (auto r = remedy_set_lr(s, round_down_125(lr / 3), "a third of the lr at this step")) {
      e.suggestions.push_back(r->text);
      e.fix.insert(r->fix.begin(), r->fix.end());
    }
  if (auto r = remedy_warmup(s)) e.suggestions.push_back(r->text);
  if (auto r = remedy_clip(s)) e.suggestions.push_back(r->text);
  e.suggestions.push_back("check the batch at this step for bad or unusual samples (details: sample_ids)");
}

// Weight matrices only (biases and norm gains have their own scales); data written before
// "dim" existed (ndim 0) counts every parameter, as the check did then.
bool is_weight(const LayerNorms& l) { return l.ndim >= 2 || l.ndim == 0; }

}  // namespace

HealthMonitor::HealthMonitor(HealthOptions options, RunSettings settings)
    : options_(options), settings_(std::move(settings)) {
  warmup_steps_ = static_cast<int64_t>(settings_.number("schedule.warmup_steps", 0));
}

bool HealthMonitor::cooling_down(const std::string& kind, int64_t step) const {
  auto it = last_fired_.find(kind);
  return it != last_fired_.end() && step - it->second < options_.cooldown_steps;
}

void HealthMonitor::emit(std::vector<HealthEvent>& out, HealthEvent e) {
  if (cooling_down(e.kind, e.step)) return;
  std::vector<std::string> once;  // remedies from several sources may repeat
  for (auto& s : e.suggestions)
    if (std::find(once.begin(), once.end(), s) == once.end()) once.push_back(s);
  e.suggestions = std::move(once);
  last_fired_[e.kind] = e.step;
  out.push_back(std::move(e));
}

bool HealthMonitor::wants_layer_detail(double grad_norm) const {
  if (!std::isfinite(grad_norm)) return true;
  if (static_cast<int64_t>(grad_norms_.size()) < options_.min_samples) return false;
  const MeanStd s = mean_std(grad_norms_);
  return s.mean > 0 && grad_norm >= 10 * s.mean;
}

std::vector<HealthEvent> HealthMonitor::check_inputs(const StepMetrics& m) {
  std::vector<HealthEvent> out;
  const InputStats& in = m.input;
  if (!in.present) return out;
  auto ids_text = [](const std::vector<int64_t>& ids) {
    std::string s;
    for (size_t i = 0; i < ids.size() && i < 64; ++i) {
      if (i) s += ',';
      s += std::to_string(ids[i]);
    }
    return s;
  };
  if (!in.nonfinite_ids.empty()) {
    HealthEvent e;
    e.step = m.step;
    e.kind = "bad_sample";
    e.severity = "error";
    e.message = std::to_string(in.nonfinite_ids.size()) + " sample(s) of step " + std::to_string(m.step) +
                " hold NaN/Inf in their input: dataset ids " + ids_text(in.nonfinite_ids) +
                "; everything computed from them is non-finite";
    e.details["sample_ids"] = ids_text(in.nonfinite_ids);
    e.details["step"] = std::to_string(m.step);
    e.suggestions = {"fix or drop these samples in the data (dataset indices " + ids_text(in.nonfinite_ids) + ")",
                     "validate the data when it is prepared: reject non-finite values"};
    out.push_back(std::move(e));  // no cooldown: every bad sample is worth naming
  }
  // A sample far outside the others' range: compare with the step's own typical sample and
  // with recent steps', so a batch of raw (unnormalized) data is not an outlier of itself.
  const double typical = std::max(in.median_absmax, median(std::vector<double>(input_medians_.begin(), input_medians_.end())));
  const bool outlier = in.max_id >= 0 && typical > 0 && in.max_absmax >= options_.outlier_factor * typical;
  if (outlier) {
    HealthEvent e;
    e.step = m.step;
    e.kind = "bad_sample";
    e.severity = "warning";
    e.message = "sample " + std::to_string(in.max_id) + " of step " + std::to_string(m.step) + " has an input value of magnitude " +
                fmt(in.max_absmax) + ", " + fmt(in.max_absmax / typical) + "x the typical sample's largest |x| (" + fmt(typical) +
                "): a corrupted or mis-scaled sample";
    e.details["sample_ids"] = std::to_string(in.max_id);
    e.details["step"] = std::to_string(m.step);
    e.details["absmax"] = fmt(in.max_absmax);
    e.details["typical_absmax"] = fmt(typical);
    e.suggestions = {"inspect dataset index " + std::to_string(in.max_id) + "; fix or drop it, or clip the inputs when preparing the data"};
    emit(out, std::move(e));
  }
  if (std::isfinite(in.median_absmax) && in.median_absmax > 0) push(input_medians_, in.median_absmax, options_.spike_window);
  // Standardized inputs have mean ~0 and std ~1; raw pixel or sensor units are in the tens to
  // thousands, which makes the first layer's pre-activations as large and its gradients
  // badly scaled against the others'.
  // (Not judged on a step with an outlier sample: its one value skews the batch's std.)
  if (!inputs_reported_ && !outlier && std::isfinite(in.std) &&
      (std::fabs(in.mean) > 5 || in.std > 5 || in.median_absmax > 50)) {
    inputs_reported_ = true;
    HealthEvent e;
    e.step = m.step;
    e.kind = "inputs_not_normalized";
    e.severity = "warning";
    e.message = "the inputs are not normalized: mean " + fmt(in.mean) + ", std " + fmt(in.std) + ", largest |x| " + fmt(in.absmax) +
                " (standardized inputs have mean ~0 and std ~1); the first layer's activations and gradients are as "
                "large, which makes training slow or unstable";
    e.details["input_mean"] = fmt(in.mean);
    e.details["input_std"] = fmt(in.std);
    e.details["input_absmax"] = fmt(in.absmax);
    if (settings_.has("data.normalize") && !settings_.flag("data.normalize", true)) {
      e.suggestions.push_back("normalize the inputs: data.normalize: true");
      e.fix["data.normalize"] = "true";
    } else {
      e.suggestions.push_back("standardize the inputs: x' = (x - " + fmt(in.mean) + ") / " + fmt(in.std) +
                              " (the training set's mean and std, per feature or channel)");
    }
    out.push_back(std::move(e));
  }
  return out;
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
    e.suggestions = {"an occasional skip with the f16 loss scaler is normal; many in a row are not"};
    add_instability_remedies(e, settings_, m.lr);
    if (auto r = remedy_bf16(settings_)) e.suggestions.push_back(r->text);
    emit(out, std::move(e));
  }

  const int64_t window = std::max<int64_t>(2, options_.spike_window);
  const bool warm = !in_warmup(m.step);
  // Loss spike, against the window before this step.
  if (warm && std::isfinite(m.loss) && static_cast<int64_t>(losses_.size()) >= options_.min_samples) {
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
      add_instability_remedies(e, settings_, m.lr);
      emit(out, std::move(e));
    }
  }
  // Gradient norm: orders of magnitude above the window = exploding, else a z-score spike.
  if (warm && std::isfinite(m.grad_norm) && static_cast<int64_t>(grad_norms_.size()) >= options_.min_samples) {
    const MeanStd s = mean_std(grad_norms_);
    const double sd = std::max(s.std, 0.01 * std::fabs(s.mean) + 1e-12);
    const double z = (m.grad_norm - s.mean) / sd;
    if (s.mean > 0 && m.grad_norm >= options_.explode_factor * s.mean) {
      HealthEvent e = event("exploding_gradients", "error");
      e.message = "the gradient norm is " + fmt(m.grad_norm) + " at step " + std::to_string(m.step) + ", " +
                  fmt(m.grad_norm / s.mean) + "x its recent mean " + fmt(s.mean) + ": gradients are exploding";
      e.details["grad_norm"] = fmt(m.grad_norm);
      e.details["window_mean"] = fmt(s.mean);
      e.details["lr"] = fmt(m.lr);
      // The layers whose gradient grew most since the last statistics step.
      std::vector<std::pair<double, std::string>> growth;
      for (const LayerNorms& l : m.layers) {
        if (!is_weight(l) || !(l.param_norm > 0)) continue;
        const double r = l.grad_norm / l.param_norm;
        auto it = last_layer_ratio_.find(l.name);
        if (it != last_layer_ratio_.end() && it->second > 0 && std::isfinite(r)) growth.emplace_back(r / it->second, l.name);
      }
      std::sort(growth.rbegin(), growth.rend());
      if (!growth.empty()) {
        std::vector<std::string> names;
        for (size_t i = 0; i < growth.size() && i < 3; ++i) names.push_back(growth[i].second + " (" + fmt(growth[i].first) + "x)");
        e.details["layers"] = growth[0].second;
        e.message += "; the gradient grew most in " + join(names) + " since the last statistics step";
      }
      if (auto r = remedy_clip(settings_)) {
        e.suggestions.push_back(r->text);
        e.fix.insert(r->fix.begin(), r->fix.end());
      }
      add_instability_remedies(e, settings_, m.lr);
      emit(out, std::move(e));
    } else if (z > options_.grad_spike_z && m.grad_norm >= options_.grad_spike_min_ratio * s.mean &&
               !cooling_down("exploding_gradients", m.step)) {  // same story, told once
      HealthEvent e = event("grad_spike", "warning");
      e.message = "the gradient norm jumped to " + fmt(m.grad_norm) + " at step " + std::to_string(m.step) + ", " +
                  fmt(z) + " standard deviations above the recent mean " + fmt(s.mean);
      e.details["grad_norm"] = fmt(m.grad_norm);
      e.details["window_mean"] = fmt(s.mean);
      e.details["z"] = fmt(z);
      add_instability_remedies(e, settings_, m.lr);
      emit(out, std::move(e));
    }
  }
  // Warm-up values describe a different regime (the lr still ramps): the windows start after it.
  if (warm) {
    push(losses_, m.loss, window);
    push(grad_norms_, m.grad_norm, window);
  }
  check_loss_rise(m, out, context);
  if (!m.layers.empty()) check_layers(m, out, context);
  if (!m.activations.empty()) check_activations(m, out, context);

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
      if (auto r = remedy_bf16(settings_)) {
        e.suggestions.push_back(r->text);
        e.fix.insert(r->fix.begin(), r->fix.end());
      } else {
        e.suggestions.push_back("use trainer.precision: bf16 (same range as f32, no loss scaling needed)");
      }
      if (auto r = remedy_clip(settings_)) e.suggestions.push_back(r->text);
      emit(out, std::move(e));
      scale_drop_steps_.clear();
    }
  }
  return out;
}

void HealthMonitor::check_loss_rise(const StepMetrics& m, std::vector<HealthEvent>& out,
                                    const std::map<std::string, std::string>& context) {
  if (!std::isfinite(m.loss)) return;
  const size_t w = static_cast<size_t>(std::max<int64_t>(3, options_.rise_window));
  // The starting level is the untrained model's loss (the first step's); the level is the
  // median of the last `w` losses, or of all of them while there are fewer (from 3 on, so a
  // spike in the first steps is seen).
  if (first_losses_.empty()) {
    first_losses_.push_back(m.loss);
    initial_level_ = m.loss;
  }
  recent_losses_.push_back(m.loss);
  while (recent_losses_.size() > w) recent_losses_.pop_front();
  // One step worse than the untrained model, after real progress: no statistics needed (the
  // starting loss is the ceiling of a model that learned anything), so it is seen from step
  // 2 on, where an early spike without warm-up happens (and the median below hides it).
  if (!rise_reported_ && min_loss_step_ > 0 && initial_level_ > 0 && min_loss_ <= 0.9 * initial_level_ &&
      m.loss >= 1.25 * initial_level_) {
    HealthEvent e;
    e.step = m.step;
    e.kind = "loss_rise";
    e.severity = "warning";
    e.details = context;
    e.message = "the loss jumped to " + fmt(m.loss) + " at step " + std::to_string(m.step) + ", above the untrained model's " +
                fmt(initial_level_) + " (step 1), after it had come down to " + fmt(min_loss_) + " (step " +
                std::to_string(min_loss_step_) + ")";
    e.details["min_level"] = fmt(min_loss_);
    e.details["min_step"] = std::to_string(min_loss_step_);
    e.details["level"] = fmt(m.loss);
    e.details["initial_level"] = fmt(initial_level_);
    e.details["lr"] = fmt(m.lr);
    e.details["lr_at_min"] = fmt(lr_at_min_loss_);
    e.details["single_step"] = "true";
    add_instability_remedies(e, settings_, lr_at_min_loss_ > 0 ? lr_at_min_loss_ : m.lr);
    rise_reported_ = true;
    out.push_back(std::move(e));
  }
  if (min_loss_step_ == 0 || m.loss < min_loss_) min_loss_ = m.loss, min_loss_step_ = m.step, lr_at_min_loss_ = m.lr;
  if (recent_losses_.size() < 3) return;
  const double level = median(std::vector<double>(recent_losses_.begin(), recent_losses_.end()));
  if (!have_min_ || level < min_level_) {
    have_min_ = true;
    min_level_ = level;
    min_step_ = m.step;
    lr_at_min_ = m.lr;
    rise_reported_ = false;  // a new low re-arms the check
    return;
  }
  if (rise_reported_) return;  // one rise is one story until the loss makes a new low
  const double progress = initial_level_ - min_level_;
  const double scale = std::max(std::fabs(initial_level_), 1e-12);
  // Given back a quarter of a real (≥ 10%) improvement, and at least a tenth of the starting
  // loss (the lowest level is the minimum of many noisy medians: a slowly learning, noisy
  // run would otherwise "rise" from a lucky low), or climbed well above the start.
  const bool gave_back = progress >= 0.1 * scale && level - min_level_ >= options_.rise_fraction * progress &&
                         level - min_level_ >= 0.1 * scale;
  const bool above_start = level >= initial_level_ + 0.25 * scale;
  if (!gave_back && !above_start) return;
  HealthEvent e;
  e.step = m.step;
  e.kind = "loss_rise";
  e.severity = "warning";
  e.details = context;
  e.message = "the loss rose from its lowest level " + fmt(min_level_) + " (step " + std::to_string(min_step_) + ") to " + fmt(level) +
              " at step " + std::to_string(m.step) + " (median of the last " + std::to_string(w) + " steps; it started at " +
              fmt(initial_level_) + ")" + (above_start ? ": above where it started" : "");
  e.details["min_level"] = fmt(min_level_);
  e.details["min_step"] = std::to_string(min_step_);
  e.details["level"] = fmt(level);
  e.details["initial_level"] = fmt(initial_level_);
  e.details["lr"] = fmt(m.lr);
  e.details["lr_at_min"] = fmt(lr_at_min_);
  add_instability_remedies(e, settings_, lr_at_min_ > 0 ? lr_at_min_ : m.lr);
  rise_reported_ = true;
  out.push_back(std::move(e));
}

void HealthMonitor::check_layers(const StepMetrics& m, std::vector<HealthEvent>& out,
                                 const std::map<std::string, std::string>& context) {
  // Per-layer grad/param ratios: one layer far above the others, or layers far below.
  std::vector<std::pair<std::string, double>> ratios;
  for (const LayerNorms& l : m.layers)
    if (is_weight(l) && l.param_norm > 0 && std::isfinite(l.grad_norm) && std::isfinite(l.param_norm))
      ratios.emplace_back(l.name, l.grad_norm / l.param_norm);
  std::vector<std::string> high, low;
  std::vector<double> all;
  for (auto& [n, r] : ratios) all.push_back(r);
  const double med = median(all);
  if (ratios.size() >= 3) {
    for (size_t i = 0; i < ratios.size(); ++i) {
      std::vector<double> others;
      for (size_t j = 0; j < ratios.size(); ++j)
        if (j != i) others.push_back(ratios[j].second);
      const double med_others = median(others);
      // Exploding is a change: far above the others and 10x above its own last value (the
      // last layers of a deep sigmoid net always sit far above a vanishing median).
      const auto last = last_layer_ratio_.find(ratios[i].first);
      const bool grew = last != last_layer_ratio_.end() && last->second > 0 && ratios[i].second >= 10 * last->second;
      if (med_others > 0 && ratios[i].second >= options_.layer_ratio_factor * med_others && grew) high.push_back(ratios[i].first);
      else if (med > 0 && ratios[i].second <= med / options_.layer_ratio_factor) low.push_back(ratios[i].first);
    }
  }
  std::map<std::string, int64_t> streak;
  for (const auto& n : low) streak[n] = low_streak_.count(n) ? low_streak_[n] + 1 : 1;
  low_streak_ = streak;
  std::vector<std::string> vanishing;
  for (const auto& [n, k] : low_streak_)
    if (k >= options_.persist_stat_steps) vanishing.push_back(n);
  for (auto& [n, r] : ratios) last_layer_ratio_[n] = r;

  auto event = [&](const char* kind, const char* severity) {
    HealthEvent e;
    e.step = m.step;
    e.kind = kind;
    e.severity = severity;
    e.details = context;
    return e;
  };
  if (!high.empty()) {
    HealthEvent e = event("exploding_gradients", "error");
    e.message = "layer " + join(high) + " has a gradient/parameter norm ratio over " + fmt(options_.layer_ratio_factor) +
                "x the other layers' (median " + fmt(med) + ") at step " + std::to_string(m.step) +
                ": its gradients are exploding";
    e.details["layers"] = join(high, 100);
    e.details["median_ratio"] = fmt(med);
    if (auto r = remedy_clip(settings_)) {
      e.suggestions.push_back(r->text);
      e.fix.insert(r->fix.begin(), r->fix.end());
    }
    add_instability_remedies(e, settings_, m.lr);
    e.suggestions.push_back("check this layer's initialization and the normalization before it");
    emit(out, std::move(e));
  }
  if (!vanishing.empty()) {
    // Keep the network's order (the order of m.layers), not the map's.
    std::vector<std::string> ordered;
    std::string ratios_text;
    for (const auto& [n, r] : ratios)
      if (std::find(vanishing.begin(), vanishing.end(), n) != vanishing.end()) {
        ordered.push_back(n);
        ratios_text += (ratios_text.empty() ? "" : ", ") + n + " " + fmt(r);
      }
    HealthEvent e = event("vanishing_gradients", "warning");
    e.message = "layer(s) " + join(ordered) + " get gradients under 1/" + fmt(options_.layer_ratio_factor) +
                " of the other layers' (relative to their weights; median ratio " + fmt(med) + ") for " +
                std::to_string(options_.persist_stat_steps) + " statistics steps in a row, up to step " +
                std::to_string(m.step) + ": they are barely learning";
    e.details["layers"] = join(ordered, 100);
    e.details["grad_to_weight"] = ratios_text;
    e.details["median_ratio"] = fmt(med);
    // Saturated squashing activations are the classic cause: name them when present.
    std::string saturated;
    for (const ActivationStats& a : m.activations)
      if (a.saturated_frac >= 0.5) saturated += (saturated.empty() ? "" : ", ") + a.name + " " + pct(a.saturated_frac);
    if (!saturated.empty()) e.details["saturated_activations"] = saturated;
    const std::string act = settings_.text("model.activation");
    if (act == "sigmoid" || act == "tanh") {
      e.suggestions.push_back("use a non-saturating activation: model.activation: relu (" + act +
                              "'s derivative is at most " + (act == "sigmoid" ? std::string("0.25") : std::string("1")) +
                              " and shrinks the gradient at every layer)");
      e.fix["model.activation"] = "relu";
    } else {
      e.suggestions.push_back("check for saturated activations or dead ReLUs before these layers");
    }
    e.suggestions.push_back("use residual connections / normalization layers, or fewer layers");
    e.suggestions.push_back("check that these parameters are actually used in the forward pass");
    emit(out, std::move(e));
  }
}

void HealthMonitor::check_activations(const StepMetrics& m, std::vector<HealthEvent>& out,
                                      const std::map<std::string, std::string>& context) {
  std::map<std::string, int64_t> streak;
  std::vector<std::string> dead;
  std::string fractions;
  for (const ActivationStats& a : m.activations) {
    if (a.dead_frac < options_.dead_fraction) continue;
    streak[a.name] = dead_streak_.count(a.name) ? dead_streak_[a.name] + 1 : 1;
    if (streak[a.name] >= options_.persist_stat_steps) {
      dead.push_back(a.name);
      fractions += (fractions.empty() ? "" : ", ") + a.name + " " + pct(a.dead_frac) + " of " + std::to_string(a.units) + " units";
    }
  }
  dead_streak_ = streak;
  if (dead.empty()) return;
  HealthEvent e;
  e.step = m.step;
  e.kind = "dead_relus";
  e.severity = "warning";
  e.details = context;
  e.message = "dead ReLUs: " + fractions + " output 0 for every input of the last statistics window (>= 256 samples; for " +
              std::to_string(options_.persist_stat_steps) + " statistics steps in a row, up to step " + std::to_string(m.step) +
              "); a dead unit gets no gradient and never recovers";
  e.details["layers"] = join(dead, 100);
  e.details["dead_fraction"] = fractions;
  const double lr = m.lr > 0 ? m.lr : settings_.number("optimizer.lr", -1);
  if (lr > 0)
    if (auto r = remedy_set_lr(settings_, round_down_125(lr / 10), "a large update pushed the units' biases and weights "
                                                                      "to where they never fire")) {
      e.suggestions.push_back(r->text);
      e.fix.insert(r->fix.begin(), r->fix.end());
    }
  if (auto r = remedy_warmup(settings_)) e.suggestions.push_back(r->text);
  if (settings_.text("model.activation") == "relu") e.suggestions.push_back("or use an activation without a dead zone: model.activation: gelu or silu");
  emit(out, std::move(e));
}

}  // namespace athanor::observe
