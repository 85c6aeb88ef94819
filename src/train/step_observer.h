#pragma once
// What the trainer measures for the doctor and the per-layer views, beside the step's
// own metrics (observe/metrics.h):
//  - per layer, on layer-statistics steps (the logged steps, observe.layer_stats): the
//    gradient and weight norms, the update-to-weight ratio ||W_after - W_before||/||W_before||
//    (the weights are copied before the optimizer step, only on those steps), and the
//    statistics of each layer's forward output (through the autograd forward observer);
//  - every step: the statistics of floating inputs, per sample (a NaN or an outlier is
//    named by its dataset id before the step runs);
//  - on histogram steps (observe.histograms_every): weight and gradient histograms for
//    TensorBoard;
//  - once: the entropy of the training labels (the loss of a model that ignores its inputs),
//    written with the run's shape to run.json.
// Statistics are computed in double from the tensors' own dtype, outside autograd. A device
// tensor's statistics are computed on its device (athanor/ops/value_stats.h): only a few
// doubles per tensor come back, one read per list of tensors; the weights kept for the
// update ratio stay on the device.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "athanor/autograd/function.h"
#include "athanor/data/dataset.h"
#include "athanor/observe/metrics.h"
#include "athanor/optim/optimizer.h"

namespace athanor::dist {
class ProcessGroup;
}

namespace athanor::train {

class StepObserver {
 public:
  // log_every: the trainer's log interval; histograms_every: 0 = none; batch: samples per
  // micro-batch (a dead unit is judged over at least kDeadSamples samples).
  StepObserver(int64_t log_every, bool layer_stats, int64_t histograms_every, int64_t batch)
      : log_every_(std::max<int64_t>(1, log_every)), layer_stats_(layer_stats), histograms_every_(histograms_every),
        dead_window_(std::clamp<int64_t>((kDeadSamples + std::max<int64_t>(1, batch) - 1) / std::max<int64_t>(1, batch), 1,
                                         log_every_)) {}
  // A ReLU unit is dead when it is 0 for every one of this many samples: one batch of 32 is
  // too few (a unit that fires for 1 input in 100 looks dead in most batches).
  static constexpr int64_t kDeadSamples = 256;
  // Layer statistics on the logged steps (every log_every, the first and the last).
  bool stats_step(int64_t step, int64_t max_steps) const {
    return layer_stats_ && (step % log_every_ == 0 || step == 1 || step == max_steps);
  }
  // The steps just before a statistics step whose first micro-batch adds to the ReLU units'
  // alive record (dead_window_ steps, the statistics step included).
  bool dead_window_step(int64_t step, int64_t max_steps) const {
    if (!layer_stats_) return false;
    const int64_t next = std::min(max_steps, (step + log_every_ - 1) / log_every_ * log_every_);
    return stats_step(step, max_steps) || (next - step < dead_window_ && next >= step);
  }
  // The forward observer for a step: on statistics steps (`stats` non-null) every layer's
  // output statistics, the ReLU layers' dead fraction over the window; on window steps only
  // the ReLU units' alive record.
  ForwardObserver observer(std::vector<observe::ActivationStats>* stats);
  bool histogram_step(int64_t step, int64_t max_steps) const {
    return histograms_every_ > 0 && stats_step(step, max_steps) && (step % histograms_every_ == 0 || step == 1 || step == max_steps);
  }
  // Gradient and weight norms of every parameter; with `keep_weights`, a copy of the
  // weights for after_update's ratios; with `histograms`, their histograms into m.
  void before_update(const optim::NamedTensors& named, observe::StepMetrics& m, bool keep_weights, bool histograms);
  // The update-to-weight ratios of the step (after before_update with keep_weights).
  void after_update(const optim::NamedTensors& named, observe::StepMetrics& m);

 private:
  int64_t log_every_;
  bool layer_stats_;
  int64_t histograms_every_;
  int64_t dead_window_;
  std::vector<Tensor> before_;
  std::map<std::string, Tensor> alive_;  // per ReLU layer: unit fired in the window (u8, where the layer runs)
};

// Statistics of the step's floating inputs over all its micro-batches (present = false for
// integer inputs such as tokens).
observe::InputStats input_stats(const std::vector<data::Batch>& batches);
// A forward observer (autograd/function.h) that appends the statistics of each layer-like
// op's output (linear, conv2d, the activations and their fused forms) to `out`.
ForwardObserver activation_observer(std::vector<observe::ActivationStats>& out);
// Statistics of one output tensor; `op` decides the dead (ReLU) and saturation (sigmoid,
// tanh) fractions. Units are the last dim, or dim 1 of a 4-D (NCHW) output.
observe::ActivationStats activation_stats(const std::string& name, const std::string& op, const Tensor& y);
// L2 norm in double, of any floating dtype.
double l2_norm(const Tensor& t);
// The histogram of a tensor in TensorBoard's form, `buckets` equal buckets over [min, max].
observe::Histogram histogram(const std::string& tag, const Tensor& t, int buckets = 30);
// Entropy (nats) of the integer targets over up to `max_samples` samples spread over the
// dataset; classes = distinct values seen. Negative when the targets are not integers.
double label_entropy(const data::Dataset& set, int64_t max_samples, int64_t* classes);
// v from every rank, in rank order (an all-gather of one double); {v} without a group.
std::vector<double> gather_across_ranks(dist::ProcessGroup* group, double v);

}  // namespace athanor::train
