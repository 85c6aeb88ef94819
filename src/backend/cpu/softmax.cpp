// Softmax kernels and the f32 row primitives (softmax.h), compiled once per ISA level
// (isa_kernel.h).
#include "backend/cpu/softmax.h"

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "athanor/core/convert.h"
#include "backend/cpu/isa_kernel.h"

#define ATHANOR_INSTANTIATE_SOFTMAX(T)                                               \
  template void softmax_forward<T>(const T*, T*, int64_t, int64_t, bool); \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t, bool);
#define ATHANOR_INSTANTIATE_SOFTMAX_LOWP(L)                                                      \
  template void softmax_forward_lowp_input<L>(const L*, float*, int64_t, int64_t, bool); \
  template void softmax_backward_lowp_dx<L>(const float*, const float*, L*, int64_t, int64_t, bool);
#define ATHANOR_INSTANTIATE_ROW(T)                                     \
  template void row::to_f32<T>(const T*, float*, int64_t); \
  template void row::from_f32<T>(const float*, T*, int64_t);

ATHANOR_ISA_BEGIN

namespace {
template <class T> using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

#if ATHANOR_CPU_AVX512
inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u); }

// exp(x) for 16 floats: x = n ln2 + r with |r| <= ln2/2, e^r by the Cephes
// polynomial (max rel. error ~2 ulp), 2^n applied with scalef so overflow gives
// inf and underflow goes through the subnormals to 0. The clamp keeps NaN (the
// second operand of max/min is returned when one is NaN).
inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // x - n * ln2 in two pieces (Cody–Waite)
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));  // 1 + r + r^2 p(r)
  return _mm512_scalef_ps(p, n);
}

inline __m512 load_bf16(const bfloat16* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_maskz_cvtepu16_epi32(0xffff, h), 16));
}
inline __m256i narrow_bf16(__m512 v) {  // round to nearest even, NaN quieted: bit-exact with float_to_bf16_bits
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}
#endif

// ---- f32 / f64 rows ----------------------------------------------------------------

void softmax_row(const float* x, float* y, int64_t n, bool log) {
  const float m = row::max(x, n);
  if (log) {
    const float ls = std::log(row::sum_exp(x, m, nullptr, n));
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - ls;  // x - m first: exact when x is near the max
  } else {
    const float inv = 1.0f / row::sum_exp(x, m, y, n);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] *= inv;
  }
}
void softmax_row(const double* x, double* y, int64_t n, bool log) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - m);
  if (log) {
    const double ls = std::log(s);
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - ls;
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i] - m) / s;
  }
}

template <class A> void softmax_backward_row(const A* dy, const A* y, A* dx, int64_t n, bool log) {
  if (log) {  // dx = dy - softmax * sum(dy), softmax = exp(y)
    A s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += dy[i];
    if constexpr (std::is_same_v<A, float>) {
      row::exp_shift(y, 0.0f, dx, n);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] - dx[i] * s;
    } else {
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] - std::exp(y[i]) * s;
    }
  } else {  // dx = y * (dy - <dy, y>)
    A d = 0;
#pragma omp simd reduction(+ : d)
    for (int64_t i = 0; i < n; ++i) d += dy[i] * y[i];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dx[i] = y[i] * (dy[i] - d);
  }
}

// Runs fn(row_in..., row_out) on every row, widening 16-bit inputs into per-thread
// f32 scratch rows and narrowing the output row back.
template <class T, class Fn>
void for_each_row(int64_t rows, int64_t cols, std::initializer_list<const T*> ins, T* out, Fn fn) {
  using A = acc_t<T>;
  constexpr bool wide = std::is_same_v<T, A>;
  const std::vector<const T*> in(ins);
#pragma omp parallel if (rows > 1 && rows * cols >= (1 << 14))
  {
    std::vector<A> scratch(wide ? 0 : (in.size() + 1) * cols);
    std::vector<const A*> rin(in.size());
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      A* rout;
      if constexpr (wide) {
        for (size_t k = 0; k < in.size(); ++k) rin[k] = in[k] + r * cols;
        rout = out + r * cols;
      } else {
        for (size_t k = 0; k < in.size(); ++k) {
          row::to_f32(in[k] + r * cols, scratch.data() + k * cols, cols);
          rin[k] = scratch.data() + k * cols;
        }
        rout = scratch.data() + in.size() * cols;
      }
      fn(rin.data(), rout);
      if constexpr (!wide) row::from_f32(rout, out + r * cols, cols);
    }
  }
}
}  // namespace

// ---- row primitives -------------------------------------------------------------------
namespace row {

template <class T> void to_f32(const T* src, float* dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    if (src != dst) std::copy(src, src + n, dst);
  } else {
#if ATHANOR_CPU_AVX512
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = tail_mask(n - i);
      __m512 v;
      if constexpr (std::is_same_v<T, bfloat16>) v = load_bf16(src + i, m);
      else v = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i));
      _mm512_mask_storeu_ps(dst + i, m, v);
    }
#else
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
#endif
  }
}

template <class T> void from_f32(const float* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    if (src != dst) std::copy(src, src + n, dst);
  } else {
#if ATHANOR_CPU_AVX512
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = tail_mask(n - i);
      const __m512 v = _mm512_maskz_loadu_ps(m, src + i);
      __m256i h;
      if constexpr (std::is_same_v<T, bfloat16>) h = narrow_bf16(v);
      else h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_mask_storeu_epi16(dst + i, m, h);
    }
#else
    for (int64_t i = 0; i < n; ++i) dst[i] = T(src[i]);
#endif
  }
}

float max(const float* x, int64_t n) {
#if ATHANOR_CPU_AVX512
  __m512 m = _mm512_set1_ps(kNegInf);
  for (int64_t i = 0; i < n; i += 16) m = _mm512_max_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(kNegInf), tail_mask(n - i), x + i), m);
  return _mm512_reduce_max_ps(m);
#else
  float m = kNegInf;
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
#endif
}

float sum_exp(const float* x, float shift, float* out, int64_t n) {
#if ATHANOR_CPU_AVX512
  const __m512 s = _mm512_set1_ps(shift);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 e0 = exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
    const __m512 e1 = exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), s));
    if (out) _mm512_storeu_ps(out + i, e0), _mm512_storeu_ps(out + i + 16, e1);
    acc0 = _mm512_add_ps(acc0, e0);
    acc1 = _mm512_add_ps(acc1, e1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), s));
    if (out) _mm512_mask_storeu_ps(out + i, m, e);
    acc0 = _mm512_mask_add_ps(acc0, m, acc0, e);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#else
  float acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float e = std::exp(x[i] - shift);
    if (out) out[i] = e;
    acc += e;
  }
  return acc;
#endif
}

void exp_shift(const float* x, float shift, float* y, int64_t n) {
#if ATHANOR_CPU_AVX512
  const __m512 s = _mm512_set1_ps(shift);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, exp512(_mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), s)));
  }
#else
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i] + shift);
#endif
}

}  // namespace row

// ---- fast kernels ---------------------------------------------------------------------

template <class T> void softmax_forward(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
  using A = acc_t<T>;
  for_each_row<T>(rows, cols, {x}, y, [&](const A* const* in, A* out) { softmax_row(in[0], out, cols, log); });
}

template <class T> void softmax_backward(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols, bool log) {
  using A = acc_t<T>;
  for_each_row<T>(rows, cols, {dy, y}, dx,
                  [&](const A* const* in, A* out) { softmax_backward_row<A>(in[0], in[1], out, cols, log); });
}

template <class L> void softmax_forward_lowp_input(const L* x, float* y, int64_t rows, int64_t cols, bool log) {
#pragma omp parallel if (rows > 1 && rows * cols >= (1 << 14))
  {
    std::vector<float> xr(cols);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      row::to_f32(x + r * cols, xr.data(), cols);
      softmax_row(xr.data(), y + r * cols, cols, log);
    }
  }
}
template <class L>
void softmax_backward_lowp_dx(const float* dy, const float* y, L* dx, int64_t rows, int64_t cols, bool log) {
#pragma omp parallel if (rows > 1 && rows * cols >= (1 << 14))
  {
    std::vector<float> dxr(cols);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      softmax_backward_row<float>(dy + r * cols, y + r * cols, dxr.data(), cols, log);
      row::from_f32(dxr.data(), dx + r * cols, cols);
    }
  }
}

// ---- reference kernels: one row at a time, in double, straight from the definitions ----
ATHANOR_INSTANTIATE_SOFTMAX(float)
ATHANOR_INSTANTIATE_SOFTMAX(double)
ATHANOR_INSTANTIATE_SOFTMAX(bfloat16)
ATHANOR_INSTANTIATE_SOFTMAX(float16)
ATHANOR_INSTANTIATE_SOFTMAX_LOWP(bfloat16)
ATHANOR_INSTANTIATE_SOFTMAX_LOWP(float16)
ATHANOR_INSTANTIATE_ROW(float)
ATHANOR_INSTANTIATE_ROW(bfloat16)
ATHANOR_INSTANTIATE_ROW(float16)

ATHANOR_ISA_END

#if ATHANOR_ISA_PRIMARY
namespace athanor::cpu {

ATHANOR_ISA_DECLARE(
    template <class T> void softmax_forward(const T* x, T* y, int64_t rows, int64_t cols, bool log);
    template <class T> void softmax_backward(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols, bool log);
    template <class L> void softmax_forward_lowp_input(const L* x, float* y, int64_t rows, int64_t cols, bool log);
    template <class L>
    void softmax_backward_lowp_dx(const float* dy, const float* y, L* dx, int64_t rows, int64_t cols, bool log);
    namespace row {
      template <class T> void to_f32(const T* src, float* dst, int64_t n);
      template <class T> void from_f32(const float* src, T* dst, int64_t n);
      float max(const float* x, int64_t n);
      float sum_exp(const float* x, float shift, float* out, int64_t n);
      void exp_shift(const float* x, float shift, float* y, int64_t n);
    })

template <class T> void softmax_forward(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
  ATHANOR_ISA_CALL(softmax_forward<T>, x, y, rows, cols, log);
}
template <class T> void softmax_backward(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols, bool log) {
  ATHANOR_ISA_CALL(softmax_backward<T>, dy, y, dx, rows, cols, log);
}
template <class L> void softmax_forward_lowp_input(const L* x, float* y, int64_t rows, int64_t cols, bool log) {
  ATHANOR_ISA_CALL(softmax_forward_lowp_input<L>, x, y, rows, cols, log);
}
template <class L>
void softmax_backward_lowp_dx(const float* dy, const float* y, L* dx, int64_t rows, int64_t cols, bool log) {
  ATHANOR_ISA_CALL(softmax_backward_lowp_dx<L>, dy, y, dx, rows, cols, log);
}
namespace row {
template <class T> void to_f32(const T* src, float* dst, int64_t n) { ATHANOR_ISA_CALL(row::to_f32<T>, src, dst, n); }
template <class T> void from_f32(const float* src, T* dst, int64_t n) { ATHANOR_ISA_CALL(row::from_f32<T>, src, dst, n); }
float max(const float* x, int64_t n) { ATHANOR_ISA_CALL(row::max, x, n); }
float sum_exp(const float* x, float shift, float* out, int64_t n) { ATHANOR_ISA_CALL(row::sum_exp, x, shift, out, n); }
void exp_shift(const float* x, float shift, float* y, int64_t n) { ATHANOR_ISA_CALL(row::exp_shift, x, shift, y, n); }
}  // namespace row
ATHANOR_INSTANTIATE_SOFTMAX(float)
ATHANOR_INSTANTIATE_SOFTMAX(double)
ATHANOR_INSTANTIATE_SOFTMAX(bfloat16)
ATHANOR_INSTANTIATE_SOFTMAX(float16)
ATHANOR_INSTANTIATE_SOFTMAX_LOWP(bfloat16)
ATHANOR_INSTANTIATE_SOFTMAX_LOWP(float16)
ATHANOR_INSTANTIATE_ROW(float)
ATHANOR_INSTANTIATE_ROW(bfloat16)
ATHANOR_INSTANTIATE_ROW(float16)

namespace ref {
template <class T> void softmax_forward(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
  std::vector<double> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < cols; ++c) row[c] = cast_value<double>(x[r * cols + c]), m = std::max(m, row[c]);
    double s = 0;
    for (int64_t c = 0; c < cols; ++c) s += std::exp(row[c] - m);
    for (int64_t c = 0; c < cols; ++c)
      y[r * cols + c] = cast_value<T>(log ? row[c] - m - std::log(s) : std::exp(row[c] - m) / s);
  }
}
template <class T> void softmax_backward(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols, bool log) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = dy + r * cols;
    const T* o = y + r * cols;
    double s = 0;  // softmax: sum_j g_j y_j; log_softmax: sum_j g_j
    for (int64_t c = 0; c < cols; ++c) s += cast_value<double>(g[c]) * (log ? 1.0 : cast_value<double>(o[c]));
    for (int64_t c = 0; c < cols; ++c) {
      const double gc = cast_value<double>(g[c]), yc = cast_value<double>(o[c]);
      dx[r * cols + c] = cast_value<T>(log ? gc - std::exp(yc) * s : yc * (gc - s));
    }
  }
}
}  // namespace ref


#define ATHANOR_INSTANTIATE_SOFTMAX_REF(T)                                                      \
  template void ref::softmax_forward<T>(const T*, T*, int64_t, int64_t, bool);              \
  template void ref::softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t, bool);
ATHANOR_INSTANTIATE_SOFTMAX_REF(float)
ATHANOR_INSTANTIATE_SOFTMAX_REF(double)
ATHANOR_INSTANTIATE_SOFTMAX_REF(bfloat16)
ATHANOR_INSTANTIATE_SOFTMAX_REF(float16)

}  // namespace athanor::cpu
#endif  // ATHANOR_ISA_PRIMARY
