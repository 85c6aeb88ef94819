#pragma once
// Sum reduction of a contiguous buffer viewed as [outer, r, inner]:
//   out[o, i] = sum_j x[o, j, i]
// Any reduction over one block of adjacent dims has this form without a copy;
// the op permutes other cases into it. inner == 1 is a row sum (SIMD partial
// sums), inner > 1 vectorizes across `inner`. Accumulates in f32 for f32/bf16/f16
// and in f64 for f64.
#include <cstdint>

namespace athanor::cpu {

template <class T> void sum_3d(const T* x, T* out, int64_t outer, int64_t r, int64_t inner, double scale = 1.0);
// bf16/f16 x (L), f32 out: sum/mean under autocast (f32 category) read the 16-bit input
// directly; the same f32 accumulation as sum_3d<L>, without rounding the result to L.
template <class L>
void sum_3d_lowp_input(const L* x, float* out, int64_t outer, int64_t r, int64_t inner, double scale = 1.0);

namespace ref {
template <class T> void sum_3d(const T* x, T* out, int64_t outer, int64_t r, int64_t inner, double scale = 1.0);
}

}  // namespace athanor::cpu
