#pragma once
#include "athanor/core/tensor.h"

namespace athanor {

// The SwiGLU feed-forward's first half (Llama's MLP before down_proj), fused:
//   silu(x W_gate^T) * (x W_up^T)
// x [..., d], w_gate and w_up [I, d] (nn::Linear's [out, in] layout) -> [..., I]. The two GEMMs
// run on the GEMM path linear uses, then silu(g) * u in one pass; the backward computes
// dg = dy u silu'(g), du = dy silu(g) in one pass, then dx = dg W_gate + du W_up,
// dW_gate = dg^T x, dW_up = du^T x. Autocast: lower_precision.
Tensor swiglu(const Tensor& x, const Tensor& w_gate, const Tensor& w_up);

}  // namespace athanor
