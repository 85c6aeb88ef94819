#pragma once
// The online health monitor: reads each step's StepMetrics and says, in plain
// language, when training looks unhealthy and what to try.
//
//   observe::HealthMonitor health({.spike_window = cfg.get_int("health.spike_window"), …}, settings);
//   for (auto& e : health.check_inputs(step_metrics)) sink.on_health(e);  // before the forward
//   for (auto& e : health.check(step_metrics)) sink.on_health(e);         // after the step
//
// Checks (HealthEvent.kind):
//   loss_spike / grad_spike   value > mean + z·std of a running window of the last
//                             `spike_window` finite values. Statistics need a warm window:
//                             `min_samples` values, none from the learning-rate warm-up
//                             (schedule.warmup_steps), whose values are not stationary. The
//                             std is floored at 1% of |mean| so a flat loss does not turn
//                             noise into spikes; a grad spike must also be `grad_spike_min_ratio`
//                             times the mean (gradient norms are heavy-tailed).
//   loss_rise                 the loss level (median of the last `rise_window` losses) climbed
//                             back by `rise_fraction` of the progress made so far, or above its
//                             starting level; or one step's loss rose 25% above the untrained
//                             model's (step 1) after coming down 10%: no z-score, so it works
//                             from step 2 (an early spike without warm-up, a divergence). The
//                             doctor tells the two apart by whether the loss recovers.
//   exploding_gradients       grad_norm ≥ `explode_factor` × the (warm) window mean, or one
//                             weight's grad/param norm ratio ≥ `layer_ratio_factor` × the
//                             median of the others and 10x its own last value; names the layers
//   vanishing_gradients       weights whose ratio ≤ median / `layer_ratio_factor` on
//                             `persist_stat_steps` layer-statistics steps in a row (named)
//   dead_relus                ReLU layers with ≥ `dead_fraction` of their units 0 for every input
//                             seen over the window before a statistics step (≥ 256 samples,
//                             train/step_observer.h), on `persist_stat_steps` statistics steps in a row
//   skipped_step              the update was skipped (names the non-finite params)
//   scale_collapse            the f16 loss scale dropped ≥ `scale_drops` times within
//                             the window (or fell below 1)
//   check_inputs():
//   bad_sample                samples whose input holds NaN/Inf (error), or whose largest |x| is
//                             ≥ `outlier_factor` × the typical sample's (warning): names the ids
//   inputs_not_normalized     floating inputs far from standardized (|mean| or std > 5, or
//                             |x| > 50): once per run, naming the statistics
// Per-layer checks read weight matrices only (ndim ≥ 2): biases and norm gains start at 0
// or 1 and have their own scales. A kind that fired is not reported again for
// `cooldown_steps` steps (no event storms). Suggestions read the run's settings
// (observe/run_settings.h): nothing already set is suggested.
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "athanor/observe/metrics.h"
#include "athanor/observe/run_settings.h"

namespace athanor::observe {

struct HealthOptions {
  int64_t spike_window = 50;   // health.spike_window
  double loss_spike_z = 6.0;   // health.loss_spike_z
  double grad_spike_z = 6.0;   // health.grad_spike_z
  // Gradient norms are heavy-tailed: a doubling within a quiet window is routine
  // (measured on a healthy tiny GPT: z 6.7 at 1.9x the mean), so a grad spike must
  // also be this many times the window mean.
  double grad_spike_min_ratio = 3.0;
  // Values a window needs before its statistics are trusted (the trainer and the doctor use
  // the whole spike_window: a window is warm when it is full).
  int64_t min_samples = 50;
  double explode_factor = 100.0;
  double layer_ratio_factor = 100.0;
  int64_t scale_drops = 4;
  int64_t cooldown_steps = 20;
  // loss_rise: a median over this many steps is the loss level (one bad batch is not a rise) …
  int64_t rise_window = 9;
  // … and giving back this fraction of the progress (starting level - lowest level) is a rise.
  double rise_fraction = 0.25;
  int64_t persist_stat_steps = 3;
  double dead_fraction = 0.5;
  double outlier_factor = 100.0;
};

class HealthMonitor {
 public:
  explicit HealthMonitor(HealthOptions options = {}, RunSettings settings = {});
  // Events for this step (usually none). `context` (e.g. {"sample_ids": "…"}) is
  // copied into the details of the events it produces.
  std::vector<HealthEvent> check(const StepMetrics& m, const std::map<std::string, std::string>& context = {});
  // The step's inputs (m.input), before its forward: a NaN in a sample is reported even
  // when the step then stops the run.
  std::vector<HealthEvent> check_inputs(const StepMetrics& m);
  // Whether a step with this gradient norm deserves per-layer statistics (the trainer
  // computes them then, to name the layer of an explosion): non-finite, or ≥ 10x the window mean.
  bool wants_layer_detail(double grad_norm) const;
  const HealthOptions& options() const { return options_; }

 private:
  bool cooling_down(const std::string& kind, int64_t step) const;
  void emit(std::vector<HealthEvent>& out, HealthEvent e);
  void check_loss_rise(const StepMetrics& m, std::vector<HealthEvent>& out, const std::map<std::string, std::string>& context);
  void check_layers(const StepMetrics& m, std::vector<HealthEvent>& out, const std::map<std::string, std::string>& context);
  void check_activations(const StepMetrics& m, std::vector<HealthEvent>& out, const std::map<std::string, std::string>& context);
  bool in_warmup(int64_t step) const { return step <= warmup_steps_; }

  HealthOptions options_;
  RunSettings settings_;
  int64_t warmup_steps_ = 0;
  std::deque<double> losses_, grad_norms_;
  std::deque<int64_t> scale_drop_steps_;
  double last_scale_ = 0;
  std::map<std::string, int64_t> last_fired_;
  // loss_rise
  std::deque<double> recent_losses_;
  std::vector<double> first_losses_;
  double initial_level_ = 0, min_level_ = 0, lr_at_min_ = 0;
  int64_t min_step_ = 0;
  double min_loss_ = 0, lr_at_min_loss_ = 0;  // the lowest single loss so far (0 steps: none)
  int64_t min_loss_step_ = 0;
  bool have_min_ = false, rise_reported_ = false;
  // per-layer persistence: how many statistics steps in a row each layer was low / dead
  std::map<std::string, int64_t> low_streak_, dead_streak_;
  std::map<std::string, double> last_layer_ratio_;
  std::deque<double> input_medians_;
  bool inputs_reported_ = false;
};

}  // namespace athanor::observe
