#pragma once
// Softmax and log-softmax over the last dim of a contiguous [rows, cols] buffer,
// forward and backward, plus the f32 row primitives the other fused kernels of
// this folder (norm, cross_entropy) share.
//
// Invariants:
//  - numerically stable: the row max is subtracted before exp, so logits of any
//    magnitude (±1e4 and beyond) give finite results; a row containing NaN gives
//    NaN, a row that is all -inf gives NaN (as PyTorch);
//  - f32/bf16/f16 compute in f32 (16-bit rows are widened once into a per-thread
//    scratch row and narrowed once with round-to-nearest-even), f64 in f64;
//  - rows are independent and processed by OpenMP threads, so results do not
//    depend on the thread count;
//  - fast kernels use AVX-512 (exp by range reduction + polynomial, ~2 ulp) when
//    compiled for it and portable loops otherwise; ref:: kernels are naive double.
#include <cstdint>

namespace athanor::cpu {

// y = softmax(x) (log = false) or log_softmax(x) (log = true) along each row.
template <class T> void softmax_forward(const T* x, T* y, int64_t rows, int64_t cols, bool log);
// dx from dy and the forward output y:
//   softmax:     dx = y * (dy - sum(dy * y))
//   log_softmax: dx = dy - exp(y) * sum(dy)
template <class T> void softmax_backward(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols, bool log);

// The f32-category op under autocast on a bf16/f16 input (L: bfloat16 or float16): x
// is read in its own storage and widened row by row, y is f32; backward takes the f32
// dy and y and writes dx in L (rounded once). Bit-identical to the f32 kernels on x
// widened to f32, with dx then rounded to L, but no f32 copy of x or dx is made.
template <class L> void softmax_forward_lowp_input(const L* x, float* y, int64_t rows, int64_t cols, bool log);
template <class L>
void softmax_backward_lowp_dx(const float* dy, const float* y, L* dx, int64_t rows, int64_t cols, bool log);

namespace ref {
template <class T> void softmax_forward(const T* x, T* y, int64_t rows, int64_t cols, bool log);
template <class T> void softmax_backward(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols, bool log);
}  // namespace ref

// ---- row primitives (f32 rows; AVX-512 when available)
namespace row {
// Widen n elements of T (f32, bf16, f16) into f32 / narrow f32 into T (round to nearest even).
template <class T> void to_f32(const T* src, float* dst, int64_t n);
template <class T> void from_f32(const float* src, T* dst, int64_t n);
float max(const float* x, int64_t n);  // -inf for n == 0; NaN elements are skipped (they poison the sum instead)
// sum_i exp(x[i] - shift); stores exp(x[i] - shift) into out when out != nullptr (out may be x).
float sum_exp(const float* x, float shift, float* out, int64_t n);
// y[i] = exp(x[i] + shift) (y may be x).
void exp_shift(const float* x, float shift, float* y, int64_t n);
}  // namespace row

}  // namespace athanor::cpu
