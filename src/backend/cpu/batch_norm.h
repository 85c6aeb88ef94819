#pragma once
// BatchNorm kernels over the channels of a contiguous [N, C, L] buffer.
//
// Invariants (as for LayerNorm, norm.h): S = norm_stat_t<T> is float for f32/bf16/f16 and
// double for f64, every sum is accumulated in S; weight/bias pointers may be null (weight
// = 1, bias = 0) and in backward any of dx/dweight/dbias may be null; OpenMP over channels,
// each channel's sums on one thread (deterministic whatever the thread count); ref::
// kernels are naive loops in double, straight from the definitions.
#include <cstdint>

#include "backend/cpu/norm.h"  // norm_stat_t

namespace athanor::cpu {

// Per-channel batch statistics of x [N, C, L]: mean and biased variance (two passes).
template <class T> void batch_norm_stats(const T* x, norm_stat_t<T>* mean, norm_stat_t<T>* var, int64_t N, int64_t C, int64_t L);
// y = (x - mean[c]) * rstd[c] * w[c] + b[c]
template <class T>
void batch_norm_forward(const T* x, const norm_stat_t<T>* mean, const norm_stat_t<T>* rstd, const T* w, const T* b, T* y,
                        int64_t N, int64_t C, int64_t L);
// training: mean/rstd are the batch statistics (functions of x), so dx has the
// two centering terms; eval: they are constants and dx = dy * w * rstd.
template <class T>
void batch_norm_backward(const T* dy, const T* x, const norm_stat_t<T>* mean, const norm_stat_t<T>* rstd, const T* w,
                         T* dx, T* dw, T* db, int64_t N, int64_t C, int64_t L, bool training);

namespace ref {
template <class T> void batch_norm_stats(const T* x, norm_stat_t<T>* mean, norm_stat_t<T>* var, int64_t N, int64_t C, int64_t L);
template <class T>
void batch_norm_forward(const T* x, const norm_stat_t<T>* mean, const norm_stat_t<T>* rstd, const T* w, const T* b, T* y,
                        int64_t N, int64_t C, int64_t L);
template <class T>
void batch_norm_backward(const T* dy, const T* x, const norm_stat_t<T>* mean, const norm_stat_t<T>* rstd, const T* w,
                         T* dx, T* dw, T* db, int64_t N, int64_t C, int64_t L, bool training);
}  // namespace ref

}  // namespace athanor::cpu
