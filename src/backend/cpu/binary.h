#pragma once
// Binary elementwise kernels on contiguous buffers of one dtype.
// Layouts the fast kernels handle directly (everything else is materialized by
// the op with copy_into first):
//   same:    out[i] = a[i] op b[i]
//   scalar:  out[i] = a[i] op b[0]        (and the mirrored case)
//   row:     out[r, c] = a[r, c] op b[c]  (b broadcast over leading dims)
// Low-precision types compute in f32 and round once.
#include <cstdint>

#include "athanor/core/tensor.h"

namespace athanor::cpu {

enum class BinaryOp { add, sub, mul, div };

template <class T> void binary_same(BinaryOp op, const T* a, const T* b, T* out, int64_t n);
template <class T> void binary_scalar(BinaryOp op, const T* a, const T* b, T* out, int64_t n, bool scalar_is_a);
template <class T> void binary_row(BinaryOp op, const T* a, const T* b, T* out, int64_t rows, int64_t cols, bool row_is_a);
// out[i] = a[i] op b[i] where one operand is f32 and the other (`low`) bf16/f16, and
// out is f32 (type promotion): `low` is widened in registers, so no f32 copy of it
// is made. This is the residual add x + sublayer(x) under autocast. L: bfloat16 or float16.
template <class L>
void binary_same_mixed(BinaryOp op, const float* full, const L* low, float* out, int64_t n, bool low_is_a);

namespace ref {
// out = a op b with full broadcasting, by index arithmetic on each element (any strides).
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
}  // namespace ref

}  // namespace athanor::cpu
