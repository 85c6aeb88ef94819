#pragma once
#include <vector>

#include "athanor/core/tensor.h"

namespace athanor::optim {

// Scales all gradients by min(1, max_norm / total_norm) and returns the total
// L2 norm before clipping (computed in f64 over all parameters). If the norm is
// not finite, no gradient is touched and the non-finite norm is returned, so the
// caller can report or skip the step rather than spread NaN into every weight.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);
// The global L2 norm of the gradients, without clipping.
double grad_norm(const std::vector<Tensor>& params);
// grad_norm's Σ g² for gradients on one CUDA device, left there: a 1-element f64 tensor (no
// host read; the same fixed order, so sqrt of it is grad_norm's value).
Tensor grad_sum_squares_on_device(const std::vector<Tensor>& params);
// The factor clip_grad_norm scales gradients of total norm `norm` by: min(1, max_norm /
// (norm + 1e-6)); 1 for a non-finite norm (clip_grad_norm leaves those alone).
double clip_coefficient(double norm, double max_norm);
// Clamps every gradient element to [-clip, clip].
void clip_grad_value(const std::vector<Tensor>& params, double clip);

}  // namespace athanor::optim
