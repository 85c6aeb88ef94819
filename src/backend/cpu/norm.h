#pragma once
// Normalization kernels: LayerNorm and RMSNorm over the rows of a contiguous
// [rows, cols] buffer (BatchNorm, over channels: batch_norm.h).
//
// Invariants:
//  - S, the statistics type, is float for f32/bf16/f16 and double for f64; every
//    sum is accumulated in S and mean/rstd are stored in S (the forward caches
//    them, the backward reuses them, as llm.c does);
//  - weight/bias pointers may be null (weight = 1, bias = 0); in backward any of
//    dx/dweight/dbias may be null when that gradient is not needed;
//  - OpenMP over rows; dweight/dbias are per-thread partial sums (static
//    schedule) added in thread order, so results are deterministic for a fixed
//    thread count;
//  - 16-bit data is read and written in its own storage and computed in f32;
//  - LayerNorm with f32 statistics on AVX-512 (f32, bf16, f16 data): forward takes
//    mean and variance of a row in one pass (f64 lanes, shifted by the row's first
//    element, so a large common offset costs no accuracy) and writes y (and xhat)
//    in a second; backward makes one pass for the row and column sums and one for
//    dx. Other builds and f64 use the portable loops (two passes for the statistics);
//  - ref:: kernels are naive loops in double, straight from the definitions.
#include <cstdint>
#include <type_traits>

namespace athanor::cpu {

template <class T> using norm_stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// y = (x - mean) * rstd * w + b,  mean = avg(x),  rstd = 1 / sqrt(avg((x - mean)^2) + eps)
template <class T>
void layer_norm_forward(const T* x, const T* w, const T* b, T* y, norm_stat_t<T>* mean, norm_stat_t<T>* rstd,
                        int64_t rows, int64_t cols, double eps);
// accumulate_dx (f32 and f64 only): dx holds a gradient on entry (what x has received from
// its other uses: a residual stream's sum) and this one is added to it, each element as
// dx + (this gradient rounded to T), the sum autograd would otherwise make in a pass of its
// own; bit-identical to that separate sum at every level.
template <class T>
void layer_norm_backward(const T* dy, const T* x, const T* w, const norm_stat_t<T>* mean, const norm_stat_t<T>* rstd,
                         T* dx, T* dw, T* db, int64_t rows, int64_t cols, bool accumulate_dx = false);
// The same with a bf16/f16 input x (and its gradient dx) but f32 weight, bias, y, dy,
// dweight, dbias: layer_norm under autocast (an f32-category op) reads the 16-bit
// activation directly, widening each row in registers, instead of from an f32 copy.
// L: bfloat16 or float16. Numerically identical to the f32 kernel on x widened to f32.
template <class L>
void layer_norm_forward_lowp_input(const L* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                                   int64_t rows, int64_t cols, double eps);
template <class L>
void layer_norm_backward_lowp_input(const float* dy, const L* x, const float* w, const float* mean, const float* rstd,
                                    L* dx, float* dw, float* db, int64_t rows, int64_t cols);

// layer_norm of an f32 x under bf16/f16 autocast keeping, for backward, xhat =
// (x - mean) * rstd rounded to L (bfloat16 or float16) instead of x itself: half the
// bytes of the saved f32 residual-stream activation. xhat is bounded by sqrt(cols) and
// has unit RMS, so L's relative rounding (2^-9 bf16, 2^-11 f16) is all that is lost
// (rounding x itself would lose x - mean to cancellation when |mean| >> std).
// Forward: y, mean and rstd exactly as layer_norm_forward<float>, plus xhat, and (when
// y_low is not null) y rounded to L as cast() would round it: the low-precision copy the
// next lower_precision op under autocast would make in a pass of its own.
template <class L>
void layer_norm_forward_keep_xhat(const float* x, const float* w, const float* b, float* y, L* xhat, float* mean,
                                  float* rstd, int64_t rows, int64_t cols, double eps, L* y_low = nullptr);
// Backward from the saved xhat (widened to f32), dnorm = dy * w:
//   dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)),  dw = sum_rows dy * xhat,  db = sum_rows dy
template <class L>
void layer_norm_backward_from_xhat(const float* dy, const L* xhat, const float* w, const float* rstd, float* dx,
                                   float* dw, float* db, int64_t rows, int64_t cols, bool accumulate_dx = false);

// y = x * rstd * w,  rstd = 1 / sqrt(avg(x^2) + eps)
template <class T>
void rms_norm_forward(const T* x, const T* w, T* y, norm_stat_t<T>* rstd, int64_t rows, int64_t cols, double eps);
template <class T>
void rms_norm_backward(const T* dy, const T* x, const T* w, const norm_stat_t<T>* rstd, T* dx, T* dw, int64_t rows,
                       int64_t cols);
// The same with a bf16/f16 x (and dx) but f32 weight, y, dy, dweight: rms_norm under
// autocast reads the 16-bit activation directly, as layer_norm_*_lowp_input above.
template <class L>
void rms_norm_forward_lowp_input(const L* x, const float* w, float* y, float* rstd, int64_t rows, int64_t cols,
                                 double eps);
template <class L>
void rms_norm_backward_lowp_input(const float* dy, const L* x, const float* w, const float* rstd, L* dx, float* dw,
                                  int64_t rows, int64_t cols);

namespace ref {
template <class T>
void layer_norm_forward(const T* x, const T* w, const T* b, T* y, norm_stat_t<T>* mean, norm_stat_t<T>* rstd,
                        int64_t rows, int64_t cols, double eps);
template <class T>
void layer_norm_backward(const T* dy, const T* x, const T* w, const norm_stat_t<T>* mean, const norm_stat_t<T>* rstd,
                         T* dx, T* dw, T* db, int64_t rows, int64_t cols);
template <class T>
void rms_norm_forward(const T* x, const T* w, T* y, norm_stat_t<T>* rstd, int64_t rows, int64_t cols, double eps);
template <class T>
void rms_norm_backward(const T* dy, const T* x, const T* w, const norm_stat_t<T>* rstd, T* dx, T* dw, int64_t rows,
                       int64_t cols);
}  // namespace ref

}  // namespace athanor::cpu
