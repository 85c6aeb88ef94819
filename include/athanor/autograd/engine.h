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
#include <vector>

#include "athanor/core/tensor.h"

namespace athanor {

// grad_roots[i] may be undefined only when roots[i] is a scalar (then 1 is used).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots = {}, bool retain_graph = false);

// Gradients handed to backwards by Node::take_pending_grad since the process started (each one
// a summation pass the engine did not make): for tests and for profiling.
uint64_t pending_grads_taken();

}  // namespace athanor
