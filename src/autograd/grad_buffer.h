#pragma once
// Raw (non-recording) gradient arithmetic used by the engine: summing the
// gradients that meet at a node (dense, or row-sparse from embedding-like ops),
// and accumulating into a leaf's .grad.
#include "athanor/autograd/node.h"
#include "athanor/core/tensor.h"

namespace athanor {

// acc += g in place (g is broadcast to acc's shape and converted to its dtype).
void add_into(Tensor& acc, const Tensor& g);
// a + b as a new contiguous tensor of a's shape and dtype.
Tensor add_new(const Tensor& a, const Tensor& b);

// True when nothing but this handle can see t's memory (one handle on the TensorImpl, one
// TensorImpl on an owned storage it fills exactly): the engine may then add into t in place
// or hand it over as a leaf's .grad instead of copying. `handles` is how many Tensor
// handles the caller itself holds on the impl.
bool exclusively_owned(const Tensor& t, long handles = 1);

// dense[indices[p]] += rows[p] in place (dense: contiguous f32/f64 of the gradient's shape).
// Bit-identical to dense + (the zero-filled dense form of g) up to the sign of zero.
void add_rows_into(Tensor& dense, const RowSparseGrad& g);
// The dense tensor of `sizes`/`dtype` equal to `dense` (may be undefined: zeros) plus every
// part; reuses `dense` in place when exclusively owned.
Tensor materialize_rows(Tensor dense, const std::vector<RowSparseGrad>& parts, const Shape& sizes, DType dtype);
// Can add_rows_into write g into a tensor of this dtype (f32/f64, rows of that dtype)?
bool rows_addable(const Tensor& dense, const RowSparseGrad& g);

}  // namespace athanor
