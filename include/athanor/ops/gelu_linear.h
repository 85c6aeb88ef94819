#pragma once
#include "athanor/core/tensor.h"

namespace athanor {

// y = linear(gelu_tanh(x), weight, bias), fused so that only x is kept for backward
// (llm.c's GELU recompute): the forward writes gelu(x) to a scratch buffer that is
// freed after the GEMM, and the backward recomputes it for dW = dy^T gelu(x).
// Saves one [..., in] activation per call against the unfused composition.
// x: [..., in], weight: [out, in], bias: [out] or undefined. Autocast: lower_precision.
Tensor gelu_linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace athanor
