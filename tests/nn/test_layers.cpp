// Layers: shapes, names, init ranges, train/eval behaviour, and that each layer
// computes the same as its functional op.
#include <cmath>
#include <stdexcept>

#include "athanor/nn/convnet.h"
#include "athanor/ops.h"
#include "athanor/nn/layers.h"
#include "athanor/nn/mlp.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

TEST(Layers, LinearInitRangeAndForward) {
  manual_seed(3);
  nn::Linear l(100, 7);
  const double bound = 1.0 / std::sqrt(100.0);
  double mx = 0;
  for (double v : l.weight.to_vector()) mx = std::max(mx, std::fabs(v));
  EXPECT_LE(mx, bound);
  EXPECT_GT(mx, 0.9 * bound);  // actually spread over the range
  Tensor x = randn({4, 100});
  EXPECT_CLOSE(l.forward(x), linear(x, l.weight, l.bias), 0, 0);
  nn::Linear nb(3, 2, /*bias=*/false);
  EXPECT_FALSE(nb.bias.defined());
  EXPECT_EQ(nb.named_parameters().size(), 1u);
}

TEST(Layers, EmbeddingPaddingRowIsZeroAndGetsNoGradient) {
  nn::Embedding e(10, 4, /*padding_idx=*/0);
  EXPECT_EQ(make_view(e.weight, {4}, {1}, 0).to_vector(), std::vector<double>(4, 0.0));
  Tensor ids = from_vector(std::vector<int64_t>{0, 3, 0, 5}, {2, 2});
  Tensor out = e.forward(ids);
  EXPECT_EQ(out.sizes(), (Shape{2, 2, 4}));
  sum(out).backward();
  EXPECT_EQ(make_view(e.weight.grad(), {4}, {1}, 0).to_vector(), std::vector<double>(4, 0.0));
  EXPECT_EQ(make_view(e.weight.grad(), {4}, {1}, 12).to_vector(), std::vector<double>(4, 1.0));
}

TEST(Layers, BatchNormTracksRunningStatsOnlyInTraining) {
  auto bn = nn::BatchNorm1d(3);
  Tensor x = randn({16, 3});
  bn->forward(x);
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 1);
  const auto rm = bn->running_mean.to_vector();
  EXPECT_NE(rm[0], 0.0);
  bn->eval();
  Tensor y = bn->forward(x);
  EXPECT_EQ(bn->running_mean.to_vector(), rm);  // unchanged in eval
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 1);
  std::vector<std::string> bufs;
  for (auto& [n, b] : bn->named_buffers()) bufs.push_back(n);
  EXPECT_EQ(bufs, (std::vector<std::string>{"running_mean", "running_var", "num_batches_tracked"}));
  EXPECT_NE(error_message([&] { nn::BatchNorm2d(3)->forward(zeros({2, 3})); }).find("4-D"), std::string::npos);
}

// A reducer that doubles its input stands for two processes that hold the same
// rows: the statistics must then be those of the local kernel over the batch
// concatenated with itself (M = 2N in the unbiased running variance), the input
// gradient that of the first half, and the parameter gradients half of the reference's
// (the other "process" contributes the other half).
TEST(Layers, BatchNormWithAStatsReducerEqualsTheLocalKernelOnTheReducedBatch) {
  for (const Shape& shape : {Shape{4, 3}, Shape{3, 2, 3, 2}}) {
    const int64_t dims = static_cast<int64_t>(shape.size()) == 2 ? 2 : 4;
    nn::BatchNorm ref(shape[1], dims, 1e-5, 0.3), reduced(shape[1], dims, 1e-5, 0.3);
    ref.to(DType::f64);
    reduced.to(DType::f64);
    reduced.set_batch_stats_reducer([](const Tensor& t) { return mul(t, 2.0); });
    EXPECT_TRUE(reduced.has_batch_stats_reducer());
    for (int it = 0; it < 2; ++it) {
      Tensor x = randn64(shape, 10 + it, true);
      Tensor G = randn64(shape, 20 + it, false);
      Tensor xx = cat({x.detach(), x.detach()}, 0);
      xx.requires_grad_(true);
      Tensor Y = ref.forward(xx);
      sum(mul(Y, cat({G, G}, 0))).backward();
      Tensor y = reduced.forward(x);
      sum(mul(y, G)).backward();
      EXPECT_CLOSE(y, narrow(Y, 0, 0, shape[0]), 1e-12, 1e-10) << "output, step " << it;
      EXPECT_CLOSE(x.grad(), narrow(xx.grad(), 0, 0, shape[0]), 1e-12, 1e-10) << "input grad, step " << it;
      EXPECT_CLOSE(mul(reduced.weight.grad(), 2.0), ref.weight.grad(), 1e-12, 1e-10) << "weight grad, step " << it;
      EXPECT_CLOSE(mul(reduced.bias.grad(), 2.0), ref.bias.grad(), 1e-12, 1e-10) << "bias grad, step " << it;
      EXPECT_CLOSE(reduced.running_mean, ref.running_mean, 1e-12, 1e-10) << "running_mean, step " << it;
      EXPECT_CLOSE(reduced.running_var, ref.running_var, 1e-12, 1e-10) << "running_var, step " << it;
      ref.zero_grad();
      reduced.zero_grad();
    }
    EXPECT_EQ(reduced.num_batches_tracked.item<int64_t>(), 2);
    ref.eval();
    reduced.eval();  // eval: running statistics; the reducer is not called
    reduced.set_batch_stats_reducer([](const Tensor&) -> Tensor { throw std::runtime_error("reducer called in eval"); });
    Tensor z = randn64(shape, 30, false);
    EXPECT_CLOSE(reduced.forward(z), ref.forward(z), 1e-12, 1e-10);
  }
  nn::BatchNorm bad(3, 2);
  bad.set_batch_stats_reducer([](const Tensor&) { return zeros({2}); });
  const std::string msg = error_message([&] { bad.forward(randn({4, 3})); });
  EXPECT_NE(msg.find("reducer"), std::string::npos) << msg;
  EXPECT_NE(error_message([&] { nn::BatchNorm1d(3)->forward(zeros({4, 5})); }).find("5 channels"), std::string::npos);
}

TEST(Layers, DropoutIsIdentityInEval) {
  nn::Dropout d(0.5);
  Tensor x = ones({1000});
  const auto train_out = d.forward(x).to_vector();
  int zeros_seen = 0;
  for (double v : train_out) zeros_seen += v == 0.0;
  EXPECT_GT(zeros_seen, 400);
  EXPECT_LT(zeros_seen, 600);
  d.eval();
  EXPECT_EQ(d.forward(x).to_vector(), x.to_vector());
}

TEST(Layers, SequentialNamesChildrenByIndex) {
  nn::Sequential s({std::make_shared<nn::Linear>(4, 8), nn::make_activation("gelu_tanh"), std::make_shared<nn::Linear>(8, 2)});
  std::vector<std::string> names;
  for (auto& [n, p] : s.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_EQ(s.forward(zeros({5, 4})).sizes(), (Shape{5, 2}));
  EXPECT_NE(error_message([] { nn::make_activation("rellu"); }).find("relu, tanh"), std::string::npos);
}

TEST(Layers, MlpAndConvNetShapesAndNames) {
  nn::MLP mlp({784, 64, 10});
  EXPECT_EQ(mlp.forward(zeros({3, 1, 28, 28})).sizes(), (Shape{3, 10}));  // flattens images
  EXPECT_EQ(mlp.named_parameters()[0].first, "layers.0.weight");
  EXPECT_EQ(mlp.parameters_count(), 784 * 64 + 64 + 64 * 10 + 10);
  nn::ConvNet cnn({.channels1 = 4, .channels2 = 8, .hidden = 16});
  Tensor logits = cnn.forward(randn({2, 1, 28, 28}));
  EXPECT_EQ(logits.sizes(), (Shape{2, 10}));
  sum(logits).backward();
  for (auto& [n, p] : cnn.named_parameters()) EXPECT_TRUE(p.grad().defined()) << n;
  const std::string msg = error_message([&] { cnn.forward(zeros({2, 3, 28, 28})); });
  EXPECT_NE(msg.find("[2, 3, 28, 28]"), std::string::npos) << msg;
}

TEST(Layers, ModuleToF64ConvertsParametersInPlace) {
  nn::MLP mlp({3, 4, 2}, "tanh");
  Tensor w = mlp.layers->named_parameters()[0].second;
  mlp.to(DType::f64);
  EXPECT_EQ(w.dtype(), DType::f64);  // the same handle sees the conversion
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& x) { return mlp.forward(x[0]); }, {randn64({5, 3}, 1)}));
}

}  // namespace athanor
