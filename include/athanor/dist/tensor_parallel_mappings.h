#pragma once
// The communication of tensor (and sequence) parallelism as autograd functions, as in
// Megatron-LM's tensor_parallel/mappings.py. `tp` is the tensor-parallel group
// (DeviceMesh::tp()); every rank of it calls the same functions in the same order, in
// forward and (the engine runs the same graph on every rank) in backward.
//
//   f  copy_to_tensor_parallel_region        forward: identity     backward: all-reduce (sum)
//   g  reduce_from_tensor_parallel_region    forward: all-reduce   backward: identity
// f and g are conjugate: f enters a region where each rank computes a part (the input of
// a column-parallel layer), g leaves it by summing the parts (the output of a
// row-parallel layer).
//
// Sequence parallelism (Korthikanti et al. 2022) replaces them outside the region: the
// activations there are slices of the sequence dimension `dim` (T/tp rows each, rank r
// holding [r·T/tp, (r+1)·T/tp)), and
//   gather_from_sequence_parallel_region       forward: all-gather  backward: reduce-scatter
//                                              (or a plain split when the consumer is not
//                                              tensor-parallel: grad_reduce_scatter false)
//   reduce_scatter_to_sequence_parallel_region forward: reduce-scatter  backward: all-gather
//   scatter_to_sequence_parallel_region        forward: keep own slice  backward: all-gather
// An all-reduce costs what an all-gather and a reduce-scatter cost together, so the
// traffic is that of f and g.
//
// With a group of one rank every function returns its input (no node, no collective).
// Tensors may be any floating dtype (bf16/f16 reductions are done in f32, process_group.h).
#include <functional>
#include <memory>

#include "athanor/core/tensor.h"
#include "athanor/dist/process_group.h"

namespace athanor::dist {

using GroupPtr = std::shared_ptr<ProcessGroup>;

Tensor copy_to_tensor_parallel_region(const Tensor& x, const GroupPtr& tp);
Tensor reduce_from_tensor_parallel_region(const Tensor& x, const GroupPtr& tp);

Tensor gather_from_sequence_parallel_region(const Tensor& x, const GroupPtr& tp, int64_t dim, bool grad_reduce_scatter = true);
Tensor reduce_scatter_to_sequence_parallel_region(const Tensor& x, const GroupPtr& tp, int64_t dim);
Tensor scatter_to_sequence_parallel_region(const Tensor& x, const GroupPtr& tp, int64_t dim);
// All-gather along `dim` whose backward keeps this rank's slice of the gradient (for outputs
// gathered out of a tensor-parallel region, e.g. a column-parallel layer's gather_output).
Tensor gather_from_tensor_parallel_region(const Tensor& x, const GroupPtr& tp, int64_t dim);
// Keeps this rank's slice of `dim` (a row-parallel layer fed a full input); backward all-gathers.
Tensor scatter_to_tensor_parallel_region(const Tensor& x, const GroupPtr& tp, int64_t dim);

// The collectives themselves, without autograd (contiguous results):
Tensor all_gather_along(const Tensor& x, ProcessGroup& g, int64_t dim);      // sizes[dim] × group size
Tensor reduce_scatter_along(const Tensor& x, ProcessGroup& g, int64_t dim);  // sizes[dim] / group size (sum)
Tensor split_along(const Tensor& x, ProcessGroup& g, int64_t dim);           // this rank's slice

// A column-parallel linear fed by a sequence-parallel input, Megatron's way:
//   y = linear(gather_from_sequence_parallel_region(x_local), w, b)
// with the gathered input NOT kept for backward: only x_local is (a saved-tensor hook,
// autograd/saved_tensor_hooks.h), and the weight gradient's backward all-gathers it again.
// So a layer keeps T/tp rows of its input instead of T, at the cost of one more all-gather
// per layer in backward. Under autocast the input is cast to the GEMM dtype before the
// all-gather (half the bytes in bf16), as Megatron gathers bf16 activations.
// regather = false keeps the gathered input instead (no extra all-gather, T rows kept).
Tensor sequence_parallel_linear(const Tensor& x_local, const Tensor& weight, const Tensor& bias, const GroupPtr& tp,
                                int64_t dim, bool regather = true);
// The same for any column-parallel consumer of the gathered input (several linears reading
// one input, as a Llama's q|k|v projections; a fused op such as swiglu): op(full) runs on the
// all-gathered input (cast first as autocast would cast it for `autocast_op`), and with
// regather every tensor op saves that is the gathered input keeps this rank's slice instead,
// all-gathered once again in backward however many ops saved it. The gradient of the gathered
// input, summed over its consumers, is reduce-scattered once.
Tensor sequence_parallel_apply(const Tensor& x_local, const GroupPtr& tp, int64_t dim, bool regather, const char* autocast_op,
                               const std::function<Tensor(const Tensor& full)>& op);

}  // namespace athanor::dist
