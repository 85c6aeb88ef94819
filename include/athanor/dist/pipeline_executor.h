#pragma once
// The pipeline executor: runs this rank's action list (pipeline_schedule.h) for one training
// step: forwards and backwards of its model chunks, and the transfers between stages over the
// pp group. Every schedule runs through it.
//
//   dist::PipelineExecutor ex(mesh.pp(), dist::ScheduleKind::one_f_one_b, /*m=*/8);
//   dist::PipelineCallbacks cb;
//   cb.forward = [&](int chunk, int mb, const Tensor& input) { return model.forward_chunk(chunk, input, …); };
//   cb.activation_shape = [&](int mb) { return model.activation_shape(B, T); };
//   auto stats = ex.run(cb);      // every parameter's .grad now holds the step's gradient
//
// Forward of (mb, chunk): its input is the received activation as a fresh leaf that requires
// grad (undefined on virtual stage 0); what forward returns is sent to the next virtual stage,
// or, on the last virtual stage, is the loss the backward starts from (a scalar the callback
// has already weighted and scaled). Backward of (mb, chunk) starts from the received gradient
// of that output and leaves the input's gradient to send back; both are then dropped.
// backward_input / backward_weight (zero_bubble) split it (autograd/engine.h: backward_input
// defers the gradients of callbacks.weights to the weight pass).
//
// Transfers (non-blocking MPI over the pp group; tag = the receiving virtual stage, direction
// and micro-batch, so no two transfers can be confused):
//  - a send is posted (MPI_Isend) and never waited for inline: the executor pushes it for at
//    most 1 ms (MPI moves data only while a rank is inside MPI, and some transports need the
//    sender's help: a receiver that is already waiting gets it now, not one action later),
//    checks the pending sends between actions and waits for the rest at the end of the step.
//    Since no send blocks,
//    a rank can only wait at a receive, and a schedule whose lists simulate() runs without a
//    deadlock cannot deadlock here, whatever order the ranks post their transfers in;
//  - the receives a compute action needs are posted before the previous compute action
//    starts, so a transfer overlaps that computation (and Open MPI progresses it whenever this
//    rank enters MPI: testing sends, posting receives);
//  - every wait has the pp group's timeout (dist.timeout_s): a transfer that does not complete
//    in time aborts every rank with a message naming this stage, the micro-batch, the chunk,
//    what was transferred and the peer stage and world rank (process_group.h).
//
// Gradient reduction: callbacks.set_grad_sync(true) is called before the last action of each
// chunk that accumulates weight gradients (the last backward, or the last backward_weight),
// false before the others, so a DDP wrapper reduces each gradient once per step.
//
// Clocks: each compute action's start and end, in seconds since this rank's step start (the
// end of a barrier over the pp group, so the ranks' clocks start together), go into the
// stats' timeline; the bubble is 1 - busy / step time, with the step time the longest of
// the pp ranks (one all-reduce at the end of the step).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "athanor/core/tensor.h"
#include "athanor/dist/pipeline_schedule.h"
#include "athanor/dist/process_group.h"

namespace athanor::dist {

struct PipelineCallbacks {
  std::function<Tensor(int chunk, int mb, const Tensor& input)> forward;
  // The shape of micro-batch mb's activation between chunks (receive buffers).
  std::function<Shape(int mb)> activation_shape;
  DType activation_dtype = DType::f32;
  // Optional: see "Gradient reduction" above.
  std::function<void(bool sync)> set_grad_sync;
  // zero_bubble: the tensors whose gradients the weight pass computes (the model's parameters).
  std::vector<Tensor> weights;
  // Optional test hook: called before each action with its index in the list.
  std::function<void(std::size_t index, const Action& a)> before_action;
};

struct TimelineEvent {
  ActionKind kind;
  int mb = 0, chunk = 0;
  double start = 0, end = 0;  // seconds since the step start
};

struct PipelineStats {
  std::vector<TimelineEvent> timeline;  // this rank's compute actions
  double busy = 0;                      // seconds computing
  double recv_wait = 0;                 // seconds waiting for receives
  double span = 0;                      // this rank's step: start to its last action's end
  double step = 0;                      // the longest span of the pp ranks
  double bubble = 0;                    // this rank's 1 - busy / step
  double mean_bubble = 0;               // over the pp ranks
  int peak_in_flight = 0;               // chunk micro-batches forwarded and not done with
};

class PipelineExecutor {
 public:
  // pp: the pipeline's group (its rank = this rank's stage). Errors (check_schedule) before any work.
  PipelineExecutor(std::shared_ptr<ProcessGroup> pp, ScheduleKind kind, int micro_batches, int virtual_stages = 1);
  ScheduleKind kind() const { return kind_; }
  int micro_batches() const { return m_; }
  const std::vector<Action>& actions() const { return actions_; }
  PipelineStats run(const PipelineCallbacks& callbacks);

 private:
  std::shared_ptr<ProcessGroup> pp_;
  ScheduleKind kind_;
  int m_, v_;
  std::vector<Action> actions_;
};

}  // namespace athanor::dist
