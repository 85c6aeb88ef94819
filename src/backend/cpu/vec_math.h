#pragma once
// The vector math of the elementwise kernels, for the per-level kernel files
// (isa_kernel.h): 16-lane f32 loads and stores of f32, bf16 and f16 with masked
// tails, and the f32 polynomial exp, log, tanh, sigmoid and normal CDF, at the
// avx512 levels; at the avx2 level, map1/map2 compute per element in double.
// Everything here is defined in athanor::cpu::<level>::vec.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "athanor/core/convert.h"
#include "backend/cpu/isa_kernel.h"
#include "backend/cpu/unary.h"  // vec::parallel_blocks and the grain sizes

ATHANOR_ISA_BEGIN
namespace vec {

using cpu::vec::kBlock;
using cpu::vec::kGrainCheap;
using cpu::vec::kGrainTranscendental;
using cpu::vec::parallel_blocks;

#if ATHANOR_CPU_AVX512
// ---- 16 lanes of f32 in, 16 lanes out, for each storage type (masked tails).
// Full vectors (m == 0xffff) use plain loads and stores: masked ones cost up to 2x on
// cold data on Zen 5 (measured on the layer_norm kernels); only tails are masked.
inline __m256i load16_bits(const void* p, __mmask16 m) {
  return m == 0xffff ? _mm256_loadu_si256(static_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(m, p);
}
inline void store16_bits(void* p, __mmask16 m, __m256i v) {
  if (m == 0xffff) _mm256_storeu_si256(static_cast<__m256i*>(p), v);
  else _mm256_mask_storeu_epi16(p, m, v);
}
inline __m512 load16(const float* p, __mmask16 m) { return m == 0xffff ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p); }
// (the zero-masking form with an all-ones mask: the plain one's _mm512_undefined_epi32 trips
// GCC 12's -Wuninitialized when inlined)
inline __m512 load16(const bfloat16* p, __mmask16 m) {  // bf16 is the top half of an f32: exact
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_maskz_cvtepu16_epi32(0xffff, load16_bits(p, m)), 16));
}
inline __m512 load16(const float16* p, __mmask16 m) { return _mm512_cvtph_ps(load16_bits(p, m)); }

inline void store16(float* p, __mmask16 m, __m512 v) {
  if (m == 0xffff) _mm512_storeu_ps(p, v);
  else _mm512_mask_storeu_ps(p, m, v);
}
// 16 f32 lanes rounded to bf16 bits exactly as float_to_bf16_bits (nearest even,
// denormals kept, NaN quieted), in integer SIMD: VCVTNEPS2BF16 would flush denormals.
inline __m256i narrow_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}
inline void store16(bfloat16* p, __mmask16 m, __m512 v) { store16_bits(p, m, narrow_bf16(v)); }
inline void store16(float16* p, __mmask16 m, __m512 v) {
  store16_bits(p, m, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u); }

// ---- f32 vector math. Accuracy (measured against double, see tests/backend/test_unary_kernels.cpp):
// exp, log: <= 2 ulp; tanh, sigmoid: <= 4 ulp; normal CDF: <= 16 ulp.

// e^(a + b) for a "large" part a and a small correction b (|b| <~ 2): n = round((a+b)/ln2),
// and the range reduction r = (a - n ln2) + b subtracts n ln2 from a alone (Cody-Waite,
// exact), so callers with a two-term argument (gelu's -x²/2 as hi + lo) keep full
// accuracy; |r| <~ ln2/2 + rounding. exp(x) is exp2part(x, 0). Overflow gives +inf,
// underflow 0 (through denormals, by VSCALEFPS), NaN stays NaN.
inline __m512 exp2part(__m512 a, __m512 b) {
  // Clamp keeps n finite and r bounded; e^-110 and e^95 are already 0 and inf in f32
  // whatever b is. max/min return their second operand for NaN, so NaN passes through.
  a = _mm512_min_ps(_mm512_set1_ps(95.0f), _mm512_max_ps(_mm512_set1_ps(-110.0f), a));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_add_ps(a, b), _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), a);  // ln2 = 0.693359375 - 2.12194440e-4
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  r = _mm512_add_ps(r, b);
  // e^r on |r| <~ ln2/2: Cephes expf minimax polynomial.
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);  // p * 2^n with correct overflow/underflow
}
inline __m512 exp(__m512 x) { return exp2part(x, _mm512_setzero_ps()); }

// ln x: x = m 2^e with m in [sqrt(1/2), sqrt(2)), Cephes logf polynomial in m - 1.
inline __m512 log(__m512 x) {
  __m512 e = _mm512_getexp_ps(x);                                         // floor(log2 x), denormals too
  __m512 m = _mm512_getmant_ps(x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_zero);  // [1, 2)
  const __mmask16 big = _mm512_cmp_ps_mask(m, _mm512_set1_ps(1.41421356237f), _CMP_GT_OQ);
  m = _mm512_mask_mul_ps(m, big, m, _mm512_set1_ps(0.5f));
  e = _mm512_mask_add_ps(e, big, e, _mm512_set1_ps(1.0f));
  const __m512 f = _mm512_sub_ps(m, _mm512_set1_ps(1.0f));
  const __m512 z = _mm512_mul_ps(f, f);
  __m512 y = _mm512_set1_ps(7.0376836292e-2f);
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-1.1514610310e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.1676998740e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-1.2420140846e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.4249322787e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-1.6668057665e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.0000714765e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-2.4999993993e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(3.3333331174e-1f));
  y = _mm512_mul_ps(_mm512_mul_ps(y, f), z);
  y = _mm512_fmadd_ps(e, _mm512_set1_ps(-2.12194440e-4f), y);
  y = _mm512_fnmadd_ps(z, _mm512_set1_ps(0.5f), y);
  __m512 r = _mm512_add_ps(f, y);
  r = _mm512_fmadd_ps(e, _mm512_set1_ps(0.693359375f), r);
  // Special values: log(0) = -inf, log(x < 0) = NaN, log(inf) = inf, NaN stays NaN.
  r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_EQ_OQ), _mm512_set1_ps(-INFINITY));
  r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), _mm512_set1_ps(NAN));
  r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x, _mm512_set1_ps(INFINITY), _CMP_EQ_OQ), x);
  r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
  return r;
}

inline __m512 abs(__m512 x) { return _mm512_abs_ps(x); }

// tanh: odd polynomial for |x| < 0.625, else sign(x) (1 - 2 / (e^{2|x|} + 1)) (Cephes tanhf).
inline __m512 tanh(__m512 x) {
  const __m512 ax = _mm512_abs_ps(x);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 s = exp(_mm512_add_ps(ax, ax));
  __m512 big = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(s, one)));
  big = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(big),  // copy x's sign
                                            _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(int(0x80000000u)))));
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(-5.70498872745e-3f);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
  // NaN compares false, so it takes the polynomial branch and stays NaN.
  return _mm512_mask_mov_ps(small, _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_GE_OQ), big);
}

// Numerically stable logistic pieces of z: e = e^{-|z|} (in (0, 1], never overflows)
// and num = 1 for z >= 0, e for z < 0, so that sigmoid(z) = num / (1 + e) and
// sigmoid(z)(1 - sigmoid(z)) = e / (1 + e)². Deep negative z gives denormal/0, not 1/inf.
struct Logistic {
  __m512 e, num;
};
inline Logistic logistic(__m512 z) {
  Logistic l;
  l.e = exp(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(z)));
  l.num = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_LT_OQ), l.e);
  return l;
}
inline __m512 sigmoid(__m512 x) {
  const Logistic l = logistic(x);
  return _mm512_div_ps(l.num, _mm512_add_ps(_mm512_set1_ps(1.0f), l.e));
}

// Standard normal CDF Phi(x) = erfc(-x/sqrt2)/2, and its density phi(x) = e^{-x²/2}/sqrt(2 pi).
// erfc(z), z >= 0, is t exp(-z² + P(t)), t = 1/(1 + z/2) (Numerical Recipes' erfcc,
// relative error < 1.2e-7 for all z); -z² = -x²/2 is kept as an exact hi + lo pair
// (FMA) so the tail keeps its relative accuracy. Phi = 1 - erfc/2 for x >= 0.
struct NormalCdfPdf {
  __m512 cdf, pdf_exp;  // pdf_exp = e^{-x²/2} (multiply by 1/sqrt(2 pi) for the density)
};
inline NormalCdfPdf normal_cdf(__m512 x, bool want_pdf) {
  const __m512 one = _mm512_set1_ps(1.0f), half = _mm512_set1_ps(0.5f);
  const __m512 z = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(0.70710678118654752f));
  const __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(half, z, one));
  __m512 p = _mm512_set1_ps(0.17087277f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.82215223f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.48851587f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.13520398f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.27886807f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.18628806f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.09678418f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.37409196f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.00002368f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.26551223f));
  const __m512 sq_hi = _mm512_mul_ps(x, x);
  // x² = sq_hi + sq_lo exactly (FMA); sq_lo is 0 where x² overflows (else inf - inf = NaN).
  const __m512 sq_lo = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(1e18f), _CMP_LT_OQ),
                                           _mm512_fmsub_ps(x, x, sq_hi));
  const __m512 a = _mm512_mul_ps(sq_hi, _mm512_set1_ps(-0.5f));
  const __m512 lo = _mm512_mul_ps(sq_lo, _mm512_set1_ps(-0.5f));
  const __m512 erfc = _mm512_mul_ps(t, exp2part(a, _mm512_add_ps(lo, p)));
  const __m512 h = _mm512_mul_ps(half, erfc);
  const __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ);
  NormalCdfPdf r;
  r.cdf = _mm512_mask_sub_ps(h, pos, one, h);
  r.pdf_exp = want_pdf ? exp2part(a, lo) : _mm512_setzero_ps();
  return r;
}

// Applies f to n elements: f.vec(__m512) for f32/bf16/f16 (16 lanes, masked tail),
// f.scalar(double) for f64.
template <class T, class F> void map1(const T* x, T* out, int64_t n, int64_t grain, const F& f) {
  if constexpr (std::is_same_v<T, double>) {
    parallel_blocks(n, grain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[i] = f.scalar(x[i]);
    });
  } else {
    parallel_blocks(n, grain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; i += 16) {
        const __mmask16 m = tail_mask(e - i);
        store16(out + i, m, f.vec(load16(x + i, m)));
      }
    });
  }
}
template <class T, class F> void map2(const T* x, const T* y, T* out, int64_t n, int64_t grain, const F& f) {
  if constexpr (std::is_same_v<T, double>) {
    parallel_blocks(n, grain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[i] = f.scalar(x[i], y[i]);
    });
  } else {
    parallel_blocks(n, grain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; i += 16) {
        const __mmask16 m = tail_mask(e - i);
        store16(out + i, m, f.vec(load16(x + i, m), load16(y + i, m)));
      }
    });
  }
}
#else   // portable fallback: per-element f.scalar in double (accurate tails), rounded once to T
        // (for bf16/f16 through f32, exactly as cast_value does)
template <class T, class F> void map1(const T* x, T* out, int64_t n, int64_t grain, const F& f) {
  parallel_blocks(n, grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = cast_value<T>(f.scalar(cast_value<double>(x[i])));
  });
}
template <class T, class F> void map2(const T* x, const T* y, T* out, int64_t n, int64_t grain, const F& f) {
  parallel_blocks(n, grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = cast_value<T>(f.scalar(cast_value<double>(x[i]), cast_value<double>(y[i])));
  });
}
#endif
}  // namespace vec
ATHANOR_ISA_END
