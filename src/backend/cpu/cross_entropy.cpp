#include "backend/cpu/cross_entropy.h"

#include <cmath>
#include <limits>
#include <vector>

#include "athanor/core/convert.h"
#include "backend/cpu/softmax.h"  // row primitives

namespace athanor::cpu {
namespace {

inline bool parallel_rows(int64_t rows, int64_t cols) { return rows > 1 && rows * cols >= (1 << 14); }

// One row's forward in S (float rows use the AVX-512 primitives).
template <class S>
double ce_row_forward(const S* x, int64_t t, int64_t C, double eps, S* stat) {
  S m, ls, sum_xm = 0;  // max, log sum exp(x - max), sum (x - max)
  if constexpr (std::is_same_v<S, float>) {
    m = row::max(x, C);
    ls = std::log(row::sum_exp(x, m, nullptr, C));
  } else {
    m = -std::numeric_limits<S>::infinity();
    for (int64_t c = 0; c < C; ++c) m = std::max(m, x[c]);
    S se = 0;
    for (int64_t c = 0; c < C; ++c) se += std::exp(x[c] - m);
    ls = std::log(se);
  }
  if (eps != 0.0) {
#pragma omp simd reduction(+ : sum_xm)
    for (int64_t c = 0; c < C; ++c) sum_xm += x[c] - m;
  }
  stat[0] = m;
  stat[1] = ls;
  // -log p_c = logsum - (x_c - max)
  return static_cast<double>(ls) - (1.0 - eps) * static_cast<double>(x[t] - m) -
         eps * static_cast<double>(sum_xm) / static_cast<double>(C);
}

// One row's gradient in S, written to d (may not alias x).
template <class S>
void ce_row_backward(const S* x, int64_t t, int64_t C, double eps, const S* stat, double s, S* d) {
  const S m = stat[0], ls = stat[1];
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) d[c] = (x[c] - m) - ls;  // log softmax, max subtracted first
  if constexpr (std::is_same_v<S, float>) {
    row::exp_shift(d, 0.0f, d, C);
  } else {
    for (int64_t c = 0; c < C; ++c) d[c] = std::exp(d[c]);
  }
  const S sc = static_cast<S>(s), off = static_cast<S>(eps / static_cast<double>(C));
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) d[c] = sc * (d[c] - off);  // softmax - smoothed uniform part
  d[t] -= static_cast<S>(s * (1.0 - eps));                   // minus the target's one-hot part
}

}  // namespace

template <class T>
void cross_entropy_forward(const T* logits, const int64_t* target, loss_stat_t<T>* stats, double* loss, int64_t N,
                           int64_t C, int64_t ignore_index, double eps) {
  using S = loss_stat_t<T>;
  constexpr bool wide = std::is_same_v<T, S>;
#pragma omp parallel if (parallel_rows(N, C))
  {
    std::vector<S> scratch(wide ? 0 : C);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t t = target[n];
      if (t == ignore_index) {
        stats[2 * n] = stats[2 * n + 1] = 0;
        loss[n] = 0.0;
        continue;
      }
      const S* xr;
      if constexpr (wide) xr = logits + n * C;
      else row::to_f32(logits + n * C, scratch.data(), C), xr = scratch.data();
      loss[n] = ce_row_forward<S>(xr, t, C, eps, stats + 2 * n);
    }
  }
}

template <class T>
void cross_entropy_backward(const T* logits, const int64_t* target, const loss_stat_t<T>* stats, const double* grad,
                            int64_t grad_stride, double grad_scale, T* dlogits, int64_t N, int64_t C,
                            int64_t ignore_index, double eps) {
  using S = loss_stat_t<T>;
  constexpr bool wide = std::is_same_v<T, S>;
#pragma omp parallel if (parallel_rows(N, C))
  {
    std::vector<S> scratch(wide ? 0 : 2 * C);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t t = target[n];
      if (t == ignore_index) {
        std::fill(dlogits + n * C, dlogits + (n + 1) * C, cast_value<T>(0.0f));
        continue;
      }
      const double s = grad[n * grad_stride] * grad_scale;
      if constexpr (wide) {
        ce_row_backward<S>(logits + n * C, t, C, eps, stats + 2 * n, s, dlogits + n * C);
      } else {
        row::to_f32(logits + n * C, scratch.data(), C);
        ce_row_backward<S>(scratch.data(), t, C, eps, stats + 2 * n, s, scratch.data() + C);
        row::from_f32(scratch.data() + C, dlogits + n * C, C);
      }
    }
  }
}

template <class T> void mse_forward(const T* a, const T* b, T* out, int64_t n) {
  using S = loss_stat_t<T>;
#pragma omp parallel for simd if (n >= (1 << 16)) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const S d = cast_value<S>(a[i]) - cast_value<S>(b[i]);
    out[i] = cast_value<T>(d * d);
  }
}

template <class T> double mse_sum(const T* a, const T* b, int64_t n) {
  using S = loss_stat_t<T>;
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks);
#pragma omp parallel for if (chunks > 1) schedule(static)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t lo = k * kChunk, hi = std::min(n, lo + kChunk);
    S s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = lo; i < hi; ++i) {
      const S d = cast_value<S>(a[i]) - cast_value<S>(b[i]);
      s += d * d;
    }
    partial[k] = static_cast<double>(s);
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

template <class T>
void mse_backward(const T* a, const T* b, const T* g, int64_t g_stride, double scale, T* da, T* db, int64_t n) {
  using S = loss_stat_t<T>;
  const S k = static_cast<S>(2.0 * scale);
#pragma omp parallel for simd if (n >= (1 << 16)) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const S v = k * (cast_value<S>(a[i]) - cast_value<S>(b[i])) * cast_value<S>(g[i * g_stride]);  // 2 (a - b) g
    if (da) da[i] = cast_value<T>(v);
    if (db) db[i] = cast_value<T>(-v);
  }
}

// ---- reference kernels: double, one element at a time, from the definitions ----------
namespace ref {
template <class T>
void cross_entropy_forward(const T* logits, const int64_t* target, loss_stat_t<T>* stats, double* loss, int64_t N,
                           int64_t C, int64_t ignore_index, double eps) {
  std::vector<double> logp(C);
  for (int64_t n = 0; n < N; ++n) {
    if (target[n] == ignore_index) {
      stats[2 * n] = stats[2 * n + 1] = 0;
      loss[n] = 0;
      continue;
    }
    double m = -std::numeric_limits<double>::infinity(), s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, cast_value<double>(logits[n * C + c]));
    for (int64_t c = 0; c < C; ++c) s += std::exp(cast_value<double>(logits[n * C + c]) - m);
    for (int64_t c = 0; c < C; ++c) logp[c] = cast_value<double>(logits[n * C + c]) - m - std::log(s);
    double smooth = 0;
    for (int64_t c = 0; c < C; ++c) smooth += -logp[c];
    loss[n] = (1 - eps) * -logp[target[n]] + eps * smooth / C;
    stats[2 * n] = static_cast<loss_stat_t<T>>(m);
    stats[2 * n + 1] = static_cast<loss_stat_t<T>>(std::log(s));
  }
}
template <class T>
void cross_entropy_backward(const T* logits, const int64_t* target, const loss_stat_t<T>* stats, const double* grad,
                            int64_t grad_stride, double grad_scale, T* dlogits, int64_t N, int64_t C,
                            int64_t ignore_index, double eps) {
  for (int64_t n = 0; n < N; ++n) {
    // recomputes the softmax from the logits (the stats are not trusted here)
    double m = -std::numeric_limits<double>::infinity(), s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, cast_value<double>(logits[n * C + c]));
    for (int64_t c = 0; c < C; ++c) s += std::exp(cast_value<double>(logits[n * C + c]) - m);
    for (int64_t c = 0; c < C; ++c) {
      if (target[n] == ignore_index) { dlogits[n * C + c] = cast_value<T>(0.0); continue; }
      const double p = std::exp(cast_value<double>(logits[n * C + c]) - m) / s;
      const double q = (1 - eps) * (c == target[n] ? 1.0 : 0.0) + eps / C;  // smoothed target distribution
      dlogits[n * C + c] = cast_value<T>(grad[n * grad_stride] * grad_scale * (p - q));
    }
  }
}
template <class T> void mse_forward(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double d = cast_value<double>(a[i]) - cast_value<double>(b[i]);
    out[i] = cast_value<T>(d * d);
  }
}
template <class T> double mse_sum(const T* a, const T* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = cast_value<double>(a[i]) - cast_value<double>(b[i]);
    s += d * d;
  }
  return s;
}
template <class T>
void mse_backward(const T* a, const T* b, const T* g, int64_t g_stride, double scale, T* da, T* db, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = 2.0 * (cast_value<double>(a[i]) - cast_value<double>(b[i])) * cast_value<double>(g[i * g_stride]) * scale;
    if (da) da[i] = cast_value<T>(v);
    if (db) db[i] = cast_value<T>(-v);
  }
}
}  // namespace ref

#define ATHANOR_INSTANTIATE_LOSS_NS(NS, T)                                                                         \
  template void NS::cross_entropy_forward<T>(const T*, const int64_t*, loss_stat_t<T>*, double*, int64_t, int64_t, \
                                             int64_t, double);                                                    \
  template void NS::cross_entropy_backward<T>(const T*, const int64_t*, const loss_stat_t<T>*, const double*,      \
                                              int64_t, double, T*, int64_t, int64_t, int64_t, double);            \
  template void NS::mse_forward<T>(const T*, const T*, T*, int64_t);                                              \
  template double NS::mse_sum<T>(const T*, const T*, int64_t);                                                    \
  template void NS::mse_backward<T>(const T*, const T*, const T*, int64_t, double, T*, T*, int64_t);
#define ATHANOR_INSTANTIATE_LOSS(T)    \
  ATHANOR_INSTANTIATE_LOSS_NS(cpu, T) \
  ATHANOR_INSTANTIATE_LOSS_NS(ref, T)
ATHANOR_INSTANTIATE_LOSS(float)
ATHANOR_INSTANTIATE_LOSS(double)
ATHANOR_INSTANTIATE_LOSS(bfloat16)
ATHANOR_INSTANTIATE_LOSS(float16)
#undef ATHANOR_INSTANTIATE_LOSS
#undef ATHANOR_INSTANTIATE_LOSS_NS

}  // namespace athanor::cpu
