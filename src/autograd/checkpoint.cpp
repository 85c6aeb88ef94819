// Activation checkpointing: forward without a tape, backward by recomputing
// with one and running a nested (reentrant) backward through it. See
// include/athanor/autograd/checkpoint.h for the contract.
// The replay runs at the precision the forward ran at (autocast on or off, its dtype):
// that state lives in core (athanor/core/precision.h), so autograd saves and restores it
// without reaching into the ops layer that sets it.
#include "athanor/autograd/checkpoint.h"

#include <memory>
#include <string>

#include "athanor/autograd/engine.h"
#include "athanor/autograd/function.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/core/error.h"
#include "athanor/core/rng.h"
#include "athanor/core/precision.h"

namespace athanor {
namespace {

// Puts the generator back to `restore_to` when the recompute ends (also on error).
class GeneratorRestore {
 public:
  GeneratorRestore(Generator& gen, GeneratorState restore_to) : gen_(gen), state_(restore_to) {}
  ~GeneratorRestore() { gen_.set_state(state_); }
  GeneratorRestore(const GeneratorRestore&) = delete;
  GeneratorRestore& operator=(const GeneratorRestore&) = delete;

 private:
  Generator& gen_;
  GeneratorState state_;
};

// Everything the backward needs to replay fn exactly as the forward ran it.
struct Replay {
  CheckpointFn fn;
  std::vector<SavedTensor> inputs;
  std::vector<bool> input_requires_grad;
  size_t num_real_inputs = 0;  // inputs.size() without the dummy (if any)
  GeneratorState rng;
  Precision precision;
  std::string module_path;
};

std::vector<Tensor> checkpoint_backward(const Replay& r, const Node& node, const std::vector<Tensor>& grad_outputs) {
  const size_t n_edges = node.next_edges.size();
  std::vector<Tensor> detached(r.num_real_inputs);
  for (size_t i = 0; i < r.num_real_inputs; ++i) {
    Tensor saved = r.inputs[i].unpack(node);  // raises if the input was modified in place since forward
    if (!saved.defined()) continue;
    detached[i] = saved.detach();
    if (r.input_requires_grad[i]) detached[i].requires_grad_(true);
  }

  std::vector<Tensor> outputs;
  {
    Generator& gen = default_generator();
    GeneratorRestore restore(gen, gen.state());  // the outer RNG stream is unaffected by the replay
    gen.set_state(r.rng);
    PrecisionScope precision(r.precision);
    std::unique_ptr<ModuleScope> path;
    if (!r.module_path.empty()) path = std::make_unique<ModuleScope>(r.module_path);  // nodes keep their module names
    EnableGradGuard grad_on;
    outputs = r.fn(detached);
  }
  ATH_CHECK(outputs.size() == node.output_meta.size(), "checkpoint",
            "the recomputation returned ", outputs.size(), " tensors but the forward returned ", node.output_meta.size(),
            Hint{"the function passed to checkpoint() must be deterministic: same inputs, same outputs"});

  std::vector<Tensor> roots, root_grads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& y = outputs[i];
    ATH_CHECK(y.defined() && y.sizes() == node.output_meta[i].sizes && y.dtype() == node.output_meta[i].dtype,
              "checkpoint", "recomputed output ", i, " is ", (y.defined() ? y.describe() : std::string("undefined")),
              " but the forward produced ", node.output_meta[i].str(),
              Hint{"the function passed to checkpoint() must be deterministic: same inputs, same outputs"});
    if (i < grad_outputs.size() && grad_outputs[i].defined() && y.requires_grad()) {
      roots.push_back(y);
      root_grads.push_back(grad_outputs[i]);
    }
  }
  if (!roots.empty()) backward(roots, root_grads);  // reentrant: parameters inside fn accumulate their .grad here

  std::vector<Tensor> grads(n_edges);  // the dummy's slot (if any) stays undefined
  for (size_t i = 0; i < r.num_real_inputs && i < n_edges; ++i)
    if (needs_grad(node, i) && detached[i].defined()) grads[i] = detached[i].grad();
  return grads;
}

}  // namespace

std::vector<Tensor> checkpoint(CheckpointFn fn, const std::vector<Tensor>& inputs) {
  ATH_CHECK(static_cast<bool>(fn), "checkpoint", "the function to checkpoint is empty",
            Hint{"pass a callable that maps the inputs to the outputs"});
  if (!grad_enabled()) return fn(inputs);  // nothing to record: e.g. evaluation, or inside an outer checkpoint's forward

  auto replay = std::make_shared<Replay>();
  replay->rng = default_generator().state();  // before fn draws anything
  replay->precision = current_precision();
  replay->module_path = current_module_path();
  replay->num_real_inputs = inputs.size();

  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;  // the point: fn's intermediates are not kept by the tape
    outputs = fn(inputs);
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    ATH_CHECK(outputs[i].defined(), "checkpoint", "output ", i, " of the checkpointed function is undefined",
              Hint{"return only defined tensors from the function passed to checkpoint()"});
    outputs[i] = outputs[i].detach();  // a fresh TensorImpl, so the node may own it even if fn returned an input
  }

  std::vector<Tensor> record_inputs = inputs;
  if (!any_requires_grad(inputs)) {
    // Parameters used inside fn may still need gradients (see the header): record against a dummy leaf.
    Tensor dummy = zeros({}, TensorOptions(DType::f32));
    dummy.requires_grad_(true);
    record_inputs.push_back(dummy);
  }
  for (const Tensor& t : inputs) {
    replay->inputs.emplace_back(t, "checkpoint input");
    replay->input_requires_grad.push_back(t.defined() && t.requires_grad());
  }
  replay->fn = std::move(fn);
  return record_multi("checkpoint", record_inputs, std::move(outputs),
                      [replay](const Node& node, const std::vector<Tensor>& grad_outputs) {
                        return checkpoint_backward(*replay, node, grad_outputs);
                      });
}

Tensor checkpoint(std::function<Tensor(const Tensor&)> fn, const Tensor& input) {
  ATH_CHECK(static_cast<bool>(fn), "checkpoint", "the function to checkpoint is empty",
            Hint{"pass a callable that maps the input to the output"});
  auto many = [fn = std::move(fn)](const std::vector<Tensor>& xs) { return std::vector<Tensor>{fn(xs[0])}; };
  return checkpoint(CheckpointFn(many), std::vector<Tensor>{input})[0];
}

}  // namespace athanor
