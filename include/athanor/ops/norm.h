#pragma once
// Normalizations. Statistics are computed in f32 (f64 for f64 inputs); forward
// caches mean and rstd for backward, as llm.c does.
#include "athanor/core/tensor.h"

namespace athanor {

// Normalizes over the last normalized_shape.size() dims; weight/bias of normalized_shape (or undefined).
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(), double eps = 1e-6);
// x: [N, C] or [N, C, *]. In training, normalizes with batch statistics and updates
// running_mean/running_var in place (unbiased variance, momentum as in PyTorch);
// in eval, uses the running statistics.
Tensor batch_norm(const Tensor& x, Tensor running_mean, Tensor running_var, const Tensor& weight, const Tensor& bias,
                  bool training, double momentum = 0.1, double eps = 1e-5);

}  // namespace athanor
