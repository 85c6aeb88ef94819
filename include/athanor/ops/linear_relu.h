#pragma once
#include "athanor/core/tensor.h"

namespace athanor {

// y = relu(linear(x, weight, bias)) = max(x W^T + b, 0), fused: one GEMM (bias in its
// epilogue) and the ReLU applied to the GEMM's output in place, so the pre-activation is
// never a tensor of its own. Only y (with x and W, which the GEMMs need) is saved: the
// ReLU mask is y > 0. The backward makes g = dy ⊙ [y > 0] and db = rowsum(g) in one pass,
// then dx = g W and dW = g^T x. Values and gradients equal relu(linear(x, W, b))'s (the
// gradient at the kink, y = 0, is 0 as in PyTorch).
// x: [..., in], weight: [out, in], bias: [out] or undefined. Autocast: lower_precision;
// under bf16 autocast with f32 W (and b) the op reads their bf16 copies but records W and
// b themselves, so dW and db come out in f32 without a cast-back pass (linear_relu.cpp).
Tensor linear_relu(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace athanor
