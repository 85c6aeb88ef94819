#pragma once
// The backward engine: a dependency-counted traversal of the graph from the
// roots, running nodes in decreasing sequence number as soon as all their
// consumers are done, summing gradients that meet at a node, and accumulating
// into leaves. Gradient reduction for data parallel starts from leaves'
// post-accumulate hooks, which therefore fire in roughly reverse order of use.
//
// Bookkeeping without copies: gradients that meet are summed in place into whichever
// summand only the engine holds (a new tensor otherwise); a leaf without .grad adopts
// its incoming gradient when nothing else can see that memory (else it copies); and
// row-sparse gradients (RowSparseGrad, from embedding) are added straight into the dense
// gradient they meet or into an existing .grad, without a zero-filled table; and a backward
// may add its input's gradient straight into the sum already waiting there
// (Node::take_pending_grad: layer_norm on a residual stream).
#include <cstdint>
#include <memory>
#include <vector>

#include "athanor/core/tensor.h"

namespace athanor {

// grad_roots[i] may be undefined only when roots[i] is a scalar (then 1 is used).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots = {}, bool retain_graph = false);

// The backward split in two (zero-bubble pipeline schedules, Qi et al. 2023): the input
// pass computes every gradient except those of `weights` and returns the rest of the
// work; run() later computes the weights' gradients and accumulates them into .grad.
//
//   auto w = backward_input({y}, {dy}, model.parameters());   // x.grad is ready: send it on
//   …                                                           // other work fills the bubble
//   w.run();                                                    // every parameter's .grad, as backward()
//
// How: an op node with a weight among its inputs runs twice. In the input pass its weight
// inputs are masked (needs_grad is false for them, so linear computes dX = dY W but not
// dW); the node keeps its saved tensors and the gradients it received. run() applies it
// again with only the weight inputs unmasked (dW = dYᵀ X) and then releases it. A node
// whose every input is a weight (an embedding's) runs only in run(). The result equals
// backward(roots, grad_roots) up to the order in which a weight's gradients are summed.
// A backward that nests inside the input pass (checkpoint()'s recompute) defers its weight
// work into the same object. Until run(), the deferred nodes keep their saved tensors and
// incoming gradients alive: memory the weight pass needs. Each weight's accumulator runs
// once in run() (post-accumulate hooks such as DDP's fire once), as in backward().
// Destroying the object without run() drops the weight gradients.
class DeferredWeightGrads {
 public:
  struct State;
  DeferredWeightGrads();
  explicit DeferredWeightGrads(std::unique_ptr<State> state);
  ~DeferredWeightGrads();
  DeferredWeightGrads(DeferredWeightGrads&&) noexcept;
  DeferredWeightGrads& operator=(DeferredWeightGrads&&) noexcept;
  void run();                // the weight pass; afterwards empty()
  bool empty() const;
  std::size_t size() const;  // nodes waiting for the weight pass

 private:
  std::unique_ptr<State> state_;
};

DeferredWeightGrads backward_input(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
                                   const std::vector<Tensor>& weights, bool retain_graph = false);

// Gradients handed to backwards by Node::take_pending_grad since the process started (each one
// a summation pass the engine did not make): for tests and for profiling.
uint64_t pending_grads_taken();

}  // namespace athanor
