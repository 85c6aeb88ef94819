// Unary elementwise kernels (unary.h), compiled once per ISA level (isa_kernel.h):
// the kernels per level, then (once) the dispatching entry points and the references.
#include "backend/cpu/unary.h"

#include <limits>
#include <vector>

#include "athanor/core/error.h"
#include "backend/cpu/vec_math.h"

#define ATHANOR_INSTANTIATE_UNARY_FLOAT(T)                                              \
  template void unary<T>(UnaryOp, const T*, T*, int64_t);                               \
  template void pow_scalar<T>(const T*, double, T*, int64_t);                           \
  template void pow_tensor<T>(const T*, const T*, T*, int64_t);                         \
  template void clamp<T>(const T*, double, double, T*, int64_t);                        \
  template void abs_backward<T>(const T*, const T*, T*, int64_t);                       \
  template void clamp_backward<T>(const T*, double, double, const T*, T*, int64_t);
#define ATHANOR_INSTANTIATE_UNARY_INT(T)                  \
  template void unary<T>(UnaryOp, const T*, T*, int64_t); \
  template void clamp<T>(const T*, double, double, T*, int64_t);
#define ATHANOR_INSTANTIATE_SELECT(T)                                                     \
  template void where<T>(const uint8_t*, const T*, bool, const T*, bool, T*, int64_t);    \
  template void compare<T>(CompareOp, const T*, const T*, bool, bool*, int64_t);          \
  template void compare_scalar<T>(CompareOp, const T*, double, bool*, int64_t);

ATHANOR_ISA_BEGIN

namespace {
template <class T> inline constexpr bool is_int_v = std::is_integral_v<T>;  // incl. bool, uint8_t
// Compute type: f32 for half types, the type itself otherwise.
template <class T> using compute_t = std::conditional_t<is_half_v<T>, float, T>;

// ---- per-element functors: vec() on 16 f32 lanes (avx512 levels), scalar() in f32/f64.
struct ExpF {
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 x) const { return vec::exp(x); }
#endif
  template <class C> C scalar(C x) const { return std::exp(x); }
};
struct LogF {
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 x) const { return vec::log(x); }
#endif
  template <class C> C scalar(C x) const { return std::log(x); }
};
struct SqrtF {
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 x) const { return _mm512_sqrt_ps(x); }
#endif
  template <class C> C scalar(C x) const { return std::sqrt(x); }
};
struct RsqrtF {
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 x) const { return _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_sqrt_ps(x)); }
#endif
  template <class C> C scalar(C x) const { return C(1) / std::sqrt(x); }
};
struct AbsF {
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 x) const { return _mm512_abs_ps(x); }
#endif
  template <class C> C scalar(C x) const { return std::abs(x); }
};
struct SquareF {
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 x) const { return _mm512_mul_ps(x, x); }
#endif
  template <class C> C scalar(C x) const { return x * x; }
};
struct CubeF {
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 x) const { return _mm512_mul_ps(_mm512_mul_ps(x, x), x); }
#endif
  template <class C> C scalar(C x) const { return x * x * x; }
};
struct ReciprocalF {
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 x) const { return _mm512_div_ps(_mm512_set1_ps(1.0f), x); }
#endif
  template <class C> C scalar(C x) const { return C(1) / x; }
};
struct OneF {
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512) const { return _mm512_set1_ps(1.0f); }
#endif
  template <class C> C scalar(C) const { return C(1); }
};
struct IdentityF {
#if ATHANOR_CPU_AVX512
  __m512 vec(__m512 x) const { return x; }
#endif
  template <class C> C scalar(C x) const { return x; }
};

// Plain loops (the compiler vectorizes them) for the ops without a vector functor.
template <class T, class F> void loop1(const T* x, T* out, int64_t n, const F& f) {
  using C = compute_t<T>;
  vec::parallel_blocks(n, vec::kGrainCheap, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) out[i] = cast_value<T>(f(cast_value<C>(x[i])));
  });
}
}  // namespace

template <class T> void unary(UnaryOp op, const T* x, T* out, int64_t n) {
  if constexpr (is_int_v<T>) {
    switch (op) {
      case UnaryOp::abs: return loop1(x, out, n, [](T v) { return v < 0 ? T(-v) : v; });
      case UnaryOp::square: return loop1(x, out, n, [](T v) { return T(v * v); });
      default: ATH_ASSERT(false && "floating-only unary op on an integer buffer");
    }
  } else {
    constexpr int64_t heavy = vec::kGrainTranscendental, cheap = vec::kGrainCheap;
    switch (op) {
      case UnaryOp::exp: return vec::map1(x, out, n, heavy, ExpF{});
      case UnaryOp::log: return vec::map1(x, out, n, heavy, LogF{});
      case UnaryOp::sqrt: return vec::map1(x, out, n, cheap, SqrtF{});
      case UnaryOp::rsqrt: return vec::map1(x, out, n, cheap, RsqrtF{});
      case UnaryOp::abs: return vec::map1(x, out, n, cheap, AbsF{});
      case UnaryOp::square: return vec::map1(x, out, n, cheap, SquareF{});
    }
  }
}

template <class T> void pow_scalar(const T* x, double p, T* out, int64_t n) {
  using C = compute_t<T>;
  constexpr int64_t cheap = vec::kGrainCheap;
  if (p == 0.0) return vec::map1(x, out, n, cheap, OneF{});  // x^0 = 1, even for NaN (as std::pow)
  if (p == 1.0) return vec::map1(x, out, n, cheap, IdentityF{});
  if (p == 2.0) return vec::map1(x, out, n, cheap, SquareF{});
  if (p == 3.0) return vec::map1(x, out, n, cheap, CubeF{});
  if (p == 0.5) return vec::map1(x, out, n, cheap, SqrtF{});
  if (p == -0.5) return vec::map1(x, out, n, cheap, RsqrtF{});
  if (p == -1.0) return vec::map1(x, out, n, cheap, ReciprocalF{});
  const C pc = static_cast<C>(p);
  vec::parallel_blocks(n, vec::kGrainTranscendental, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = cast_value<T>(std::pow(cast_value<C>(x[i]), pc));
  });
}

template <class T> void pow_tensor(const T* x, const T* y, T* out, int64_t n) {
  using C = compute_t<T>;
  vec::parallel_blocks(n, vec::kGrainTranscendental, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = cast_value<T>(std::pow(cast_value<C>(x[i]), cast_value<C>(y[i])));
  });
}

template <class T> void clamp(const T* x, double lo, double hi, T* out, int64_t n) {
  if constexpr (is_int_v<T>) {
    // Integer clamp: the integral bounds inside [lo, hi], saturated to T's range.
    using L = std::numeric_limits<T>;
    const double l = std::isnan(lo) ? -INFINITY : std::ceil(lo), h = std::isnan(hi) ? INFINITY : std::floor(hi);
    const T tl = l <= static_cast<double>(L::lowest()) ? L::lowest() : l >= static_cast<double>(L::max()) ? L::max() : static_cast<T>(l);
    const T th = h <= static_cast<double>(L::lowest()) ? L::lowest() : h >= static_cast<double>(L::max()) ? L::max() : static_cast<T>(h);
    loop1(x, out, n, [tl, th](T v) { v = v < tl ? tl : v; return v > th ? th : v; });
  } else {
    using C = compute_t<T>;
    // Bounds rounded to the compute type; NaN bound = no bound. Comparisons are false
    // for a NaN x, which therefore passes through unchanged.
    const C l = std::isnan(lo) ? -std::numeric_limits<C>::infinity() : static_cast<C>(lo);
    const C h = std::isnan(hi) ? std::numeric_limits<C>::infinity() : static_cast<C>(hi);
    loop1(x, out, n, [l, h](C v) { v = v < l ? l : v; return v > h ? h : v; });
  }
}

template <class T> void abs_backward(const T* x, const T* g, T* out, int64_t n) {
  using C = compute_t<T>;
  vec::parallel_blocks(n, vec::kGrainCheap, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const C v = cast_value<C>(x[i]), gv = cast_value<C>(g[i]);
      out[i] = cast_value<T>(v > C(0) ? gv : v < C(0) ? -gv : C(0));
    }
  });
}

template <class T> void clamp_backward(const T* x, double lo, double hi, const T* g, T* out, int64_t n) {
  using C = compute_t<T>;
  const C l = std::isnan(lo) ? -std::numeric_limits<C>::infinity() : static_cast<C>(lo);
  const C h = std::isnan(hi) ? std::numeric_limits<C>::infinity() : static_cast<C>(hi);
  vec::parallel_blocks(n, vec::kGrainCheap, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const C v = cast_value<C>(x[i]);
      out[i] = (v >= l && v <= h) ? g[i] : cast_value<T>(C(0));
    }
  });
}

namespace {
template <class T, bool AS, bool BS>
void where_impl(const uint8_t* c, const T* a, const T* b, T* out, int64_t n) {
  vec::parallel_blocks(n, vec::kGrainCheap, [&](int64_t lo, int64_t hi) {
    if constexpr (sizeof(T) == 2 && !std::is_integral_v<T>) {  // half types: select the raw bits
      const uint16_t* ab = reinterpret_cast<const uint16_t*>(a);
      const uint16_t* bb = reinterpret_cast<const uint16_t*>(b);
      uint16_t* ob = reinterpret_cast<uint16_t*>(out);
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) ob[i] = c[i] ? ab[AS ? 0 : i] : bb[BS ? 0 : i];
    } else {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) out[i] = c[i] ? a[AS ? 0 : i] : b[BS ? 0 : i];
    }
  });
}

template <class T, CompareOp OP, bool BS> void compare_impl(const T* a, const T* b, bool* out, int64_t n) {
  vec::parallel_blocks(n, vec::kGrainCheap, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      const double x = cast_value<double>(a[i]), y = cast_value<double>(b[BS ? 0 : i]);
      out[i] = OP == CompareOp::eq ? x == y : OP == CompareOp::gt ? x > y : x < y;
    }
  });
}
}  // namespace

template <class T> void where(const uint8_t* cond, const T* a, bool a_scalar, const T* b, bool b_scalar, T* out, int64_t n) {
  if (a_scalar && b_scalar) return where_impl<T, true, true>(cond, a, b, out, n);
  if (a_scalar) return where_impl<T, true, false>(cond, a, b, out, n);
  if (b_scalar) return where_impl<T, false, true>(cond, a, b, out, n);
  where_impl<T, false, false>(cond, a, b, out, n);
}

template <class T> void compare(CompareOp op, const T* a, const T* b, bool b_scalar, bool* out, int64_t n) {
  switch (op) {
    case CompareOp::eq: return b_scalar ? compare_impl<T, CompareOp::eq, true>(a, b, out, n) : compare_impl<T, CompareOp::eq, false>(a, b, out, n);
    case CompareOp::gt: return b_scalar ? compare_impl<T, CompareOp::gt, true>(a, b, out, n) : compare_impl<T, CompareOp::gt, false>(a, b, out, n);
    case CompareOp::lt: return b_scalar ? compare_impl<T, CompareOp::lt, true>(a, b, out, n) : compare_impl<T, CompareOp::lt, false>(a, b, out, n);
  }
}

template <class T> void compare_scalar(CompareOp op, const T* a, double s, bool* out, int64_t n) {
  vec::parallel_blocks(n, vec::kGrainCheap, [&](int64_t lo, int64_t hi) {
    switch (op) {
      case CompareOp::eq:
#pragma omp simd
        for (int64_t i = lo; i < hi; ++i) out[i] = cast_value<double>(a[i]) == s;
        break;
      case CompareOp::gt:
#pragma omp simd
        for (int64_t i = lo; i < hi; ++i) out[i] = cast_value<double>(a[i]) > s;
        break;
      case CompareOp::lt:
#pragma omp simd
        for (int64_t i = lo; i < hi; ++i) out[i] = cast_value<double>(a[i]) < s;
        break;
    }
  });
}

namespace {
template <class D, class S> void convert_typed(const S* x, D* out, int64_t n) {
  vec::parallel_blocks(n, vec::kGrainCheap, [&](int64_t lo, int64_t hi) {
#if ATHANOR_CPU_AVX512
    for (int64_t i = lo; i < hi; i += 16) {
      const __mmask16 m = vec::tail_mask(hi - i);
      vec::store16(out + i, m, vec::load16(x + i, m));
    }
#else
    for (int64_t i = lo; i < hi; ++i) out[i] = cast_value<D>(x[i]);
#endif
  });
}
}  // namespace

// Vectorised conversions: faster than the generic converting copy (copy_into: a cast_value
// loop), most on one thread (bench/RESULTS.md).
bool convert(DType from, DType to, const void* x, void* out, int64_t n) {
  const auto* f = static_cast<const float*>(x);
  auto* o = static_cast<float*>(out);
  if (from == DType::f32 && to == DType::bf16) convert_typed(f, static_cast<bfloat16*>(out), n);
  else if (from == DType::f32 && to == DType::f16) convert_typed(f, static_cast<float16*>(out), n);
  else if (from == DType::bf16 && to == DType::f32) convert_typed(static_cast<const bfloat16*>(x), o, n);
  else if (from == DType::f16 && to == DType::f32) convert_typed(static_cast<const float16*>(x), o, n);
  else return false;
  return true;
}

ATHANOR_INSTANTIATE_UNARY_FLOAT(float)
ATHANOR_INSTANTIATE_UNARY_FLOAT(double)
ATHANOR_INSTANTIATE_UNARY_FLOAT(bfloat16)
ATHANOR_INSTANTIATE_UNARY_FLOAT(float16)
ATHANOR_INSTANTIATE_UNARY_INT(int32_t)
ATHANOR_INSTANTIATE_UNARY_INT(int64_t)
ATHANOR_INSTANTIATE_UNARY_INT(uint8_t)
ATHANOR_INSTANTIATE_SELECT(float)
ATHANOR_INSTANTIATE_SELECT(double)
ATHANOR_INSTANTIATE_SELECT(bfloat16)
ATHANOR_INSTANTIATE_SELECT(float16)
ATHANOR_INSTANTIATE_SELECT(int32_t)
ATHANOR_INSTANTIATE_SELECT(int64_t)
ATHANOR_INSTANTIATE_SELECT(uint8_t)
ATHANOR_INSTANTIATE_SELECT(bool)

ATHANOR_ISA_END

#if ATHANOR_ISA_PRIMARY
namespace athanor::cpu {

const char* unary_op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::exp: return "exp";
    case UnaryOp::log: return "log";
    case UnaryOp::sqrt: return "sqrt";
    case UnaryOp::rsqrt: return "rsqrt";
    case UnaryOp::abs: return "abs";
    case UnaryOp::square: return "square";
  }
  return "?";
}

ATHANOR_ISA_DECLARE(
    template <class T> void unary(UnaryOp op, const T* x, T* out, int64_t n);
    template <class T> void pow_scalar(const T* x, double p, T* out, int64_t n);
    template <class T> void pow_tensor(const T* x, const T* y, T* out, int64_t n);
    template <class T> void clamp(const T* x, double lo, double hi, T* out, int64_t n);
    template <class T> void abs_backward(const T* x, const T* g, T* out, int64_t n);
    template <class T> void clamp_backward(const T* x, double lo, double hi, const T* g, T* out, int64_t n);
    bool convert(DType from, DType to, const void* x, void* out, int64_t n);
    template <class T>
    void where(const uint8_t* cond, const T* a, bool a_scalar, const T* b, bool b_scalar, T* out, int64_t n);
    template <class T> void compare(CompareOp op, const T* a, const T* b, bool b_scalar, bool* out, int64_t n);
    template <class T> void compare_scalar(CompareOp op, const T* a, double s, bool* out, int64_t n);)

template <class T> void unary(UnaryOp op, const T* x, T* out, int64_t n) { ATHANOR_ISA_CALL(unary<T>, op, x, out, n); }
template <class T> void pow_scalar(const T* x, double p, T* out, int64_t n) { ATHANOR_ISA_CALL(pow_scalar<T>, x, p, out, n); }
template <class T> void pow_tensor(const T* x, const T* y, T* out, int64_t n) { ATHANOR_ISA_CALL(pow_tensor<T>, x, y, out, n); }
template <class T> void clamp(const T* x, double lo, double hi, T* out, int64_t n) {
  ATHANOR_ISA_CALL(clamp<T>, x, lo, hi, out, n);
}
template <class T> void abs_backward(const T* x, const T* g, T* out, int64_t n) { ATHANOR_ISA_CALL(abs_backward<T>, x, g, out, n); }
template <class T> void clamp_backward(const T* x, double lo, double hi, const T* g, T* out, int64_t n) {
  ATHANOR_ISA_CALL(clamp_backward<T>, x, lo, hi, g, out, n);
}
bool convert(DType from, DType to, const void* x, void* out, int64_t n) { ATHANOR_ISA_CALL(convert, from, to, x, out, n); }
template <class T>
void where(const uint8_t* cond, const T* a, bool a_scalar, const T* b, bool b_scalar, T* out, int64_t n) {
  ATHANOR_ISA_CALL(where<T>, cond, a, a_scalar, b, b_scalar, out, n);
}
template <class T> void compare(CompareOp op, const T* a, const T* b, bool b_scalar, bool* out, int64_t n) {
  ATHANOR_ISA_CALL(compare<T>, op, a, b, b_scalar, out, n);
}
template <class T> void compare_scalar(CompareOp op, const T* a, double s, bool* out, int64_t n) {
  ATHANOR_ISA_CALL(compare_scalar<T>, op, a, s, out, n);
}

ATHANOR_INSTANTIATE_UNARY_FLOAT(float)
ATHANOR_INSTANTIATE_UNARY_FLOAT(double)
ATHANOR_INSTANTIATE_UNARY_FLOAT(bfloat16)
ATHANOR_INSTANTIATE_UNARY_FLOAT(float16)
ATHANOR_INSTANTIATE_UNARY_INT(int32_t)
ATHANOR_INSTANTIATE_UNARY_INT(int64_t)
ATHANOR_INSTANTIATE_UNARY_INT(uint8_t)
ATHANOR_INSTANTIATE_SELECT(float)
ATHANOR_INSTANTIATE_SELECT(double)
ATHANOR_INSTANTIATE_SELECT(bfloat16)
ATHANOR_INSTANTIATE_SELECT(float16)
ATHANOR_INSTANTIATE_SELECT(int32_t)
ATHANOR_INSTANTIATE_SELECT(int64_t)
ATHANOR_INSTANTIATE_SELECT(uint8_t)
ATHANOR_INSTANTIATE_SELECT(bool)

// ---------------------------------------------------------------------------
namespace ref {
namespace {
// Broadcast shape of several shapes (aligned from the right), by hand.
Shape broadcast_all(const std::vector<Shape>& shapes, const char* op) {
  size_t nd = 0;
  for (const Shape& s : shapes) nd = std::max(nd, s.size());
  Shape out(nd, 1);
  for (const Shape& s : shapes)
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[nd - s.size() + i];
      ATH_CHECK(s[i] == o || s[i] == 1 || o == 1, op, "shapes do not broadcast: ", shape_str(s), " vs ", shape_str(out));
      if (o == 1) o = s[i];
    }
  return out;
}
// t's logical values, repeated to the broadcast shape `out`, in row-major order.
std::vector<double> broadcast_values(const Tensor& t, const Shape& out) {
  const std::vector<double> v = t.to_vector();
  const int64_t nd = static_cast<int64_t>(out.size()), td = t.dim();
  const Shape ts = contiguous_strides(t.sizes());
  const int64_t n = shape_numel(out);
  std::vector<double> r(n);
  for (int64_t lin = 0; lin < n; ++lin) {
    int64_t rem = lin, off = 0;
    for (int64_t i = nd - 1; i >= 0; --i) {
      const int64_t coord = rem % out[i];
      rem /= out[i];
      const int64_t it = i - (nd - td);
      if (it >= 0 && t.sizes()[it] != 1) off += coord * ts[it];
    }
    r[lin] = v[off];
  }
  return r;
}
double apply(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::exp: return std::exp(x);
    case UnaryOp::log: return std::log(x);
    case UnaryOp::sqrt: return std::sqrt(x);
    case UnaryOp::rsqrt: return 1.0 / std::sqrt(x);
    case UnaryOp::abs: return std::fabs(x);
    case UnaryOp::square: return x * x;
  }
  return x;
}
double clamp1(double x, double lo, double hi) {
  if (std::isnan(x)) return x;
  if (!std::isnan(lo) && x < lo) x = lo;
  if (!std::isnan(hi) && x > hi) x = hi;
  return x;
}
}  // namespace

Tensor unary(UnaryOp op, const Tensor& x) {
  std::vector<double> v = x.to_vector();
  for (double& e : v) e = apply(op, e);
  return from_vector(v, x.sizes(), TensorOptions(x.dtype()));
}

Tensor pow(const Tensor& x, double p) {
  std::vector<double> v = x.to_vector();
  for (double& e : v) e = std::pow(e, p);
  return from_vector(v, x.sizes(), TensorOptions(x.dtype()));
}

Tensor pow(const Tensor& x, const Tensor& y) {
  const Shape out = broadcast_all({x.sizes(), y.sizes()}, "ref::pow");
  std::vector<double> xv = broadcast_values(x, out);
  const std::vector<double> yv = broadcast_values(y, out);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::pow(xv[i], yv[i]);
  return from_vector(xv, out, TensorOptions(promote_types(x.dtype(), y.dtype())));
}

Tensor clamp(const Tensor& x, double lo, double hi) {
  std::vector<double> v = x.to_vector();
  const bool integral = !is_floating(x.dtype());
  const double l = integral && !std::isnan(lo) ? std::ceil(lo) : lo, h = integral && !std::isnan(hi) ? std::floor(hi) : hi;
  for (double& e : v) e = clamp1(e, l, h);
  return from_vector(v, x.sizes(), TensorOptions(x.dtype()));
}

Tensor abs_backward(const Tensor& x, const Tensor& g) {
  const std::vector<double> xv = x.to_vector();
  std::vector<double> gv = g.to_vector();
  for (size_t i = 0; i < gv.size(); ++i) gv[i] *= xv[i] > 0 ? 1.0 : xv[i] < 0 ? -1.0 : 0.0;
  return from_vector(gv, x.sizes(), TensorOptions(x.dtype()));
}

Tensor clamp_backward(const Tensor& x, double lo, double hi, const Tensor& g) {
  const std::vector<double> xv = x.to_vector();
  std::vector<double> gv = g.to_vector();
  for (size_t i = 0; i < gv.size(); ++i) {
    const bool pass = (std::isnan(lo) || xv[i] >= lo) && (std::isnan(hi) || xv[i] <= hi) && !std::isnan(xv[i]);
    if (!pass) gv[i] = 0.0;
  }
  return from_vector(gv, x.sizes(), TensorOptions(x.dtype()));
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const Shape out = broadcast_all({cond.sizes(), a.sizes(), b.sizes()}, "ref::where");
  const std::vector<double> cv = broadcast_values(cond, out), av = broadcast_values(a, out), bv = broadcast_values(b, out);
  std::vector<double> r(cv.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = cv[i] != 0.0 ? av[i] : bv[i];
  return from_vector(r, out, TensorOptions(promote_types(a.dtype(), b.dtype())));
}

Tensor compare(CompareOp op, const Tensor& a, const Tensor& b) {
  const Shape out = broadcast_all({a.sizes(), b.sizes()}, "ref::compare");
  const std::vector<double> av = broadcast_values(a, out), bv = broadcast_values(b, out);
  std::vector<double> r(av.size());
  for (size_t i = 0; i < r.size(); ++i)
    r[i] = op == CompareOp::eq ? av[i] == bv[i] : op == CompareOp::gt ? av[i] > bv[i] : av[i] < bv[i];
  return from_vector(r, out, TensorOptions(DType::boolean));
}
}  // namespace ref

}  // namespace athanor::cpu
#endif  // ATHANOR_ISA_PRIMARY
