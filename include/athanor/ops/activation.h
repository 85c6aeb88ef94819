#pragma once
#include "athanor/core/tensor.h"

namespace athanor {

enum class GeluApprox { none, tanh };  // none: exact erf form; tanh: GPT-2's approximation

Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::none);
Tensor silu(const Tensor& x);

}  // namespace athanor
