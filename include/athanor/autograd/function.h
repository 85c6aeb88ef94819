#pragma once
// How a computation joins the tape.
//
// The ops of the functional API (src/ops) join it through the op dispatch point
// (athanor/ops/registry.h), which checks anomalies and calls attach_node. A custom
// differentiable function outside the registry (a collective in dist, a test's op) ends
// with `record`, which checks its outputs in anomaly mode and attaches its node:
//
//   Tensor all_reduce_sum(const Tensor& x) {
//     Tensor y = …;
//     return record("all_reduce_sum", {x}, y, [](const Node& n, const Grads& g) {
//       return Grads{…the gradient of x…};
//     });
//   }
//
// A node is created only when grad mode is on and some input requires grad. Backward
// closures run with grad mode off and may return undefined tensors for inputs that need
// no gradient (`needs_grad(n, i)` tells which).
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "athanor/autograd/grad_mode.h"
#include "athanor/autograd/node.h"

namespace athanor {

using Grads = std::vector<Tensor>;

inline SavedTensor save(const Tensor& t, const char* what) { return SavedTensor(t, what); }

// True when grad mode is on and any defined input requires grad.
bool any_requires_grad(std::initializer_list<Tensor> inputs);
bool any_requires_grad(const std::vector<Tensor>& inputs);
// Inside a backward closure: does input i need a gradient?
inline bool needs_grad(const Node& n, size_t i) {
  return i < n.next_edges.size() && n.next_edges[i].valid() && !n.input_masked(i);
}

// Makes `backward` the grad_fn of the outputs when grad mode is on and some input requires
// grad (no checks; the dispatch point and record() call it).
std::vector<Tensor> attach_node(const char* op, const std::vector<Tensor>& inputs, std::vector<Tensor> outputs,
                                OpBackward backward);

Tensor record(const char* op, const std::vector<Tensor>& inputs, Tensor output, OpBackward backward);
std::vector<Tensor> record_multi(const char* op, const std::vector<Tensor>& inputs, std::vector<Tensor> outputs,
                                 OpBackward backward);

// Anomaly-mode check of one tensor; raises an Error naming `op` and `phase`
// ("forward"/"backward") with min/max/abs-max of the inputs and of the output.
void check_finite(const char* phase, const std::string& op, const std::vector<Tensor>& inputs, const Tensor& out,
                  size_t out_index, const std::string& module_path);
bool all_finite(const Tensor& t);

// Forward-output observer: while a ForwardObserverScope is alive on this thread, `record`,
// `record_multi` and the op dispatch point pass each forward op's name, module path and (first) output to it.
// The trainer's per-layer activation statistics use it (train/step_observer.h); with no
// scope it costs one thread-local load per op. The observer runs with observation
// suspended, so ops it calls itself are not observed; scopes nest (the inner one wins).
using ForwardObserver = std::function<void(const char* op, const std::string& module_path, const Tensor& output)>;
class ForwardObserverScope {
 public:
  explicit ForwardObserverScope(ForwardObserver observer);
  ~ForwardObserverScope();
  ForwardObserverScope(const ForwardObserverScope&) = delete;
  ForwardObserverScope& operator=(const ForwardObserverScope&) = delete;

 private:
  ForwardObserver observer_;
  const ForwardObserver* previous_;
};
// Passes outputs[0] to the thread's forward observer, if a scope is alive (the dispatch point
// and record() call it; one thread-local load when none is).
void notify_forward_observer(const char* op, const std::vector<Tensor>& outputs);
std::string tensor_stats(const Tensor& t);  // "min -1.2 max 3.4 absmax 3.4 nan 0 inf 0"

}  // namespace athanor
