// BatchNorm kernels (batch_norm.h) and their naive references.
#include "backend/cpu/batch_norm.h"

#include <omp.h>

#include "athanor/core/convert.h"
#include "athanor/core/half.h"

namespace athanor::cpu {

template <class T> void batch_norm_stats(const T* x, norm_stat_t<T>* mean, norm_stat_t<T>* var, int64_t N, int64_t C, int64_t L) {
  using S = norm_stat_t<T>;
  const S inv_m = S(1) / static_cast<S>(N * L);
#pragma omp parallel for if (C > 1 && N * C * L >= (1 << 14)) schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    S s = 0;
    for (int64_t n = 0; n < N; ++n) {
      const T* p = x + (n * C + c) * L;
#pragma omp simd reduction(+ : s)
      for (int64_t l = 0; l < L; ++l) s += cast_value<S>(p[l]);
    }
    const S m = s * inv_m;
    S v = 0;
    for (int64_t n = 0; n < N; ++n) {
      const T* p = x + (n * C + c) * L;
#pragma omp simd reduction(+ : v)
      for (int64_t l = 0; l < L; ++l) {
        const S d = cast_value<S>(p[l]) - m;
        v += d * d;
      }
    }
    mean[c] = m;
    var[c] = v * inv_m;
  }
}

template <class T>
void batch_norm_forward(const T* x, const norm_stat_t<T>* mean, const norm_stat_t<T>* rstd, const T* w, const T* b, T* y,
                        int64_t N, int64_t C, int64_t L) {
  using S = norm_stat_t<T>;
#pragma omp parallel for if (N * C > 1 && N * C * L >= (1 << 14)) schedule(static)
  for (int64_t nc = 0; nc < N * C; ++nc) {
    const int64_t c = nc % C;
    // y = x * scale + shift with scale = rstd * w, shift = b - mean * scale
    const S scale = rstd[c] * (w ? cast_value<S>(w[c]) : S(1));
    const S shift = (b ? cast_value<S>(b[c]) : S(0)) - mean[c] * scale;
    const T* p = x + nc * L;
    T* q = y + nc * L;
#pragma omp simd
    for (int64_t l = 0; l < L; ++l) q[l] = cast_value<T>(cast_value<S>(p[l]) * scale + shift);
  }
}

template <class T>
void batch_norm_backward(const T* dy, const T* x, const norm_stat_t<T>* mean, const norm_stat_t<T>* rstd, const T* w,
                         T* dx, T* dw, T* db, int64_t N, int64_t C, int64_t L, bool training) {
  using S = norm_stat_t<T>;
  const S inv_m = S(1) / static_cast<S>(N * L);
#pragma omp parallel for if (C > 1 && N * C * L >= (1 << 14)) schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    const S m = mean[c], rs = rstd[c], wc = w ? cast_value<S>(w[c]) : S(1);
    S sdy = 0, sdy_xhat = 0;  // sum over (n, l) of dy and of dy * xhat
    for (int64_t n = 0; n < N; ++n) {
      const T* g = dy + (n * C + c) * L;
      const T* p = x + (n * C + c) * L;
#pragma omp simd reduction(+ : sdy, sdy_xhat)
      for (int64_t l = 0; l < L; ++l) {
        const S gl = cast_value<S>(g[l]);
        sdy += gl;
        sdy_xhat += gl * ((cast_value<S>(p[l]) - m) * rs);
      }
    }
    if (dw) dw[c] = cast_value<T>(sdy_xhat);  // dL/dw = sum dy * xhat
    if (db) db[c] = cast_value<T>(sdy);       // dL/db = sum dy
    if (!dx) continue;
    // training: dL/dx = w * rstd * (dy - mean(dy) - xhat * mean(dy * xhat))  (mean and var depend on x)
    // eval:     dL/dx = w * rstd * dy                                        (running stats are constants)
    const S k = wc * rs, a = training ? sdy * inv_m : S(0), bcoef = training ? sdy_xhat * inv_m : S(0);
    for (int64_t n = 0; n < N; ++n) {
      const T* g = dy + (n * C + c) * L;
      const T* p = x + (n * C + c) * L;
      T* q = dx + (n * C + c) * L;
#pragma omp simd
      for (int64_t l = 0; l < L; ++l) {
        const S xhat = (cast_value<S>(p[l]) - m) * rs;
        q[l] = cast_value<T>(k * (cast_value<S>(g[l]) - a - xhat * bcoef));
      }
    }
  }
}

namespace ref {
namespace {
template <class T> double at(const T* p, int64_t i) { return cast_value<double>(p[i]); }
template <class T> double at_or(const T* p, int64_t i, double fill) { return p ? cast_value<double>(p[i]) : fill; }
}  // namespace

template <class T> void batch_norm_stats(const T* x, norm_stat_t<T>* mean, norm_stat_t<T>* var, int64_t N, int64_t C, int64_t L) {
  for (int64_t c = 0; c < C; ++c) {
    double s = 0, v = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t l = 0; l < L; ++l) s += at(x, (n * C + c) * L + l);
    const double m = s / (N * L);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t l = 0; l < L; ++l) v += (at(x, (n * C + c) * L + l) - m) * (at(x, (n * C + c) * L + l) - m);
    mean[c] = static_cast<norm_stat_t<T>>(m);
    var[c] = static_cast<norm_stat_t<T>>(v / (N * L));
  }
}

template <class T>
void batch_norm_forward(const T* x, const norm_stat_t<T>* mean, const norm_stat_t<T>* rstd, const T* w, const T* b, T* y,
                        int64_t N, int64_t C, int64_t L) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t l = 0; l < L; ++l) {
        const int64_t i = (n * C + c) * L + l;
        y[i] = cast_value<T>((at(x, i) - mean[c]) * static_cast<double>(rstd[c]) * at_or(w, c, 1) + at_or(b, c, 0));
      }
}

template <class T>
void batch_norm_backward(const T* dy, const T* x, const norm_stat_t<T>* mean, const norm_stat_t<T>* rstd, const T* w,
                         T* dx, T* dw, T* db, int64_t N, int64_t C, int64_t L, bool training) {
  const double M = static_cast<double>(N * L);
  for (int64_t c = 0; c < C; ++c) {
    const double m = mean[c], rs = rstd[c];
    double sg = 0, sgx = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t l = 0; l < L; ++l) {
        const int64_t i = (n * C + c) * L + l;
        sg += at(dy, i);
        sgx += at(dy, i) * (at(x, i) - m) * rs;
      }
    if (dw) dw[c] = cast_value<T>(sgx);
    if (db) db[c] = cast_value<T>(sg);
    if (!dx) continue;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t l = 0; l < L; ++l) {
        const int64_t i = (n * C + c) * L + l;
        const double xhat = (at(x, i) - m) * rs;
        const double inner = training ? at(dy, i) - sg / M - xhat * sgx / M : at(dy, i);
        dx[i] = cast_value<T>(at_or(w, c, 1) * rs * inner);
      }
  }
}
}  // namespace ref

#define ATHANOR_INSTANTIATE_BATCH_NORM_NS(NS, T)                                                                    \
  template void NS::batch_norm_stats<T>(const T*, norm_stat_t<T>*, norm_stat_t<T>*, int64_t, int64_t, int64_t);   \
  template void NS::batch_norm_forward<T>(const T*, const norm_stat_t<T>*, const norm_stat_t<T>*, const T*,         \
                                          const T*, T*, int64_t, int64_t, int64_t);                                \
  template void NS::batch_norm_backward<T>(const T*, const T*, const norm_stat_t<T>*, const norm_stat_t<T>*,        \
                                           const T*, T*, T*, T*, int64_t, int64_t, int64_t, bool);
#define ATHANOR_INSTANTIATE_BATCH_NORM(T)    \
  ATHANOR_INSTANTIATE_BATCH_NORM_NS(cpu, T) \
  ATHANOR_INSTANTIATE_BATCH_NORM_NS(ref, T)
ATHANOR_INSTANTIATE_BATCH_NORM(float)
ATHANOR_INSTANTIATE_BATCH_NORM(double)
ATHANOR_INSTANTIATE_BATCH_NORM(bfloat16)
ATHANOR_INSTANTIATE_BATCH_NORM(float16)
#undef ATHANOR_INSTANTIATE_BATCH_NORM
#undef ATHANOR_INSTANTIATE_BATCH_NORM_NS

}  // namespace athanor::cpu
