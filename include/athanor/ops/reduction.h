#pragma once
// Reductions over a set of dims (empty = all dims). Negative dims count from
// the end. f32/f64 inputs accumulate in their own type; bf16/f16 in f32.
#include <vector>

#include "athanor/core/tensor.h"

namespace athanor {

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Values of the max/min along one dim; the gradient goes to the first maximal element.
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);  // over all elements
Tensor min(const Tensor& x);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);  // i64, no gradient
// Variance with Bessel's correction (correction=1) or population (0).
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);

}  // namespace athanor
