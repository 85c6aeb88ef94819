#include "athanor/nn/mlp.h"

#include <typeinfo>

#include "athanor/ops/linear_relu.h"
#include "athanor/ops/shape.h"

namespace athanor::nn {

MLP::MLP(std::vector<int64_t> sizes, const std::string& activation, double dropout) {
  ATH_CHECK(sizes.size() >= 2, "MLP", "needs at least {in, out} sizes, got ", sizes.size());
  layers = register_module("layers", std::make_shared<Sequential>());
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    layers->push_back(std::make_shared<Linear>(sizes[i], sizes[i + 1]));
    if (i + 2 < sizes.size()) {
      layers->push_back(make_activation(activation));
      if (dropout > 0) layers->push_back(std::make_shared<Dropout>(dropout));
    }
  }
}

Tensor MLP::forward(const Tensor& x) {
  auto scope = enter();
  Tensor h = x.dim() > 2 ? flatten(x, 1) : x;
  // The Sequential's loop, with each layer run through Module::run_forward so that a forward
  // interceptor (ZeRO-3 sharding of the Linear layers) can wrap it.
  auto seq_scope = layers->enter();
  for (size_t i = 0; i < layers->size(); ++i) {
    UnaryModule* layer = (*layers)[i].get();
    if (Linear* lin = fusable_linear_relu(i)) {
      // Linear then ReLU as one linear_relu op (no pre-activation tensor, one backward pass
      // for the mask and the bias gradient); the ReLU module, which holds no parameters, is
      // skipped. Still run through the Linear's run_forward so an interceptor wraps it.
      h = layer->run_forward(h, [lin](const Tensor& in) {
        auto scope = lin->enter();
        return linear_relu(in, lin->weight, lin->bias);
      });
      ++i;
      continue;
    }
    h = layer->run_forward(h, [layer](const Tensor& in) { return layer->forward(in); });
  }
  return h;
}

Linear* MLP::fusable_linear_relu(size_t i) const {
  if (i + 1 >= layers->size()) return nullptr;
  auto* lin = dynamic_cast<Linear*>((*layers)[i].get());
  const UnaryModule* next = (*layers)[i + 1].get();
  // Only a plain ReLU right after the Linear (a Dropout or any other layer in between keeps
  // them apart), and none that something else wraps.
  if (!lin || typeid(*next) != typeid(ReLU) || next->has_forward_interceptor()) return nullptr;
  return lin;
}

std::vector<std::string> MLP::shard_units() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < layers->size(); ++i)
    if (std::dynamic_pointer_cast<Linear>((*layers)[i])) out.push_back("layers." + std::to_string(i));
  return out;
}

}  // namespace athanor::nn
