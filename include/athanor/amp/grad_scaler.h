#pragma once
// Dynamic loss scaling for f16 mixed precision (PyTorch's GradScaler).
//
//   scaler.scale(loss).backward();            // gradients are multiplied by scale()
//   bool found_inf = scaler.unscale(model.named_parameters());  // divides grads in place; any non-finite?
//   (all-reduce found_inf across ranks; clip grads)
//   if (!found_inf) optimizer.step();
//   scaler.update(found_inf);                 // backoff on inf/nan, growth after growth_interval clean steps
//
// f16 gradients below 2^-24 flush to zero; scaling the loss by 2^16 lifts them
// into range, and unscaling in f32 restores their true value. A non-finite
// gradient means the scale is too large: the step is skipped and the scale
// halved. With enabled = false (bf16/f32) scale() is the identity and update()
// keeps the scale, but unscale() still reports non-finite gradients, so the
// same step code skips bad steps in every precision.
//
// Invariants: unscale() runs at most once between update()s (a second call
// would divide twice) — it throws; update() resets that. The scale never
// leaves [min_scale, max_scale].
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "athanor/core/tensor.h"

namespace athanor {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // consecutive finite steps before the scale grows
  bool enabled = true;
  double min_scale = 1.0 / 16777216.0;  // 2^-24
  double max_scale = 16777216.0 * 16777216.0;  // 2^48
};

class GradScaler {
 public:
  using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

  explicit GradScaler(GradScalerOptions opts = {});

  // loss * scale (differentiable; the result keeps the loss's dtype, f32 for an
  // autocast loss). Records whether the loss itself was non-finite.
  Tensor scale(const Tensor& loss);
  // Divides every defined gradient by the scale, in place, in f32 precision
  // (f64 grads in f64); returns true when any gradient holds inf/nan and
  // records which parameters (by name; "param.<i>" for the unnamed overload).
  bool unscale(const NamedTensors& named_params);
  bool unscale(const std::vector<Tensor>& params);
  // Backoff on found_inf (and reset the growth tracker), else count a clean
  // step and grow after growth_interval of them. Ends the step.
  void update(bool found_inf);

  double get_scale() const { return opts_.enabled ? scale_ : 1.0; }
  int64_t growth_tracker() const { return growth_tracker_; }
  bool enabled() const { return opts_.enabled; }
  const GradScalerOptions& options() const { return opts_; }

  // What the last unscale()/update() saw (for metrics and the NaN doctor).
  const std::vector<std::string>& nonfinite_params() const { return nonfinite_params_; }
  bool loss_nonfinite() const { return loss_nonfinite_; }
  bool last_step_skipped() const { return last_step_skipped_; }
  int64_t skipped_steps() const { return skipped_steps_; }

  // {"scale", "growth_tracker"} as 0-D f64 tensors (safetensors-compatible keys).
  NamedTensors state_dict() const;
  void load_state_dict(const NamedTensors& state);

 private:
  GradScalerOptions opts_;
  double scale_;
  int64_t growth_tracker_ = 0;
  bool unscaled_ = false;
  bool loss_nonfinite_ = false;
  bool last_step_skipped_ = false;
  int64_t skipped_steps_ = 0;
  std::vector<std::string> nonfinite_params_;
};

}  // namespace athanor
