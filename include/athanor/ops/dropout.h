#pragma once
#include "athanor/core/rng.h"
#include "athanor/core/tensor.h"

namespace athanor {

// Inverted dropout: zeroes each element with probability p and scales the rest
// by 1/(1-p). The mask is a pure function of the generator's (seed, offset) and
// the element index, so it is reproducible and independent of thread count.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen = default_generator());

}  // namespace athanor
