#pragma once
// Shape and indexing ops. View ops (view, reshape when possible, permute,
// transpose, slice, narrow, expand, squeeze, unsqueeze) share storage.
#include <vector>

#include "athanor/core/tensor.h"

namespace athanor {

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op = "broadcast");
// Sums `grad` over broadcast dimensions so that it has `shape` (inverse of broadcasting).
Tensor sum_to(const Tensor& grad, const Shape& shape);

Tensor view(const Tensor& x, const Shape& shape);     // one dim may be -1; needs compatible strides
Tensor reshape(const Tensor& x, const Shape& shape);  // a view when possible, else a copy
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor expand(const Tensor& x, const Shape& shape);   // -1 keeps a dim
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor contiguous(const Tensor& x);
Tensor clone(const Tensor& x);
Tensor cast(const Tensor& x, DType dtype);  // differentiable dtype conversion

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);  // Python-style bounds
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
Tensor stack(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim);  // last chunk may be smaller
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);  // index: 1-D i64/i32
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);        // index: same rank as x

}  // namespace athanor
