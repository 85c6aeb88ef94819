#include "athanor/autograd/function.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "athanor/autograd/anomaly.h"
#include "athanor/core/convert.h"
#include "athanor/core/error.h"

namespace athanor {

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}
bool any_requires_grad(std::initializer_list<Tensor> inputs) { return any_requires_grad(std::vector<Tensor>(inputs)); }

namespace {
struct Stats {
  double mn = std::numeric_limits<double>::infinity(), mx = -std::numeric_limits<double>::infinity(), absmax = 0;
  int64_t nan = 0, inf = 0;
};
Stats compute_stats(const Tensor& t) {
  Stats s;
  if (!is_floating(t.dtype())) return s;
  Tensor c = t.is_contiguous() ? t : [&] { Tensor x = empty(t.sizes(), TensorOptions(t.dtype())); copy_into(x, t); return x; }();
  dispatch(c.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
      const T* d = static_cast<const T*>(c.raw_data());
      for (int64_t i = 0; i < c.numel(); ++i) {
        const double v = cast_value<double>(d[i]);
        if (std::isnan(v)) { ++s.nan; continue; }
        if (std::isinf(v)) ++s.inf;
        s.mn = std::min(s.mn, v);
        s.mx = std::max(s.mx, v);
        s.absmax = std::max(s.absmax, std::fabs(v));
      }
    }
  });
  return s;
}

void attach(const char* op, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs, OpBackward backward) {
  auto node = std::make_shared<FunctionNode>(op, std::move(backward));
  node->module_path = current_module_path();
  node->next_edges.reserve(inputs.size());
  for (const Tensor& in : inputs) {
    node->next_edges.push_back(gradient_edge(in));
    node->input_meta.push_back(in.defined() ? TensorMeta{in.sizes(), in.dtype()} : TensorMeta{});
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor& out = outputs[i];
    for (const Tensor& in : inputs) ATH_ASSERT(!out.is_same(in));  // an op must return a new TensorImpl
    node->output_meta.push_back({out.sizes(), out.dtype()});
    auto& meta = out.impl()->meta();
    meta.grad_fn = node;
    meta.output_nr = static_cast<uint32_t>(i);
    meta.requires_grad = true;
  }
}
}  // namespace

bool all_finite(const Tensor& t) {
  const Stats s = compute_stats(t);
  return s.nan == 0 && s.inf == 0;
}

std::string tensor_stats(const Tensor& t) {
  const Stats s = compute_stats(t);
  std::ostringstream o;
  o.precision(4);
  o << t.describe() << ": min " << s.mn << " max " << s.mx << " absmax " << s.absmax << " nan " << s.nan << " inf " << s.inf;
  return o.str();
}

namespace {
// First anomaly since clear_anomaly(), per thread (anomaly.h).
thread_local std::optional<AnomalyReport> t_anomaly;

// Copies (not views) so a later in-place op cannot change what the doctor replays.
// (copy_into, not clone(): clone is an op, and anomaly mode would check its non-finite output again.)
Tensor snapshot(const Tensor& t) {
  if (!t.defined()) return Tensor();
  Tensor c = empty(t.sizes(), TensorOptions(t.dtype()));
  copy_into(c, t);
  return c;
}

void note_anomaly(const char* phase, const std::string& op, const std::vector<Tensor>& inputs, const Tensor& out,
                  size_t out_index, const std::string& module_path, const std::string& message) {
  if (t_anomaly) return;  // keep the origin of a cascade
  AnomalyReport r;
  r.phase = phase;
  r.op = op;
  r.module_path = module_path;
  r.output_index = out_index;
  r.output = snapshot(out);
  r.output_stats = tensor_stats(out);
  for (const Tensor& in : inputs) {
    r.inputs.push_back(snapshot(in));
    r.input_shapes.push_back(in.defined() ? in.describe() : "undefined");
    r.input_stats.push_back(in.defined() ? tensor_stats(in) : "undefined");
  }
  r.message = message;
  t_anomaly = std::move(r);
}
}  // namespace

std::optional<AnomalyReport> last_anomaly() { return t_anomaly; }
void clear_anomaly() { t_anomaly.reset(); }

void check_finite(const char* phase, const std::string& op, const std::vector<Tensor>& inputs, const Tensor& out,
                  size_t out_index, const std::string& module_path) {
  if (!out.defined() || !is_floating(out.dtype()) || all_finite(out)) return;
  std::ostringstream o;
  o << "anomaly: " << phase << " of '" << op << "' produced non-finite values in "
    << (std::string(phase) == "backward" ? "the gradient for input " : "output ") << out_index << " (" << tensor_stats(out) << ")";
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined()) o << "\n  input " << i << ": " << tensor_stats(inputs[i]);
  const std::string hint =
      "this is the first op that produced NaN/Inf: check its inputs' ranges (log or sqrt of values <= 0, "
              "division by zero, exp overflow); lower the learning rate, add warmup or gradient clipping if values grew "
              "over training";
  Error err(op, o.str(), hint, module_path, phase);
  note_anomaly(phase, op, inputs, out, out_index, module_path, err.what());
  throw err;
}

namespace {
thread_local const ForwardObserver* t_forward_observer = nullptr;

void observe_output(const char* op, const Tensor& output) {
  const ForwardObserver* obs = t_forward_observer;
  t_forward_observer = nullptr;  // ops the observer runs are not observed
  try {
    (*obs)(op, current_module_path(), output);
  } catch (...) {
    t_forward_observer = obs;
    throw;
  }
  t_forward_observer = obs;
}
}  // namespace

ForwardObserverScope::ForwardObserverScope(ForwardObserver observer)
    : observer_(std::move(observer)), previous_(t_forward_observer) {
  t_forward_observer = &observer_;
}
ForwardObserverScope::~ForwardObserverScope() { t_forward_observer = previous_; }

void notify_forward_observer(const char* op, const std::vector<Tensor>& outputs) {
  if (t_forward_observer && !outputs.empty()) observe_output(op, outputs[0]);
}

std::vector<Tensor> attach_node(const char* op, const std::vector<Tensor>& inputs, std::vector<Tensor> outputs,
                                OpBackward backward) {
  if (any_requires_grad(inputs)) attach(op, inputs, outputs, std::move(backward));
  return outputs;
}

Tensor record(const char* op, const std::vector<Tensor>& inputs, Tensor output, OpBackward backward) {
  if (anomaly_mode_enabled()) check_finite("forward", op, inputs, output, 0, current_module_path());
  if (t_forward_observer) observe_output(op, output);
  if (!any_requires_grad(inputs)) return output;
  std::vector<Tensor> outs{output};
  attach(op, inputs, outs, std::move(backward));
  return output;
}

std::vector<Tensor> record_multi(const char* op, const std::vector<Tensor>& inputs, std::vector<Tensor> outputs,
                                 OpBackward backward) {
  if (anomaly_mode_enabled())
    for (size_t i = 0; i < outputs.size(); ++i) check_finite("forward", op, inputs, outputs[i], i, current_module_path());
  if (t_forward_observer && !outputs.empty()) observe_output(op, outputs[0]);
  if (!any_requires_grad(inputs)) return outputs;
  attach(op, inputs, outputs, std::move(backward));
  return outputs;
}

}  // namespace athanor
