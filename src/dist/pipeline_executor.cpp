// The pipeline executor: one rank's action list, run with non-blocking transfers over the pp
// group (contract in include/athanor/dist/pipeline_executor.h).
#include "athanor/dist/pipeline_executor.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <sstream>
#include <thread>

#include "athanor/autograd/engine.h"
#include "athanor/core/allocator.h"
#include "athanor/core/error.h"
#include "athanor/core/observer.h"
#include "athanor/ops.h"

namespace athanor::dist {
namespace {

constexpr double kPushSeconds = 1e-3;  // how long a new send is pushed before computing on

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What one (micro-batch, chunk) holds between its actions.
struct Slot {
  Tensor input;        // the received activation (a leaf), undefined on virtual stage 0
  Tensor output;       // what forward returned: the activation sent on, or the loss
  Tensor grad;         // the received gradient of output
  WorkPtr recv_act, recv_grad;
  DeferredWeightGrads weights;  // zero_bubble: the weight pass of an earlier backward_input
};

}  // namespace

PipelineExecutor::PipelineExecutor(std::shared_ptr<ProcessGroup> pp, ScheduleKind kind, int m, int v)
    : pp_(std::move(pp)), kind_(kind), m_(m), v_(v) {
  ATH_CHECK(pp_ != nullptr, "PipelineExecutor", "got no pipeline group", Hint{"pass a DeviceMesh's pp() group"});
  actions_ = make_schedule(kind, pp_->size(), pp_->rank(), m, v);  // checks (p, m, v)
}

PipelineStats PipelineExecutor::run(const PipelineCallbacks& cb) {
  const char* op = "PipelineExecutor";
  ATH_CHECK(static_cast<bool>(cb.forward), op, "the forward callback is empty");
  ATH_CHECK(static_cast<bool>(cb.activation_shape) || pp_->size() * v_ == 1, op, "the activation_shape callback is empty",
            Hint{"the receive buffers need each micro-batch's activation shape"});
  const int p = pp_->size(), r = pp_->rank(), S = p * v_;
  const int prev = (r - 1 + p) % p, next = (r + 1) % p;
  // Tags: the receiving virtual stage, the direction and the micro-batch when that fits MPI's
  // guaranteed tag range; otherwise the stage and direction alone (transfers of one stream
  // are sent and received in micro-batch order, and MPI keeps their order).
  const bool mb_in_tag = 2L * S * m_ <= 32767;
  auto tag_of = [&](bool grad, int recv_stage, int mb) {
    const int stream = (grad ? S : 0) + recv_stage;
    return mb_in_tag ? stream * m_ + mb : stream;
  };
  auto stage_text = [&](int rank, int chunk) {
    std::ostringstream o;
    o << "stage " << rank;
    if (v_ > 1) o << " (virtual stage " << chunk * p + rank << ")";
    o << " [world rank " << pp_->world_rank_of(rank) << "]";
    return o.str();
  };
  // The virtual stage a transfer of `a` goes to / comes from: rank and chunk.
  auto peer_of = [&](const Action& a) -> std::pair<int, int> {
    const bool forward = a.kind == ActionKind::send_activation || a.kind == ActionKind::recv_grad;
    const int s = a.chunk * p + r + ((forward) ? 1 : -1);  // sends of activations and receives of gradients face the next stage
    return {s % p, s / p};
  };
  auto context = [&](const Action& a) {
    const auto [pr, pc] = peer_of(a);
    const bool sending = a.kind == ActionKind::send_activation || a.kind == ActionKind::send_grad;
    const bool grad = a.kind == ActionKind::send_grad || a.kind == ActionKind::recv_grad;
    std::ostringstream o;
    o << stage_text(r, a.chunk) << (sending ? " sending " : " receiving ") << (grad ? "the gradient" : "the activation")
      << " of micro-batch " << a.mb << (v_ > 1 ? " (chunk " + std::to_string(a.chunk) + ")" : "") << (sending ? " to " : " from ")
      << stage_text(pr, pc) << " in the " << schedule_name(kind_) << " schedule";
    return o.str();
  };

  std::map<std::pair<int, int>, Slot> slots;  // (mb, chunk)
  std::vector<WorkPtr> sends;
  std::vector<std::size_t> last_acc(static_cast<std::size_t>(v_), actions_.size());
  for (std::size_t i = 0; i < actions_.size(); ++i)
    if (actions_[i].kind == ActionKind::backward || actions_[i].kind == ActionKind::backward_weight) last_acc[actions_[i].chunk] = i;

  auto post_recv = [&](const Action& a) {
    Slot& s = slots[{a.mb, a.chunk}];
    const bool grad = a.kind == ActionKind::recv_grad;
    WorkPtr& w = grad ? s.recv_grad : s.recv_act;
    if (w) return;
    MemTagScope tag(grad ? MemTag::workspace : MemTag::activation);  // a received activation is kept for backward
    Tensor buf = empty(cb.activation_shape(a.mb), TensorOptions(cb.activation_dtype));
    const int src = grad ? next : prev, my_stage = a.chunk * p + r;
    w = pp_->recv_async(buf, src, tag_of(grad, my_stage, a.mb));
    w->set_context(context(a));
    (grad ? s.grad : s.input) = buf;
  };
  // The receives the next compute action after position `from` needs, posted now so that
  // they travel while this rank computes.
  auto post_ahead = [&](std::size_t from) {
    for (std::size_t j = from; j < actions_.size() && !actions_[j].is_compute(); ++j)
      if (actions_[j].kind == ActionKind::recv_activation || actions_[j].kind == ActionKind::recv_grad) post_recv(actions_[j]);
  };
  auto test_sends = [&] { std::erase_if(sends, [](const WorkPtr& w) { return w->test(); }); };
  // MPI moves a message only while a rank is inside MPI, and some transports (shared memory
  // without a single-copy mechanism, fragmented rendezvous) need the sender too: right after
  // posting a send, push it for a moment, enough for a waiting receiver to take it, before
  // this rank goes back to computing for a whole action.
  auto push_sends = [&] {
    const double until = now_seconds() + kPushSeconds;
    for (test_sends(); !sends.empty() && now_seconds() < until; test_sends()) std::this_thread::yield();
  };

  PipelineStats st;
  if (p > 1) pp_->barrier();
  const double t0 = now_seconds();
  int in_flight = 0;
  auto compute = [&](const Action& a, const std::function<void()>& fn) {
    ObservedSpan span(action_name(a.kind));  // the profiler's span, through the core hook
    const double ts = now_seconds();
    fn();
    const double te = now_seconds();
    st.timeline.push_back({a.kind, a.mb, a.chunk, ts - t0, te - t0});
    st.busy += te - ts;
  };
  post_ahead(0);
  for (std::size_t i = 0; i < actions_.size(); ++i) {
    const Action& a = actions_[i];
    if (cb.before_action) cb.before_action(i, a);
    if (!sends.empty()) test_sends();
    const int my_stage = a.chunk * p + r;
    Slot& s = slots[{a.mb, a.chunk}];
    switch (a.kind) {
      case ActionKind::recv_activation:
      case ActionKind::recv_grad: {
        post_recv(a);
        const double tw = now_seconds();
        (a.kind == ActionKind::recv_grad ? s.recv_grad : s.recv_act)->wait();
        st.recv_wait += now_seconds() - tw;
        break;
      }
      case ActionKind::send_activation: {
        Tensor out = s.output.detach();
        if (out.dtype() != cb.activation_dtype) out = out.to(cb.activation_dtype);
        sends.push_back(pp_->send_async(out.contiguous(), next, tag_of(false, my_stage + 1, a.mb)));
        sends.back()->set_context(context(a));
        push_sends();
        break;
      }
      case ActionKind::send_grad: {
        ATH_CHECK(s.input.defined() && s.input.grad().defined(), op, stage_text(r, a.chunk), ": micro-batch ", a.mb,
                  "'s input has no gradient to send back",
                  Hint{"the stage's output must depend on its input (the forward callback must use it)"});
        Tensor g = s.input.grad();
        if (g.dtype() != cb.activation_dtype) g = g.to(cb.activation_dtype);
        sends.push_back(pp_->send_async(g.contiguous(), prev, tag_of(true, my_stage - 1, a.mb)));
        sends.back()->set_context(context(a));
        push_sends();
        s.input = Tensor();
        if (kind_ != ScheduleKind::zero_bubble) slots.erase({a.mb, a.chunk});
        break;
      }
      case ActionKind::forward:
        post_ahead(i + 1);
        compute(a, [&] {
          // What forward allocates is kept for backward ("activation"); backward's temporaries are "workspace".
          MemTagScope tag(MemTag::activation);
          if (s.input.defined()) s.input.requires_grad_(true);  // a fresh leaf: its .grad is what goes back
          s.output = cb.forward(a.chunk, a.mb, s.input);
        });
        ATH_CHECK(s.output.defined(), op, stage_text(r, a.chunk), ": the forward of micro-batch ", a.mb, " returned nothing");
        st.peak_in_flight = std::max(st.peak_in_flight, ++in_flight);
        break;
      case ActionKind::backward:
      case ActionKind::backward_input: {
        post_ahead(i + 1);
        const bool last = my_stage == S - 1;
        if (cb.set_grad_sync && a.kind == ActionKind::backward) cb.set_grad_sync(i == last_acc[a.chunk]);
        compute(a, [&] {
          MemTagScope tag(MemTag::workspace);
          std::vector<Tensor> grads;
          if (!last) grads.push_back(s.grad);
          if (a.kind == ActionKind::backward) athanor::backward({s.output}, grads);
          else s.weights = backward_input({s.output}, grads, cb.weights);
        });
        s.output = Tensor();
        s.grad = Tensor();
        s.recv_grad.reset();
        if (a.kind == ActionKind::backward) --in_flight;
        if (a.kind == ActionKind::backward && my_stage == 0) slots.erase({a.mb, a.chunk});
        break;
      }
      case ActionKind::backward_weight:
        post_ahead(i + 1);
        if (cb.set_grad_sync) cb.set_grad_sync(i == last_acc[a.chunk]);
        compute(a, [&] {
          MemTagScope tag(MemTag::workspace);
          s.weights.run();
        });
        --in_flight;
        slots.erase({a.mb, a.chunk});
        break;
    }
  }
  for (auto& w : sends) w->wait();
  sends.clear();
  st.span = now_seconds() - t0;
  // The step time (the longest rank's) and the ranks' mean busy time: one all-reduce each.
  Tensor span = from_vector(std::vector<double>{st.span}, {1}, TensorOptions(DType::f64));
  Tensor busy = from_vector(std::vector<double>{st.busy}, {1}, TensorOptions(DType::f64));
  if (p > 1) {
    pp_->all_reduce(span, ReduceOp::max);
    pp_->all_reduce(busy, ReduceOp::sum);
  }
  st.step = span.item();
  st.bubble = st.step > 0 ? 1.0 - st.busy / st.step : 0.0;
  st.mean_bubble = st.step > 0 ? 1.0 - busy.item() / p / st.step : 0.0;
  return st;
}

}  // namespace athanor::dist
