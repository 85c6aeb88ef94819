#include "athanor/nn/module.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/device_hooks.h"

namespace athanor::nn {

void Module::check_new_name(const std::string& name) const {
  ATH_CHECK(!name.empty() && name.find('.') == std::string::npos, "Module", "invalid name '", name, "'",
            Hint{"names must be non-empty and contain no '.' (the path separator)"});
  auto taken = [&](const auto& v) { return std::any_of(v.begin(), v.end(), [&](const auto& p) { return p.first == name; }); };
  ATH_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), "Module", "name '", name, "' is already registered");
}

Tensor& Module::register_parameter(const std::string& name, Tensor value, bool requires_grad) {
  check_new_name(name);
  ATH_CHECK(value.defined(), "register_parameter", "parameter '", name, "' is undefined");
  ATH_CHECK(value.is_leaf(), "register_parameter", "parameter '", name, "' must be a leaf tensor",
            Hint{"register value.detach() and copy initial values into it"});
  value.storage()->set_tag(MemTag::parameter);
  if (requires_grad) value.requires_grad_(true);
  value.set_name(name);
  params_.emplace_back(name, value);
  return params_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor value) {
  check_new_name(name);
  buffers_.emplace_back(name, value);
  return buffers_.back().second;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name);
  ATH_CHECK(module != nullptr, "register_module", "module '", name, "' is null");
  module->local_name_ = name;
  children_.emplace_back(name, std::move(module));
}

void Module::replace_module(const std::string& name, std::shared_ptr<Module> module) {
  for (auto& [n, m] : children_)
    if (n == name) {
      module->local_name_ = name;
      m = std::move(module);
      return;
    }
  ATH_FAIL("replace_module", "no child module named '", name, "'");
}

void Module::collect(const std::string& prefix, bool params, bool recurse,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [n, t] : params ? params_ : buffers_) out.emplace_back(prefix + n, t);
  if (!recurse) return;
  for (const auto& [n, m] : children_) m->collect(prefix + n + ".", params, true, out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", true, recurse, out);
  // A tensor registered in two places (tied weights) is listed once, under its first name.
  std::vector<std::pair<std::string, Tensor>> unique;
  std::set<const TensorImpl*> seen;
  for (auto& p : out)
    if (seen.insert(p.second.impl()).second) unique.push_back(p);
  return unique;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", false, recurse, out);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const { return children_; }

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out{{"", shared_from_this()}};
  for (auto& [n, m] : children_)
    for (auto& [sub, mod] : m->named_modules()) out.emplace_back(sub.empty() ? n : n + "." + sub, mod);
  return out;
}

int64_t Module::parameters_count() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

StateDict Module::state_dict() const {
  StateDict out;
  std::vector<std::pair<std::string, Tensor>> params, bufs;
  collect("", true, true, params);  // tied weights appear under every name, as in PyTorch
  collect("", false, true, bufs);
  out = params;
  out.insert(out.end(), bufs.begin(), bufs.end());
  return out;
}

void Module::load_state_dict(const StateDict& state, bool strict) { load_state_dict(state, strict, nullptr); }

void Module::load_state_dict(const StateDict& state, bool strict, const std::function<bool(const std::string&)>& skip_copy) {
  StateDict mine = state_dict();
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> given;
  for (auto& [k, v] : state) given.insert(k);
  for (auto& [k, t] : mine) {
    if (!given.count(k)) missing.push_back(k);
  }
  std::vector<std::pair<Tensor, Tensor>> copies;
  for (auto& [k, v] : state) {
    auto it = std::find_if(mine.begin(), mine.end(), [&](auto& p) { return p.first == k; });
    if (it == mine.end()) { unexpected.push_back(k); continue; }
    if (it->second.sizes() != v.sizes()) {
      mismatched.push_back(k + ": checkpoint " + shape_str(v.sizes()) + " vs model " + shape_str(it->second.sizes()));
      continue;
    }
    if (!skip_copy || !skip_copy(k)) copies.emplace_back(it->second, v);
  }
  const bool fail = !mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty()));
  if (fail) {  // report everything at once, and change nothing
    std::ostringstream o;
    o << "the state dict does not match the model";
    auto list = [&](const char* what, const std::vector<std::string>& v) {
      if (v.empty()) return;
      o << "\n  " << what << " (" << v.size() << "):";
      for (auto& s : v) o << "\n    " << s;
    };
    list("missing keys", missing);
    list("unexpected keys", unexpected);
    list("shape mismatches", mismatched);
    ATH_FAIL("load_state_dict", o.str(),
             Hint{"check that the checkpoint was saved from the same model config; use strict=false to load a subset"});
  }
  NoGradGuard ng;
  for (auto& [dst, src] : copies) dst.copy_(src);
}

void Module::to(DType dtype) {
  ATH_CHECK(is_floating(dtype), "Module::to", "target dtype must be floating, got ", dtype_name(dtype));
  auto convert = [&](Tensor& t) {
    if (!t.defined() || !is_floating(t.dtype()) || t.dtype() == dtype) return;
    Tensor fresh = empty(t.sizes(), TensorOptions(dtype).with_tag(t.storage()->tag()));
    copy_into(fresh, t);
    TensorImpl* impl = t.impl();
    impl->storage = fresh.storage();
    impl->strides = fresh.strides();
    impl->offset = 0;
    impl->dtype = dtype;
    if (impl->autograd) impl->autograd->grad.reset();
  };
  for (auto& [n, t] : params_) convert(t);
  for (auto& [n, t] : buffers_) convert(t);
  for (auto& [n, m] : children_) m->to(dtype);
}

namespace {
// The bytes of `from` (a whole storage) in a new storage of the same size and tag on `to`.
std::shared_ptr<Storage> moved_storage(const Storage& from, Device to) {
  auto fresh = Storage::allocate(from.nbytes(), from.tag(), to);
  const std::size_t n = from.nbytes();
  if (n == 0) return fresh;
  const Device src = from.device();
  if (src.is_cpu()) {
    require_device_hooks(to, "Module::to").copy_to_device(fresh->data(), to.index, from.data(), n);
  } else if (to.is_cpu()) {
    require_device_hooks(src, "Module::to").copy_to_host(fresh->data(), from.data(), src.index, n);
  } else {
    ATH_CHECK(src.type == to.type, "Module::to", "moving a tensor from ", src.str(), " to ", to.str(),
              Hint{"move it to the cpu first"});
    require_device_hooks(to, "Module::to").copy_between(fresh->data(), to.index, from.data(), src.index, n);
  }
  return fresh;
}
}  // namespace

void Module::to(Device device) {
  if (!device.is_cpu()) require_device_hooks(device, "Module::to");  // no GPU, cuda:7: before any change
  // Every tensor to move: parameters, buffers and the parameters' gradients, each impl once.
  std::vector<TensorImpl*> impls;
  std::set<const TensorImpl*> seen;
  auto add = [&](const Tensor& t) {
    if (t.defined() && t.device() != device && seen.insert(t.impl()).second) impls.push_back(t.impl());
  };
  for (auto& [n, t] : state_dict()) {
    add(t);
    if (t.requires_grad()) add(t.grad());
  }
  // One new storage per old one: views and tied weights (two impls, one storage) stay shared,
  // with their sizes, strides and offsets unchanged.
  std::map<const Storage*, std::shared_ptr<Storage>> moved;
  for (TensorImpl* impl : impls) {
    auto& fresh = moved[impl->storage.get()];
    if (!fresh) fresh = moved_storage(*impl->storage, device);
  }
  for (TensorImpl* impl : impls) impl->storage = moved.at(impl->storage.get());
}

Device Module::device() const {
  for (auto& [n, t] : state_dict())
    if (t.defined()) return t.device();
  return Device::cpu();
}

void Module::zero_grad() {
  for (auto& [n, t] : named_parameters()) t.set_grad(Tensor());
}

}  // namespace athanor::nn
