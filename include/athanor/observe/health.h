#pragma once
// The online health monitor: reads each step's StepMetrics and says, in plain
// language, when training looks unhealthy and what to try.
//
//   observe::HealthMonitor health({.spike_window = cfg.get_int("health.spike_window"), …});
//   for (auto& e : health.check(step_metrics)) sink.on_health(e);
//
// Checks (HealthEvent.kind):
//   loss_spike / grad_spike   value > mean + z·std of a running window of the last
//                             `spike_window` finite values (needs `min_samples`; the
//                             std is floored at 1% of |mean| so a flat loss does not
//                             turn noise into spikes)
//   exploding_gradients       grad_norm ≥ `explode_factor` × the window mean, or one
//                             layer's grad/param norm ratio ≥ `layer_ratio_factor` ×
//                             the median of the others (named)
//   vanishing_gradients       layers whose ratio ≤ median / `layer_ratio_factor` (named)
//   skipped_step              the update was skipped (names the non-finite params)
//   scale_collapse            the f16 loss scale dropped ≥ `scale_drops` times within
//                             the window (or fell below 1)
// A kind that fired is not reported again for `cooldown_steps` steps (no event storms).
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "athanor/observe/metrics.h"

namespace athanor::observe {

struct HealthOptions {
  int64_t spike_window = 50;   // health.spike_window
  double loss_spike_z = 6.0;   // health.loss_spike_z
  double grad_spike_z = 6.0;   // health.grad_spike_z
  // Gradient norms are heavy-tailed: a doubling within a quiet window is routine
  // (measured on a healthy tiny GPT: z 6.7 at 1.9x the mean), so a grad spike must
  // also be this many times the window mean.
  double grad_spike_min_ratio = 3.0;
  int64_t min_samples = 10;
  double explode_factor = 100.0;
  double layer_ratio_factor = 100.0;
  int64_t scale_drops = 4;
  int64_t cooldown_steps = 20;
};

class HealthMonitor {
 public:
  explicit HealthMonitor(HealthOptions options = {});
  // Events for this step (usually none). `context` (e.g. {"sample_ids": "…"}) is
  // copied into the details of the events it produces.
  std::vector<HealthEvent> check(const StepMetrics& m, const std::map<std::string, std::string>& context = {});
  const HealthOptions& options() const { return options_; }

 private:
  bool cooling_down(const std::string& kind, int64_t step) const;
  void emit(std::vector<HealthEvent>& out, HealthEvent e);

  HealthOptions options_;
  std::deque<double> losses_, grad_norms_;
  std::deque<int64_t> scale_drop_steps_;
  double last_scale_ = 0;
  std::map<std::string, int64_t> last_fired_;
};

}  // namespace athanor::observe
