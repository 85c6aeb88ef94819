// LayerNorm and RMSNorm kernels (norm.h), compiled once per ISA level (isa_kernel.h).
#include "backend/cpu/norm.h"

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "athanor/core/convert.h"
#include "athanor/core/error.h"
#include "backend/cpu/softmax.h"  // row::to_f32 / row::from_f32
#include "backend/cpu/vec_math.h"  // vec:: 16-lane loads/stores of f32, bf16 and f16

#define ATHANOR_INSTANTIATE_LN_LOWP(L)                                                                           \
  template void layer_norm_forward_lowp_input<L>(const L*, const float*, const float*, float*, float*, float*, \
                                                 int64_t, int64_t, double);                                    \
  template void layer_norm_backward_lowp_input<L>(const float*, const L*, const float*, const float*,          \
                                                  const float*, L*, float*, float*, int64_t, int64_t);
#define ATHANOR_INSTANTIATE_LN_XHAT(L)                                                                              \
  template void layer_norm_forward_keep_xhat<L>(const float*, const float*, const float*, float*, L*, float*, float*, \
                                                int64_t, int64_t, double, L*);                                      \
  template void layer_norm_backward_from_xhat<L>(const float*, const L*, const float*, const float*, float*, float*,  \
                                                 float*, int64_t, int64_t, bool);
#define ATHANOR_INSTANTIATE_RMS_LOWP(L)                                                                             \
  template void rms_norm_forward_lowp_input<L>(const L*, const float*, float*, float*, int64_t, int64_t, double); \
  template void rms_norm_backward_lowp_input<L>(const float*, const L*, const float*, const float*, L*, float*,    \
                                                int64_t, int64_t);
#define ATHANOR_INSTANTIATE_NORM(T)                                                                              \
  template void layer_norm_forward<T>(const T*, const T*, const T*, T*, norm_stat_t<T>*, norm_stat_t<T>*, int64_t,  \
                                      int64_t, double);                                                            \
  template void layer_norm_backward<T>(const T*, const T*, const T*, const norm_stat_t<T>*, const norm_stat_t<T>*,  \
                                       T*, T*, T*, int64_t, int64_t, bool);                                        \
  template void rms_norm_forward<T>(const T*, const T*, T*, norm_stat_t<T>*, int64_t, int64_t, double);            \
  template void rms_norm_backward<T>(const T*, const T*, const T*, const norm_stat_t<T>*, T*, T*, int64_t, int64_t);
#define ATHANOR_INSTANTIATE_NORM_REF(T)                                                                           \
  template void ref::layer_norm_forward<T>(const T*, const T*, const T*, T*, norm_stat_t<T>*, norm_stat_t<T>*,     \
                                           int64_t, int64_t, double);                                              \
  template void ref::layer_norm_backward<T>(const T*, const T*, const T*, const norm_stat_t<T>*,                   \
                                            const norm_stat_t<T>*, T*, T*, T*, int64_t, int64_t);                  \
  template void ref::rms_norm_forward<T>(const T*, const T*, T*, norm_stat_t<T>*, int64_t, int64_t, double);       \
  template void ref::rms_norm_backward<T>(const T*, const T*, const T*, const norm_stat_t<T>*, T*, T*, int64_t,     \
                                          int64_t);

ATHANOR_ISA_BEGIN

namespace {

// A parameter vector (weight/bias) as S: the pointer itself for S-typed data, a
// widened copy for 16-bit data, or `fill` repeated when the parameter is absent.
template <class T, class S> const S* param_as(const T* p, std::vector<S>& buf, int64_t n, S fill) {
  if constexpr (std::is_same_v<T, S>) {
    if (p) return p;
  } else {
    if (p) {
      buf.resize(n);
      row::to_f32(p, buf.data(), n);
      return buf.data();
    }
  }
  buf.assign(n, fill);
  return buf.data();
}

// Row ranges big enough to be worth a thread team.
inline bool parallel_rows(int64_t rows, int64_t cols) { return rows > 1 && rows * cols >= (1 << 14); }

// Per-thread partial sums of per-column gradients (dweight, dbias), added in
// thread order at the end: deterministic for a fixed thread count.
// Each thread's row starts on its own cache line and is padded to whole lines: every
// thread updates its row once per input row, so a line shared by two threads would
// bounce between their cores on every row (false sharing: it made a 2-thread
// layer_norm backward of 2048 x 256 slower than the 1-thread one).
template <class S> struct ColumnPartials {
  static constexpr int64_t kLine = 64 / sizeof(S);  // elements per cache line
  int nthreads;
  int64_t cols, stride;
  std::vector<S> buf;
  S* base = nullptr;
  ColumnPartials(bool on, int64_t c)
      : nthreads(omp_get_max_threads()), cols(c), stride((c + kLine - 1) / kLine * kLine),
        buf(on ? nthreads * stride + kLine : 0, S(0)) {
    if (on) base = buf.data() + (kLine - (reinterpret_cast<std::uintptr_t>(buf.data()) / sizeof(S)) % kLine) % kLine;
  }
  S* of(int tid) { return base ? base + tid * stride : nullptr; }
  template <class T> void reduce_into(T* out) const {
    if (!out) return;
    std::vector<S> acc(base, base + cols);
    for (int t = 1; t < nthreads; ++t)
      for (int64_t i = 0; i < cols; ++i) acc[i] += base[t * stride + i];
    for (int64_t i = 0; i < cols; ++i) out[i] = cast_value<T>(acc[i]);
  }
};

// Per-thread views of one row as S: the data itself (f32/f64) or widened scratch (16-bit).
template <class T> struct RowIO {
  using S = norm_stat_t<T>;
  static constexpr bool wide = std::is_same_v<T, S>;
  std::vector<S> scratch;
  int64_t cols;
  RowIO(int nbuf, int64_t c) : scratch(wide ? 0 : nbuf * c), cols(c) {}
  const S* in(const T* p, int slot) {
    if constexpr (wide) return p;
    else { row::to_f32(p, scratch.data() + slot * cols, cols); return scratch.data() + slot * cols; }
  }
  S* out(T* p, int slot) {
    if constexpr (wide) return p;
    else return scratch.data() + slot * cols;
  }
  void commit(const S* r, T* p) {
    if constexpr (!wide) row::from_f32(r, p, cols);
  }
};

#if ATHANOR_CPU_AVX512
// ---- LayerNorm rows in AVX-512 (f32 statistics), 16 lanes at a time, each storage type
// widened/narrowed in registers: no scratch copy of a row and no separate passes per sum.

// Loads and stores of 16 lanes: plain for a full vector, masked only for a row's tail
// (masked accesses to memory are slower on some cores, e.g. stores on AMD Zen).
constexpr __mmask16 kFull = 0xffff;
inline __m512 ld(const float* p, __mmask16 k) { return k == kFull ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(k, p); }
inline __m256i ld16bits(const void* p, __mmask16 k) {
  return k == kFull ? _mm256_loadu_si256(static_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(k, p);
}
inline __m512 ld(const bfloat16* p, __mmask16 k) {  // exact: bf16 is the top half of an f32
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_maskz_cvtepu16_epi32(0xffff, ld16bits(p, k)), 16));
}
inline __m512 ld(const float16* p, __mmask16 k) { return _mm512_cvtph_ps(ld16bits(p, k)); }
inline void st(float* p, __mmask16 k, __m512 v) {
  if (k == kFull) _mm512_storeu_ps(p, v);
  else _mm512_mask_storeu_ps(p, k, v);
}
inline void st16bits(void* p, __mmask16 k, __m256i v) {
  if (k == kFull) _mm256_storeu_si256(static_cast<__m256i*>(p), v);
  else _mm256_mask_storeu_epi16(p, k, v);
}
inline void st(bfloat16* p, __mmask16 k, __m512 v) { st16bits(p, k, vec::narrow_bf16(v)); }
inline void st(float16* p, __mmask16 k, __m512 v) {
  st16bits(p, k, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// Row statistics in one pass, in f64 lanes (their accuracy must not depend on how a sum
// is split into lanes): with d = x - K for a shift K = x[0] taken from the row,
// mean = K + sum(d)/n and var = sum(d^2)/n - (sum(d)/n)^2. The shift keeps the
// subtraction free of cancellation when |mean| >> std (the textbook shifted-data
// algorithm); d and d^2 of f32 data are exact or nearly so in f64.
inline void add_shifted(__m512d& s0, __m512d& s1, __m512d& q0, __m512d& q1, __m512 v, __m512d shift, __mmask16 k) {
  const __m512d d0 = _mm512_maskz_sub_pd(static_cast<__mmask8>(k), _mm512_cvtps_pd(_mm512_castps512_ps256(v)), shift);
  const __m512d d1 = _mm512_maskz_sub_pd(static_cast<__mmask8>(k >> 8),
                                         _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))),
                                         shift);
  s0 = _mm512_add_pd(s0, d0);
  s1 = _mm512_add_pd(s1, d1);
  q0 = _mm512_fmadd_pd(d0, d0, q0);
  q1 = _mm512_fmadd_pd(d1, d1, q1);
}

// One row forward: mean, rstd; y = xhat * w + b; xhat itself and y rounded to TH too
// when `xhat` / `y_low` are not null.
template <class TX, class TY, class TH>
inline void layer_norm_row_forward(const TX* x, const float* w, const float* b, TY* y, TH* xhat, TH* y_low,
                                   float& mean, float& rstd, int64_t cols, double eps) {
  const double K = static_cast<double>(static_cast<float>(x[0]));
  const __m512d shift = _mm512_set1_pd(K);
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd(), q0 = _mm512_setzero_pd(), q1 = _mm512_setzero_pd();
  for (int64_t i = 0; i < cols; i += 16) {
    const __mmask16 k = vec::tail_mask(cols - i);
    add_shifted(s0, s1, q0, q1, ld(x + i, k), shift, k);
  }
  const double n = static_cast<double>(cols), dm = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1)) / n;
  const double var = std::max(0.0, _mm512_reduce_add_pd(_mm512_add_pd(q0, q1)) / n - dm * dm);
  const float m = static_cast<float>(K + dm);
  const float rs = static_cast<float>(1.0 / std::sqrt(var + eps));
  const __m512 vm = _mm512_set1_ps(m);
  const __m512 vrs = _mm512_set1_ps(rs);
  for (int64_t i = 0; i < cols; i += 16) {
    const __mmask16 k = vec::tail_mask(cols - i);
    const __m512 h = _mm512_mul_ps(_mm512_sub_ps(ld(x + i, k), vm), vrs);
    const __m512 yv = _mm512_fmadd_ps(h, ld(w + i, k), ld(b + i, k));
    st(y + i, k, yv);
    if (xhat) st(xhat + i, k, h);
    if (y_low) st(y_low + i, k, yv);
  }
  mean = m;
  rstd = rs;
}

// One row backward. xhat is (x - mean) * rstd when kFromX, else read from `xh` (a saved
// xhat); dn = dy * w:  dx = rstd * (dn - mean(dn) - xhat * mean(dn * xhat)),
// dw += dy * xhat, db += dy (per-thread partial rows; null when not wanted).
// kAccumulate: dx += the row's gradient (dx f32), the product kept apart from the sum (no FMA),
// so the result is bit-identical to adding the gradient in a pass of its own.
template <bool kFromX, bool kAccumulate = false, class TG, class TX, class TD>
inline void layer_norm_row_backward(const TG* dy, const TX* xh, const float* w, float mean, float rstd, TD* dx,
                                    float* tdw, float* tdb, int64_t cols) {
  static_assert(!kAccumulate || std::is_same_v<TD, float>);
  const __m512 vm = _mm512_set1_ps(mean), vrs = _mm512_set1_ps(rstd);
  auto xhat_at = [&](int64_t i, __mmask16 k) {
    const __m512 v = ld(xh + i, k);
    return kFromX ? _mm512_mul_ps(_mm512_sub_ps(v, vm), vrs) : v;
  };
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  for (int64_t i = 0; i < cols; i += 16) {  // one pass for both row sums and both column sums
    const __mmask16 k = vec::tail_mask(cols - i);
    const __m512 g = ld(dy + i, k), h = xhat_at(i, k);
    const __m512 dn = _mm512_mul_ps(g, ld(w + i, k));
    a0 = _mm512_add_ps(a0, dn);
    a1 = _mm512_fmadd_ps(dn, h, a1);
    if (tdw) st(tdw + i, k, _mm512_fmadd_ps(g, h, ld(tdw + i, k)));
    if (tdb) st(tdb + i, k, _mm512_add_ps(g, ld(tdb + i, k)));
  }
  if (!dx) return;
  const float inv_n = 1.0f / static_cast<float>(cols);
  const __m512 dn_mean = _mm512_set1_ps(_mm512_reduce_add_ps(a0) * inv_n);
  const __m512 dn_xhat_mean = _mm512_set1_ps(_mm512_reduce_add_ps(a1) * inv_n);
  for (int64_t i = 0; i < cols; i += 16) {
    const __mmask16 k = vec::tail_mask(cols - i);
    const __m512 dn = _mm512_mul_ps(ld(dy + i, k), ld(w + i, k));
    // direct path through xhat, minus the paths through the mean and through rstd
    const __m512 inner = _mm512_fnmadd_ps(xhat_at(i, k), dn_xhat_mean, _mm512_sub_ps(dn, dn_mean));
    __m512 g = _mm512_mul_ps(vrs, inner);
    if constexpr (kAccumulate) {
      asm("" : "+v"(g));  // rounded here: GCC would otherwise contract the multiply and the add into an FMA
      g = _mm512_add_ps(ld(dx + i, k), g);
    }
    st(dx + i, k, g);
  }
}
#endif

}  // namespace

// ---- LayerNorm ---------------------------------------------------------------------------

namespace {
// x (and dx) of type TX; weight, bias, y (and dy, dweight, dbias) of type TY. TX == TY
// is the plain kernel; TX = bf16/f16 with TY = f32 reads a 16-bit input directly and
// writes f32 (layer_norm under autocast), with no f32 copy of x.
template <class TX, class TY>
void layer_norm_forward_impl(const TX* x, const TY* w, const TY* b, TY* y, norm_stat_t<TX>* mean, norm_stat_t<TX>* rstd,
                             int64_t rows, int64_t cols, double eps) {
  using S = norm_stat_t<TX>;
  static_assert(std::is_same_v<S, norm_stat_t<TY>>);
  std::vector<S> wbuf, bbuf;
  const S* pw = param_as<TY, S>(w, wbuf, cols, S(1));
  const S* pb = param_as<TY, S>(b, bbuf, cols, S(0));
  const S e = static_cast<S>(eps);
#if ATHANOR_CPU_AVX512
  if constexpr (std::is_same_v<S, float>) {
#pragma omp parallel for if (parallel_rows(rows, cols)) schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      layer_norm_row_forward<TX, TY, float>(x + r * cols, pw, pb, y + r * cols, nullptr, nullptr, mean[r], rstd[r], cols,
                                            eps);
    return;
  }
#endif
#pragma omp parallel if (parallel_rows(rows, cols))
  {
    RowIO<TX> iox(1, cols);
    RowIO<TY> ioy(1, cols);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const S* xr = iox.in(x + r * cols, 0);
      S* yr = ioy.out(y + r * cols, 0);
      // Row statistics accumulate in f64: their accuracy must not depend on how
      // the compiler vectorizes the sum (an f32 sum of 5000 values differs by
      // ~1e-6 relative between vectorized and scalar code).
      double s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < cols; ++i) s += static_cast<double>(xr[i]);
      const double md = s / static_cast<double>(cols);
      const S m = static_cast<S>(md);
      // Second pass over the (cached) row, about the f64 mean: no cancellation from E[x^2] -
      // E[x]^2, and none from the f32 mean's rounding either (at |mean| = 1e7 an f32 mean is
      // off by up to 0.5, which would add its square to the variance).
      double v = 0;
#pragma omp simd reduction(+ : v)
      for (int64_t i = 0; i < cols; ++i) v += (static_cast<double>(xr[i]) - md) * (static_cast<double>(xr[i]) - md);
      const S rs = static_cast<S>(1.0 / std::sqrt(v / static_cast<double>(cols) + static_cast<double>(e)));
#pragma omp simd
      for (int64_t i = 0; i < cols; ++i) yr[i] = (xr[i] - m) * rs * pw[i] + pb[i];
      mean[r] = m;
      rstd[r] = rs;
      ioy.commit(yr, y + r * cols);
    }
  }
}

template <class TX, class TY>
void layer_norm_backward_impl(const TY* dy, const TX* x, const TY* w, const norm_stat_t<TX>* mean,
                              const norm_stat_t<TX>* rstd, TX* dx, TY* dw, TY* db, int64_t rows, int64_t cols,
                              bool accumulate_dx = false) {
  using S = norm_stat_t<TX>;
  ATH_ASSERT((!accumulate_dx || std::is_same_v<TX, S>));  // f32 / f64 gradients only
  std::vector<S> wbuf;
  const S* pw = param_as<TY, S>(w, wbuf, cols, S(1));
  ColumnPartials<S> pdw(dw != nullptr, cols), pdb(db != nullptr, cols);
  const S inv_n = S(1) / static_cast<S>(cols);
#pragma omp parallel if (parallel_rows(rows, cols))
  {
    RowIO<TX> iox(2, cols);
    RowIO<TY> ioy(1, cols);
    std::vector<S> acc_row(accumulate_dx && dx ? cols : 0);
    S* tdw = pdw.of(omp_get_thread_num());
    S* tdb = pdb.of(omp_get_thread_num());
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
#if ATHANOR_CPU_AVX512
      if constexpr (std::is_same_v<S, float>) {
        TX* dxr = dx ? dx + r * cols : nullptr;
        if constexpr (std::is_same_v<TX, float>)
          if (accumulate_dx) {
            layer_norm_row_backward<true, true>(dy + r * cols, x + r * cols, pw, mean[r], rstd[r], dxr, tdw, tdb, cols);
            continue;
          }
        layer_norm_row_backward<true>(dy + r * cols, x + r * cols, pw, mean[r], rstd[r], dxr, tdw, tdb, cols);
        continue;
      }
#endif
      const S* dyr = ioy.in(dy + r * cols, 0);
      const S* xr = iox.in(x + r * cols, 0);
      const S m = mean[r], rs = rstd[r];
      // y = xhat * w + b with xhat = (x - mean) * rstd, dnorm = dy * w = dL/dxhat.
      S dn_mean = 0, dn_xhat_mean = 0;
      if (tdw && tdb) {  // the common case, fused: one read of the row for all four sums
#pragma omp simd reduction(+ : dn_mean, dn_xhat_mean)
        for (int64_t i = 0; i < cols; ++i) {
          const S xhat = (xr[i] - m) * rs, dn = dyr[i] * pw[i];
          dn_mean += dn;
          dn_xhat_mean += dn * xhat;
          tdw[i] += dyr[i] * xhat;  // dL/dw = sum_rows dy * xhat
          tdb[i] += dyr[i];         // dL/db = sum_rows dy
        }
      } else {
#pragma omp simd reduction(+ : dn_mean, dn_xhat_mean)
        for (int64_t i = 0; i < cols; ++i) {
          const S xhat = (xr[i] - m) * rs, dn = dyr[i] * pw[i];
          dn_mean += dn;
          dn_xhat_mean += dn * xhat;
        }
        if (tdw) {
#pragma omp simd
          for (int64_t i = 0; i < cols; ++i) tdw[i] += dyr[i] * ((xr[i] - m) * rs);
        }
        if (tdb) {
#pragma omp simd
          for (int64_t i = 0; i < cols; ++i) tdb[i] += dyr[i];
        }
      }
      dn_mean *= inv_n;
      dn_xhat_mean *= inv_n;
      if (dx) {
        // Accumulating (TX == S), this row's gradient goes to scratch first and is added in a
        // second loop: in one loop the compiler would fuse rstd * (...) + dx into an FMA, and
        // the sum would differ in its last bit from the one autograd makes apart.
        S* dxr = accumulate_dx ? acc_row.data() : iox.out(dx + r * cols, 1);
        // dL/dx = rstd * (dnorm                  direct path through xhat
        //                 - mean(dnorm)          through the mean
        //                 - xhat * mean(dnorm * xhat))   through rstd
#pragma omp simd
        for (int64_t i = 0; i < cols; ++i) {
          const S xhat = (xr[i] - m) * rs;
          dxr[i] = rs * (dyr[i] * pw[i] - dn_mean - xhat * dn_xhat_mean);
        }
        if (accumulate_dx) {
          if constexpr (std::is_same_v<TX, S>) {
            S* out = dx + r * cols;
#pragma omp simd
            for (int64_t i = 0; i < cols; ++i) out[i] += dxr[i];
          }
        } else {
          iox.commit(dxr, dx + r * cols);
        }
      }
    }
  }
  pdw.reduce_into(dw);
  pdb.reduce_into(db);
}

}  // namespace

template <class T>
void layer_norm_forward(const T* x, const T* w, const T* b, T* y, norm_stat_t<T>* mean, norm_stat_t<T>* rstd,
                        int64_t rows, int64_t cols, double eps) {
  layer_norm_forward_impl<T, T>(x, w, b, y, mean, rstd, rows, cols, eps);
}
template <class T>
void layer_norm_backward(const T* dy, const T* x, const T* w, const norm_stat_t<T>* mean, const norm_stat_t<T>* rstd,
                         T* dx, T* dw, T* db, int64_t rows, int64_t cols, bool accumulate_dx) {
  layer_norm_backward_impl<T, T>(dy, x, w, mean, rstd, dx, dw, db, rows, cols, accumulate_dx);
}
template <class L>
void layer_norm_forward_lowp_input(const L* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                                   int64_t rows, int64_t cols, double eps) {
  layer_norm_forward_impl<L, float>(x, w, b, y, mean, rstd, rows, cols, eps);
}
template <class L>
void layer_norm_backward_lowp_input(const float* dy, const L* x, const float* w, const float* mean, const float* rstd,
                                    L* dx, float* dw, float* db, int64_t rows, int64_t cols) {
  layer_norm_backward_impl<L, float>(dy, x, w, mean, rstd, dx, dw, db, rows, cols);
}

// f32 x, xhat kept in L for backward (layer_norm under autocast): see norm.h.
template <class L>
void layer_norm_forward_keep_xhat(const float* x, const float* w, const float* b, float* y, L* xhat, float* mean,
                                  float* rstd, int64_t rows, int64_t cols, double eps, L* y_low) {
#if ATHANOR_CPU_AVX512
  // The plain kernel's row function with xhat stored in the same pass: y stays bit-identical.
  std::vector<float> wbuf, bbuf;
  const float* pw = param_as<float, float>(w, wbuf, cols, 1.0f);
  const float* pb = param_as<float, float>(b, bbuf, cols, 0.0f);
#pragma omp parallel for if (parallel_rows(rows, cols)) schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    layer_norm_row_forward<float, float, L>(x + r * cols, pw, pb, y + r * cols, xhat + r * cols,
                                            y_low ? y_low + r * cols : nullptr, mean[r], rstd[r], cols, eps);
#else
  layer_norm_forward_impl<float, float>(x, w, b, y, mean, rstd, rows, cols, eps);
  // A second pass over x for xhat: it is memory-bound and leaves y bit-identical to the plain kernel.
#pragma omp parallel if (parallel_rows(rows, cols))
  {
    std::vector<float> scratch(cols);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const float m = mean[r], rs = rstd[r];
#pragma omp simd
      for (int64_t i = 0; i < cols; ++i) scratch[i] = (xr[i] - m) * rs;
      row::from_f32(scratch.data(), xhat + r * cols, cols);
      if (y_low) row::from_f32(y + r * cols, y_low + r * cols, cols);
    }
  }
#endif
}

template <class L>
void layer_norm_backward_from_xhat(const float* dy, const L* xhat, const float* w, const float* rstd, float* dx,
                                   float* dw, float* db, int64_t rows, int64_t cols, bool accumulate_dx) {
  std::vector<float> wbuf;
  const float* pw = param_as<float, float>(w, wbuf, cols, 1.0f);
  ColumnPartials<float> pdw(dw != nullptr, cols), pdb(db != nullptr, cols);
  const float inv_n = 1.0f / static_cast<float>(cols);
#pragma omp parallel if (parallel_rows(rows, cols))
  {
    RowIO<L> ioh(1, cols);
    std::vector<float> acc_row(accumulate_dx && dx ? cols : 0);
    float* tdw = pdw.of(omp_get_thread_num());
    float* tdb = pdb.of(omp_get_thread_num());
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
#if ATHANOR_CPU_AVX512
      if (accumulate_dx)
        layer_norm_row_backward<false, true>(dy + r * cols, xhat + r * cols, pw, 0.0f, rstd[r],
                                             dx ? dx + r * cols : nullptr, tdw, tdb, cols);
      else
        layer_norm_row_backward<false>(dy + r * cols, xhat + r * cols, pw, 0.0f, rstd[r], dx ? dx + r * cols : nullptr,
                                       tdw, tdb, cols);
      continue;
#endif
      const float* dyr = dy + r * cols;
      const float* hr = ioh.in(xhat + r * cols, 0);
      float dn_mean = 0, dn_xhat_mean = 0;
#pragma omp simd reduction(+ : dn_mean, dn_xhat_mean)
      for (int64_t i = 0; i < cols; ++i) {
        const float dn = dyr[i] * pw[i];  // dL/dxhat
        dn_mean += dn;
        dn_xhat_mean += dn * hr[i];
      }
      if (tdw) {
#pragma omp simd
        for (int64_t i = 0; i < cols; ++i) tdw[i] += dyr[i] * hr[i];  // dL/dw = sum_rows dy * xhat
      }
      if (tdb) {
#pragma omp simd
        for (int64_t i = 0; i < cols; ++i) tdb[i] += dyr[i];  // dL/db = sum_rows dy
      }
      dn_mean *= inv_n;
      dn_xhat_mean *= inv_n;
      if (dx) {
        // Accumulating: this row's gradient in scratch, then added in a loop of its own (no
        // FMA across the two: bit-identical to autograd's separate sum).
        float* out = dx + r * cols;
        float* dxr = accumulate_dx ? acc_row.data() : out;
        const float rs = rstd[r];
        // direct path through xhat, minus the paths through the mean and through rstd
#pragma omp simd
        for (int64_t i = 0; i < cols; ++i) dxr[i] = rs * (dyr[i] * pw[i] - dn_mean - hr[i] * dn_xhat_mean);
        if (accumulate_dx) {
#pragma omp simd
          for (int64_t i = 0; i < cols; ++i) out[i] += dxr[i];
        }
      }
    }
  }
  pdw.reduce_into(dw);
  pdb.reduce_into(db);
}

// ---- RMSNorm -----------------------------------------------------------------------------

namespace {
// x (and dx) of type TX; weight, y (and dy, dweight) of type TY, as for LayerNorm above.
template <class TX, class TY>
void rms_norm_forward_impl(const TX* x, const TY* w, TY* y, norm_stat_t<TX>* rstd, int64_t rows, int64_t cols,
                           double eps) {
  using S = norm_stat_t<TX>;
  static_assert(std::is_same_v<S, norm_stat_t<TY>>);
  std::vector<S> wbuf;
  const S* pw = param_as<TY, S>(w, wbuf, cols, S(1));
  const S e = static_cast<S>(eps);
#pragma omp parallel if (parallel_rows(rows, cols))
  {
    RowIO<TX> iox(1, cols);
    RowIO<TY> ioy(1, cols);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const S* xr = iox.in(x + r * cols, 0);
      S* yr = ioy.out(y + r * cols, 0);
      double ss = 0;  // f64 accumulation, as in layer_norm_forward
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < cols; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const S rs = static_cast<S>(1.0 / std::sqrt(ss / static_cast<double>(cols) + static_cast<double>(e)));
#pragma omp simd
      for (int64_t i = 0; i < cols; ++i) yr[i] = xr[i] * rs * pw[i];
      rstd[r] = rs;
      ioy.commit(yr, y + r * cols);
    }
  }
}

template <class TX, class TY>
void rms_norm_backward_impl(const TY* dy, const TX* x, const TY* w, const norm_stat_t<TX>* rstd, TX* dx, TY* dw,
                            int64_t rows, int64_t cols) {
  using S = norm_stat_t<TX>;
  std::vector<S> wbuf;
  const S* pw = param_as<TY, S>(w, wbuf, cols, S(1));
  ColumnPartials<S> pdw(dw != nullptr, cols);
  const S inv_n = S(1) / static_cast<S>(cols);
#pragma omp parallel if (parallel_rows(rows, cols))
  {
    RowIO<TX> iox(2, cols);
    RowIO<TY> ioy(1, cols);
    S* tdw = pdw.of(omp_get_thread_num());
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const S* dyr = ioy.in(dy + r * cols, 0);
      const S* xr = iox.in(x + r * cols, 0);
      const S rs = rstd[r];
      S dn_xhat_mean = 0;  // mean(dnorm * xhat), dnorm = dy * w, xhat = x * rstd
#pragma omp simd reduction(+ : dn_xhat_mean)
      for (int64_t i = 0; i < cols; ++i) dn_xhat_mean += dyr[i] * pw[i] * (xr[i] * rs);
      dn_xhat_mean *= inv_n;
      if (tdw) {
#pragma omp simd
        for (int64_t i = 0; i < cols; ++i) tdw[i] += dyr[i] * (xr[i] * rs);  // dL/dw = sum_rows dy * xhat
      }
      if (dx) {
        S* dxr = iox.out(dx + r * cols, 1);
        // dL/dx = rstd * (dnorm - xhat * mean(dnorm * xhat)): direct path, then through rstd
#pragma omp simd
        for (int64_t i = 0; i < cols; ++i) dxr[i] = rs * (dyr[i] * pw[i] - (xr[i] * rs) * dn_xhat_mean);
        iox.commit(dxr, dx + r * cols);
      }
    }
  }
  pdw.reduce_into(dw);
}
}  // namespace

template <class T>
void rms_norm_forward(const T* x, const T* w, T* y, norm_stat_t<T>* rstd, int64_t rows, int64_t cols, double eps) {
  rms_norm_forward_impl<T, T>(x, w, y, rstd, rows, cols, eps);
}
template <class T>
void rms_norm_backward(const T* dy, const T* x, const T* w, const norm_stat_t<T>* rstd, T* dx, T* dw, int64_t rows,
                       int64_t cols) {
  rms_norm_backward_impl<T, T>(dy, x, w, rstd, dx, dw, rows, cols);
}
template <class L>
void rms_norm_forward_lowp_input(const L* x, const float* w, float* y, float* rstd, int64_t rows, int64_t cols,
                                 double eps) {
  rms_norm_forward_impl<L, float>(x, w, y, rstd, rows, cols, eps);
}
template <class L>
void rms_norm_backward_lowp_input(const float* dy, const L* x, const float* w, const float* rstd, L* dx, float* dw,
                                  int64_t rows, int64_t cols) {
  rms_norm_backward_impl<L, float>(dy, x, w, rstd, dx, dw, rows, cols);
}

// ---- reference kernels: double, no threads, straight from the definitions ---------------
ATHANOR_INSTANTIATE_LN_LOWP(bfloat16)
ATHANOR_INSTANTIATE_LN_LOWP(float16)
ATHANOR_INSTANTIATE_LN_XHAT(bfloat16)
ATHANOR_INSTANTIATE_LN_XHAT(float16)
ATHANOR_INSTANTIATE_RMS_LOWP(bfloat16)
ATHANOR_INSTANTIATE_RMS_LOWP(float16)
ATHANOR_INSTANTIATE_NORM(float)
ATHANOR_INSTANTIATE_NORM(double)
ATHANOR_INSTANTIATE_NORM(bfloat16)
ATHANOR_INSTANTIATE_NORM(float16)

ATHANOR_ISA_END

#if ATHANOR_ISA_PRIMARY
namespace athanor::cpu {

ATHANOR_ISA_DECLARE(
    template <class T>
    void layer_norm_forward(const T* x, const T* w, const T* b, T* y, norm_stat_t<T>* mean, norm_stat_t<T>* rstd,
                            int64_t rows, int64_t cols, double eps);
    template <class T>
    void layer_norm_backward(const T* dy, const T* x, const T* w, const norm_stat_t<T>* mean,
                             const norm_stat_t<T>* rstd, T* dx, T* dw, T* db, int64_t rows, int64_t cols,
                             bool accumulate_dx);
    template <class L>
    void layer_norm_forward_lowp_input(const L* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                                       int64_t rows, int64_t cols, double eps);
    template <class L>
    void layer_norm_backward_lowp_input(const float* dy, const L* x, const float* w, const float* mean,
                                        const float* rstd, L* dx, float* dw, float* db, int64_t rows, int64_t cols);
    template <class L>
    void layer_norm_forward_keep_xhat(const float* x, const float* w, const float* b, float* y, L* xhat, float* mean,
                                      float* rstd, int64_t rows, int64_t cols, double eps, L* y_low);
    template <class L>
    void layer_norm_backward_from_xhat(const float* dy, const L* xhat, const float* w, const float* rstd, float* dx,
                                       float* dw, float* db, int64_t rows, int64_t cols, bool accumulate_dx);
    template <class T>
    void rms_norm_forward(const T* x, const T* w, T* y, norm_stat_t<T>* rstd, int64_t rows, int64_t cols, double eps);
    template <class T>
    void rms_norm_backward(const T* dy, const T* x, const T* w, const norm_stat_t<T>* rstd, T* dx, T* dw,
                           int64_t rows, int64_t cols);
    template <class L>
    void rms_norm_forward_lowp_input(const L* x, const float* w, float* y, float* rstd, int64_t rows, int64_t cols,
                                     double eps);
    template <class L>
    void rms_norm_backward_lowp_input(const float* dy, const L* x, const float* w, const float* rstd, L* dx,
                                      float* dw, int64_t rows, int64_t cols);)

template <class T>
void layer_norm_forward(const T* x, const T* w, const T* b, T* y, norm_stat_t<T>* mean, norm_stat_t<T>* rstd,
                        int64_t rows, int64_t cols, double eps) {
  ATHANOR_ISA_CALL(layer_norm_forward<T>, x, w, b, y, mean, rstd, rows, cols, eps);
}
template <class T>
void layer_norm_backward(const T* dy, const T* x, const T* w, const norm_stat_t<T>* mean, const norm_stat_t<T>* rstd,
                         T* dx, T* dw, T* db, int64_t rows, int64_t cols, bool accumulate_dx) {
  ATHANOR_ISA_CALL(layer_norm_backward<T>, dy, x, w, mean, rstd, dx, dw, db, rows, cols, accumulate_dx);
}
template <class L>
void layer_norm_forward_lowp_input(const L* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                                   int64_t rows, int64_t cols, double eps) {
  ATHANOR_ISA_CALL(layer_norm_forward_lowp_input<L>, x, w, b, y, mean, rstd, rows, cols, eps);
}
template <class L>
void layer_norm_backward_lowp_input(const float* dy, const L* x, const float* w, const float* mean, const float* rstd,
                                    L* dx, float* dw, float* db, int64_t rows, int64_t cols) {
  ATHANOR_ISA_CALL(layer_norm_backward_lowp_input<L>, dy, x, w, mean, rstd, dx, dw, db, rows, cols);
}
template <class L>
void layer_norm_forward_keep_xhat(const float* x, const float* w, const float* b, float* y, L* xhat, float* mean,
                                  float* rstd, int64_t rows, int64_t cols, double eps, L* y_low) {
  ATHANOR_ISA_CALL(layer_norm_forward_keep_xhat<L>, x, w, b, y, xhat, mean, rstd, rows, cols, eps, y_low);
}
template <class L>
void layer_norm_backward_from_xhat(const float* dy, const L* xhat, const float* w, const float* rstd, float* dx,
                                   float* dw, float* db, int64_t rows, int64_t cols, bool accumulate_dx) {
  ATHANOR_ISA_CALL(layer_norm_backward_from_xhat<L>, dy, xhat, w, rstd, dx, dw, db, rows, cols, accumulate_dx);
}
template <class T>
void rms_norm_forward(const T* x, const T* w, T* y, norm_stat_t<T>* rstd, int64_t rows, int64_t cols, double eps) {
  ATHANOR_ISA_CALL(rms_norm_forward<T>, x, w, y, rstd, rows, cols, eps);
}
template <class T>
void rms_norm_backward(const T* dy, const T* x, const T* w, const norm_stat_t<T>* rstd, T* dx, T* dw, int64_t rows,
                       int64_t cols) {
  ATHANOR_ISA_CALL(rms_norm_backward<T>, dy, x, w, rstd, dx, dw, rows, cols);
}
template <class L>
void rms_norm_forward_lowp_input(const L* x, const float* w, float* y, float* rstd, int64_t rows, int64_t cols,
                                 double eps) {
  ATHANOR_ISA_CALL(rms_norm_forward_lowp_input<L>, x, w, y, rstd, rows, cols, eps);
}
template <class L>
void rms_norm_backward_lowp_input(const float* dy, const L* x, const float* w, const float* rstd, L* dx, float* dw,
                                  int64_t rows, int64_t cols) {
  ATHANOR_ISA_CALL(rms_norm_backward_lowp_input<L>, dy, x, w, rstd, dx, dw, rows, cols);
}
ATHANOR_INSTANTIATE_LN_LOWP(bfloat16)
ATHANOR_INSTANTIATE_LN_LOWP(float16)
ATHANOR_INSTANTIATE_LN_XHAT(bfloat16)
ATHANOR_INSTANTIATE_LN_XHAT(float16)
ATHANOR_INSTANTIATE_RMS_LOWP(bfloat16)
ATHANOR_INSTANTIATE_RMS_LOWP(float16)
ATHANOR_INSTANTIATE_NORM(float)
ATHANOR_INSTANTIATE_NORM(double)
ATHANOR_INSTANTIATE_NORM(bfloat16)
ATHANOR_INSTANTIATE_NORM(float16)

namespace ref {
namespace {
template <class T> double at(const T* p, int64_t i) { return cast_value<double>(p[i]); }
template <class T> double at_or(const T* p, int64_t i, double fill) { return p ? cast_value<double>(p[i]) : fill; }
}  // namespace

template <class T>
void layer_norm_forward(const T* x, const T* w, const T* b, T* y, norm_stat_t<T>* mean, norm_stat_t<T>* rstd,
                        int64_t rows, int64_t cols, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    double m = 0, v = 0;
    for (int64_t i = 0; i < cols; ++i) m += at(xr, i);
    m /= cols;
    for (int64_t i = 0; i < cols; ++i) v += (at(xr, i) - m) * (at(xr, i) - m);
    v /= cols;
    const double rs = 1.0 / std::sqrt(v + eps);
    for (int64_t i = 0; i < cols; ++i) y[r * cols + i] = cast_value<T>((at(xr, i) - m) * rs * at_or(w, i, 1) + at_or(b, i, 0));
    mean[r] = static_cast<norm_stat_t<T>>(m);
    rstd[r] = static_cast<norm_stat_t<T>>(rs);
  }
}

template <class T>
void layer_norm_backward(const T* dy, const T* x, const T* w, const norm_stat_t<T>* mean, const norm_stat_t<T>* rstd,
                         T* dx, T* dw, T* db, int64_t rows, int64_t cols) {
  std::vector<double> gw(cols, 0.0), gb(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double m = mean[r], rs = rstd[r];
    double s1 = 0, s2 = 0;
    for (int64_t i = 0; i < cols; ++i) {
      const double xhat = (at(x, r * cols + i) - m) * rs, g = at(dy, r * cols + i);
      s1 += g * at_or(w, i, 1);
      s2 += g * at_or(w, i, 1) * xhat;
      gw[i] += g * xhat;
      gb[i] += g;
    }
    for (int64_t i = 0; i < cols; ++i) {
      const double xhat = (at(x, r * cols + i) - m) * rs;
      if (dx) dx[r * cols + i] = cast_value<T>(rs * (at(dy, r * cols + i) * at_or(w, i, 1) - s1 / cols - xhat * s2 / cols));
    }
  }
  for (int64_t i = 0; i < cols; ++i) {
    if (dw) dw[i] = cast_value<T>(gw[i]);
    if (db) db[i] = cast_value<T>(gb[i]);
  }
}

template <class T>
void rms_norm_forward(const T* x, const T* w, T* y, norm_stat_t<T>* rstd, int64_t rows, int64_t cols, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < cols; ++i) ss += at(x, r * cols + i) * at(x, r * cols + i);
    const double rs = 1.0 / std::sqrt(ss / cols + eps);
    for (int64_t i = 0; i < cols; ++i) y[r * cols + i] = cast_value<T>(at(x, r * cols + i) * rs * at_or(w, i, 1));
    rstd[r] = static_cast<norm_stat_t<T>>(rs);
  }
}

template <class T>
void rms_norm_backward(const T* dy, const T* x, const T* w, const norm_stat_t<T>* rstd, T* dx, T* dw, int64_t rows,
                       int64_t cols) {
  std::vector<double> gw(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double rs = rstd[r];
    double s = 0;
    for (int64_t i = 0; i < cols; ++i) {
      const double xhat = at(x, r * cols + i) * rs, g = at(dy, r * cols + i);
      s += g * at_or(w, i, 1) * xhat;
      gw[i] += g * xhat;
    }
    for (int64_t i = 0; i < cols; ++i) {
      const double xhat = at(x, r * cols + i) * rs;
      if (dx) dx[r * cols + i] = cast_value<T>(rs * (at(dy, r * cols + i) * at_or(w, i, 1) - xhat * s / cols));
    }
  }
  if (dw)
    for (int64_t i = 0; i < cols; ++i) dw[i] = cast_value<T>(gw[i]);
}

}  // namespace ref

ATHANOR_INSTANTIATE_NORM_REF(float)
ATHANOR_INSTANTIATE_NORM_REF(double)
ATHANOR_INSTANTIATE_NORM_REF(bfloat16)
ATHANOR_INSTANTIATE_NORM_REF(float16)

}  // namespace athanor::cpu
#endif  // ATHANOR_ISA_PRIMARY
