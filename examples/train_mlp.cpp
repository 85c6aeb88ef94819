// Training with the C++ API and a hand-written loop, the way a PyTorch user
// would: a model, an optimizer, a data loader, forward, backward, step.
//
//   ./build/examples/train_mlp [epochs]
#include <cstdio>
#include <cstdlib>

#include "athanor/athanor.h"

using namespace athanor;

int main(int argc, char** argv) try {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 1;
  manual_seed(0);
  auto train_set = data::fashion_mnist(data::default_fashion_mnist_dir(), /*train=*/true);
  auto test_set = data::fashion_mnist(data::default_fashion_mnist_dir(), /*train=*/false);

  nn::MLP model({784, 256, 10});
  auto optimizer = optim::make_adamw(optim::default_param_groups(model.named_parameters(), /*lr=*/1e-3, /*weight_decay=*/0.01));
  data::DataLoader loader(train_set, {.batch_size = 64, .shuffle = true, .num_workers = 2, .seed = 0});

  for (int epoch = 0; epoch < epochs; ++epoch) {
    model.train();
    for (int64_t i = 0; i < loader.batches_per_epoch(); ++i) {
      data::Batch batch = loader.next();
      Tensor loss = cross_entropy(model.forward(batch.input), batch.target);
      optimizer->zero_grad();
      loss.backward();
      optimizer->step();
      if (i % 200 == 0) std::printf("epoch %d batch %4ld  loss %.4f\n", epoch, static_cast<long>(i), loss.item());
    }
    // Evaluate on the test set: no autograd, eval mode.
    model.eval();
    NoGradGuard no_grad;
    data::DataLoader test_loader(test_set, {.batch_size = 500, .shuffle = false, .drop_last = false, .num_workers = 2});
    int64_t correct = 0;
    for (int64_t i = 0; i < test_loader.batches_per_epoch(); ++i) {
      data::Batch b = test_loader.next();
      const auto pred = argmax(model.forward(b.input), 1).to_vector(), target = b.target.to_vector();
      for (size_t k = 0; k < pred.size(); ++k) correct += pred[k] == target[k];
    }
    std::printf("epoch %d: test accuracy %.2f%%\n", epoch, 100.0 * correct / test_set->size());
  }
  return 0;
} catch (const athanor::Error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
