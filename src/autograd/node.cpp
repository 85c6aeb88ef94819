#include "athanor/autograd/node.h"

#include "athanor/autograd/grad_mode.h"
#include "athanor/autograd/saved_tensor_hooks.h"
#include "athanor/core/error.h"
#include "athanor/core/storage.h"
#include "grad_buffer.h"

namespace athanor {
namespace {
std::atomic<uint64_t> g_sequence{0};
}

Node::Node(std::string name) : name_(std::move(name)), sequence_nr_(g_sequence.fetch_add(1)) {}

SavedTensor::SavedTensor(const Tensor& t, const char* what) : what_(what) {
  if (!t.defined()) return;
  if ((packed_ = pack_saved_tensor(t))) {  // a saved-tensor hook keeps its own form
    name_ = t.name();
    return;
  }
  data_ = t.detach();
  version_ = t.version();
  name_ = t.name();
}

Tensor SavedTensor::unpack(const Node& owner) const {
  ATH_CHECK(!owner.released(), owner.name(),
            "trying to backward through the graph a second time (its saved tensors were freed after the first backward)",
            Hint{"call backward(grad, /*retain_graph=*/true) the first time if you need to backward twice"});
  if (packed_) return packed_->unpack(owner);
  if (!data_.defined()) return data_;
  if (data_.version() != version_) {
    std::string which = name_.empty() ? std::string("'") + what_ + "'" : "'" + name_ + "' (saved as '" + what_ + "')";
    ATH_FAIL(owner.name(), "a tensor needed for the gradient of ", owner.name(), " has been modified by an in-place operation: ",
             which, " ", data_.describe(), " is at version ", data_.version(), "; expected version ", version_,
             Hint{"do not modify tensors in place between forward and backward; use an out-of-place op or clone() the tensor first"});
  }
  return data_;
}

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor>&& grads) {
  ATH_CHECK(!released_, name(),
            "trying to backward through the graph a second time (its saved tensors were freed after the first backward)",
            Hint{"call backward(grad, /*retain_graph=*/true) the first time if you need to backward twice"});
  return fn_(*this, grads);
}

void FunctionNode::release() {
  released_ = true;
  fn_ = nullptr;  // frees every saved tensor the closure captured
}

AccumulateGrad::AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf) : Node("AccumulateGrad"), leaf_(leaf) {
  output_meta.push_back({leaf->sizes, leaf->dtype});
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  auto impl = leaf_.lock();
  if (!impl || grads.empty() || !grads[0].defined()) return {};
  Tensor leaf(impl);
  Tensor g = std::move(grads[0]);  // the engine keeps no other handle: g may be adopted below
  if (impl->autograd)
    for (auto& [id, hook] : impl->autograd->hooks) {
      Tensor r = hook(g);
      if (r.defined()) g = r;
    }
  auto& meta = impl->meta();
  if (!meta.grad) {
    if (g.dtype() == leaf.dtype() && g.sizes() == leaf.sizes() && exclusively_owned(g)) {
      // Nobody else can see g's memory: it becomes .grad as is (no copy; accounted as a gradient).
      g.storage()->set_tag(MemTag::gradient);
      meta.grad = g.impl_ptr();
    } else {
      Tensor fresh = empty(leaf.sizes(), TensorOptions(leaf.dtype()).with_device(leaf.device()).with_tag(MemTag::gradient));
      copy_into(fresh, g);
      meta.grad = fresh.impl_ptr();
    }
  } else {
    Tensor acc(meta.grad);
    ATH_CHECK(acc.sizes() == leaf.sizes(), "AccumulateGrad", "existing .grad ", acc.describe(),
              " does not match the parameter ", leaf.describe(), Hint{"set .grad to a tensor of the parameter's shape, or zero_grad()"});
    add_into(acc, g);
  }
  if (impl->autograd)
    for (auto& [id, hook] : impl->autograd->post_accumulate_hooks) hook(leaf);
  return {};
}

bool AccumulateGrad::accumulate_rows(const std::vector<RowSparseGrad>& parts) {
  auto impl = leaf_.lock();
  if (!impl) return true;  // the leaf is gone: nothing to accumulate into (as apply)
  if (impl->autograd && !impl->autograd->hooks.empty()) return false;  // hooks see dense gradients
  auto& meta = impl->meta();
  if (!meta.grad) return false;
  Tensor leaf(impl), acc(meta.grad);
  if (acc.sizes() != leaf.sizes()) return false;  // apply raises the error with the full message
  for (const RowSparseGrad& p : parts)
    if (!rows_addable(acc, p)) return false;
  for (const RowSparseGrad& p : parts) add_rows_into(acc, p);
  if (impl->autograd)
    for (auto& [id, hook] : impl->autograd->post_accumulate_hooks) hook(leaf);
  return true;
}

std::shared_ptr<Node> grad_accumulator(const Tensor& t) {
  auto& meta = t.impl()->meta();
  ATH_ASSERT(!meta.grad_fn);
  if (auto n = meta.grad_accumulator.lock()) return n;
  auto n = std::make_shared<AccumulateGrad>(t.impl_ptr());
  meta.grad_accumulator = n;
  return n;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  const auto& meta = *t.impl()->autograd;
  if (meta.grad_fn) return {meta.grad_fn, meta.output_nr};
  return {grad_accumulator(t), 0};
}

}  // namespace athanor
