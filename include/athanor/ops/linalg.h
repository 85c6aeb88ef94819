#pragma once
#include <optional>

#include "athanor/core/tensor.h"

namespace athanor {

// PyTorch semantics: 1-D operands are promoted and the added dim removed;
// batch dims broadcast. Transposed operands are passed to the GEMM without copies.
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x @ weight^T + bias; x: [..., in], weight: [out, in], bias: [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace athanor
