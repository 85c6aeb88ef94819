// The op dispatch point (athanor/ops/registry.h): device, autocast, profiler span,
// anomaly checks and the autograd node, for every op of the functional API.
#include <sstream>

#include "athanor/autograd/anomaly.h"
#include "athanor/autograd/backward_pass.h"
#include "athanor/autograd/function.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/core/observer.h"
#include "athanor/core/precision.h"
#include "athanor/ops/autocast.h"
#include "athanor/ops/registry.h"

namespace athanor {

const char* autocast_category_name(AutocastCategory c) {
  switch (c) {
    case AutocastCategory::lower_precision: return "lower_precision";
    case AutocastCategory::f32: return "f32";
    case AutocastCategory::promote: return "promote";
    case AutocastCategory::passthrough: return "passthrough";
  }
  return "?";
}

const char* device_type_name(DeviceType t) { return t == DeviceType::cpu ? "cpu" : "cuda"; }

OpCall::OpCall(const OpDef& op, std::vector<Tensor> inputs, const void* args, const std::type_info& args_type)
    : op_(&op), in_(std::move(inputs)), args_(args), args_type_(&args_type) {}

bool OpCall::requires_grad(std::size_t i) const {
  const Tensor& t = recorded(i);
  return records_ && t.defined() && t.requires_grad();
}

namespace {

std::string input_name(const OpDef& op, std::size_t i) {
  if (i < op.inputs.size()) return op.inputs[i];
  if (op.inputs.size() == 1) return op.inputs[0] + "[" + std::to_string(i) + "]";  // a list (cat's tensors)
  return "input " + std::to_string(i);
}

// The one device of the defined inputs (CPU when there are none).
Device common_device(const OpDef& op, const std::vector<Tensor>& in) {
  std::optional<Device> dev;
  bool mixed = false;
  for (const Tensor& t : in) {
    if (!t.defined()) continue;
    const Device d = t.device();
    if (!dev) dev = d;
    else if (!(*dev == d)) mixed = true;
  }
  if (mixed) {
    std::ostringstream o;
    o << "inputs are on different devices:";
    Device other = Device::cpu();
    for (std::size_t i = 0; i < in.size(); ++i)
      if (in[i].defined()) {
        o << (i ? ", " : " ") << input_name(op, i) << " on " << in[i].device().str();
        if (!in[i].device().is_cpu()) other = in[i].device();
      }
    const std::string first = in.empty() ? "x" : input_name(op, 0);
    ATH_FAIL(op.name, o.str(),
             Hint{"move every input of '" + op.name + "' to one device first, e.g. " + first + ".to(Device::" +
                  (other.is_cpu() ? std::string("cpu()") : "cuda(" + std::to_string(other.index) + ")") + ")"});
  }
  return dev.value_or(Device::cpu());
}

// Under bf16 autocast: does the f32-master rule (OpDef::f32_master) apply to this call? Every
// defined master input is f32 (at least one is defined), and every other floating input runs
// at bf16 under the category.
bool master_applies(const OpDef& op, const std::vector<Tensor>& in) {
  bool any = false;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const Tensor& t = in[i];
    if (!t.defined()) continue;
    if (i < 32 && (op.f32_master >> i & 1u)) {
      if (t.dtype() != DType::f32) return false;
      any = true;
    } else if (is_floating(t.dtype()) && autocast_target(*op.category, t.dtype(), DType::bf16) != DType::bf16) {
      return false;
    }
  }
  return any;
}

}  // namespace

std::vector<Tensor> dispatch(const OpDef& op, std::vector<Tensor> inputs, const void* args, const std::type_info& args_type) {
  ObservedOp span(op.name.c_str());  // the profiler's span: the casts below are part of the op's time
  OpCall call(op, std::move(inputs), args, args_type);

  // 1. The device.
  call.device_ = common_device(op, call.in_);
  if (!call.device_.is_cpu()) (void)op_registry();  // building it fills the CUDA slots (registry.h)
  const OpKernels& k = op.kernels[device_slot(call.device_.type)];
  ATH_CHECK(k.forward != nullptr, op.name, "has no ", device_type_name(call.device_.type), " kernel (input ",
            input_name(op, 0), " is on ", call.device_.str(), ")",
            Hint{"`athanor ops` lists the devices each op runs on; move the inputs with .to(Device::cpu())"});

  // 2. Autocast, by the op's category.
  if (const Precision p = current_precision(); p.autocast) {
    call.autocast_ = p.dtype;
    const AutocastCategory cat = *op.category;
    if (cat == AutocastCategory::lower_precision || cat == AutocastCategory::f32) {
      const bool master = op.f32_master != 0 && p.dtype == DType::bf16 && master_applies(op, call.in_);
      if (master) call.recorded_ = call.in_;
      for (std::size_t i = 0; i < call.in_.size(); ++i) {
        Tensor& t = call.in_[i];
        if (!t.defined() || !is_floating(t.dtype())) continue;
        const DType to = autocast_target(cat, t.dtype(), p.dtype);
        if (to == t.dtype()) continue;
        const bool bit = i < 32;
        if (cat == AutocastCategory::f32 && bit && (op.reads_lowp >> i & 1u)) continue;  // the kernel reads it as it is
        // A master input's bf16 copy is read, not differentiated: the node records the f32 tensor.
        t = autocast_cast(t, to);
        if (master && !(bit && (op.f32_master >> i & 1u))) call.recorded_[i] = t;
      }
    }
  }

  // 3. Does this call record a node?
  if (grad_enabled())
    for (const Tensor& t : call.recorded_inputs())
      if (t.defined() && t.requires_grad()) {
        call.records_ = true;
        break;
      }

  std::vector<Tensor> out = k.forward(call);

  // 4. Anomaly mode: the first op whose output is not finite raises, naming itself. Ops a
  // backward closure runs are its node's arithmetic: the engine checks the node's outputs
  // ("backward of '<node>'") instead (autograd/backward_pass.h).
  if (anomaly_mode_enabled() && !in_backward_apply())
    for (std::size_t i = 0; i < out.size(); ++i)
      check_finite("forward", op.name, call.recorded_inputs(), out[i], i, current_module_path());

  // The forward observer (the trainer's per-layer activation statistics), when one is set.
  notify_forward_observer(op.name.c_str(), out);

  // 5. The autograd node: the device's backward on what the forward saved.
  if (call.records_ && call.differentiable_) {
    ATH_CHECK(k.backward != nullptr, op.name, "has no ", device_type_name(call.device_.type), " backward",
              Hint{"run it under NoGradGuard, or register a backward for it"});
    out = attach_node(op.name.c_str(), call.recorded_inputs(), std::move(out),
                      [bw = k.backward, saved = std::move(call.saved_)](const Node& n, const std::vector<Tensor>& g) {
                        static const OpSaved none;
                        return bw(n, g, saved ? *saved : none);
                      });
  }
  return out;
}

std::vector<Tensor> run_reference(const OpDef& op, const std::vector<Tensor>& inputs, const void* args,
                                  const std::type_info& args_type) {
  ATH_CHECK(op.reference != nullptr, op.name, "has no reference kernel");
  NoGradGuard no_grad;
  OpCall call(op, inputs, args, args_type);
  return op.reference(call);
}

}  // namespace athanor
