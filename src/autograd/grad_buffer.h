#pragma once
// Raw (non-recording) gradient arithmetic used by the engine: summing the
// gradients that meet at a node, and accumulating into a leaf's .grad.
#include "athanor/core/tensor.h"

namespace athanor {

// acc += g in place (g is broadcast to acc's shape and converted to its dtype).
void add_into(Tensor& acc, const Tensor& g);
// a + b as a new contiguous tensor of a's shape and dtype.
Tensor add_new(const Tensor& a, const Tensor& b);

}  // namespace athanor
