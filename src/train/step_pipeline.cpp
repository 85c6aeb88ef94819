// The two ways a step's micro-batches become gradients (contract in
// include/athanor/train/step_pipeline.h): the micro-batch loop and a pipeline schedule.
#include "athanor/train/step_pipeline.h"

#include <chrono>
#include <optional>

#include "athanor/core/allocator.h"
#include "athanor/core/rng.h"
#include "athanor/dist/pipeline_lm.h"
#include "athanor/dist/process_group.h"
#include "athanor/dist/zero.h"
#include "athanor/observe/profiler.h"
#include "athanor/ops.h"
#include "athanor/ops/autocast.h"
#include "athanor/train/parallel_context.h"
#include "athanor/train/trainer.h"

namespace athanor::train {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The loss a backward starts from: the micro-batch's share n_k / N of the step's mean, × dp
// (DDP averages over dp, so the reduced gradient is the global batch's), scaled for f16.
Tensor weighted_loss(const Tensor& loss, const data::Batch& b, const observe::StepMetrics& m, const StepParts& p) {
  const double w = static_cast<double>(b.num_targets) / static_cast<double>(m.targets);
  Tensor weighted = mul(loss, w * static_cast<double>(p.dp_size));
  return p.scaler.enabled() ? p.scaler.scale(weighted) : weighted;
}

class MicroBatchLoop final : public StepPipeline {
 public:
  explicit MicroBatchLoop(StepParts p) : p_(p) {}

  void forward_backward(const std::vector<data::Batch>& batches, observe::StepMetrics& m) override {
    losses_.clear();  // a step that threw before read_loss left its losses
    for (size_t k = 0; k < batches.size(); ++k) {
      const auto& b = batches[k];
      // Data parallel: gradients of non-final micro-batches accumulate locally (no reduction).
      std::optional<dist::DataParallel::NoSync> no_sync;
      if (p_.dp && k + 1 < batches.size()) no_sync.emplace(*p_.dp);
      const double tf = now_seconds();
      Tensor loss;
      {
        observe::ProfileSpan span("forward");
        // What forward allocates (the activations kept for backward, autocast's weight casts) is
        // "activation"; backward's temporaries (activation gradients) are "workspace", so the
        // activation peak is the memory the forward pass holds, as the memory report means it.
        MemTagScope tag(MemTag::activation);
        std::optional<autocast> ac;
        if (p_.precision != DType::f32) ac.emplace(p_.precision);
        std::optional<ForwardObserverScope> observe_layers;  // the first micro-batch, when asked
        if (k == 0 && first_forward_observer_) observe_layers.emplace(first_forward_observer_);
        loss = p_.task.loss(b);
      }
      losses_.push_back({loss.detach(), static_cast<double>(b.num_targets) / static_cast<double>(m.targets)});
      const double tb = now_seconds();
      m.forward_seconds += tb - tf;
      // Backward runs outside autocast, as in PyTorch.
      observe::ProfileSpan span("backward");
      MemTagScope tag(MemTag::workspace);
      weighted_loss(loss, b, m, p_).backward();
      m.backward_seconds += now_seconds() - tb;
    }
    first_forward_observer_ = nullptr;
  }

  void read_loss(observe::StepMetrics& m) override {
    // In micro-batch order, each converted to double first: the same sum as reading each loss
    // right after its forward.
    for (const auto& [loss, weight] : losses_) m.loss += loss.item() * weight;
    losses_.clear();
  }

  Tensor loss_on_device() const override {
    NoGradGuard ng;
    Tensor total;
    for (const auto& [loss, weight] : losses_) {
      Tensor t = mul(loss.dtype() == DType::f32 ? loss : loss.to(DType::f32), weight);
      total = total.defined() ? add(total, t) : t;
    }
    return total.defined() ? total.reshape({1}) : total;
  }

  void finish_backward(observe::StepMetrics& m) override {
    if (!p_.dp) return;
    const double tc = now_seconds();
    {
      observe::ProfileSpan span("comm");
      p_.dp->finish_backward();  // the wait for the bucket reductions still in flight after backward
    }
    m.comm_seconds = now_seconds() - tc;
  }

 private:
  StepParts p_;
  std::vector<std::pair<Tensor, double>> losses_;  // this step's (loss, n_k / N), on the model's device
};

class PipelineSchedule final : public StepPipeline {
 public:
  PipelineSchedule(StepParts p, const ParallelContext& par, dist::ScheduleKind kind, int m, int v)
      : p_(p), par_(par), model_(dynamic_cast<dist::PipelineLM*>(&p.task.module())),
        executor_(par.pp_group(), kind, m, v), theory_(dist::theoretical_bubble(kind, par.pp_size(), m, v)) {
    ATH_CHECK(model_ != nullptr, "trainer", "a pipeline schedule needs the model split into stages (dist::PipelineLM)",
              Hint{"let the trainer build the model (model.type gpt or llama) with dist.pp > 1"});
  }

  void forward_backward(const std::vector<data::Batch>& batches, observe::StepMetrics& m) override {
    const int mbs = static_cast<int>(batches.size());
    ATH_CHECK(mbs == executor_.micro_batches(), "trainer", "the pipeline schedule is built for ", executor_.micro_batches(),
              " micro-batches, the step has ", mbs);
    // Where one process's forward of each micro-batch starts drawing (dropout).
    std::vector<GeneratorState> rng;
    GeneratorState at = default_generator().state();
    for (const auto& b : batches) {
      rng.push_back(at);
      at.offset += model_->dropout_blocks(b.input.size(0), b.input.size(1));
    }
    std::optional<dist::DataParallel::NoSync> no_sync;
    dist::PipelineCallbacks cb;
    cb.activation_dtype = DType::f32;  // the residual stream stays f32 under autocast
    cb.activation_shape = [&](int k) { return model_->activation_shape(batches[k].input.size(0), batches[k].input.size(1)); };
    cb.weights = model_->parameters();
    if (p_.dp)
      cb.set_grad_sync = [&](bool sync) {
        if (sync) no_sync.reset();
        else if (!no_sync) no_sync.emplace(*p_.dp);
      };
    cb.forward = [&](int chunk, int k, const Tensor& input) {
      const data::Batch& b = batches[k];
      Tensor out;
      {
        std::optional<autocast> ac;
        if (p_.precision != DType::f32) ac.emplace(p_.precision);
        out = model_->forward_chunk(chunk, {input, b.input, b.target, &rng[k]});
      }
      if (!model_->chunk(chunk).head) return out;
      m.loss += out.item() * static_cast<double>(b.num_targets) / static_cast<double>(m.targets);
      return weighted_loss(out, b, m, p_);
    };
    dist::PipelineStats st = executor_.run(cb);
    no_sync.reset();
    default_generator().set_state(at);  // where one process's step leaves it
    for (const auto& e : st.timeline)
      (e.kind == dist::ActionKind::forward ? m.forward_seconds : m.backward_seconds) += e.end - e.start;
    m.pipeline.schedule = dist::schedule_name(executor_.kind());
    m.pipeline.stages = par_.pp_size();
    m.pipeline.virtual_stages = model_->layout().virtual_stages();
    m.pipeline.micro_batches = mbs;
    m.pipeline.bubble = st.mean_bubble;
    m.pipeline.theory = theory_;
    m.pipeline.recv_wait_seconds = st.recv_wait;
    m.pipeline.step_seconds = st.step;
    timeline_ = std::move(st.timeline);
  }

  void finish_backward(observe::StepMetrics& m) override {
    const double tc = now_seconds();
    {
      observe::ProfileSpan span("comm");
      if (p_.dp) p_.dp->finish_backward();
      model_->sum_tied_gradients();  // after the dp average: the sum of the two averages is the average of the sums
    }
    m.comm_seconds = now_seconds() - tc;
    m.loss = par_.from_last_stage(m.loss);  // the loss lives on the last stage
  }

  const std::vector<dist::TimelineEvent>& timeline() const override { return timeline_; }

 private:
  StepParts p_;
  const ParallelContext& par_;
  dist::PipelineLM* model_;
  dist::PipelineExecutor executor_;
  double theory_;
  std::vector<dist::TimelineEvent> timeline_;
};

}  // namespace

const std::vector<dist::TimelineEvent>& StepPipeline::timeline() const {
  static const std::vector<dist::TimelineEvent> none;
  return none;
}

std::unique_ptr<StepPipeline> make_micro_batch_loop(StepParts parts) { return std::make_unique<MicroBatchLoop>(parts); }

std::unique_ptr<StepPipeline> make_pipeline_schedule(StepParts parts, const ParallelContext& par, dist::ScheduleKind kind, int m,
                                                     int v) {
  return std::make_unique<PipelineSchedule>(parts, par, kind, m, v);
}

}  // namespace athanor::train
