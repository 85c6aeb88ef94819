#pragma once
// Optimizers over named parameter groups. State is f32 (whatever the parameter
// dtype), stored per parameter under logical names ("exp_avg.<param name>") so a
// checkpoint is independent of parameter order and of how ranks shard it.
//
// Contract of step(): runs under no-grad; skips parameters whose .grad is
// undefined; reads the group's current lr (set by the Scheduler); never changes
// .grad. Gradient clipping, unscaling and skipping on non-finite gradients are
// the Trainer's job, before step().
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "athanor/core/tensor.h"

namespace athanor::optim {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct ParamGroup {
  std::string name;           // "decay" / "no_decay" or user-chosen
  NamedTensors params;
  double lr = 1e-3;           // current lr (the Scheduler overwrites it every step)
  double base_lr = 1e-3;      // the lr the schedule scales
  double weight_decay = 0.0;
};

// The default grouping: parameters with dim >= 2 (weights of linear/conv) decay;
// biases, norm weights and (unless decay_embeddings) embeddings do not.
// Embeddings are recognised by name: "wte", "wpe", "embed" in the path.
std::vector<ParamGroup> default_param_groups(const NamedTensors& named, double lr, double weight_decay,
                                             bool decay_embeddings = false);

class Optimizer {
 public:
  explicit Optimizer(std::vector<ParamGroup> groups);
  virtual ~Optimizer();  // forgets the low-precision copies it registered with autocast, and the packed weight copies
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  virtual void step() = 0;
  virtual std::string name() const = 0;
  void zero_grad();  // sets every .grad to undefined
  // The next step() takes every gradient as multiplied by coef (> 0), rounded as
  // clip_grad_norm's scaling rounds it (f32(f64(g) * coef)), without writing the
  // gradients: clipping by norm folded into the update. SGD and Adam/AdamW apply it in
  // their update pass over f32 parameters; everything else scales its gradients in
  // place first. So grad_norm + scale_grads_in_next_step(clip_coefficient(...)) + step()
  // gives the bits of clip_grad_norm + step(), one pass over the gradients fewer.
  void scale_grads_in_next_step(double coef);
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  int64_t steps() const;  // a guarded step's count is the device's (read back: a host sync)

  // The step guarded on the device (CUDA parameters: the trainer's step with no host read).
  // From now on step() takes the decision and the clip coefficient from the device: `skip`
  // (f32, 1 element, 1 = skip) and `grad_scale` (f64, 1 element: the gradient scale to fold
  // in, 1 = none), both written by work queued before step() (optim/device_update.h:
  // step_guard_on_device). A skipped step leaves the weights, the state and the step counts
  // (the optimizer's and each parameter's) unchanged on the device, exactly as the CPU's
  // skipped step (no step() call); the counts live on the device then, and steps() and
  // state_scalars() read them back. Only Adam, AdamW and SGD (the optimizers with CUDA
  // kernels) take it; undefined tensors turn it off (reading the counts back).
  void set_device_guard(const Tensor& skip, const Tensor& grad_scale);
  bool device_guarded() const { return guard_skip_.defined(); }

  // State under logical names "<state>.<param name>" (f32 tensors), and scalars.
  NamedTensors state_tensors() const;
  std::map<std::string, double> state_scalars() const;  // "steps", per-group "lr.<group>"
  // Loads state saved by any optimizer of the same kind over the same named
  // parameters; a missing or mis-shaped state tensor is an Error naming it.
  void load_state(const NamedTensors& tensors, const std::map<std::string, double>& scalars);

  // Persistent low-precision weight copies for autocast. When on, each step also
  // writes every updated f32 parameter rounded to `dtype` (bf16 or f16; the same
  // bits as cast()) — in the update pass itself for SGD and Adam/AdamW (one read
  // of the weight), by a cast right after the update for the other optimizers —
  // and registers it with autocast (autocast_set_persistent_cast) at the
  // parameter's new version. Autocast then uses the copy instead of casting the
  // parameter, for as long as nothing else changes the parameter. Enabling makes
  // the copies of all f32 parameters at once (so the next forward already uses
  // them). Memory: 2 bytes per f32 parameter, tagged MemTag::parameter, on the
  // parameter's device. On CUDA only with the lowp_copies candidate on
  // (backend/cuda/candidates.h; the update kernels write them); off, CUDA parameters
  // get no copy and autocast casts them. A step the device guard skips writes neither
  // weights nor copies: each copy still equals the cast of its (unchanged) weight.
  void enable_low_precision_copies(DType dtype);
  void disable_low_precision_copies();
  DType low_precision_copies() const { return copy_dtype_; }  // f32 when off

 protected:
  // The state tensor `state` of parameter `param` (created zero-filled on first use,
  // f32 — f64 for f64 parameters — tagged optimizer_state).
  Tensor& state(const std::string& param, const std::string& state, const Tensor& like);
  // Per-parameter step count (for bias correction / first-step momentum), incremented by the caller.
  int64_t& param_step(const std::string& param) { return param_steps_[param]; }
  // Calls fn(group, name, param, grad) for every parameter with a gradient; checks dtypes.
  void for_each_param(const std::function<void(ParamGroup&, const std::string&, Tensor&, const Tensor&)>& fn);
  std::vector<ParamGroup> groups_;
  mutable int64_t steps_ = 0;  // mutable: refreshed from the device's count when read (device guard)

  // Low-precision copies (see enable_low_precision_copies): the buffer that receives
  // parameter `name`'s copy (allocated on first use), or null when copies are off or
  // the parameter is not f32. After the pass that filled it, publish_copy registers it.
  // Returns a host pointer for a CPU parameter, a device pointer for a CUDA one.
  void* copy_buffer(const std::string& name, const Tensor& p);
  void publish_copy(const std::string& name, const Tensor& p);
  // copy_buffer + a cast of p into it (on p's device) + publish_copy; nothing when copy_buffer is null.
  void cast_into_copy(const std::string& name, const Tensor& p);
  // True for optimizers whose update pass writes the copies; the others get a cast
  // after each parameter's update (in for_each_param).
  virtual bool writes_copies_in_pass() const { return false; }
  // True for optimizers whose update pass over f32 parameters applies grad_scale()
  // itself; for the others (and other dtypes) for_each_param scales the gradient first.
  virtual bool folds_grad_scale() const { return false; }
  // True for optimizers whose step() runs over f32 parameters on a CUDA device (Adam, AdamW,
  // SGD: the multi-tensor kernels); the others refuse such parameters before any work.
  virtual bool steps_on_cuda() const { return false; }
  double grad_scale() const { return grad_scale_; }  // this step's (1: none); reset when for_each_param returns
  // Every step() ends with this, once all parameters (and their copies) hold their new
  // values: the packed weight copies that GEMMs asked for (src/ops/packed_weights.h)
  // are rewritten from them.
  void refresh_packed_weights();
  // With a device guard: parameter `name`'s step count on the device (f64, made from the
  // host's count on first use), queued to advance after this step's update unless skipped;
  // null without a guard. Call it before the host count's increment.
  double* device_step(const std::string& name, const Tensor& like);
  const float* guard_skip() const;
  const double* guard_grad_scale() const;
  // Queues this step's advance of the device counts (the parameters' and the total) on
  // `device`; call it after the update kernels, before ++steps_. Nothing without a guard.
  void advance_device_steps(int device);

 private:
  void pull_device_steps() const;  // the device counts into steps_ / param_steps_ (a host read)
  Tensor guard_skip_, guard_scale_;
  std::map<std::string, Tensor> device_steps_;  // "" : the optimizer's total
  std::vector<double*> stepped_;                // this step's parameter counters
  DType copy_dtype_ = DType::f32;
  double grad_scale_ = 1.0;
  std::map<std::string, Tensor> copies_;  // param -> its low-precision copy
  std::vector<Tensor> written_;           // refresh_packed_weights' list, capacity kept
  std::map<std::string, std::map<std::string, Tensor>> state_;  // param -> state name -> tensor
  mutable std::map<std::string, int64_t> param_steps_;
};

struct SgdOptions { double momentum = 0, dampening = 0; bool nesterov = false; };
struct RmspropOptions { double alpha = 0.99, eps = 1e-8, momentum = 0; bool centered = false; };
struct AdamOptions { double beta1 = 0.9, beta2 = 0.999, eps = 1e-8; };
struct LambOptions { double beta1 = 0.9, beta2 = 0.999, eps = 1e-6; };
struct LarsOptions { double momentum = 0.9, trust_coefficient = 0.001, eps = 1e-8; };

// weight_decay semantics: SGD/RMSprop/Adam/LARS add wd*param to the gradient (L2);
// AdamW and LAMB decouple it (PyTorch / the LAMB paper).
std::unique_ptr<Optimizer> make_sgd(std::vector<ParamGroup> groups, SgdOptions o = {});
std::unique_ptr<Optimizer> make_rmsprop(std::vector<ParamGroup> groups, RmspropOptions o = {});
std::unique_ptr<Optimizer> make_adam(std::vector<ParamGroup> groups, AdamOptions o = {});
std::unique_ptr<Optimizer> make_adamw(std::vector<ParamGroup> groups, AdamOptions o = {});
std::unique_ptr<Optimizer> make_lamb(std::vector<ParamGroup> groups, LambOptions o = {});
std::unique_ptr<Optimizer> make_lars(std::vector<ParamGroup> groups, LarsOptions o = {});

}  // namespace athanor::optim
