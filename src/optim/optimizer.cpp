#include "athanor/optim/optimizer.h"

#include <cmath>
#include <set>

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/error.h"
#include "athanor/ops/autocast.h"
#include "ops/packed_weights.h"
#include "optim/device_update.h"
#include "optim/fused_update.h"

namespace athanor::optim {

std::vector<ParamGroup> default_param_groups(const NamedTensors& named, double lr, double weight_decay,
                                             bool decay_embeddings) {
  ParamGroup decay{"decay", {}, lr, lr, weight_decay}, no_decay{"no_decay", {}, lr, lr, 0.0};
  for (const auto& [name, p] : named) {
    const bool embedding = name.find("wte") != std::string::npos || name.find("wpe") != std::string::npos ||
                           name.find("embed") != std::string::npos;
    const bool decays = p.dim() >= 2 && (decay_embeddings || !embedding);
    (decays ? decay : no_decay).params.emplace_back(name, p);
  }
  std::vector<ParamGroup> out;
  if (!decay.params.empty()) out.push_back(std::move(decay));
  if (!no_decay.params.empty()) out.push_back(std::move(no_decay));
  return out;
}

Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  std::set<std::string> names;
  for (const auto& g : groups_)
    for (const auto& [name, p] : g.params) {
      ATH_CHECK(names.insert(name).second, "optimizer", "parameter '", name, "' appears in more than one group");
      ATH_CHECK(p.defined() && p.is_leaf(), "optimizer", "parameter '", name, "' must be a defined leaf tensor");
      ATH_CHECK(p.dtype() == DType::f32 || p.dtype() == DType::f64, "optimizer", "parameter '", name, "' is ",
                p.describe(), "; optimizers update f32 (or f64) master weights",
                Hint{"keep parameters in f32 and use autocast (precision: bf16) for low-precision compute"});
    }
}

Optimizer::~Optimizer() {
  std::vector<Tensor> mine;
  for (const auto& g : groups_)
    for (const auto& [name, p] : g.params) mine.push_back(p);
  for (const auto& [name, c] : copies_) mine.push_back(c);
  athanor::detail::drop_packed_weights(mine);  // the weights' packed copies go with the optimizer that kept them current
  disable_low_precision_copies();
}

void Optimizer::enable_low_precision_copies(DType dtype) {
  ATH_CHECK(dtype == DType::bf16 || dtype == DType::f16, "optimizer", "low-precision copies are bf16 or f16, got ",
            dtype_name(dtype), Hint{"pass the autocast dtype (trainer.precision)"});
  if (copy_dtype_ != dtype) disable_low_precision_copies();
  copy_dtype_ = dtype;
  NoGradGuard ng;
  for (auto& g : groups_)
    for (auto& [name, p] : g.params) cast_into_copy(name, p);
}

void Optimizer::cast_into_copy(const std::string& name, const Tensor& p) {
  void* buf = copy_buffer(name, p);
  if (!buf) return;
  if (p.device().is_cpu()) detail::narrow_f32(static_cast<const float*>(p.raw_data()), buf, p.numel(), copy_dtype_);
  else detail::narrow_on_device(p, copies_.at(name));  // queued on the device's compute stream, before any later update
  publish_copy(name, p);
}

void Optimizer::disable_low_precision_copies() {
  std::vector<Tensor> dropped;
  for (const auto& g : groups_)
    for (const auto& [name, p] : g.params)
      if (copies_.count(name)) autocast_forget_persistent_cast(p, copy_dtype_), dropped.push_back(copies_.at(name));
  if (!dropped.empty()) athanor::detail::drop_packed_weights(dropped);
  copies_.clear();
  copy_dtype_ = DType::f32;
}

void* Optimizer::copy_buffer(const std::string& name, const Tensor& p) {
  if (copy_dtype_ == DType::f32 || p.dtype() != DType::f32 || !p.is_contiguous()) return nullptr;
  // On a CUDA device the update kernels write the copies only with the lowp_copies candidate
  // on (backend/cuda/candidates.h); off, autocast casts the weights as before.
  if (!p.device().is_cpu() && !detail::device_copies_enabled()) return nullptr;
  Tensor& c = copies_[name];
  if (!c.defined() || c.device() != p.device()) {  // (a parameter moved since: its copy follows it)
    c = empty(p.sizes(), TensorOptions(copy_dtype_).with_device(p.device()).with_tag(MemTag::parameter));
    // A device update the step guard skips writes no copy, and the copy is published all the
    // same: a new one must already hold cast(p) (queued before the update that overwrites it).
    if (!p.device().is_cpu()) detail::narrow_on_device(p, c);
  }
  c.bump_version();  // about to be overwritten: a graph that saved the old copy must notice
  return p.device().is_cpu() ? c.raw_data() : c.device_data();
}

void Optimizer::publish_copy(const std::string& name, const Tensor& p) {
  autocast_set_persistent_cast(p, copies_.at(name));
}

void Optimizer::refresh_packed_weights() {
  written_.clear();
  for (const auto& g : groups_)
    for (const auto& [name, p] : g.params) {
      written_.push_back(p);
      if (const auto it = copies_.find(name); it != copies_.end()) written_.push_back(it->second);
    }
  athanor::detail::refresh_packed_weights(written_);
}

void Optimizer::scale_grads_in_next_step(double coef) {
  ATH_CHECK(coef > 0 && std::isfinite(coef), "optimizer", "the gradient scale must be finite and > 0, got ", coef);
  grad_scale_ = coef;
}

void Optimizer::zero_grad() {
  for (auto& g : groups_)
    for (auto& [name, p] : g.params) p.set_grad(Tensor());
}

Tensor& Optimizer::state(const std::string& param, const std::string& name, const Tensor& like) {
  Tensor& t = state_[param][name];
  if (!t.defined()) {
    const DType dt = like.dtype() == DType::f64 ? DType::f64 : DType::f32;
    t = zeros(like.sizes(), TensorOptions(dt).with_device(like.device()).with_tag(MemTag::optimizer_state));
  }
  return t;
}

void Optimizer::for_each_param(const std::function<void(ParamGroup&, const std::string&, Tensor&, const Tensor&)>& fn) {
  NoGradGuard ng;
  for (auto& g : groups_)
    for (auto& [name, p] : g.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      ATH_CHECK(grad.sizes() == p.sizes() && grad.dtype() == p.dtype() && grad.is_contiguous() && p.is_contiguous(),
                "optimizer", "gradient of '", name, "' ", grad.describe(), " does not fit the parameter ", p.describe(),
                Hint{"gradients must have the parameter's shape and dtype"});
      ATH_CHECK(grad.device() == p.device(), "optimizer", "gradient of '", name, "' is on ", grad.device().str(),
                " but the parameter is on ", p.device().str(), Hint{"gradients live on their parameter's device"});
      if (!p.device().is_cpu())
        ATH_CHECK(steps_on_cuda() && p.dtype() == DType::f32, "optimizer",
                  "not yet supported on cuda: the ", this->name(), " optimizer over '", name, "' ", p.describe(),
                  Hint{"on cuda use adamw, adam or sgd over f32 parameters, or train on the CPU"});
      if (grad_scale_ != 1.0 && !(folds_grad_scale() && p.dtype() == DType::f32)) {
        detail::scale_gradient(grad, grad_scale_);  // as clip_grad_norm scales it
        grad.bump_version();
      }
      fn(g, name, p, grad);
      p.bump_version();
      if (!writes_copies_in_pass()) cast_into_copy(name, p);  // a cast after the update (one more read of p)
    }
  grad_scale_ = 1.0;  // one step's
}

NamedTensors Optimizer::state_tensors() const {
  NamedTensors out;
  for (const auto& g : groups_)
    for (const auto& [name, p] : g.params) {
      auto it = state_.find(name);
      if (it == state_.end()) continue;
      for (const auto& [sname, t] : it->second) out.emplace_back(sname + "." + name, t);
    }
  return out;
}

int64_t Optimizer::steps() const {
  pull_device_steps();
  return steps_;
}

void Optimizer::set_device_guard(const Tensor& skip, const Tensor& grad_scale) {
  if (!skip.defined()) {
    pull_device_steps();
    device_steps_.clear();
    guard_skip_ = Tensor();
    guard_scale_ = Tensor();
    return;
  }
  ATH_CHECK(steps_on_cuda(), "optimizer", "the ", name(), " optimizer has no device step guard",
            Hint{"the step guard is for adamw, adam and sgd over CUDA parameters"});
  ATH_CHECK(!skip.device().is_cpu() && skip.dtype() == DType::f32 && skip.numel() == 1 && grad_scale.defined() &&
                grad_scale.device() == skip.device() && grad_scale.dtype() == DType::f64 && grad_scale.numel() == 1 &&
                skip.is_contiguous() && grad_scale.is_contiguous(),
            "optimizer", "the device step guard takes skip (f32, 1 element) and grad_scale (f64, 1 element) on one CUDA "
            "device, got ", skip.describe(), " and ", grad_scale.defined() ? grad_scale.describe() : std::string("undefined"),
            Hint{"make them with optim::detail::step_guard_on_device's outputs"});
  guard_skip_ = skip;
  guard_scale_ = grad_scale;
}

const float* Optimizer::guard_skip() const {
  return guard_skip_.defined() ? static_cast<const float*>(guard_skip_.device_data()) : nullptr;
}
const double* Optimizer::guard_grad_scale() const {
  return guard_scale_.defined() ? static_cast<const double*>(guard_scale_.device_data()) : nullptr;
}

double* Optimizer::device_step(const std::string& name, const Tensor& like) {
  if (!guard_skip_.defined() || like.device().is_cpu()) return nullptr;
  ATH_CHECK(like.device() == guard_skip_.device(), "optimizer", "parameter '", name, "' is on ", like.device().str(),
            " but the step guard on ", guard_skip_.device().str(), Hint{"one device per optimizer"});
  Tensor& t = device_steps_[name];
  if (!t.defined())
    t = full({1}, static_cast<double>(param_steps_[name]),
             TensorOptions(DType::f64).with_device(like.device()).with_tag(MemTag::other));
  double* p = static_cast<double*>(t.device_data());
  stepped_.push_back(p);
  return p;
}

void Optimizer::advance_device_steps(int device) {
  if (!guard_skip_.defined()) return;
  Tensor& total = device_steps_[""];
  if (!total.defined())
    total = full({1}, static_cast<double>(steps_), TensorOptions(DType::f64).with_device(guard_skip_.device()).with_tag(MemTag::other));
  stepped_.push_back(static_cast<double*>(total.device_data()));
  detail::advance_steps_on_device(device, stepped_, guard_skip());
  stepped_.clear();
}

void Optimizer::pull_device_steps() const {
  for (const auto& [name, t] : device_steps_) {
    const auto n = static_cast<int64_t>(t.item<double>());
    if (name.empty()) steps_ = n;
    else param_steps_[name] = n;
  }
}

std::map<std::string, double> Optimizer::state_scalars() const {
  pull_device_steps();
  std::map<std::string, double> out{{"steps", static_cast<double>(steps_)}};
  for (const auto& [name, n] : param_steps_) out["step." + name] = static_cast<double>(n);
  for (const auto& g : groups_) out["lr." + g.name] = g.lr;
  return out;
}

void Optimizer::load_state(const NamedTensors& tensors, const std::map<std::string, double>& scalars) {
  std::map<std::string, const Tensor*> params;
  for (const auto& g : groups_)
    for (const auto& [name, p] : g.params) params[name] = &p;
  // Validate everything first so that a bad checkpoint changes nothing.
  for (const auto& [key, t] : tensors) {
    const auto dot = key.find('.');
    ATH_CHECK(dot != std::string::npos, "optimizer.load_state", "state key '", key, "' is not '<state>.<parameter>'");
    const std::string pname = key.substr(dot + 1);
    auto it = params.find(pname);
    ATH_CHECK(it != params.end(), "optimizer.load_state", "state '", key, "' names parameter '", pname,
              "' which this optimizer does not have", Hint{"the checkpoint was saved from a different model"});
    ATH_CHECK(t.sizes() == it->second->sizes(), "optimizer.load_state", "state '", key, "' has shape ",
              shape_str(t.sizes()), " but parameter '", pname, "' is ", it->second->describe());
  }
  for (const auto& [key, t] : tensors) {
    const auto dot = key.find('.');
    const std::string pname = key.substr(dot + 1);
    Tensor& dst = state(pname, key.substr(0, dot), *params[pname]);
    dst.copy_(t);
  }
  for (const auto& [k, v] : scalars) {
    if (k == "steps") steps_ = static_cast<int64_t>(v);
    else if (k.rfind("step.", 0) == 0) param_steps_[k.substr(5)] = static_cast<int64_t>(v);
    else if (k.rfind("lr.", 0) == 0)
      for (auto& g : groups_)
        if (g.name == k.substr(3)) g.lr = v;
  }
  for (auto& [name, t] : device_steps_)  // a guarded optimizer counts on the device
    t.fill_(static_cast<double>(name.empty() ? steps_ : param_steps_[name]));
}

}  // namespace athanor::optim
