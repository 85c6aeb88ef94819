#pragma once
#include <string>
#include <vector>

#include "athanor/nn/layers.h"

namespace athanor::nn {

// sizes = {in, hidden..., out}; activation between layers (not after the last);
// optional dropout after each activation. Input [N, ...] is flattened to [N, in].
// A Linear followed by a ReLU runs as the fused linear_relu op.
// Children: "layers" (a Sequential: "layers.0.weight", …).
class MLP : public UnaryModule {
 public:
  MLP(std::vector<int64_t> sizes, const std::string& activation = "relu", double dropout = 0.0);
  Tensor forward(const Tensor& x) override;
  // The ZeRO-3 sharding units (dist::DataParallelOptions::shard_modules): its Linear layers
  // "layers.<i>" (the activations and dropouts hold no parameters).
  std::vector<std::string> shard_units() const;
  std::shared_ptr<Sequential> layers;

 private:
  // layers[i] when it is a Linear followed by a plain ReLU, which forward() runs as one
  // linear_relu op (same parameters, same result); else null.
  Linear* fusable_linear_relu(size_t i) const;
};

}  // namespace athanor::nn
