#pragma once
// Loss kernels: fused cross-entropy (log-softmax + NLL + label smoothing) over the
// rows of contiguous logits [N, C], and the mean-squared-error pieces.
//
// Cross-entropy invariants:
//  - no probability matrix is kept: forward stores two numbers per row,
//    stats[2n] = max_c x[n, c] and stats[2n + 1] = log sum_c exp(x[n, c] - max),
//    and backward recomputes softmax = exp((x - max) - logsum) row by row;
//    x - max is formed first, so logits of magnitude 1e4 lose no precision to
//    the size of logsumexp;
//  - loss[n] = (1 - eps) * (-log p[n, t]) + eps * mean_c(-log p[n, c])
//            = logsum - (1 - eps) * (x[t] - max) - eps * mean_c(x[c] - max),
//    0 for rows whose target is ignore_index (their stats are 0 too);
//  - targets are already validated by the op (0 <= t < C or t == ignore_index);
//  - S is float for f32/bf16/f16 logits, double for f64; per-row losses are
//    returned in double so the op's reduction does not lose precision;
//  - OpenMP over rows; results do not depend on the thread count.
#include <cstdint>
#include <type_traits>

namespace athanor::cpu {

template <class T> using loss_stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
void cross_entropy_forward(const T* logits, const int64_t* target, loss_stat_t<T>* stats, double* loss, int64_t N,
                           int64_t C, int64_t ignore_index, double label_smoothing);
// dlogits[n, c] = s_n * (softmax[n, c] - (1 - eps) [c == t_n] - eps / C), with
// s_n = grad[n * grad_stride] * grad_scale (grad_stride 0: one scalar for all rows);
// rows with t_n == ignore_index get 0.
template <class T>
void cross_entropy_backward(const T* logits, const int64_t* target, const loss_stat_t<T>* stats, const double* grad,
                            int64_t grad_stride, double grad_scale, T* dlogits, int64_t N, int64_t C,
                            int64_t ignore_index, double label_smoothing);

// MSE: out[i] = (a[i] - b[i])^2; mse_sum returns sum_i (a[i] - b[i])^2, summed in
// fixed-size chunks added in order (the same value for any thread count).
template <class T> void mse_forward(const T* a, const T* b, T* out, int64_t n);
template <class T> double mse_sum(const T* a, const T* b, int64_t n);
// da[i] = 2 (a[i] - b[i]) g[i * g_stride] * scale, db[i] = -da[i] (either may be null).
template <class T>
void mse_backward(const T* a, const T* b, const T* g, int64_t g_stride, double scale, T* da, T* db, int64_t n);

namespace ref {
template <class T>
void cross_entropy_forward(const T* logits, const int64_t* target, loss_stat_t<T>* stats, double* loss, int64_t N,
                           int64_t C, int64_t ignore_index, double label_smoothing);
template <class T>
void cross_entropy_backward(const T* logits, const int64_t* target, const loss_stat_t<T>* stats, const double* grad,
                            int64_t grad_stride, double grad_scale, T* dlogits, int64_t N, int64_t C,
                            int64_t ignore_index, double label_smoothing);
template <class T> void mse_forward(const T* a, const T* b, T* out, int64_t n);
template <class T> double mse_sum(const T* a, const T* b, int64_t n);
template <class T>
void mse_backward(const T* a, const T* b, const T* g, int64_t g_stride, double scale, T* da, T* db, int64_t n);
}  // namespace ref

}  // namespace athanor::cpu
