#pragma once
#include "athanor/nn/layers.h"

namespace athanor::nn {

// A small CNN for [N, 1, 28, 28] images:
// conv3x3(1→c1)+BN+ReLU, maxpool2 → conv3x3(c1→c2)+BN+ReLU, maxpool2 → flatten →
// linear(c2*7*7 → hidden)+ReLU+dropout → linear(hidden → classes).
struct ConvNetConfig {
  int64_t in_channels = 1, channels1 = 32, channels2 = 64, hidden = 128, num_classes = 10;
  double dropout = 0.25;
};
class ConvNet : public UnaryModule {
 public:
  explicit ConvNet(ConvNetConfig config = {});
  Tensor forward(const Tensor& x) override;
  ConvNetConfig config;
  std::shared_ptr<Sequential> features, classifier;
};

}  // namespace athanor::nn
