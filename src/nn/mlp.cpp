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
  return layers->forward(x.dim() > 2 ? flatten(x, 1) : x);
}

}  // namespace athanor::nn
