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
// On CUDA (the loss and gradients on a GPU) the scale and the growth tracker live on the
// device, and a step issues no host synchronisation: scale() multiplies by the device
// scale; unscale_async() unscales every gradient and checks them in one multi-tensor kernel
// and returns found_inf as a 0-d f32 device tensor (PyTorch's
// _amp_foreach_non_finite_check_and_unscale_); update(found_inf) updates the scale on the
// device (_amp_update_scale_). The values are read back only when asked: get_scale(),
// growth_tracker(), skipped_steps(), last_step_skipped(), nonfinite_params() and
// loss_nonfinite() each read the device then (the trainer asks at logged steps). The bool
// forms unscale() and update(bool) still work on CUDA gradients, reading the flag at once.
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

struct GradScalerCalls {
  int64_t unscale = 0, unscale_async = 0, update_bool = 0, update_tensor = 0;
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
  // The same without a host read: found_inf as a 0-d f32 tensor (1: a non-finite gradient)
  // on the gradients' device (CUDA gradients, one device; CPU gradients give a CPU tensor).
  Tensor unscale_async(const NamedTensors& named_params);
  // Backoff on found_inf (and reset the growth tracker), else count a clean
  // step and grow after growth_interval of them. Ends the step.
  void update(bool found_inf);
  // The same from a found_inf tensor (unscale_async's; any device), with no host read.
  void update(const Tensor& found_inf);

  double get_scale() const;
  int64_t growth_tracker() const;
  // The scale as the 0-d f32 tensor scale() multiplies by on `device` (made from the current
  // scale on first use; the device copy is the scale from then on).
  Tensor scale_tensor(Device device);
  bool enabled() const { return opts_.enabled; }
  const GradScalerOptions& options() const { return opts_; }

  // What the last unscale()/update() saw (for metrics and the NaN doctor).
  const std::vector<std::string>& nonfinite_params() const;
  bool loss_nonfinite() const;
  bool last_step_skipped() const;
  int64_t skipped_steps() const;

  // How often each form was called from outside (a form calling another counts once): the
  // trainer's step must use the no-sync forms (tests/train).
  const GradScalerCalls& calls() const { return calls_; }

  // {"scale", "growth_tracker"} as 0-D f64 tensors (safetensors-compatible keys).
  NamedTensors state_dict() const;
  void load_state_dict(const NamedTensors& state);

 private:
  void sync_from_device() const;  // the device state's values into the host fields (a read)

  GradScalerOptions opts_;
  // Host state; while a device state exists (dev_scale_ defined) the device holds the truth and
  // these are refreshed from it when read (mutable: reading is logically const).
  mutable double scale_;
  mutable int64_t growth_tracker_ = 0;
  bool unscaled_ = false;
  mutable bool loss_nonfinite_ = false;
  mutable bool last_step_skipped_ = false;
  mutable int64_t skipped_steps_ = 0;
  mutable std::vector<std::string> nonfinite_params_;
  // Device state: scale (0-d f32), counters (f64 [2]: growth tracker, skipped steps), and what
  // is read back lazily: the last loss, found_inf and per-gradient flags with their names.
  Tensor dev_scale_, dev_counters_;
  struct Entry;
  GradScalerCalls calls_;
  int depth_ = 0;
  mutable Tensor pending_loss_, pending_found_, pending_flags_;
  mutable std::vector<std::string> pending_names_;
};

}  // namespace athanor
