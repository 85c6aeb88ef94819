// Tensor's autograd methods (declared in core/tensor.h, defined here so that
// core does not depend on the tape).
#include "athanor/autograd/engine.h"
#include "athanor/autograd/node.h"
#include "athanor/core/error.h"
#include "grad_buffer.h"

namespace athanor {
namespace {
int next_hook_id() {
  static std::atomic<int> id{0};
  return ++id;
}
const std::string kEmpty;
const std::shared_ptr<Node> kNoNode;
}  // namespace

bool Tensor::requires_grad() const {
  const auto* m = impl()->autograd.get();
  return m && (m->requires_grad || m->grad_fn);
}

Tensor& Tensor::requires_grad_(bool r) {
  ATH_CHECK(defined(), "requires_grad_", "undefined tensor");
  ATH_CHECK(is_leaf(), "requires_grad_", "can only change requires_grad of leaf tensors; ", describe(), " was produced by ",
            grad_fn()->name(), Hint{"use detach() to get a leaf that shares the data"});
  ATH_CHECK(!r || is_floating(dtype()), "requires_grad_", "only floating-point tensors can require gradients, got ", describe());
  impl()->meta().requires_grad = r;
  return *this;
}

bool Tensor::is_leaf() const { return !impl()->autograd || !impl()->autograd->grad_fn; }
Tensor Tensor::grad() const {
  const auto* m = impl()->autograd.get();
  return m && m->grad ? Tensor(m->grad) : Tensor();
}
void Tensor::set_grad(const Tensor& g) const {
  ATH_CHECK(!g.defined() || g.sizes() == sizes(), "set_grad", "gradient ", g.describe(), " does not match tensor ", describe());
  impl()->meta().grad = g.defined() ? g.impl_ptr() : nullptr;
}
const std::shared_ptr<Node>& Tensor::grad_fn() const {
  const auto* m = impl()->autograd.get();
  return m ? m->grad_fn : kNoNode;
}
uint32_t Tensor::output_nr() const {
  const auto* m = impl()->autograd.get();
  return m ? m->output_nr : 0;
}
const std::string& Tensor::name() const {
  const auto* m = impl()->autograd.get();
  return m ? m->name : kEmpty;
}
Tensor& Tensor::set_name(const std::string& n) {
  impl()->meta().name = n;
  return *this;
}

void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  athanor::backward({*this}, {grad}, retain_graph);
}

int Tensor::register_hook(GradHook hook) {
  ATH_CHECK(requires_grad(), "register_hook", "cannot register a hook on a tensor that does not require grad (", describe(), ")");
  const int id = next_hook_id();
  auto& m = impl()->meta();
  if (m.grad_fn) m.grad_fn->pre_hooks.push_back({m.output_nr, {id, std::move(hook)}});
  else m.hooks.push_back({id, std::move(hook)});
  return id;
}

void Tensor::remove_hook(int handle) {
  auto& m = impl()->meta();
  std::erase_if(m.hooks, [&](auto& h) { return h.first == handle; });
  std::erase_if(m.post_accumulate_hooks, [&](auto& h) { return h.first == handle; });
  if (m.grad_fn) std::erase_if(m.grad_fn->pre_hooks, [&](auto& h) { return h.second.first == handle; });
}

int Tensor::register_post_accumulate_grad_hook(PostAccumulateHook hook) {
  ATH_CHECK(is_leaf() && requires_grad(), "register_post_accumulate_grad_hook",
            "only leaf tensors that require grad accumulate gradients; got ", describe());
  const int id = next_hook_id();
  impl()->meta().post_accumulate_hooks.push_back({id, std::move(hook)});
  return id;
}

void Tensor::retain_grad() {
  ATH_CHECK(requires_grad(), "retain_grad", "tensor ", describe(), " does not require grad");
  if (is_leaf()) return;  // leaves keep .grad anyway
  std::weak_ptr<TensorImpl> weak = impl_ptr();
  register_hook([weak](const Tensor& g) {
    if (auto p = weak.lock()) {
      auto& m = p->meta();
      if (!m.grad) {
        Tensor c = empty(g.sizes(), TensorOptions(g.dtype()).with_device(g.device()).with_tag(MemTag::gradient));
        copy_into(c, g);
        m.grad = c.impl_ptr();
      } else {
        Tensor acc(m.grad);
        add_into(acc, g);
      }
    }
    return Tensor();
  });
}

Tensor Tensor::detach() const {
  auto p = std::make_shared<TensorImpl>();
  p->storage = impl()->storage;
  p->sizes = impl()->sizes;
  p->strides = impl()->strides;
  p->offset = impl()->offset;
  p->dtype = impl()->dtype;
  return Tensor(std::move(p));
}

}  // namespace athanor
