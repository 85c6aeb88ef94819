#pragma once
// Activation checkpointing (recompute): trade ~one extra forward of `fn` for
// not keeping its intermediates alive between forward and backward.
//
//   auto ys = checkpoint([&](const std::vector<Tensor>& xs) { return std::vector<Tensor>{block(xs[0])}; }, {x});
//
// Contract:
//  - forward: `fn` runs under no-grad, so none of its intermediate tensors are
//    saved by the tape; only its outputs exist afterwards. If grad mode is on,
//    one node ("checkpoint") is recorded whose inputs are `inputs` and whose
//    outputs are fn's outputs.
//  - backward of that node: restores the saved RNG state of the default
//    generator (so dropout draws the same masks), re-enters the saved autocast
//    state and module path, recomputes `fn` with grad on from detached aliases
//    of the inputs (requires_grad as the originals), and runs a nested
//    backward from the recomputed outputs with the incoming gradients. That
//    nested backward accumulates the gradients of parameters used inside `fn`
//    straight into their `.grad` (post-accumulate hooks fire as usual, as in
//    PyTorch's reentrant checkpoint); the node returns the inputs' gradients.
//    Afterwards the generator is put back where it was before the recompute,
//    so the outer RNG stream is the same as without checkpointing.
//
// What is saved: the inputs (as SavedTensors: modifying one in place before
// backward raises the usual version Error), the default generator's
// (seed, offset), autocast enabled + dtype, and the module path. Nothing else.
//
// Parameters inside fn when no input requires grad (PyTorch's reentrant
// pitfall: there, the output would not require grad and the parameters would
// silently get no gradient). We cannot know under no-grad whether fn uses
// parameters, so when grad mode is on and no input requires grad the node is
// recorded against an extra private 0-d dummy leaf that requires grad. The
// outputs then always require grad; if the recompute shows that nothing in fn
// requires grad, backward simply returns no gradients. The dummy's gradient
// is never produced.
//
// Invariants:
//  - `fn` must be deterministic given its inputs, the default generator and
//    the autocast state (it runs twice). It must not modify its inputs in place.
//  - Nested use works: inside the no-grad forward an inner checkpoint just
//    runs its fn; during the outer recompute (grad on) it records its own node,
//    saving the RNG state at that point, which equals the original forward's.
//  - Outputs are returned as fresh tensors (aliases when fn returns an input),
//    so fn may return its input unchanged.
//
// Cost: one extra forward of fn per backward; memory between forward and
// backward is the inputs and outputs of fn instead of all its intermediates.
#include <functional>
#include <vector>

#include "athanor/core/tensor.h"

namespace athanor {

using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

std::vector<Tensor> checkpoint(CheckpointFn fn, const std::vector<Tensor>& inputs);

// Single input, single output convenience form.
Tensor checkpoint(std::function<Tensor(const Tensor&)> fn, const Tensor& input);

}  // namespace athanor
