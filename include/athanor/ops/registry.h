#pragma once
// The op registry: every differentiable op is one OpDef, the live C++ form of PyTorch's
// derivatives.yaml. An entry holds
//  - the op's name and the names of its inputs;
//  - a forward kernel per device and, beside it, the backward for that device (the CUDA
//    slot is filled from src/ops/cuda/ when the registry is built in a CUDA build);
//  - the naive reference kernel the fast one is tested against;
//  - the autocast category (an enum, read by the dispatch point, never looked up by name);
//  - the inputs the op harness feeds it (athanor/ops/op_harness.h): several shapes, with
//    broadcasting and non-contiguous strides where the op takes them, and the dtypes the
//    op supports.
//
// The functional API (layer_norm(x, ...), linear(...)) keeps its PyTorch-like signatures;
// each function packs its non-tensor arguments into the op's argument struct and calls
// the one dispatch point, call_op(), which
//   1. picks the device from the inputs (inputs on different devices are an Error that
//      names the op and every input's device);
//   2. applies autocast by the op's category;
//   3. opens the profiler span (the core observer hook, athanor/core/observer.h);
//   4. runs the device's forward kernel, then anomaly mode's checks of its outputs;
//   5. records the autograd node, whose backward is the device's backward kernel fed the
//      state the forward saved (OpCall::save).
// A kernel does none of these itself: it validates its arguments, computes, and saves what
// its backward needs.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "athanor/autograd/node.h"
#include "athanor/core/error.h"
#include "athanor/core/tensor.h"

namespace athanor {

enum class AutocastCategory : uint8_t {
  lower_precision,  // runs in bf16/f16 under autocast (GEMM-bound: matmul, linear, conv2d, attention)
  f32,              // computed in f32 under autocast (softmax, norms, losses, reductions, exp/log)
  promote,          // the kernel promotes its operands to the widest dtype (binary elementwise ops, where)
  passthrough       // keeps the input's dtype (views, indexing, activations, casts)
};
const char* autocast_category_name(AutocastCategory c);

class OpCall;

// What a forward saves for its backward (PyTorch's ctx): each op derives its own struct.
struct OpSaved {
  virtual ~OpSaved() = default;
  template <class S> const S& as() const {
    const S* s = dynamic_cast<const S*>(this);
    ATH_ASSERT(s != nullptr);
    return *s;
  }
};

// A device's forward: computes the outputs of one call (OpCall::in are the inputs after
// autocast) and saves what the backward needs. A backward maps the outputs' gradients to one
// gradient per input (undefined where needs_grad(node, i) is false).
using ForwardFn = std::vector<Tensor> (*)(OpCall& call);
using BackwardFn = std::vector<Tensor> (*)(const Node& node, const std::vector<Tensor>& grads, const OpSaved& saved);

struct OpKernels {
  ForwardFn forward = nullptr;
  BackwardFn backward = nullptr;
};

inline constexpr std::size_t kDeviceTypes = 2;  // DeviceType::cpu, DeviceType::cuda
inline std::size_t device_slot(DeviceType t) { return static_cast<std::size_t>(t); }
const char* device_type_name(DeviceType t);

struct OpCase;
using CasesFn = std::vector<OpCase> (*)(int scale);

struct OpDef {
  std::string name;
  std::vector<std::string> inputs;  // input names in call order ("tensors" for cat's list)
  std::optional<AutocastCategory> category;
  // Under autocast, bit i set: an f32-category op's kernel reads input i in bf16/f16 itself
  // (f32 math and output, the gradient in the input's dtype) instead of getting an f32 copy.
  uint32_t reads_lowp = 0;
  // Under bf16 autocast, bit i set: an f32 input i (a parameter) reaches the kernel as its bf16
  // copy but the node records the f32 tensor, and the backward writes its gradient in f32
  // from the f32 accumulators (linear-shaped ops: no bf16 dW, no cast-back pass).
  uint32_t f32_master = 0;
  // Indexed by device_slot(). The CUDA slot is filled once, when op_registry() is first
  // built (src/ops/cuda/cuda_kernels.h): mutable so that the op files stay free of CUDA.
  mutable std::array<OpKernels, kDeviceTypes> kernels;
  ForwardFn reference = nullptr;                // naive CPU kernel (cpu::ref::), any dtype the op takes
  std::vector<DType> dtypes;                    // the floating dtypes the op computes in
  CasesFn cases = nullptr;                      // the harness's inputs (op_harness.h)
  std::string derivative;                       // the backward's formula, in brief (athanor ops)
  std::string file;                             // where forward and backward live

  bool has_kernel(DeviceType t) const { return kernels[device_slot(t)].forward != nullptr; }
};

// Every registered op, in the order `athanor ops` prints them.
const std::vector<const OpDef*>& op_registry();
const OpDef* find_op(std::string_view name);

// Public functions of the functional API that are not ops of their own: each is built
// from registered ops (reshape: view, or clone + view) or computes no gradient (eq,
// argmax). A test holds the public headers against the registry and this list.
struct ApiFunction {
  std::string name;
  std::string built_from;  // registered ops, comma-separated; empty: no gradient
};
const std::vector<ApiFunction>& api_functions();

// One call of an op, as its kernels see it.
class OpCall {
 public:
  OpCall(const OpDef& op, std::vector<Tensor> inputs, const void* args, const std::type_info& args_type);

  const OpDef& op() const { return *op_; }
  const char* name() const { return op_->name.c_str(); }
  Device device() const { return device_; }
  std::size_t size() const { return in_.size(); }
  const Tensor& in(std::size_t i) const { return in_[i]; }
  const std::vector<Tensor>& inputs() const { return in_; }
  // The node's input i: in(i), or the f32 parameter whose bf16 copy in(i) is (OpDef::f32_master).
  const Tensor& recorded(std::size_t i) const { return recorded_.empty() ? in_[i] : recorded_[i]; }
  const std::vector<Tensor>& recorded_inputs() const { return recorded_.empty() ? in_ : recorded_; }
  bool runs_on_master(std::size_t i) const { return !recorded_.empty() && !recorded_[i].is_same(in_[i]); }
  template <class A> const A& args() const {
    ATH_ASSERT(*args_type_ == typeid(A));
    return *static_cast<const A*>(args_);
  }
  // The region's dtype when this call runs under autocast.
  std::optional<DType> autocast() const { return autocast_; }
  // A node will be recorded: grad mode is on and some recorded input requires grad.
  bool records() const { return records_; }
  // Recorded input i requires grad (and grad mode is on).
  bool requires_grad(std::size_t i) const;
  // The state the backward gets; made on the first call. Only meaningful when records().
  template <class S> S& save() {
    if (!saved_) saved_ = std::make_shared<S>();
    S* s = dynamic_cast<S*>(saved_.get());
    ATH_ASSERT(s != nullptr);
    return *s;
  }
  // Outputs that carry no gradient (a cast to an integer dtype): no node is recorded.
  void set_differentiable(bool d) { differentiable_ = d; }

 private:
  friend std::vector<Tensor> dispatch(const OpDef&, std::vector<Tensor>, const void*, const std::type_info&);
  friend struct OpCallAccess;
  const OpDef* op_;
  std::vector<Tensor> in_, recorded_;  // recorded_ empty: the same as in_
  const void* args_;
  const std::type_info* args_type_;
  Device device_;
  std::optional<DType> autocast_;
  bool records_ = false;
  bool differentiable_ = true;
  std::shared_ptr<OpSaved> saved_;
};

struct NoArgs {};

// The dispatch point (see the file comment). args points at the op's argument struct.
std::vector<Tensor> dispatch(const OpDef& op, std::vector<Tensor> inputs, const void* args, const std::type_info& args_type);

template <class A = NoArgs> Tensor call_op(const OpDef& op, std::vector<Tensor> inputs, const A& args = {}) {
  return dispatch(op, std::move(inputs), &args, typeid(A))[0];
}
template <class A = NoArgs> std::vector<Tensor> call_op_multi(const OpDef& op, std::vector<Tensor> inputs, const A& args = {}) {
  return dispatch(op, std::move(inputs), &args, typeid(A));
}

// The reference kernel of `op` on these inputs (no autocast, no autograd, CPU).
std::vector<Tensor> run_reference(const OpDef& op, const std::vector<Tensor>& inputs, const void* args,
                                  const std::type_info& args_type);

}  // namespace athanor
