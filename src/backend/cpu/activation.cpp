// Activation kernels (activation.h), compiled once per ISA level (isa_kernel.h).
#include "backend/cpu/activation.h"

#include <cmath>
#include <vector>

#include "athanor/core/error.h"
#include "backend/cpu/stealing_runs.h"
#include "backend/cpu/vec_math.h"

namespace athanor::cpu {
namespace {
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // √(2/π)
constexpr double kGeluC = 0.044715;
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1/√(2π)

}  // namespace
}  // namespace athanor::cpu

#define ATHANOR_INSTANTIATE_ACTIVATION(T)                                   \
  template void activation_forward<T>(Activation, const T*, T*, int64_t); \
  template void activation_backward<T>(Activation, const T*, const T*, T*, int64_t); \
  template void relu_backward_rowsum<T>(const T*, const T*, T*, rowsum_acc_t<T>*, int64_t, int64_t);

ATHANOR_ISA_BEGIN

namespace {
// Scalar forms (f64 kernels, and f32 at the avx2 level).
template <class C> C sigmoid_s(C x) {  // e^x/(1+e^x) for x < 0: no overflow, denormal tails kept
  if (x < C(0)) {
    const C e = std::exp(x);
    return e / (C(1) + e);
  }
  return C(1) / (C(1) + std::exp(-x));
}
template <class C> C gelu_s(C x) { return C(0.5) * x * std::erfc(-x * C(kInvSqrt2)); }
template <class C> C gelu_tanh_s(C x) {  // x/2 (1 + tanh u) = x / (1 + e^{-2u})
  const C u = C(kSqrt2OverPi) * (x + C(kGeluC) * x * x * x);
  return x / (C(1) + std::exp(C(-2) * u));
}

// ---- forward functors
struct TanhF {
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 x) const { return vec::tanh(x); }
#endif
  template <class C> C scalar(C x) const { return std::tanh(x); }
};
struct SigmoidF {
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 x) const { return vec::sigmoid(x); }
#endif
  template <class C> C scalar(C x) const { return sigmoid_s(x); }
};
struct ReluF {
#if ATHANOR_CPU_AVX512
  // MAXPS returns its second operand when either is NaN: NaN inputs stay NaN.
  __m512 vec(__m512 x) const { return _mm512_max_ps(_mm512_setzero_ps(), x); }
#endif
  template <class C> C scalar(C x) const { return x > C(0) ? x : (x != x ? x : C(0)); }
};
struct GeluF {
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 x) const { return _mm512_mul_ps(x, vec::normal_cdf(x, false).cdf); }
#endif
  template <class C> C scalar(C x) const { return gelu_s(x); }
};
struct GeluTanhF {
#if ATHANOR_CPU_AVX512
  // x/2 (1 + tanh u) = x sigmoid(2u): no cancellation for x < 0, no overflow.
  __m512 vec(__m512 x) const {
    const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    const __m512 u = _mm512_mul_ps(_mm512_set1_ps(float(kSqrt2OverPi)), _mm512_fmadd_ps(_mm512_set1_ps(float(kGeluC)), x3, x));
    const vec::Logistic l = vec::logistic(_mm512_add_ps(u, u));
    return _mm512_div_ps(_mm512_mul_ps(x, l.num), _mm512_add_ps(_mm512_set1_ps(1.0f), l.e));
  }
#endif
  template <class C> C scalar(C x) const { return gelu_tanh_s(x); }
};
struct SiluF {
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 x) const {  // x sigmoid(x)
    const vec::Logistic l = vec::logistic(x);
    return _mm512_div_ps(_mm512_mul_ps(x, l.num), _mm512_add_ps(_mm512_set1_ps(1.0f), l.e));
  }
#endif
  template <class C> C scalar(C x) const { return x * sigmoid_s(x); }
};

// ---- backward functors: (saved, g) -> dx
struct TanhB {  // d tanh = 1 - y²
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 y, __m512 g) const { return _mm512_mul_ps(g, _mm512_fnmadd_ps(y, y, _mm512_set1_ps(1.0f))); }
#endif
  template <class C> C scalar(C y, C g) const { return g * (C(1) - y * y); }
};
struct SigmoidB {  // d sigmoid = y (1 - y)
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 y, __m512 g) const {
    return _mm512_mul_ps(g, _mm512_mul_ps(y, _mm512_sub_ps(_mm512_set1_ps(1.0f), y)));
  }
#endif
  template <class C> C scalar(C y, C g) const { return g * y * (C(1) - y); }
};
struct ReluB {  // d relu = [y > 0]; 0 at the kink (y = 0), like PyTorch
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 y, __m512 g) const {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_GT_OQ), g);
  }
#endif
  template <class C> C scalar(C y, C g) const { return y > C(0) ? g : C(0); }
};
struct GeluB {  // d (x Phi(x)) = Phi(x) + x phi(x)
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 x, __m512 g) const {
    const vec::NormalCdfPdf c = vec::normal_cdf(x, true);
    const __m512 pdf = _mm512_mul_ps(c.pdf_exp, _mm512_set1_ps(float(kInvSqrt2Pi)));
    return _mm512_mul_ps(g, _mm512_fmadd_ps(x, pdf, c.cdf));
  }
#endif
  template <class C> C scalar(C x, C g) const {
    const C cdf = C(0.5) * std::erfc(-x * C(kInvSqrt2));
    const C pdf = C(kInvSqrt2Pi) * std::exp(C(-0.5) * x * x);
    return g * (cdf + x * pdf);
  }
};
struct GeluTanhB {
  // y = x s(2u) with s = sigmoid, since (1 + tanh u)/2 = s(2u); so
  // dy/dx = s(2u) + x s'(2u) 2u' = s + 2x u' s(1 - s),  u' = √(2/π)(1 + 3·0.044715 x²)
  // (equal to the textbook (1 + tanh u)/2 + x/2 (1 - tanh² u) u'); s and s(1 - s) come
  // from the overflow-free logistic pieces.
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 x, __m512 g) const {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 x2 = _mm512_mul_ps(x, x);
    const __m512 u = _mm512_mul_ps(_mm512_set1_ps(float(kSqrt2OverPi)),
                                   _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(float(kGeluC)), x2), x, x));
    const __m512 du = _mm512_mul_ps(_mm512_set1_ps(float(kSqrt2OverPi)), _mm512_fmadd_ps(_mm512_set1_ps(float(3 * kGeluC)), x2, one));
    const vec::Logistic l = vec::logistic(_mm512_add_ps(u, u));
    const __m512 ope = _mm512_add_ps(one, l.e);
    const __m512 s = _mm512_div_ps(l.num, ope);
    const __m512 q = _mm512_div_ps(l.e, _mm512_mul_ps(ope, ope));  // s (1 - s)
    const __m512 d = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_add_ps(x, x), du), q, s);
    return _mm512_mul_ps(g, d);
  }
#endif
  template <class C> C scalar(C x, C g) const {
    const C u = C(kSqrt2OverPi) * (x + C(kGeluC) * x * x * x);
    const C du = C(kSqrt2OverPi) * (C(1) + C(3 * kGeluC) * x * x);
    const C t = std::tanh(u);
    return g * (C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * du);
  }
};
struct SiluB {
  // d (x s(x)) = s + x s (1 - s), s = sigmoid(x), from the overflow-free logistic pieces.
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 x, __m512 g) const {
    const __m512 one = _mm512_set1_ps(1.0f);
    const vec::Logistic l = vec::logistic(x);
    const __m512 ope = _mm512_add_ps(one, l.e);
    const __m512 s = _mm512_div_ps(l.num, ope);
    const __m512 q = _mm512_div_ps(l.e, _mm512_mul_ps(ope, ope));
    return _mm512_mul_ps(g, _mm512_fmadd_ps(x, q, s));
  }
#endif
  template <class C> C scalar(C x, C g) const {
    const C s = sigmoid_s(x);
    return g * s * (C(1) + x * (C(1) - s));
  }
};
}  // namespace

template <class T> void activation_forward(Activation a, const T* x, T* y, int64_t n) {
  constexpr int64_t heavy = vec::kGrainTranscendental, cheap = vec::kGrainCheap;
  switch (a) {
    case Activation::tanh: return vec::map1(x, y, n, heavy, TanhF{});
    case Activation::sigmoid: return vec::map1(x, y, n, heavy, SigmoidF{});
    case Activation::relu: return vec::map1(x, y, n, cheap, ReluF{});
    case Activation::gelu: return vec::map1(x, y, n, heavy, GeluF{});
    case Activation::gelu_tanh: return vec::map1(x, y, n, heavy, GeluTanhF{});
    case Activation::silu: return vec::map1(x, y, n, heavy, SiluF{});
  }
}

template <class T> void activation_backward(Activation a, const T* saved, const T* g, T* dx, int64_t n) {
  constexpr int64_t heavy = vec::kGrainTranscendental, cheap = vec::kGrainCheap;
  switch (a) {
    case Activation::tanh: return vec::map2(saved, g, dx, n, cheap, TanhB{});
    case Activation::sigmoid: return vec::map2(saved, g, dx, n, cheap, SigmoidB{});
    case Activation::relu: return vec::map2(saved, g, dx, n, cheap, ReluB{});
    case Activation::gelu: return vec::map2(saved, g, dx, n, heavy, GeluB{});
    case Activation::gelu_tanh: return vec::map2(saved, g, dx, n, heavy, GeluTanhB{});
    case Activation::silu: return vec::map2(saved, g, dx, n, heavy, SiluB{});
  }
}

namespace {
// Columns per task: a task walks all M rows of its column block, keeping the block's sums
// in 16 zmm registers. Wider blocks ran faster (fewer passes over the rows) even with the
// sums spilled to L1; 256 still gives each of two threads two tasks at N = 1024.
constexpr int64_t kRowsumCols = 256;

template <class T> void relu_backward_rowsum_cols(const T* y, const T* dy, T* g, rowsum_acc_t<T>* db, int64_t M, int64_t N,
                                                  int64_t j0, int64_t w) {
#if ATHANOR_CPU_AVX512
  if constexpr (!std::is_same_v<T, double>) {
    constexpr int kVecs = kRowsumCols / 16;
    __m512 acc[kVecs];
    __mmask16 mask[kVecs];
    for (int v = 0; v < kVecs; ++v) {
      acc[v] = _mm512_setzero_ps();
      mask[v] = v * 16 < w ? vec::tail_mask(w - v * 16) : __mmask16(0);
    }
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t i = 0; i < M; ++i) {
      const int64_t o = i * N + j0;
#pragma GCC unroll 16
      for (int v = 0; v < kVecs; ++v) {
        if (!mask[v]) continue;
        const __m512 yv = vec::load16(y + o + v * 16, mask[v]);
        const __m512 gv = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(yv, zero, _CMP_GT_OQ), vec::load16(dy + o + v * 16, mask[v]));
        vec::store16(g + o + v * 16, mask[v], gv);  // exact: gv is dy or 0
        acc[v] = _mm512_add_ps(acc[v], gv);
      }
    }
    if (db)
      for (int v = 0; v < kVecs; ++v)
        if (mask[v]) _mm512_mask_storeu_ps(db + j0 + v * 16, mask[v], acc[v]);
    return;
  }
#endif
  using A = rowsum_acc_t<T>;
  A acc[kRowsumCols] = {};
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < w; ++j) {
      const int64_t k = i * N + j0 + j;
      const T gk = cast_value<A>(y[k]) > A(0) ? dy[k] : cast_value<T>(0.0);
      g[k] = gk;
      acc[j] += cast_value<A>(gk);
    }
  if (db)
    for (int64_t j = 0; j < w; ++j) db[j0 + j] = acc[j];
}

}  // namespace

// Each column's sum runs over the rows in order: the result does not depend on the thread count.
template <class T> void relu_backward_rowsum(const T* y, const T* dy, T* g, rowsum_acc_t<T>* db, int64_t M, int64_t N) {
  const int64_t tasks = (N + kRowsumCols - 1) / kRowsumCols;
  parallel_for_stealing(tasks, M * N > vec::kGrainCheap / 2, [&](int64_t t) {
    const int64_t j0 = t * kRowsumCols;
    relu_backward_rowsum_cols(y, dy, g, db, M, N, j0, std::min(kRowsumCols, N - j0));
  });
}

ATHANOR_INSTANTIATE_ACTIVATION(float)
ATHANOR_INSTANTIATE_ACTIVATION(double)
ATHANOR_INSTANTIATE_ACTIVATION(bfloat16)
ATHANOR_INSTANTIATE_ACTIVATION(float16)

// ---- gelu_linear's fused backward pieces (activation.h)
namespace {
#if ATHANOR_CPU_AVX512
struct GeluValueSlope {
  __m512 value, slope;
};
// gelu_tanh(x) and gelu_tanh'(x) for 16 lanes from one logistic. The operations are those of
// the gelu_tanh forward and backward kernels above (GeluTanhF: x sigmoid(2u); GeluTanhB:
// s + 2x u' s(1 - s)), so h and s ⊙ g are bit-identical to theirs.
inline GeluValueSlope gelu_tanh_value_slope16(__m512 xv) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 x2 = _mm512_mul_ps(xv, xv);
  const __m512 u = _mm512_mul_ps(_mm512_set1_ps(float(kSqrt2OverPi)),
                                 _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(float(kGeluC)), x2), xv, xv));
  const __m512 du = _mm512_mul_ps(_mm512_set1_ps(float(kSqrt2OverPi)), _mm512_fmadd_ps(_mm512_set1_ps(float(3 * kGeluC)), x2, one));
  const vec::Logistic l = vec::logistic(_mm512_add_ps(u, u));
  const __m512 ope = _mm512_add_ps(one, l.e);
  const __m512 sig = _mm512_div_ps(l.num, ope);
  const __m512 q = _mm512_div_ps(l.e, _mm512_mul_ps(ope, ope));  // sig (1 - sig)
  return {_mm512_div_ps(_mm512_mul_ps(xv, l.num), ope), _mm512_fmadd_ps(_mm512_mul_ps(_mm512_add_ps(xv, xv), du), q, sig)};
}

// h[i] = gelu_tanh(x[i]) (rounded to T) and s[i] = gelu_tanh'(x[i]) (f32), in parallel.
template <class T> void gelu_tanh_value_and_slope_avx512(const T* x, T* h, float* s, int64_t n) {
  vec::parallel_blocks(n, vec::kGrainTranscendental, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i += 16) {
      const __mmask16 m = vec::tail_mask(e - i);
      const GeluValueSlope v = gelu_tanh_value_slope16(vec::load16(x + i, m));
      vec::store16(h + i, m, v.value);
      vec::store16(s + i, m, v.slope);
    }
  });
}

// g[i] = g[i] s[i], rounded to T (the last step of the gelu backward kernel).
template <class T> void multiply_by_slope_avx512(T* g, const float* s, int64_t n) {
  vec::parallel_blocks(n, vec::kGrainCheap, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i += 16) {
      const __mmask16 m = vec::tail_mask(e - i);
      vec::store16(g + i, m, _mm512_mul_ps(vec::load16(g + i, m), vec::load16(s + i, m)));
    }
  });
}

// f32, on one thread: h[i] = gelu_tanh(x[i]) (skipped when h is null) and g[i] *= gelu_tanh'(x[i]).
void gelu_tanh_value_and_apply_slope_avx512(const float* x, float* h, float* g, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = vec::tail_mask(n - i);
    const GeluValueSlope v = gelu_tanh_value_slope16(vec::load16(x + i, m));
    if (h) vec::store16(h + i, m, v.value);
    vec::store16(g + i, m, _mm512_mul_ps(vec::load16(g + i, m), v.slope));
  }
}
#endif
}  // namespace

bool gelu_tanh_fused_slope() { return ATHANOR_CPU_AVX512; }

template <class T> void gelu_tanh_value_and_slope(const T* x, T* h, float* s, int64_t n) {
#if ATHANOR_CPU_AVX512
  gelu_tanh_value_and_slope_avx512(x, h, s, n);
#else
  vec::parallel_blocks(n, vec::kGrainTranscendental, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const double xi = cast_value<double>(x[i]);
      h[i] = cast_value<T>(GeluTanhF{}.scalar(xi));
      s[i] = static_cast<float>(GeluTanhB{}.scalar(xi, 1.0));
    }
  });
#endif
}

template <class T> void multiply_by_slope(T* g, const float* s, int64_t n) {
#if ATHANOR_CPU_AVX512
  multiply_by_slope_avx512(g, s, n);
#else
  vec::parallel_blocks(n, vec::kGrainCheap, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) g[i] = cast_value<T>(cast_value<float>(g[i]) * s[i]);
  });
#endif
}

void gelu_tanh_value_and_apply_slope(const float* x, float* h, float* g, int64_t n) {
#if ATHANOR_CPU_AVX512
  gelu_tanh_value_and_apply_slope_avx512(x, h, g, n);
#else
  for (int64_t i = 0; i < n; ++i) {
    const double xi = x[i];
    if (h) h[i] = static_cast<float>(GeluTanhF{}.scalar(xi));
    g[i] = static_cast<float>(GeluTanhB{}.scalar(xi, static_cast<double>(g[i])));
  }
#endif
}

#define ATHANOR_INSTANTIATE_GELU_SLOPE(T)                                                \
  template void gelu_tanh_value_and_slope<T>(const T*, T*, float*, int64_t); \
  template void multiply_by_slope<T>(T*, const float*, int64_t);
ATHANOR_INSTANTIATE_GELU_SLOPE(float)
ATHANOR_INSTANTIATE_GELU_SLOPE(bfloat16)
ATHANOR_INSTANTIATE_GELU_SLOPE(float16)

ATHANOR_ISA_END

#if ATHANOR_ISA_PRIMARY
namespace athanor::cpu {

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::tanh: return "tanh";
    case Activation::sigmoid: return "sigmoid";
    case Activation::relu: return "relu";
    case Activation::gelu: return "gelu";
    case Activation::gelu_tanh: return "gelu_tanh";
    case Activation::silu: return "silu";
  }
  return "?";
}

bool activation_backward_uses_output(Activation a) {
  return a == Activation::tanh || a == Activation::sigmoid || a == Activation::relu;
}

ATHANOR_ISA_DECLARE(
    template <class T> void activation_forward(Activation a, const T* x, T* y, int64_t n);
    template <class T> void activation_backward(Activation a, const T* saved, const T* g, T* dx, int64_t n);
    template <class T>
    void relu_backward_rowsum(const T* y, const T* dy, T* g, rowsum_acc_t<T>* db, int64_t M, int64_t N);
    bool gelu_tanh_fused_slope();
    template <class T> void gelu_tanh_value_and_slope(const T* x, T* h, float* s, int64_t n);
    template <class T> void multiply_by_slope(T* g, const float* s, int64_t n);
    void gelu_tanh_value_and_apply_slope(const float* x, float* h, float* g, int64_t n);)

template <class T> void activation_forward(Activation a, const T* x, T* y, int64_t n) {
  ATHANOR_ISA_CALL(activation_forward<T>, a, x, y, n);
}
template <class T> void activation_backward(Activation a, const T* saved, const T* g, T* dx, int64_t n) {
  ATHANOR_ISA_CALL(activation_backward<T>, a, saved, g, dx, n);
}
template <class T> void relu_backward_rowsum(const T* y, const T* dy, T* g, rowsum_acc_t<T>* db, int64_t M, int64_t N) {
  ATHANOR_ISA_CALL(relu_backward_rowsum<T>, y, dy, g, db, M, N);
}
bool gelu_tanh_fused_slope() { ATHANOR_ISA_CALL(gelu_tanh_fused_slope); }
template <class T> void gelu_tanh_value_and_slope(const T* x, T* h, float* s, int64_t n) {
  ATHANOR_ISA_CALL(gelu_tanh_value_and_slope<T>, x, h, s, n);
}
template <class T> void multiply_by_slope(T* g, const float* s, int64_t n) { ATHANOR_ISA_CALL(multiply_by_slope<T>, g, s, n); }
void gelu_tanh_value_and_apply_slope(const float* x, float* h, float* g, int64_t n) {
  ATHANOR_ISA_CALL(gelu_tanh_value_and_apply_slope, x, h, g, n);
}
ATHANOR_INSTANTIATE_GELU_SLOPE(float)
ATHANOR_INSTANTIATE_GELU_SLOPE(bfloat16)
ATHANOR_INSTANTIATE_GELU_SLOPE(float16)
ATHANOR_INSTANTIATE_ACTIVATION(float)
ATHANOR_INSTANTIATE_ACTIVATION(double)
ATHANOR_INSTANTIATE_ACTIVATION(bfloat16)
ATHANOR_INSTANTIATE_ACTIVATION(float16)

// ---------------------------------------------------------------------------
namespace ref {
// The textbook formulas, in double, one element at a time.
Tensor activation_forward(Activation a, const Tensor& x) {
  std::vector<double> v = x.to_vector();
  for (double& e : v) {
    const double t = e;
    switch (a) {
      case Activation::tanh: e = std::tanh(t); break;
      case Activation::sigmoid: e = 1.0 / (1.0 + std::exp(-t)); break;
      case Activation::relu: e = t > 0.0 ? t : (std::isnan(t) ? t : 0.0); break;
      case Activation::gelu: e = 0.5 * t * std::erfc(-t * kInvSqrt2); break;  // = x/2 (1 + erf(x/√2)), no cancellation
      case Activation::gelu_tanh:  // x/2 (1 + tanh u) = x / (1 + e^{-2u}): the same value without cancellation for x << 0
        e = t / (1.0 + std::exp(-2.0 * kSqrt2OverPi * (t + kGeluC * t * t * t)));
        break;
      case Activation::silu: e = t / (1.0 + std::exp(-t)); break;
    }
  }
  return from_vector(v, x.sizes(), TensorOptions(x.dtype()));
}

Tensor activation_backward(Activation a, const Tensor& saved, const Tensor& g) {
  ATH_CHECK(saved.sizes() == g.sizes(), "ref::activation_backward", "shape mismatch ", saved.describe(), " vs ", g.describe());
  const std::vector<double> sv = saved.to_vector();
  std::vector<double> gv = g.to_vector();
  for (size_t i = 0; i < gv.size(); ++i) {
    const double s = sv[i];
    double d = 0;
    switch (a) {
      case Activation::tanh: d = 1.0 - s * s; break;             // s = y
      case Activation::sigmoid: d = s * (1.0 - s); break;        // s = y
      case Activation::relu: d = s > 0.0 ? 1.0 : 0.0; break;     // s = y
      case Activation::gelu:                                     // s = x
        d = 0.5 * std::erfc(-s * kInvSqrt2) + s * kInvSqrt2Pi * std::exp(-0.5 * s * s);
        break;
      case Activation::gelu_tanh: {                              // s = x
        const double th = std::tanh(kSqrt2OverPi * (s + kGeluC * s * s * s));
        d = 0.5 * (1.0 + th) + 0.5 * s * (1.0 - th * th) * kSqrt2OverPi * (1.0 + 3.0 * kGeluC * s * s);
        break;
      }
      case Activation::silu: {                                   // s = x
        const double sg = 1.0 / (1.0 + std::exp(-s));
        d = sg * (1.0 + s * (1.0 - sg));
        break;
      }
    }
    gv[i] *= d;
  }
  return from_vector(gv, saved.sizes(), TensorOptions(saved.dtype()));
}
}  // namespace ref

}  // namespace athanor::cpu
#endif  // ATHANOR_ISA_PRIMARY
