#pragma once
// The optimizers' f32 loops live in the backend (backend/cpu/optimizer_update.h); the
// tensor-level gradient scaling is here.
#include "athanor/core/tensor.h"
#include "backend/cpu/optimizer_update.h"

namespace athanor::optim::detail {

using cpu::AdamConsts;
using cpu::SgdConsts;
using cpu::adam_f32;
using cpu::narrow_f32;
using cpu::scale_f32;
using cpu::sgd_f32;
using cpu::sum_squares_f32;

// A whole gradient tensor (any floating dtype) scaled so: scale_f32 for f32, the same
// rounding through f64 for the others; parallel over elements. Not version-bumped.
void scale_gradient(const Tensor& g, double coef);

}  // namespace athanor::optim::detail
