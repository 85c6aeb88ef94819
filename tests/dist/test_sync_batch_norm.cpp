// SyncBatchNorm under `mpirun --oversubscribe -np 2|4`: N ranks with their own
// (uneven) batches equal one process running nn::BatchNorm over the concatenated
// batch — outputs, input/weight/bias gradients, running statistics — in f64; and
// convert_sync_batchnorm reaches every BatchNorm of a model in place (inside an
// nn::Sequential, behind a typed member) so a converted ConvNet on N ranks equals
// the 1-process model on the full batch, while the unconverted one does not.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/rng.h"
#include "athanor/dist/process_group.h"
#include "athanor/dist/sync_batch_norm.h"
#include "athanor/nn/convnet.h"
#include "athanor/ops/elementwise.h"
#include "athanor/ops/reduction.h"
#include "athanor/ops/shape.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {

std::shared_ptr<dist::ProcessGroup> W() { return dist::world(); }

// Rank r holds rows [row0(r), row0(r) + rows(r)) of the global batch; rows(r) = 2 + r (uneven).
int64_t rows_of(int r) { return 2 + r; }
int64_t row0_of(int r) {
  int64_t s = 0;
  for (int q = 0; q < r; ++q) s += rows_of(q);
  return s;
}

// f64 throughout; the two computations differ only in summation order.
constexpr double kAtol = 1e-12, kRtol = 1e-10;

void expect_equals_one_process(int64_t dims, const Shape& row_shape) {
  auto g = W();
  const int n = g->size(), r = g->rank();
  const int64_t C = row_shape[0], global = row0_of(n);
  Shape gshape{global};
  gshape.insert(gshape.end(), row_shape.begin(), row_shape.end());

  auto ref = std::make_shared<nn::BatchNorm>(C, dims, 1e-5, 0.3);
  ref->to(DType::f64);
  {
    NoGradGuard ng;  // non-trivial affine parameters
    ref->weight.copy_(uniform64({C}, 0.5, 1.5, 11, false));
    ref->bias.copy_(uniform64({C}, -0.5, 0.5, 12, false));
  }
  dist::SyncBatchNorm sync(*ref, g);
  EXPECT_EQ(sync.weight.dtype(), DType::f64);

  for (int it = 0; it < 2; ++it) {  // two steps: running statistics accumulate with momentum
    Tensor X = randn64(gshape, 100 + it, true);
    Tensor G = randn64(gshape, 200 + it, false);  // upstream gradient: loss = Σ y·G
    Tensor x = narrow(X.detach(), 0, row0_of(r), rows_of(r)).clone();
    x.requires_grad_(true);
    Tensor Gr = narrow(G, 0, row0_of(r), rows_of(r)).contiguous();

    Tensor Y = ref->forward(X);
    sum(mul(Y, G)).backward();
    Tensor y = sync.forward(x);
    sum(mul(y, Gr)).backward();

    EXPECT_CLOSE(y, narrow(Y, 0, row0_of(r), rows_of(r)), kAtol, kRtol) << "output, step " << it;
    EXPECT_CLOSE(x.grad(), narrow(X.grad(), 0, row0_of(r), rows_of(r)), kAtol, kRtol) << "input grad, step " << it;
    // the global loss is the sum of the per-rank losses: parameter grads sum over ranks
    Tensor gw = sync.weight.grad().clone(), gb = sync.bias.grad().clone();
    g->all_reduce(gw, dist::ReduceOp::sum);
    g->all_reduce(gb, dist::ReduceOp::sum);
    EXPECT_CLOSE(gw, ref->weight.grad(), kAtol, kRtol) << "weight grad, step " << it;
    EXPECT_CLOSE(gb, ref->bias.grad(), kAtol, kRtol) << "bias grad, step " << it;
    EXPECT_CLOSE(sync.running_mean, ref->running_mean, kAtol, kRtol) << "running_mean, step " << it;
    EXPECT_CLOSE(sync.running_var, ref->running_var, kAtol, kRtol) << "running_var, step " << it;
    EXPECT_EQ(sync.num_batches_tracked.item<int64_t>(), ref->num_batches_tracked.item<int64_t>());
    ref->zero_grad();
    sync.zero_grad();
  }
  // eval: running statistics, no communication, same as BatchNorm
  ref->eval();
  sync.eval();
  Tensor Z = randn64(gshape, 300, false);
  NoGradGuard ng;
  EXPECT_CLOSE(sync.forward(Z), ref->forward(Z), kAtol, kRtol) << "eval";
}

}  // namespace

TEST(SyncBatchNorm, BatchNorm1dOverRanksEqualsOneProcessOverTheConcatenatedBatch) {
  expect_equals_one_process(2, {3});
}
TEST(SyncBatchNorm, BatchNorm1dWithLengthEqualsOneProcess) { expect_equals_one_process(2, {3, 5}); }
TEST(SyncBatchNorm, BatchNorm2dOverRanksEqualsOneProcessOverTheConcatenatedBatch) {
  expect_equals_one_process(4, {4, 3, 2});
}

TEST(SyncBatchNorm, GradientOfTheDifferentiableAllReduceIsTheSumOfGradients) {
  auto g = W();
  const int n = g->size(), r = g->rank();
  Tensor x = from_vector(std::vector<double>{1.0 + r, 2.0 * r}, {2}, TensorOptions(DType::f64).with_requires_grad());
  Tensor s = dist::all_reduce_sum_with_grad(x, g);
  const double ranks = n * (n - 1) / 2.0;
  EXPECT_EQ(s.to_vector(), (std::vector<double>{n + ranks, 2 * ranks}));
  // loss_r = (r + 1) * s[0] + s[1]: d(Σ_r loss_r)/dx_r = [Σ (r+1), n]
  sum(mul(s, from_vector(std::vector<double>{r + 1.0, 1.0}, {2}, TensorOptions(DType::f64)))).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{ranks + n, double(n)}));
}

namespace {

// A ConvNet (two BatchNorm2d inside its `features` Sequential) followed by a
// BatchNorm1d that forward() calls through a typed member pointer.
struct NormedConvNet : nn::UnaryModule {
  NormedConvNet() {
    nn::ConvNetConfig c;
    c.channels1 = 3;
    c.channels2 = 4;
    c.hidden = 8;
    c.num_classes = 5;
    c.dropout = 0;  // dropout masks would differ between the ranks and the reference
    body = register_module("body", std::make_shared<nn::ConvNet>(c));
    head_norm = register_module("head_norm", nn::BatchNorm1d(5, 1e-5, 0.3));
  }
  Tensor forward(const Tensor& x) override { return head_norm->forward(body->forward(x)); }
  std::shared_ptr<nn::ConvNet> body;
  std::shared_ptr<nn::BatchNorm> head_norm;
};

std::shared_ptr<NormedConvNet> make_net() {
  manual_seed(7);  // the same initial weights on every rank and for every copy
  auto net = std::make_shared<NormedConvNet>();
  net->to(DType::f64);
  return net;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  double m = 0;
  for (std::size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// Deeper than one layer, so a little more summation-order slack than kAtol/kRtol.
constexpr double kNetAtol = 1e-10, kNetRtol = 1e-9;

}  // namespace

TEST(SyncBatchNorm, ConvertedConvNetOnRanksEqualsOneProcessOnTheFullBatch) {
  auto g = W();
  const int n = g->size(), r = g->rank();
  const int64_t global = row0_of(n), r0 = row0_of(r), rows = rows_of(r);

  auto ref = make_net();    // 1 process, the full batch
  auto sync = make_net();   // this rank's rows, converted
  auto local = make_net();  // this rank's rows, unconverted: must differ
  const auto names_before = sync->state_dict();
  const nn::BatchNorm* typed_before = sync->head_norm.get();
  EXPECT_EQ(dist::convert_sync_batchnorm(*sync, g), 3);  // features.1, features.5, head_norm
  // in place: the typed pointers, the names and the tensors are the ones from before
  EXPECT_EQ(sync->head_norm.get(), typed_before);
  EXPECT_TRUE(sync->head_norm->has_batch_stats_reducer());
  for (auto& [name, m] : sync->named_modules()) {
    if (auto bn = std::dynamic_pointer_cast<nn::BatchNorm>(m)) {
      EXPECT_TRUE(bn->has_batch_stats_reducer()) << name;
    }
  }
  const auto names_after = sync->state_dict();
  ASSERT_EQ(names_after.size(), names_before.size());
  for (std::size_t i = 0; i < names_after.size(); ++i) {
    EXPECT_EQ(names_after[i].first, names_before[i].first);
    EXPECT_EQ(names_after[i].second.raw_data(), names_before[i].second.raw_data()) << names_after[i].first;
  }

  double local_output_diff = 0, local_stats_diff = 0;
  for (int it = 0; it < 2; ++it) {  // two steps: running statistics accumulate with momentum
    Tensor X = randn64({global, 1, 28, 28}, 400 + it, true);
    Tensor G = randn64({global, 5}, 500 + it, false);  // upstream gradient: loss = Σ y·G
    Tensor x = narrow(X.detach(), 0, r0, rows).clone();
    x.requires_grad_(true);
    Tensor Gr = narrow(G, 0, r0, rows).contiguous();

    Tensor Y = ref->forward(X);
    sum(mul(Y, G)).backward();
    Tensor y = sync->forward(x);
    sum(mul(y, Gr)).backward();
    Tensor y_local = local->forward(x.detach());

    EXPECT_CLOSE(y, narrow(Y, 0, r0, rows), kNetAtol, kNetRtol) << "output, step " << it;
    EXPECT_CLOSE(x.grad(), narrow(X.grad(), 0, r0, rows), kNetAtol, kNetRtol) << "input grad, step " << it;
    const auto ref_params = ref->named_parameters(), sync_params = sync->named_parameters();
    ASSERT_EQ(ref_params.size(), sync_params.size());
    for (std::size_t i = 0; i < ref_params.size(); ++i) {
      Tensor gs = sync_params[i].second.grad().clone();  // the global loss sums the per-rank losses
      g->all_reduce(gs, dist::ReduceOp::sum);
      EXPECT_CLOSE(gs, ref_params[i].second.grad(), kNetAtol, kNetRtol) << sync_params[i].first << " grad, step " << it;
    }
    const auto ref_bufs = ref->named_buffers(), sync_bufs = sync->named_buffers(), local_bufs = local->named_buffers();
    ASSERT_EQ(ref_bufs.size(), sync_bufs.size());
    for (std::size_t i = 0; i < ref_bufs.size(); ++i) {
      EXPECT_CLOSE(sync_bufs[i].second, ref_bufs[i].second, kNetAtol, kNetRtol) << sync_bufs[i].first << ", step " << it;
      if (ref_bufs[i].first.find("running_") != std::string::npos)
        local_stats_diff = std::max(local_stats_diff, max_abs_diff(local_bufs[i].second, ref_bufs[i].second));
    }
    local_output_diff = std::max(local_output_diff, max_abs_diff(y_local, narrow(Y, 0, r0, rows)));
    ref->zero_grad();
    sync->zero_grad();
  }
  // Without conversion every BatchNorm normalises with this rank's rows only.
  EXPECT_GT(local_output_diff, 1e-3);
  EXPECT_GT(local_stats_diff, 1e-3);

  // eval: running statistics, no communication (ranks may even run different batch sizes)
  ref->eval();
  sync->eval();
  NoGradGuard ng;
  Tensor Z = randn64({rows, 1, 28, 28}, 600 + r, false);
  EXPECT_CLOSE(sync->forward(Z), ref->forward(Z), kNetAtol, kNetRtol) << "eval";
}

TEST(SyncBatchNorm, ConvertReachesSequentialLayersAndTheRoot) {
  auto g = W();
  auto bn = nn::BatchNorm1d(3);
  auto seq = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::UnaryModule>>{bn, std::make_shared<nn::ReLU>()});
  EXPECT_EQ(dist::convert_sync_batchnorm(*seq, g), 1);
  EXPECT_TRUE(bn->has_batch_stats_reducer());
  nn::BatchNorm root(3, 2);  // a BatchNorm that is itself the root (not owned by a shared_ptr)
  EXPECT_EQ(dist::convert_sync_batchnorm(root, g), 1);
  EXPECT_TRUE(root.has_batch_stats_reducer());
  const std::string msg = error_message([&] { dist::convert_sync_batchnorm(*seq, nullptr); });
  EXPECT_NE(msg.find("no process group"), std::string::npos) << msg;
}

TEST(SyncBatchNorm, WrongChannelCountIsAnErrorNamingShapes) {
  dist::SyncBatchNorm bn(3, 2, W());
  const std::string msg = error_message([&] { bn.forward(zeros({4, 5})); });
  EXPECT_NE(msg.find("5 channels"), std::string::npos) << msg;
}

}  // namespace athanor

int main(int argc, char** argv) {
  athanor::dist::init_from_mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  athanor::dist::finalize();
  return rc;
}
