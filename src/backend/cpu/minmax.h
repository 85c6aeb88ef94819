#pragma once
// Extremum (max/min with the index of the first extremal element) and variance
// reductions of a contiguous buffer viewed as [outer, r, inner], reducing r:
//   values[o, i]  = max_j x[o, j, i]          (min for is_max = false)
//   indices[o, i] = the smallest j attaining it
//   var[o, i]     = sum_j (x[o, j, i] - mean[o, i])^2 / max(0, r - correction)
//
// Invariants shared by every kernel here:
//  - NaN propagates: a row containing NaN has value NaN and the index of its
//    first NaN (PyTorch semantics);
//  - ties resolve to the FIRST index, whatever the thread count or SIMD width;
//  - bf16/f16 are compared/accumulated in f32 (extremal values are copied
//    exactly, never rounded); f32 accumulates in f32, f64 in f64;
//  - the fast kernel and its `ref::` twin give identical indices, and values
//    equal up to accumulation order (variance).
#include <cstdint>

namespace athanor::cpu {

// Supported T: float, double, bfloat16, float16, int32_t, int64_t, uint8_t.
// `values` may be null (argmax/argmin only). r must be >= 1.
template <class T>
void minmax_3d(const T* x, T* values, int64_t* indices, int64_t outer, int64_t r, int64_t inner, bool is_max);

// Variance with a `correction` (1 = Bessel, 0 = population), two-pass (mean,
// then squared deviations). `mean` (may be null) receives the mean in the
// accumulation type: float for f32/bf16/f16, double for f64.
// Supported T: float, double, bfloat16, float16.
template <class T, class A>
void var_3d(const T* x, T* var, A* mean, int64_t outer, int64_t r, int64_t inner, int64_t correction);

namespace ref {
// Naive loops: comparisons in f64 (native for integers), accumulation in f64.
template <class T>
void minmax_3d(const T* x, T* values, int64_t* indices, int64_t outer, int64_t r, int64_t inner, bool is_max);
template <class T, class A>
void var_3d(const T* x, T* var, A* mean, int64_t outer, int64_t r, int64_t inner, int64_t correction);
}  // namespace ref

}  // namespace athanor::cpu
