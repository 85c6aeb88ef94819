#include "athanor/nn/mlp.h"

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
    h = layer->run_forward(h, [layer](const Tensor& in) { return layer->forward(in); });
  }
  return h;
}

std::vector<std::string> MLP::shard_units() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < layers->size(); ++i)
    if (std::dynamic_pointer_cast<Linear>((*layers)[i])) out.push_back("layers." + std::to_string(i));
  return out;
}

}  // namespace athanor::nn
