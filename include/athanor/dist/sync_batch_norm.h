#pragma once
// Synchronised BatchNorm: training-mode batch statistics over the whole
// data-parallel batch (every rank's rows), as if one process normalised the
// concatenated batch.
//
//   dist::convert_sync_batchnorm(*model, mesh.dp());   // every nn::BatchNorm in the model, in place
//   auto bn = std::make_shared<dist::SyncBatchNorm>(64, 4, mesh.dp());   // or one layer, as BatchNorm2d(64)
//
// The arithmetic lives in nn::BatchNorm (include/athanor/nn/layers.h): with a
// batch statistics reducer installed it computes mean = Σx / M and
// var = Σ(x − mean)² / M from sums all-reduced over the group. The all-reduces
// are differentiable (backward all-reduces the incoming gradient sums), so input,
// weight and bias gradients equal those of 1-process BatchNorm over the
// concatenated batch for the summed per-rank losses. Running statistics are
// updated like BatchNorm (unbiased variance, momentum) with the global
// statistics, so they stay identical on every rank. Eval mode uses the running
// statistics and no communication.
//
// Every rank of the group must run forward and backward of each synchronised
// BatchNorm the same number of times, in the same order (the collectives must match).
#include <memory>

#include "athanor/dist/process_group.h"
#include "athanor/nn/layers.h"

namespace athanor::dist {

// An nn::BatchNorm born synchronised over `group`.
class SyncBatchNorm : public nn::BatchNorm {
 public:
  SyncBatchNorm(int64_t num_features, int64_t expected_dims, std::shared_ptr<ProcessGroup> group, double eps = 1e-5,
                double momentum = 0.1);
  // A SyncBatchNorm with bn's hyper-parameters and copies of its parameters and buffers (dtype kept).
  SyncBatchNorm(const nn::BatchNorm& bn, std::shared_ptr<ProcessGroup> group);
  ProcessGroup& group() { return *group_; }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

// Sum over the group, differentiable: backward all-reduces (sums) the gradient.
Tensor all_reduce_sum_with_grad(const Tensor& x, const std::shared_ptr<ProcessGroup>& group);

// Makes every nn::BatchNorm in `root` (root included) synchronise its batch
// statistics over `group`, in place: wherever the layer lives (a registered child,
// a typed member pointer, an nn::Sequential's layer list), the model keeps the same
// objects, names and state dict. Call it after the model is built and before a
// DataParallel wrapper takes it. Returns how many BatchNorms now synchronise over
// `group` (a layer already synchronised is switched to `group`).
int convert_sync_batchnorm(nn::Module& root, const std::shared_ptr<ProcessGroup>& group);

}  // namespace athanor::dist
