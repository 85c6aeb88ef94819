// SwiGLU's elementwise passes (see swiglu.h), compiled once per ISA level (isa_kernel.h): at the
// avx512 levels f32/bf16/f16 run 16 lanes with the overflow-free logistic of vec_math.h (one exp
// per element), elsewhere (f64, the avx2 level) a scalar loop.
#include "backend/cpu/swiglu.h"

#include <cmath>
#include <type_traits>

#include "athanor/core/convert.h"
#include "athanor/core/half.h"
#include "backend/cpu/vec_math.h"

ATHANOR_ISA_BEGIN
namespace {
template <class T> using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;
constexpr int64_t kGrain = vec::kGrainTranscendental;
}  // namespace

template <class T> void swiglu_forward(const T* g, const T* u, T* y, int64_t n) {
#if ATHANOR_CPU_AVX512
  if constexpr (!std::is_same_v<T, double>) {
    vec::parallel_blocks(n, kGrain, [&](int64_t b, int64_t e) {
      const __m512 one = _mm512_set1_ps(1.0f);
      for (int64_t i = b; i < e; i += 16) {
        const __mmask16 m = vec::tail_mask(e - i);
        const __m512 x = vec::load16(g + i, m);
        const vec::Logistic l = vec::logistic(x);  // sigmoid(x) = num / (1 + e)
        const __m512 silu = _mm512_div_ps(_mm512_mul_ps(x, l.num), _mm512_add_ps(one, l.e));
        vec::store16(y + i, m, _mm512_mul_ps(silu, vec::load16(u + i, m)));
      }
    });
    return;
  }
#endif
  using C = acc_t<T>;
  vec::parallel_blocks(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const C gv = cast_value<C>(g[i]);
      y[i] = cast_value<T>(gv / (C(1) + std::exp(-gv)) * cast_value<C>(u[i]));
    }
  });
}

template <class T> void swiglu_backward(const T* dy, const T* g, const T* u, T* dg, T* du, int64_t n) {
#if ATHANOR_CPU_AVX512
  if constexpr (!std::is_same_v<T, double>) {
    vec::parallel_blocks(n, kGrain, [&](int64_t b, int64_t e) {
      const __m512 one = _mm512_set1_ps(1.0f);
      for (int64_t i = b; i < e; i += 16) {
        const __mmask16 m = vec::tail_mask(e - i);
        const __m512 x = vec::load16(g + i, m), d = vec::load16(dy + i, m);
        const vec::Logistic l = vec::logistic(x);
        const __m512 s = _mm512_div_ps(l.num, _mm512_add_ps(one, l.e));  // sigmoid(x)
        const __m512 silu = _mm512_mul_ps(x, s);
        // silu'(x) = s (1 + x (1 - s)) = s + silu (1 - s)
        const __m512 slope = _mm512_fmadd_ps(silu, _mm512_sub_ps(one, s), s);
        vec::store16(dg + i, m, _mm512_mul_ps(_mm512_mul_ps(d, vec::load16(u + i, m)), slope));
        vec::store16(du + i, m, _mm512_mul_ps(d, silu));
      }
    });
    return;
  }
#endif
  using C = acc_t<T>;
  vec::parallel_blocks(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const C gv = cast_value<C>(g[i]), d = cast_value<C>(dy[i]);
      const C s = C(1) / (C(1) + std::exp(-gv));
      dg[i] = cast_value<T>(d * cast_value<C>(u[i]) * s * (C(1) + gv * (C(1) - s)));
      du[i] = cast_value<T>(d * gv * s);
    }
  });
}

namespace {
struct Sum {
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 a, __m512 b) const { return _mm512_add_ps(a, b); }
#endif
  template <class C> C scalar(C a, C b) const { return a + b; }
};
}  // namespace
template <class T> void swiglu_sum_into(T* a, const T* b, int64_t n) { vec::map2(a, b, a, n, vec::kGrainCheap, Sum{}); }

#define ATHANOR_INSTANTIATE_SWIGLU(T)                                                \
  template void swiglu_forward<T>(const T*, const T*, T*, int64_t);                  \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t); \
  template void swiglu_sum_into<T>(T*, const T*, int64_t);
ATHANOR_INSTANTIATE_SWIGLU(float)
ATHANOR_INSTANTIATE_SWIGLU(double)
ATHANOR_INSTANTIATE_SWIGLU(bfloat16)
ATHANOR_INSTANTIATE_SWIGLU(float16)
ATHANOR_ISA_END

#if ATHANOR_ISA_PRIMARY
namespace athanor::cpu {
ATHANOR_ISA_DECLARE(template <class T> void swiglu_forward(const T* g, const T* u, T* y, int64_t n);
                    template <class T> void swiglu_backward(const T* dy, const T* g, const T* u, T* dg, T* du, int64_t n);
                    template <class T> void swiglu_sum_into(T* a, const T* b, int64_t n);)
template <class T> void swiglu_forward(const T* g, const T* u, T* y, int64_t n) { ATHANOR_ISA_CALL(swiglu_forward<T>, g, u, y, n); }
template <class T> void swiglu_backward(const T* dy, const T* g, const T* u, T* dg, T* du, int64_t n) {
  ATHANOR_ISA_CALL(swiglu_backward<T>, dy, g, u, dg, du, n);
}
template <class T> void swiglu_sum_into(T* a, const T* b, int64_t n) { ATHANOR_ISA_CALL(swiglu_sum_into<T>, a, b, n); }
ATHANOR_INSTANTIATE_SWIGLU(float)
ATHANOR_INSTANTIATE_SWIGLU(double)
ATHANOR_INSTANTIATE_SWIGLU(bfloat16)
ATHANOR_INSTANTIATE_SWIGLU(float16)
}  // namespace athanor::cpu
#endif  // ATHANOR_ISA_PRIMARY
