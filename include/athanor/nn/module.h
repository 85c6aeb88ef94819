#pragma once
// nn::Module: a tree of named parameters, buffers and child modules.
//
//   class Block : public nn::Module {
//    public:
//     Block(int64_t d) {
//       fc = register_module("fc", std::make_shared<nn::Linear>(d, d));
//       scale = register_parameter("scale", ones({d}));
//     }
//     Tensor forward(const Tensor& x) {
//       auto scope = enter();        // errors and autograd nodes now name this module's path
//       return mul(fc->forward(x), scale);
//     }
//     std::shared_ptr<nn::Linear> fc;
//     Tensor scale;
//   };
//
// Names are hierarchical ("h.3.attn.c_attn.weight") and map 1:1 onto state-dict
// and safetensors keys. Parameters are tagged MemTag::parameter and named, so
// error messages and the doctor can say which one.
//
// Forward interceptors: a container runs a child through child->run_forward(x, fn)
// (GPT's block loop, MLP's layer loop do). Normally that is fn(x); a component that
// needs to wrap the child's forward without changing the model's tree (and so its
// parameter names), e.g. dist::DataParallel at ZeRO stage 3 (gather the child's
// parameters, run it under checkpoint(), release them), installs an interceptor on
// the child, which is then called as interceptor(x, fn) in place of fn(x).
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "athanor/core/error.h"
#include "athanor/core/tensor.h"

namespace athanor::nn {

using StateDict = std::vector<std::pair<std::string, Tensor>>;  // in registration order

class Module : public std::enable_shared_from_this<Module> {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // ---- traversal (hierarchical names, registration order)
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // Every module in the tree, this one first (with name "").
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules();
  int64_t parameters_count() const;  // number of scalar parameters

  // ---- mode
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // ---- state
  StateDict state_dict() const;  // parameters then buffers, per module, depth first
  // strict: every key must match a parameter/buffer of the same shape and every
  // parameter/buffer must be present; a failure lists all problems at once.
  // Values are copied into the existing tensors (dtype converted).
  void load_state_dict(const StateDict& state, bool strict = true);
  // As above (every name and shape checked), but entries `skip_copy` selects are not
  // copied: a sharded owner (ZeRO-3) loads only the tensors it holds.
  void load_state_dict(const StateDict& state, bool strict, const std::function<bool(const std::string&)>& skip_copy);
  void zero_grad();  // drops every parameter's .grad
  // Converts every floating parameter and buffer to `dtype` in place (every
  // handle to them sees the change, as with PyTorch's module.to()); drops grads.
  void to(DType dtype);
  // Moves every parameter and buffer (and each parameter's .grad) to `device` in place, as
  // PyTorch's module.to(device): every handle to them sees the device's storage, names, tags,
  // requires_grad and views are kept, and tensors that share a storage (tied weights) still
  // share one afterwards. Tensors already on `device` are untouched (on cpu, a cpu model: no
  // copy at all). Errors before any change when the device does not exist (no GPU, cuda:7,
  // a build without CUDA). Make the optimizer after the move: its state is created on each
  // parameter's device, and it keeps the parameters' handles, not their storages.
  void to(Device device);
  // The device of the first parameter (or buffer); cpu for a module without tensors.
  Device device() const;

  // The module's name within its parent ("" for a root), and its full path once
  // the tree is built (set by the parent on registration).
  const std::string& local_name() const { return local_name_; }
  // Pushes this module's name onto the module path for errors and autograd nodes.
  ModuleScope enter() const { return ModuleScope(local_name_); }

  // ---- forward interception (see the header comment)
  using ForwardFn = std::function<Tensor(const Tensor&)>;
  // Runs `forward` on x (possibly more than once: a checkpoint's recompute calls it again
  // in backward, so an interceptor that keeps it copies it).
  using ForwardInterceptor = std::function<Tensor(const Tensor& x, const ForwardFn& forward)>;
  // Installs (replaces) the interceptor; an empty one removes it.
  void set_forward_interceptor(ForwardInterceptor interceptor) { interceptor_ = std::move(interceptor); }
  bool has_forward_interceptor() const { return static_cast<bool>(interceptor_); }
  // forward(x), or interceptor(x, forward) when one is installed. `forward` must stay valid
  // until the backward is done (capture the module by pointer, no locals by reference).
  Tensor run_forward(const Tensor& x, const ForwardFn& forward) { return interceptor_ ? interceptor_(x, forward) : forward(x); }

 protected:
  Tensor& register_parameter(const std::string& name, Tensor value, bool requires_grad = true);
  Tensor& register_buffer(const std::string& name, Tensor value);
  template <class M> std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }
  // Replace a registered child (e.g. to convert layers); the old one is dropped.
  void replace_module(const std::string& name, std::shared_ptr<Module> module);

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name) const;
  void collect(const std::string& prefix, bool params, bool recurse, std::vector<std::pair<std::string, Tensor>>& out) const;

  bool training_ = true;
  std::string local_name_;
  ForwardInterceptor interceptor_;
  // std::map would reorder; registration order is part of the contract.
  std::vector<std::pair<std::string, Tensor>> params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace athanor::nn
