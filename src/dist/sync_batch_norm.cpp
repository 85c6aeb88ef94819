// SyncBatchNorm: BatchNorm over the whole data-parallel batch (contract in
// include/athanor/dist/sync_batch_norm.h). Built from differentiable ops plus one
// differentiable all-reduce, so its backward is the chain rule of the same graph.
#include "athanor/dist/sync_batch_norm.h"

#include <string>
#include <vector>

#include "athanor/autograd/function.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/core/error.h"
#include "athanor/ops/elementwise.h"
#include "athanor/ops/norm.h"
#include "athanor/ops/reduction.h"
#include "athanor/ops/shape.h"

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

SyncBatchNorm::SyncBatchNorm(int64_t num_features, int64_t dims, std::shared_ptr<ProcessGroup> group, double eps_,
                             double momentum_)
    : nn::BatchNorm(num_features, dims, eps_, momentum_), group_(std::move(group)) {
  ATH_CHECK(group_ != nullptr, "SyncBatchNorm", "got no process group",
            Hint{"pass dist::init_from_mpi() or a DeviceMesh's dp() group"});
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

Tensor SyncBatchNorm::forward(const Tensor& x) {
  auto scope = enter();
  if (expected_dims == 2) {
    ATH_CHECK(x.dim() == 2 || x.dim() == 3, "SyncBatchNorm1d", "expected a 2-D [N, C] or 3-D [N, C, L] input, got ",
              x.describe());
  } else {
    ATH_CHECK(x.dim() == 4, "SyncBatchNorm2d", "expected a 4-D [N, C, H, W] input, got ", x.describe());
  }
  const int64_t C = weight.size(0);
  ATH_CHECK(x.size(1) == C, "SyncBatchNorm", "input has ", x.size(1), " channels (dim 1) but the layer has ", C,
            "; input ", x.describe());
  if (!is_training()) return nn::BatchNorm::forward(x);  // running statistics, no communication
  num_batches_tracked.fill_(static_cast<double>(num_batches_tracked.item<int64_t>() + 1));

  std::vector<int64_t> dims{0};
  Shape bshape(x.dim(), 1);  // [1, C, 1, …] for broadcasting per-channel values
  bshape[1] = C;
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  // Positions per channel over all ranks (every rank may have its own batch size).
  Tensor count = from_vector(std::vector<double>{static_cast<double>(x.numel() / C)}, {1}, TensorOptions(DType::f64));
  group_->all_reduce(count, ReduceOp::sum);
  const double M = count.item();
  ATH_CHECK(M > 1, "SyncBatchNorm", "needs more than one value per channel over all ranks, got ", M, " for input ",
            x.describe());

  Tensor mean = div(all_reduce_sum_with_grad(sum(x, dims), group_), M);  // [C]
  Tensor centred = sub(x, mean.reshape(bshape));
  Tensor var = div(all_reduce_sum_with_grad(sum(square(centred), dims), group_), M);  // biased, [C]
  Tensor y = mul(centred, rsqrt(add(var, eps)).reshape(bshape));
  y = add(mul(y, weight.reshape(bshape)), bias.reshape(bshape));

  {
    NoGradGuard ng;  // running statistics as BatchNorm: unbiased variance, momentum
    running_mean.copy_(add(mul(running_mean, 1.0 - momentum), mul(mean.detach(), momentum)));
    running_var.copy_(add(mul(running_var, 1.0 - momentum), mul(var.detach(), momentum * M / (M - 1))));
  }
  return y;
}

namespace {
// Module::replace_module is protected; a member pointer formed through a derived
// class is the standard-conforming way to call it on any Module.
struct ModuleReplacer : nn::Module {
  static void replace(nn::Module& parent, const std::string& name, std::shared_ptr<nn::Module> m) {
    (parent.*(&ModuleReplacer::replace_module))(name, std::move(m));
  }
};

int convert_children(nn::Module& parent, const std::string& path, const std::shared_ptr<ProcessGroup>& group) {
  int replaced = 0;
  for (auto& [name, child] : parent.named_children()) {
    const std::string child_path = path.empty() ? name : path + "." + name;
    auto bn = std::dynamic_pointer_cast<nn::BatchNorm>(child);
    if (bn && !std::dynamic_pointer_cast<SyncBatchNorm>(child)) {
      ATH_CHECK(dynamic_cast<nn::Sequential*>(&parent) == nullptr, "convert_sync_batchnorm", "BatchNorm '", child_path,
                "' is held by an nn::Sequential, whose layer list cannot be replaced",
                Hint{"build that Sequential with dist::SyncBatchNorm layers directly"});
      ModuleReplacer::replace(parent, name, std::make_shared<SyncBatchNorm>(*bn, group));
      ++replaced;
    } else {
      replaced += convert_children(*child, child_path, group);
    }
  }
  return replaced;
}
}  // namespace

int convert_sync_batchnorm(nn::Module& root, const std::shared_ptr<ProcessGroup>& group) {
  ATH_CHECK(group != nullptr, "convert_sync_batchnorm", "got no process group");
  return convert_children(root, "", group);
}

}  // namespace athanor::dist
