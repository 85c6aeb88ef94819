#pragma once
// How ops join the tape. Every differentiable op ends with `record`:
//
//   Tensor exp(const Tensor& x) {
//     Tensor y = …forward kernel…;
//     return record("exp", {x}, y, [y = save(y, "result")](const Node& n, const Grads& g) {
//       return Grads{mul(g[0], y.unpack(n))};        // d/dx exp(x) = exp(x)
//     });
//   }
//
// `record` is the single place where (1) anomaly mode checks forward outputs,
// (2) the profiler will time ops, and (3) a node is created only when grad mode
// is on and some input requires grad. Backward closures run with grad mode off
// and may return undefined tensors for inputs that need no gradient
// (`needs_grad(n, i)` tells which).
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

Tensor record(const char* op, const std::vector<Tensor>& inputs, Tensor output, OpBackward backward);
std::vector<Tensor> record_multi(const char* op, const std::vector<Tensor>& inputs, std::vector<Tensor> outputs,
                                 OpBackward backward);

// Anomaly-mode check of one tensor; raises an Error naming `op` and `phase`
// ("forward"/"backward") with min/max/abs-max of the inputs and of the output.
void check_finite(const char* phase, const std::string& op, const std::vector<Tensor>& inputs, const Tensor& out,
                  size_t out_index, const std::string& module_path);
bool all_finite(const Tensor& t);

// Forward-output observer: while a ForwardObserverScope is alive on this thread, `record`
// and `record_multi` pass each forward op's name, module path and (first) output to it.
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
std::string tensor_stats(const Tensor& t);  // "min -1.2 max 3.4 absmax 3.4 nan 0 inf 0"

}  // namespace athanor
