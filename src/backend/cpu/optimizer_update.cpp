// The f32 optimizer / clipping loops (see optimizer_update.h), compiled once per ISA level
// (isa_kernel.h), with -ffp-contract=off (CMakeLists.txt): every FMA is written out, every
// other product is rounded on its own, at every level alike (the AVX-512 passes and the avx2
// level's scalar loops give the same bits: tests/backend/test_optimizer_update.cpp). The
// operation order of each formula is the one the earlier scalar loops compiled to (g++ 12
// -O3 -march=native, checked on the disassembly and by bench_optimizer_step --checksum),
// kept so that trajectories do not move:
//   SGD   d = fma(w, wd, g); b = fma(b, mom, (1-damp)·d); nesterov d = fma(b, mom, d); w = fnma(d, lr, w)
//   Adam  d = fma(w, wd, g) (L2) | g; m = fma(m, b1, (1-b1)·d); v = fma(v, b2, ((1-b2)·d)·d);
//         w = w·decay - (step·m) / fma(sqrt(v), 1/sqrt(bc2), eps)
#include "backend/cpu/optimizer_update.h"

#include <cmath>

#include "athanor/core/convert.h"
#include "backend/cpu/vec_math.h"

ATHANOR_ISA_BEGIN
namespace {

#if ATHANOR_CPU_AVX512
using vec::tail_mask;

// Full vectors use plain loads/stores; only the tail is masked (masked stores are
// several times slower on Zen 4: the clip's scale pass ran at half speed with them).
template <bool kTail> inline __m512 load(const float* p, __mmask16 m) {
  if constexpr (kTail) return _mm512_maskz_loadu_ps(m, p);
  else return _mm512_loadu_ps(p);
}
template <bool kTail> inline void store(float* p, __mmask16 m, __m512 v) {
  if constexpr (kTail) _mm512_mask_storeu_ps(p, m, v);
  else _mm512_storeu_ps(p, v);
}
// 16 weights rounded to bf16 / f16 as cast() rounds them (vec::narrow_bf16: the
// integer form, which keeps denormals); full blocks use unmasked stores.
template <bool kTail> inline void store_copy(void* copy, DType dt, int64_t i, __mmask16 m, __m512 w) {
  const __m256i h = dt == DType::bf16 ? vec::narrow_bf16(w) : _mm512_cvtps_ph(w, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  auto* p = static_cast<uint16_t*>(copy) + i;
  if constexpr (kTail) _mm256_mask_storeu_epi16(p, m, h);
  else _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
}
// Asks for the line that the loop reaches kWriteAhead elements later, in a writable
// state (PREFETCHW). In a training step the weights (or their bf16 copies) were last
// read by both cores (each thread of the forward's and backward's GEMMs packs its part
// of W), so their lines are shared; a plain store then waits for the other core to
// give its copy up, one line at a time. Asked ahead, the ownership requests overlap
// (bench/RESULTS.md has the gain; 1.5 KB ahead did best). The momentum, Adam moments and
// gradients are not shared: asking for them too gained nothing. (always_inline: GCC deems a function that only
// prefetches free of effects and deletes the calls it has not inlined yet.)
constexpr int64_t kWriteAhead = 384;
template <class T> [[gnu::always_inline]] inline void prefetch_for_write(const T* w, int64_t i, int64_t n) {
  // A call per 16 elements: each 64-byte line of f32 once; 2-byte copies twice (harmless).
  if (i + kWriteAhead < n) __builtin_prefetch(w + i + kWriteAhead, 1, 3);
}
// 16 gradients, times the clip coefficient when kScale, rounded as scale_f32 rounds them:
// f32(f64(g) * coef), so a step that folds the coefficient in gives the bits of one after
// the scaling pass.
template <bool kTail, bool kScale> inline __m512 load_grad(const float* g, __mmask16 m, __m512d coef) {
  const __m512 x = load<kTail>(g, m);
  if constexpr (!kScale) return x;
  const __m256 lo = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), coef));
  const __m256 hi = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)), coef));
  return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}
// Runs block.template operator()<kTail>(i, mask) over [0, n) in 16-lane blocks.
template <class Block> inline void for_blocks(int64_t n, const Block& block) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) block.template operator()<false>(i, __mmask16(0xffff));
  if (i < n) block.template operator()<true>(i, tail_mask(n - i));
}
#endif

template <bool kScale> inline float scalar_grad(float g, double coef) {
  if constexpr (kScale) return static_cast<float>(static_cast<double>(g) * coef);
  else return g;
}

inline void store_copy_scalar(void* copy, DType dt, int64_t i, float w) {
  if (dt == DType::bf16) static_cast<bfloat16*>(copy)[i] = cast_value<bfloat16>(w);
  else static_cast<float16*>(copy)[i] = cast_value<float16>(w);
}

// The SGD loop for one combination of the flags (hoisted out of the element loop).
template <bool kMomentum, bool kFirst, bool kNesterov, bool kCopy, bool kScale>
void sgd_loop(float* w, const float* g, float* b, int64_t n, const SgdConsts& k, void* copy, DType copy_dtype) {
#if ATHANOR_CPU_AVX512
  const __m512 lr = _mm512_set1_ps(k.lr), wd = _mm512_set1_ps(k.wd), mom = _mm512_set1_ps(k.momentum),
               omd = _mm512_set1_ps(k.one_minus_dampening);
  const __m512d coef = _mm512_set1_pd(k.grad_scale);
  for_blocks(n, [&]<bool kTail>(int64_t i, __mmask16 m) {
    prefetch_for_write(w, i, n);
    if constexpr (kCopy) prefetch_for_write(static_cast<const uint16_t*>(copy), i, n);
    const __m512 wi = load<kTail>(w + i, m);
    __m512 d = _mm512_fmadd_ps(wi, wd, load_grad<kTail, kScale>(g + i, m, coef));  // L2 weight decay enters the gradient
    if constexpr (kMomentum) {
      const __m512 bi = kFirst ? d : _mm512_fmadd_ps(load<kTail>(b + i, m), mom, _mm512_mul_ps(omd, d));
      store<kTail>(b + i, m, bi);
      d = kNesterov ? _mm512_fmadd_ps(bi, mom, d) : bi;
    }
    const __m512 wn = _mm512_fnmadd_ps(d, lr, wi);
    store<kTail>(w + i, m, wn);
    if constexpr (kCopy) store_copy<kTail>(copy, copy_dtype, i, m, wn);
  });
#else
  const float omd = k.one_minus_dampening;
  for (int64_t i = 0; i < n; ++i) {
    float d = std::fma(w[i], k.wd, scalar_grad<kScale>(g[i], k.grad_scale));
    if constexpr (kMomentum) {
      b[i] = kFirst ? d : std::fma(b[i], k.momentum, omd * d);
      d = kNesterov ? std::fma(b[i], k.momentum, d) : b[i];
    }
    w[i] = std::fma(-d, k.lr, w[i]);
    if constexpr (kCopy) store_copy_scalar(copy, copy_dtype, i, w[i]);
  }
#endif
}

template <bool kL2, bool kCopy, bool kScale>
void adam_loop(float* w, const float* g, float* mm, float* vv, int64_t n, const AdamConsts& k, void* copy,
               DType copy_dtype) {
  const float omb1 = 1.0f - k.beta1, omb2 = 1.0f - k.beta2;
#if ATHANOR_CPU_AVX512
  const __m512 b1 = _mm512_set1_ps(k.beta1), b2 = _mm512_set1_ps(k.beta2), c1 = _mm512_set1_ps(omb1),
               c2 = _mm512_set1_ps(omb2), eps = _mm512_set1_ps(k.eps), wd = _mm512_set1_ps(k.wd),
               step = _mm512_set1_ps(k.step_size), inv_bc2 = _mm512_set1_ps(k.inv_sqrt_bc2),
               decay = _mm512_set1_ps(k.decay);
  const __m512d coef = _mm512_set1_pd(k.grad_scale);
  for_blocks(n, [&]<bool kTail>(int64_t i, __mmask16 msk) {
    prefetch_for_write(w, i, n);
    if constexpr (kCopy) prefetch_for_write(static_cast<const uint16_t*>(copy), i, n);
    const __m512 wi = load<kTail>(w + i, msk), gi = load_grad<kTail, kScale>(g + i, msk, coef);
    const __m512 d = kL2 ? _mm512_fmadd_ps(wi, wd, gi) : gi;
    const __m512 m = _mm512_fmadd_ps(load<kTail>(mm + i, msk), b1, _mm512_mul_ps(c1, d));
    const __m512 v = _mm512_fmadd_ps(load<kTail>(vv + i, msk), b2, _mm512_mul_ps(_mm512_mul_ps(c2, d), d));
    const __m512 den = _mm512_fmadd_ps(_mm512_sqrt_ps(v), inv_bc2, eps);
    // w·decay is rounded on its own (the explicit-rounding multiply keeps g++'s
    // -ffp-contract=fast from fusing it into the subtraction). Masked-off tail lanes
    // divide 0 by eps: finite, and never stored.
    const __m512 decayed = _mm512_mul_round_ps(wi, decay, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 wn = _mm512_sub_ps(decayed, _mm512_div_ps(_mm512_mul_ps(step, m), den));
    store<kTail>(mm + i, msk, m);
    store<kTail>(vv + i, msk, v);
    store<kTail>(w + i, msk, wn);
    if constexpr (kCopy) store_copy<kTail>(copy, copy_dtype, i, msk, wn);
  });
#else
  for (int64_t i = 0; i < n; ++i) {
    const float gi = scalar_grad<kScale>(g[i], k.grad_scale);
    const float d = kL2 ? std::fma(w[i], k.wd, gi) : gi;
    mm[i] = std::fma(mm[i], k.beta1, omb1 * d);
    const float d2 = (omb2 * d) * d;
    vv[i] = std::fma(vv[i], k.beta2, d2);
    const float den = std::fma(std::sqrt(vv[i]), k.inv_sqrt_bc2, k.eps);
    const float decayed = w[i] * k.decay, delta = (k.step_size * mm[i]) / den;
    w[i] = decayed - delta;
    if constexpr (kCopy) store_copy_scalar(copy, copy_dtype, i, w[i]);
  }
#endif
}

}  // namespace

void sgd_f32(float* w, const float* g, float* b, int64_t n, const SgdConsts& k, void* copy, DType copy_dtype) {
  // Dispatch the flags once per chunk; each combination is its own branch-free loop.
  auto run = [&]<bool kCopy, bool kScale>() {
    if (!b) return sgd_loop<false, false, false, kCopy, kScale>(w, g, b, n, k, copy, copy_dtype);
    if (k.first && k.nesterov) return sgd_loop<true, true, true, kCopy, kScale>(w, g, b, n, k, copy, copy_dtype);
    if (k.first) return sgd_loop<true, true, false, kCopy, kScale>(w, g, b, n, k, copy, copy_dtype);
    if (k.nesterov) return sgd_loop<true, false, true, kCopy, kScale>(w, g, b, n, k, copy, copy_dtype);
    return sgd_loop<true, false, false, kCopy, kScale>(w, g, b, n, k, copy, copy_dtype);
  };
  const bool scale = k.grad_scale != 1.0;
  if (copy) scale ? run.template operator()<true, true>() : run.template operator()<true, false>();
  else scale ? run.template operator()<false, true>() : run.template operator()<false, false>();
}

void adam_f32(float* w, const float* g, float* m, float* v, int64_t n, const AdamConsts& k, void* copy,
              DType copy_dtype) {
  auto run = [&]<bool kCopy, bool kScale>() {
    if (k.l2) adam_loop<true, kCopy, kScale>(w, g, m, v, n, k, copy, copy_dtype);
    else adam_loop<false, kCopy, kScale>(w, g, m, v, n, k, copy, copy_dtype);
  };
  const bool scale = k.grad_scale != 1.0;
  if (copy) scale ? run.template operator()<true, true>() : run.template operator()<true, false>();
  else scale ? run.template operator()<false, true>() : run.template operator()<false, false>();
}

double sum_squares_f32(const float* x, int64_t n) {
#if ATHANOR_CPU_AVX512
  // Four f64 accumulators (two 16-float blocks per iteration) hide the FMA latency.
  __m512d acc[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    const __m512d a0 = _mm512_cvtps_pd(_mm512_castps512_ps256(a)), a1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(a, 1));
    const __m512d b0 = _mm512_cvtps_pd(_mm512_castps512_ps256(b)), b1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(b, 1));
    acc[0] = _mm512_fmadd_pd(a0, a0, acc[0]);
    acc[1] = _mm512_fmadd_pd(a1, a1, acc[1]);
    acc[2] = _mm512_fmadd_pd(b0, b0, acc[2]);
    acc[3] = _mm512_fmadd_pd(b1, b1, acc[3]);
  }
  for (; i < n; i += 16) {
    const __m512 a = _mm512_maskz_loadu_ps(tail_mask(n - i), x + i);  // masked lanes are 0: add nothing
    const __m512d a0 = _mm512_cvtps_pd(_mm512_castps512_ps256(a)), a1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(a, 1));
    acc[0] = _mm512_fmadd_pd(a0, a0, acc[0]);
    acc[1] = _mm512_fmadd_pd(a1, a1, acc[1]);
  }
  alignas(64) double lanes[8];  // (not _mm512_reduce_add_pd: GCC 12 PR 105593 warns inside it)
  _mm512_store_pd(lanes, _mm512_add_pd(_mm512_add_pd(acc[0], acc[1]), _mm512_add_pd(acc[2], acc[3])));
  double s = 0;
  for (const double l : lanes) s += l;
  return s;
#else
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
#endif
}

void scale_f32(float* x, int64_t n, double coef) {
#if ATHANOR_CPU_AVX512
  const __m512d c = _mm512_set1_pd(coef);
  auto scaled = [&](__m256 a) { return _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(a), c)); };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, scaled(_mm256_loadu_ps(x + i)));  // unmasked: the fast path
  if (i < n) {
    const __mmask8 m = static_cast<__mmask8>((1u << (n - i)) - 1u);
    _mm256_mask_storeu_ps(x + i, m, scaled(_mm256_maskz_loadu_ps(m, x + i)));
  }
#else
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(static_cast<double>(x[i]) * coef);
#endif
}

void narrow_f32(const float* w, void* dst, int64_t n, DType copy_dtype) {
#if ATHANOR_CPU_AVX512
  for_blocks(n, [&]<bool kTail>(int64_t i, __mmask16 m) { store_copy<kTail>(dst, copy_dtype, i, m, load<kTail>(w + i, m)); });
#else
  for (int64_t i = 0; i < n; ++i) store_copy_scalar(dst, copy_dtype, i, w[i]);
#endif
}

ATHANOR_ISA_END

#if ATHANOR_ISA_PRIMARY
namespace athanor::cpu {

ATHANOR_ISA_DECLARE(
    void sgd_f32(float* w, const float* g, float* b, int64_t n, const SgdConsts& k, void* copy, DType copy_dtype);
    void adam_f32(float* w, const float* g, float* m, float* v, int64_t n, const AdamConsts& k, void* copy,
                  DType copy_dtype);
    double sum_squares_f32(const float* x, int64_t n);
    void scale_f32(float* x, int64_t n, double coef);
    void narrow_f32(const float* w, void* dst, int64_t n, DType copy_dtype);)

void sgd_f32(float* w, const float* g, float* b, int64_t n, const SgdConsts& k, void* copy, DType copy_dtype) {
  ATHANOR_ISA_CALL(sgd_f32, w, g, b, n, k, copy, copy_dtype);
}
void adam_f32(float* w, const float* g, float* m, float* v, int64_t n, const AdamConsts& k, void* copy,
              DType copy_dtype) {
  ATHANOR_ISA_CALL(adam_f32, w, g, m, v, n, k, copy, copy_dtype);
}
double sum_squares_f32(const float* x, int64_t n) { ATHANOR_ISA_CALL(sum_squares_f32, x, n); }
void scale_f32(float* x, int64_t n, double coef) { ATHANOR_ISA_CALL(scale_f32, x, n, coef); }
void narrow_f32(const float* w, void* dst, int64_t n, DType copy_dtype) {
  ATHANOR_ISA_CALL(narrow_f32, w, dst, n, copy_dtype);
}

}  // namespace athanor::cpu
#endif  // ATHANOR_ISA_PRIMARY
