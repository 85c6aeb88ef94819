#pragma once
#include "athanor/core/tensor.h"

namespace athanor {

Tensor softmax(const Tensor& x, int64_t dim);      // numerically stable (max subtracted)
Tensor log_softmax(const Tensor& x, int64_t dim);

}  // namespace athanor
