// Synchronised BatchNorm (contract in include/athanor/dist/sync_batch_norm.h):
// nn::BatchNorm does the arithmetic; this file supplies the differentiable
// all-reduce it uses as its batch statistics reducer.
#include "athanor/dist/sync_batch_norm.h"

#include "athanor/autograd/function.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/core/error.h"

namespace athanor::dist {

Tensor all_reduce_sum_with_grad(const Tensor& x, const std::shared_ptr<ProcessGroup>& group) {
  ATH_CHECK(group != nullptr, "all_reduce_sum_with_grad", "got no process group");
  Tensor out = x.detach().clone();
  group->all_reduce(out, ReduceOp::sum);
  // d(Σ_r x_r)/d x_r = 1 for every rank's output: the gradient of x is the sum of
  // the gradients that arrive at every rank's copy of the output.
  return record("all_reduce_sum", {x}, out, [group](const Node&, const Grads& g) {
    Tensor s = g[0].contiguous().clone();
    group->all_reduce(s, ReduceOp::sum);
    return Grads{s};
  });
}

namespace {
void synchronise(nn::BatchNorm& bn, std::shared_ptr<ProcessGroup> group) {
  bn.set_batch_stats_reducer([group = std::move(group)](const Tensor& t) { return all_reduce_sum_with_grad(t, group); });
}

int convert_tree(nn::Module& m, const std::shared_ptr<ProcessGroup>& group) {
  int converted = 0;
  if (auto* bn = dynamic_cast<nn::BatchNorm*>(&m)) {
    synchronise(*bn, group);
    ++converted;
  }
  for (auto& [name, child] : m.named_children()) converted += convert_tree(*child, group);
  return converted;
}
}  // namespace

SyncBatchNorm::SyncBatchNorm(int64_t num_features, int64_t dims, std::shared_ptr<ProcessGroup> group, double eps_,
                             double momentum_)
    : nn::BatchNorm(num_features, dims, eps_, momentum_), group_(std::move(group)) {
  ATH_CHECK(group_ != nullptr, "SyncBatchNorm", "got no process group",
            Hint{"pass dist::init_from_mpi() or a DeviceMesh's dp() group"});
  synchronise(*this, group_);
}

SyncBatchNorm::SyncBatchNorm(const nn::BatchNorm& bn, std::shared_ptr<ProcessGroup> group)
    : SyncBatchNorm(bn.weight.size(0), bn.expected_dims, std::move(group), bn.eps, bn.momentum) {
  NoGradGuard ng;
  if (weight.dtype() != bn.weight.dtype()) to(bn.weight.dtype());  // same dtype as the original, then the values
  weight.copy_(bn.weight);
  bias.copy_(bn.bias);
  running_mean.copy_(bn.running_mean);
  running_var.copy_(bn.running_var);
  num_batches_tracked.copy_(bn.num_batches_tracked);
  weight.requires_grad_(bn.weight.requires_grad());
  bias.requires_grad_(bn.bias.requires_grad());
}

int convert_sync_batchnorm(nn::Module& root, const std::shared_ptr<ProcessGroup>& group) {
  ATH_CHECK(group != nullptr, "convert_sync_batchnorm", "got no process group",
            Hint{"pass dist::world() or a DeviceMesh's dp() group"});
  return convert_tree(root, group);
}

}  // namespace athanor::dist
