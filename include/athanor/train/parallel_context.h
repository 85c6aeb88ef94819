#pragma once
// The Trainer's parallel context: which processes take part in a run and how they are laid
// out (dist.*), the groups a step talks over, and the mapping between this rank's tensors
// and the logical (1-process) ones that checkpoints, model.safetensors and load_weights hold.
//
//  - one process (dist.backend none, or not started by mpirun/srun with > 1 process): every
//    group is absent, every reduction the identity;
//  - data parallel: the world is the dp group;
//  - dist.tp and/or dist.pp > 1: the ranks form a DeviceMesh dp x tp x pp (tp fastest, then
//    dp, then pp); "the ranks" of a reduction are the dp group's, the tp ranks of a dp group
//    see the same micro-batches, and so do the pp ranks (each uses its part: the first stage
//    the token ids, the last the targets).
// The configuration is checked (check_config) before any work, on every rank alike: a wrong
// layout is an Error naming the keys, the numbers and what to do.
//
// Tensors: local(logical) keeps the tensors this rank holds (its pipeline stage's) and cuts
// out its tensor-parallel shard; logical(local) gathers the shards over tp (a collective);
// gather_stages() brings every stage's logical tensors to the first stage (collectives over
// pp); checkpoint_part() is this rank's part of a sharded checkpoint file: its stage's
// tensors but not the copies another stage writes (the last stage's tied embedding), tp
// shards as slices, replicated tensors from tp rank 0 only.
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "athanor/ckpt/checkpoint.h"
#include "athanor/data/dataloader.h"
#include "athanor/dist/process_group.h"
#include "athanor/dist/shard_spec.h"
#include "athanor/nn/module.h"
#include "athanor/train/config.h"

namespace athanor::dist {
class DeviceMesh;
class ProcessGroup;
}  // namespace athanor::dist

namespace athanor::train {

class ParallelContext {
 public:
  // Checks dist.* (and the keys they constrain) against each other; no MPI, no files.
  static void check_config(const Config& c);
  // Initialises MPI when the run is distributed, builds the mesh and groups (collectives).
  explicit ParallelContext(const Config& c);
  ~ParallelContext();

  bool distributed() const { return world_group_ != nullptr; }
  int rank() const { return rank_; }  // in the world
  int world_size() const { return world_; }
  int zero_stage() const { return zero_stage_; }
  int dp_rank() const { return dp_rank_; }
  int dp_size() const { return dp_size_; }
  int tp_size() const { return tp_; }
  int pp_size() const { return pp_; }
  int pp_rank() const { return pp_rank_; }
  bool first_stage() const { return pp_rank_ == 0; }
  bool last_stage() const { return pp_rank_ == pp_ - 1; }
  const std::shared_ptr<dist::ProcessGroup>& world() const { return world_group_; }  // null in one process
  const std::shared_ptr<dist::ProcessGroup>& dp_group() const { return dp_group_; }
  const std::shared_ptr<dist::ProcessGroup>& tp_group() const { return tp_group_; }
  const std::shared_ptr<dist::ProcessGroup>& pp_group() const { return pp_group_; }
  const dist::DeviceMesh* mesh() const { return mesh_.get(); }
  std::string describe() const;  // "dp 2 x tp 2 x pp 2 (world 8)", "1 process"

  // The device this rank trains on, and its groups' backend for CUDA tensors (dist.backend;
  // collectives: every rank calls it once, before the model is wrapped). trainer.device 'cuda'
  // without an index puts each process of a launch on its own GPU of the host (local rank mod
  // GPUs); with nccl every group gets a communicator on that device. CPU: unchanged, mpi.
  Device bind_device(Device requested, const Config& c);
  dist::Backend backend() const { return backend_; }

  // Reductions for metrics (the identity in one process).
  double sum_over_dp(double v) const;        // exact, in rank order: every rank gets the same bits
  double from_last_stage(double v) const;    // the last pipeline stage's value, on every stage
  bool any_rank(bool v) const;               // over the world
  void barrier() const;
  // This rank's share of the training data's epoch order (per dp rank; null in one process).
  std::shared_ptr<data::Sampler> train_sampler(int64_t n, uint64_t seed) const;

  // The model's layout, for the tensor conversions below: how its parameters are split over
  // tp (null: not split) and which names another stage writes.
  void bind_model(nn::Module& model);
  const dist::ShardSpecs* tp_specs() const { return tp_ > 1 ? &specs_ : nullptr; }
  const std::set<std::string>& duplicates() const { return duplicates_; }
  nn::StateDict local(const nn::StateDict& logical, bool optimizer_keys) const;
  nn::StateDict logical(const nn::StateDict& local) const;       // a collective over tp
  nn::StateDict gather_stages(const nn::StateDict& logical) const;  // collectives over pp; complete on the first stage
  ckpt::TensorFile checkpoint_part(const std::string& prefix, const nn::StateDict& local, bool optimizer_keys,
                                   const std::map<std::string, std::string>& meta) const;
  // Per-parameter optimizer scalars ("step.<param>") of every stage, on every rank (collectives over pp).
  std::map<std::string, double> merge_over_stages(const std::map<std::string, double>& mine) const;

  // Test hook: ATHANOR_TEST_KILL_RANK=r ATHANOR_TEST_KILL_STEP=s make rank r send itself
  // SIGKILL in step s (after its backward, before the gradient wait).
  void maybe_kill_for_test(int64_t step) const;

 private:
  int rank_ = 0, world_ = 1, zero_stage_ = 0, dp_rank_ = 0, dp_size_ = 1, tp_ = 1, pp_ = 1, pp_rank_ = 0;
  std::shared_ptr<dist::ProcessGroup> world_group_, dp_group_, tp_group_, pp_group_;
  std::unique_ptr<dist::DeviceMesh> mesh_;
  std::set<std::string> held_;        // the parameter and buffer names this rank's model holds
  std::set<std::string> duplicates_;  // held here, written by another stage
  dist::ShardSpecs specs_;
  bool bound_ = false;
  dist::Backend backend_ = dist::Backend::mpi;
};

}  // namespace athanor::train
