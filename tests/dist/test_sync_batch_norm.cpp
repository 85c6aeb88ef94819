// SyncBatchNorm under `mpirun --oversubscribe -np 2|4`: N ranks with their own
// (uneven) batches equal one process running nn::BatchNorm over the concatenated
// batch — outputs, input/weight/bias gradients, running statistics — in f64.
#include <gtest/gtest.h>

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/rng.h"
#include "athanor/dist/process_group.h"
#include "athanor/dist/sync_batch_norm.h"
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

TEST(SyncBatchNorm, ConvertReplacesRegisteredBatchNormsAndRejectsSequential) {
  auto g = W();
  struct Net : nn::Module {
    Net() {
      register_module("norm", nn::BatchNorm1d(3));
      register_module("seq", std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::UnaryModule>>{}));
    }
  };
  auto net = std::make_shared<Net>();
  const auto names_before = net->state_dict();
  EXPECT_EQ(dist::convert_sync_batchnorm(*net, g), 1);
  bool found = false;
  for (auto& [name, m] : net->named_modules())
    if (name == "norm") found = std::dynamic_pointer_cast<dist::SyncBatchNorm>(m) != nullptr;
  EXPECT_TRUE(found);
  const auto names_after = net->state_dict();
  ASSERT_EQ(names_after.size(), names_before.size());
  for (std::size_t i = 0; i < names_after.size(); ++i) EXPECT_EQ(names_after[i].first, names_before[i].first);

  auto seq = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::UnaryModule>>{nn::BatchNorm1d(3)});
  const std::string msg = error_message([&] { dist::convert_sync_batchnorm(*seq, g); });
  EXPECT_NE(msg.find("'0'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Sequential"), std::string::npos) << msg;
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
