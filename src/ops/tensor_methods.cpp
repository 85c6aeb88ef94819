// Tensor's differentiable convenience methods, forwarding to the functional ops.
#include "athanor/core/tensor.h"
#include "athanor/ops/reduction.h"
#include "athanor/ops/shape.h"

namespace athanor {

Tensor Tensor::to(DType dt) const { return cast(*this, dt); }
Tensor Tensor::contiguous() const { return athanor::contiguous(*this); }
Tensor Tensor::clone() const { return athanor::clone(*this); }
Tensor Tensor::reshape(const Shape& shape) const { return athanor::reshape(*this, shape); }
Tensor Tensor::view(const Shape& shape) const { return athanor::view(*this, shape); }
Tensor Tensor::transpose(int64_t d0, int64_t d1) const { return athanor::transpose(*this, d0, d1); }
Tensor Tensor::permute(const Shape& dims) const { return athanor::permute(*this, dims); }
Tensor Tensor::t() const { return athanor::transpose(*this, 0, 1); }
Tensor Tensor::sum() const { return athanor::sum(*this); }
Tensor Tensor::mean() const { return athanor::mean(*this); }

}  // namespace athanor
