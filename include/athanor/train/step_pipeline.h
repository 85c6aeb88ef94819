#pragma once
// How a training step turns its micro-batches into gradients, the first part of the step
// (DESIGN.md, "The training step"); the Trainer does the rest (unscale, clip, update):
//
//   step.forward_backward(batches, m);   // every micro-batch's forward and (scaled) backward
//   step.finish_backward(m);             // the gradients reduced and complete on every rank
//
// Two kinds:
//  - the micro-batch loop: for each micro-batch k, forward under autocast, then
//    scaler.scale(loss_k · n_k / N · dp).backward() (n_k counted targets, N over the step and
//    every dp rank; × dp since DDP averages); under data parallel all but the last backward run
//    under no_sync(), and finish_backward waits for the reductions still in flight;
//  - a pipeline schedule (dist.pp > 1): the micro-batches go through dist::PipelineExecutor
//    with the schedule dist.pp_schedule; the last stage weights and scales the loss exactly as
//    above, every stage's gradient reduction is synchronised once per chunk (the last action
//    that accumulates into it); finish_backward waits for the dp reductions, sums the tied
//    embedding's gradient between the first and the last stage, and hands the loss from the
//    last stage to every rank. Dropout masks are one process's (pipeline_gpt.h): the generator
//    ends the step where one process's would.
// Both add the step's token-weighted loss (this dp rank's share) and timings to m.
#include <memory>
#include <vector>

#include "athanor/amp/grad_scaler.h"
#include "athanor/autograd/function.h"
#include "athanor/data/dataloader.h"
#include "athanor/dist/pipeline_executor.h"
#include "athanor/observe/metrics.h"

namespace athanor::dist {
class DataParallel;
}

namespace athanor::train {

class Task;
class ParallelContext;

class StepPipeline {
 public:
  virtual ~StepPipeline() = default;
  virtual void forward_backward(const std::vector<data::Batch>& batches, observe::StepMetrics& m) = 0;
  virtual void finish_backward(observe::StepMetrics& m) = 0;
  // Adds the step's token-weighted loss to m.loss, read back from where the forward left it.
  // The micro-batch loop keeps each micro-batch's loss on the model's device and reads them
  // here, once per step, after the trainer's one host sync (the gradient norm): no micro-batch
  // waits for the device. A pipeline schedule has already added it (the loss crosses ranks).
  virtual void read_loss(observe::StepMetrics& m) { (void)m; }
  // The same sum left on the model's device, as a 1-element f32 tensor, without reading
  // anything (the guarded step's non-finite check; read_loss still reads the exact sum).
  // Undefined where the loss is not kept (a pipeline schedule).
  virtual Tensor loss_on_device() const { return Tensor(); }
  // The last step's per-action clocks on this rank (pipeline schedules; empty otherwise).
  virtual const std::vector<dist::TimelineEvent>& timeline() const;
  // An observer of the next step's first forward (per-layer activation statistics,
  // train/step_observer.h), for that forward_backward only. The micro-batch loop runs its
  // first micro-batch's forward under it; a pipeline schedule does not (its layers are
  // spread over the ranks).
  void observe_next_first_forward(ForwardObserver observer) { first_forward_observer_ = std::move(observer); }

 protected:
  ForwardObserver first_forward_observer_;
};

// What both kinds use; they keep the references.
struct StepParts {
  Task& task;
  dist::DataParallel* dp;  // null in one process
  GradScaler& scaler;
  DType precision;         // f32, or the autocast dtype
  int dp_size;
};

std::unique_ptr<StepPipeline> make_micro_batch_loop(StepParts parts);
// The task's module must be a dist::PipelineLM (dist::PipelineGPT or dist::PipelineLlama). Errors (schedule, micro-batches) before any work.
std::unique_ptr<StepPipeline> make_pipeline_schedule(StepParts parts, const ParallelContext& par, dist::ScheduleKind kind,
                                                     int micro_batches, int virtual_stages);

}  // namespace athanor::train
