#pragma once
// The Trainer's checkpoints (include/athanor/ckpt/checkpoint.h for the directory format):
// <run_dir>/checkpoints/step-NNNNNN/ with the model and optimizer tensors under logical
// (1-process) names, state.json (step, loader position in global samples, RNG state,
// scheduler step, optimizer scalars, the scaler, the model-shape config and its hash, the
// layout that saved it) and MANIFEST.json.
//
// Under data, tensor or pipeline parallelism every rank writes its own part
// (ParallelContext::checkpoint_part: its stage's tensors, its tp slices, its ZeRO shard) and
// rank 0 the indexes and state.json (ckpt/sharded_checkpoint.h); the per-parameter optimizer
// scalars of every stage are merged first. Restoring reads the logical tensors, whatever
// layout wrote them, and each rank keeps its part: a checkpoint saved at any (dp, tp, pp,
// ZeRO) layout resumes at any other, continuing as the uninterrupted run would (bitwise at
// the same layout). A config whose model shape differs, or whose optimizer type differs, is
// refused naming the keys; a loader position that is not a whole number of this layout's
// global micro-batches is refused naming the numbers.
#include <cstdint>
#include <functional>
#include <string>

#include "athanor/amp/grad_scaler.h"
#include "athanor/data/dataloader.h"
#include "athanor/optim/lr_schedule.h"
#include "athanor/optim/optimizer.h"
#include "athanor/train/config.h"

namespace athanor::dist {
class DataParallel;
}

namespace athanor::train {

class Task;
class ParallelContext;
class BatchFeed;

// The counters a checkpoint keeps besides the tensors.
struct TrainCounters {
  int64_t step = 0, skipped = 0, max_steps = 0;
  double lr_factor = 1.0;  // cumulative rollback lr multiplier
};

// What a checkpoint saves and restores, by reference (the Trainer owns them).
struct CheckpointParts {
  const Config& config;
  Task& task;
  dist::DataParallel* dp;       // null in one process
  optim::Optimizer* optimizer;  // the optimizer of a 1-process run (null under data parallel)
  optim::Optimizer& optim;      // the one in use (dp's or optimizer)
  optim::Scheduler& scheduler;
  GradScaler& scaler;
  BatchFeed& feed;  // the training loader behind it: its position excludes prefetched batches
  const ParallelContext& par;
};

// `latest` (ckpt/checkpoint.h) names the newest complete checkpoint. When it names one that
// is not in `checkpoints_dir` (deleted by hand, or copied from another run), a sentence
// saying so; "" when it is absent or names a directory that is there. Resuming goes on from
// the newest valid checkpoint either way; this is what tells the user `latest` was wrong.
std::string stale_latest_note(const std::string& checkpoints_dir);

class Checkpointer {
 public:
  Checkpointer(std::string checkpoints_dir, CheckpointParts parts);
  const std::string& dir() const { return dir_; }
  // Saves the state after `c.step` steps; returns the checkpoint directory. A collective.
  std::string save(const TrainCounters& c);
  // Verifies, then restores everything from `checkpoint_dir` (the generator too) and returns
  // its counters. A collective.
  TrainCounters restore(const std::string& checkpoint_dir);
  // verify_checkpoint (ckpt/checkpoint.h); distributed: the ranks split the hashing and agree.
  void verify(const std::string& checkpoint_dir) const;
  // The newest checkpoint that verifies ("" when none); damaged newer ones are reported to `skipped`.
  std::string latest_valid(const std::function<void(const std::string&)>& skipped) const;

 private:
  std::string dir_;
  CheckpointParts p_;
};

}  // namespace athanor::train
