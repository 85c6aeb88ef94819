#pragma once
// SyncBatchNorm: BatchNorm whose training-mode batch statistics are those of the
// whole data-parallel batch (every rank's rows), as if one process normalised
// the concatenated batch.
//
//   auto bn = std::make_shared<dist::SyncBatchNorm>(64, 4, mesh.dp());   // as BatchNorm2d(64)
//   dist::convert_sync_batchnorm(*model, mesh.dp());   // see its limitation below
//
// Forward (training): mean = all_reduce(Σx) / M, var = all_reduce(Σ(x − mean)²) / M
// over the N·H·W… positions of all ranks (M of them); two passes rather than
// E[x²] − mean², so the variance is as accurate as the 1-process kernel's. The
// all-reduces are differentiable (backward all-reduces the incoming gradient
// sums), so input, weight and bias gradients equal those of 1-process
// BatchNorm over the concatenated batch for the summed per-rank losses. Running
// statistics are updated like BatchNorm (unbiased variance, momentum), with
// the global statistics, so they stay identical on every rank. Eval mode uses the
// running statistics and no communication.
//
// Every rank of the group must run forward and backward of each SyncBatchNorm
// the same number of times, in the same order (the collectives must match).
#include <memory>

#include "athanor/dist/process_group.h"
#include "athanor/nn/layers.h"

namespace athanor::dist {

class SyncBatchNorm : public nn::BatchNorm {
 public:
  SyncBatchNorm(int64_t num_features, int64_t expected_dims, std::shared_ptr<ProcessGroup> group, double eps = 1e-5,
                double momentum = 0.1);
  // A SyncBatchNorm with bn's hyper-parameters and copies of its parameters and buffers (dtype kept).
  SyncBatchNorm(const nn::BatchNorm& bn, std::shared_ptr<ProcessGroup> group);
  Tensor forward(const Tensor& x) override;
  ProcessGroup& group() { return *group_; }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

// Sum over the group, differentiable: backward all-reduces (sums) the gradient.
Tensor all_reduce_sum_with_grad(const Tensor& x, const std::shared_ptr<ProcessGroup>& group);

// Replaces every nn::BatchNorm below `root` in the module registry by a
// SyncBatchNorm over `group` (parameters and running statistics copied), keeping
// the state-dict names. Returns how many were replaced.
// LIMITATION: a parent whose forward() calls its BatchNorm through a typed member
// (std::shared_ptr<nn::BatchNorm> bn) keeps calling the old layer, and an
// nn::Sequential keeps its own layer list (that case is an Error naming the
// layer). Until nn::BatchNorm can be switched to synchronised statistics in
// place, build models with dist::SyncBatchNorm layers where they must sync.
int convert_sync_batchnorm(nn::Module& root, const std::shared_ptr<ProcessGroup>& group);

}  // namespace athanor::dist
