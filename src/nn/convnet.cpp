#include "athanor/nn/convnet.h"

namespace athanor::nn {

ConvNet::ConvNet(ConvNetConfig c) : config(c) {
  features = register_module("features", std::make_shared<Sequential>());
  features->push_back(std::make_shared<Conv2d>(c.in_channels, c.channels1, std::array<int64_t, 2>{3, 3},
                                               std::array<int64_t, 2>{1, 1}, std::array<int64_t, 2>{1, 1}));
  features->push_back(BatchNorm2d(c.channels1));
  features->push_back(std::make_shared<ReLU>());
  features->push_back(std::make_shared<MaxPool2d>(std::array<int64_t, 2>{2, 2}));
  features->push_back(std::make_shared<Conv2d>(c.channels1, c.channels2, std::array<int64_t, 2>{3, 3},
                                               std::array<int64_t, 2>{1, 1}, std::array<int64_t, 2>{1, 1}));
  features->push_back(BatchNorm2d(c.channels2));
  features->push_back(std::make_shared<ReLU>());
  features->push_back(std::make_shared<MaxPool2d>(std::array<int64_t, 2>{2, 2}));
  classifier = register_module("classifier", std::make_shared<Sequential>());
  classifier->push_back(std::make_shared<Flatten>());
  classifier->push_back(std::make_shared<Linear>(c.channels2 * 7 * 7, c.hidden));
  classifier->push_back(std::make_shared<ReLU>());
  if (c.dropout > 0) classifier->push_back(std::make_shared<Dropout>(c.dropout));
  classifier->push_back(std::make_shared<Linear>(c.hidden, c.num_classes));
}

Tensor ConvNet::forward(const Tensor& x) {
  auto scope = enter();
  ATH_CHECK(x.dim() == 4 && x.size(1) == config.in_channels && x.size(2) == 28 && x.size(3) == 28, "ConvNet",
            "expected images [N, ", config.in_channels, ", 28, 28], got ", x.describe());
  return classifier->forward(features->forward(x));
}

}  // namespace athanor::nn
