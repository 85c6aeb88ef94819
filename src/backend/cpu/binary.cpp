// Binary elementwise kernels (binary.h), compiled once per ISA level (isa_kernel.h).
#include "backend/cpu/binary.h"

#include "athanor/core/convert.h"
#include "athanor/core/error.h"
#include "backend/cpu/vec_math.h"

namespace athanor::cpu {
namespace {
constexpr int64_t kParallelGrain = 1 << 15;

template <class C> inline C apply(BinaryOp op, C x, C y) {
  switch (op) {
    case BinaryOp::add: return x + y;
    case BinaryOp::sub: return x - y;
    case BinaryOp::mul: return x * y;
    case BinaryOp::div: return x / y;
  }
  return x;
}
}  // namespace
}  // namespace athanor::cpu

#define ATHANOR_INSTANTIATE_BINARY(T)                                                         \
  template void binary_same<T>(BinaryOp, const T*, const T*, T*, int64_t);                   \
  template void binary_scalar<T>(BinaryOp, const T*, const T*, T*, int64_t, bool);           \
  template void binary_row<T>(BinaryOp, const T*, const T*, T*, int64_t, int64_t, bool);

ATHANOR_ISA_BEGIN

namespace {
// Compute type: f32 for half types, the type itself otherwise.
template <class T> using compute_t = std::conditional_t<is_half_v<T>, float, T>;

template <class T, BinaryOp OP> void same_impl(const T* a, const T* b, T* out, int64_t n) {
  using C = compute_t<T>;
#pragma omp parallel for simd if (n > kParallelGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = cast_value<T>(apply<C>(OP, cast_value<C>(a[i]), cast_value<C>(b[i])));
}
}  // namespace

template <class T> void binary_same(BinaryOp op, const T* a, const T* b, T* out, int64_t n) {
  switch (op) {  // the op is a template argument so each loop vectorizes on its own
    case BinaryOp::add: return same_impl<T, BinaryOp::add>(a, b, out, n);
    case BinaryOp::sub: return same_impl<T, BinaryOp::sub>(a, b, out, n);
    case BinaryOp::mul: return same_impl<T, BinaryOp::mul>(a, b, out, n);
    case BinaryOp::div: return same_impl<T, BinaryOp::div>(a, b, out, n);
  }
}

template <class T> void binary_scalar(BinaryOp op, const T* a, const T* b, T* out, int64_t n, bool scalar_is_a) {
  using C = compute_t<T>;
  const T* vec = scalar_is_a ? b : a;
  const C s = cast_value<C>(scalar_is_a ? a[0] : b[0]);
#pragma omp parallel for simd if (n > kParallelGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const C v = cast_value<C>(vec[i]);
    out[i] = cast_value<T>(scalar_is_a ? apply<C>(op, s, v) : apply<C>(op, v, s));
  }
}

template <class T> void binary_row(BinaryOp op, const T* a, const T* b, T* out, int64_t rows, int64_t cols, bool row_is_a) {
  using C = compute_t<T>;
  const T* full = row_is_a ? b : a;
  const T* row = row_is_a ? a : b;
#pragma omp parallel for if (rows * cols > kParallelGrain) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* f = full + r * cols;
    T* o = out + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      const C x = cast_value<C>(f[c]), y = cast_value<C>(row[c]);
      o[c] = cast_value<T>(row_is_a ? apply<C>(op, y, x) : apply<C>(op, x, y));
    }
  }
}

namespace {
template <class L, BinaryOp OP> void mixed_impl(const float* full, const L* low, float* out, int64_t n, bool low_is_a) {
  vec::parallel_blocks(n, kParallelGrain, [&](int64_t begin, int64_t end) {
#if ATHANOR_CPU_AVX512
    auto apply16 = [&](__m512 f, __m512 l) {  // widening bf16/f16 -> f32 is exact
      const __m512 x = low_is_a ? l : f, y = low_is_a ? f : l;
      if constexpr (OP == BinaryOp::add) return _mm512_add_ps(x, y);
      else if constexpr (OP == BinaryOp::sub) return _mm512_sub_ps(x, y);
      else if constexpr (OP == BinaryOp::mul) return _mm512_mul_ps(x, y);
      else return _mm512_div_ps(x, y);
    };
    // Full vectors with plain loads and stores: masked stores are slow on some cores
    // (AMD Zen) even with every lane on; only the tail is masked.
    int64_t i = begin;
    for (; i + 16 <= end; i += 16) {
      const __m256i lb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(low + i));
      __m512 l;
      if constexpr (std::is_same_v<L, bfloat16>) l = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_maskz_cvtepu16_epi32(0xffff, lb), 16));
      else l = _mm512_cvtph_ps(lb);
      _mm512_storeu_ps(out + i, apply16(_mm512_loadu_ps(full + i), l));
    }
    if (i < end) {
      const __mmask16 m = vec::tail_mask(end - i);
      vec::store16(out + i, m, apply16(vec::load16(full + i, m), vec::load16(low + i, m)));
    }
#else
    for (int64_t i = begin; i < end; ++i) {
      const float l = cast_value<float>(low[i]);
      out[i] = low_is_a ? apply<float>(OP, l, full[i]) : apply<float>(OP, full[i], l);
    }
#endif
  });
}
}  // namespace

template <class L>
void binary_same_mixed(BinaryOp op, const float* full, const L* low, float* out, int64_t n, bool low_is_a) {
  switch (op) {
    case BinaryOp::add: return mixed_impl<L, BinaryOp::add>(full, low, out, n, low_is_a);
    case BinaryOp::sub: return mixed_impl<L, BinaryOp::sub>(full, low, out, n, low_is_a);
    case BinaryOp::mul: return mixed_impl<L, BinaryOp::mul>(full, low, out, n, low_is_a);
    case BinaryOp::div: return mixed_impl<L, BinaryOp::div>(full, low, out, n, low_is_a);
  }
}
template void binary_same_mixed<bfloat16>(BinaryOp, const float*, const bfloat16*, float*, int64_t, bool);
template void binary_same_mixed<float16>(BinaryOp, const float*, const float16*, float*, int64_t, bool);

ATHANOR_INSTANTIATE_BINARY(float)
ATHANOR_INSTANTIATE_BINARY(double)
ATHANOR_INSTANTIATE_BINARY(bfloat16)
ATHANOR_INSTANTIATE_BINARY(float16)
ATHANOR_INSTANTIATE_BINARY(int32_t)
ATHANOR_INSTANTIATE_BINARY(int64_t)

ATHANOR_ISA_END

#if ATHANOR_ISA_PRIMARY
namespace athanor::cpu {

ATHANOR_ISA_DECLARE(
    template <class T> void binary_same(BinaryOp op, const T* a, const T* b, T* out, int64_t n);
    template <class T> void binary_scalar(BinaryOp op, const T* a, const T* b, T* out, int64_t n, bool scalar_is_a);
    template <class T>
    void binary_row(BinaryOp op, const T* a, const T* b, T* out, int64_t rows, int64_t cols, bool row_is_a);
    template <class L>
    void binary_same_mixed(BinaryOp op, const float* full, const L* low, float* out, int64_t n, bool low_is_a);)

template <class T> void binary_same(BinaryOp op, const T* a, const T* b, T* out, int64_t n) {
  ATHANOR_ISA_CALL(binary_same<T>, op, a, b, out, n);
}
template <class T> void binary_scalar(BinaryOp op, const T* a, const T* b, T* out, int64_t n, bool scalar_is_a) {
  ATHANOR_ISA_CALL(binary_scalar<T>, op, a, b, out, n, scalar_is_a);
}
template <class T> void binary_row(BinaryOp op, const T* a, const T* b, T* out, int64_t rows, int64_t cols, bool row_is_a) {
  ATHANOR_ISA_CALL(binary_row<T>, op, a, b, out, rows, cols, row_is_a);
}
template <class L>
void binary_same_mixed(BinaryOp op, const float* full, const L* low, float* out, int64_t n, bool low_is_a) {
  ATHANOR_ISA_CALL(binary_same_mixed<L>, op, full, low, out, n, low_is_a);
}
template void binary_same_mixed<bfloat16>(BinaryOp, const float*, const bfloat16*, float*, int64_t, bool);
template void binary_same_mixed<float16>(BinaryOp, const float*, const float16*, float*, int64_t, bool);
ATHANOR_INSTANTIATE_BINARY(float)
ATHANOR_INSTANTIATE_BINARY(double)
ATHANOR_INSTANTIATE_BINARY(bfloat16)
ATHANOR_INSTANTIATE_BINARY(float16)
ATHANOR_INSTANTIATE_BINARY(int32_t)
ATHANOR_INSTANTIATE_BINARY(int64_t)

namespace ref {
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const int64_t nd = std::max(a.dim(), b.dim());
  Shape out_shape(nd);
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t ia = i - (nd - a.dim()), ib = i - (nd - b.dim());
    const int64_t sa = ia >= 0 ? a.sizes()[ia] : 1, sb = ib >= 0 ? b.sizes()[ib] : 1;
    ATH_CHECK(sa == sb || sa == 1 || sb == 1, "ref::binary", "shapes ", shape_str(a.sizes()), " and ", shape_str(b.sizes()),
              " do not broadcast");
    out_shape[i] = sa == 1 ? sb : sa;
  }
  const DType dt = promote_types(a.dtype(), b.dtype());
  Tensor out = empty(out_shape, TensorOptions(dt));
  const int64_t n = out.numel();
  std::vector<int64_t> idx(nd);
  const auto av = a.to_vector(), bv = b.to_vector();  // logical order (contiguous)
  const Shape ac = contiguous_strides(a.sizes()), bc = contiguous_strides(b.sizes());
  std::vector<double> res(n);
  for (int64_t lin = 0; lin < n; ++lin) {
    int64_t rem = lin, oa = 0, ob = 0;
    for (int64_t i = nd - 1; i >= 0; --i) {
      const int64_t coord = rem % out_shape[i];
      rem /= out_shape[i];
      const int64_t ia = i - (nd - a.dim()), ib = i - (nd - b.dim());
      if (ia >= 0 && a.sizes()[ia] != 1) oa += coord * ac[ia];
      if (ib >= 0 && b.sizes()[ib] != 1) ob += coord * bc[ib];
    }
    res[lin] = apply<double>(op, av[oa], bv[ob]);
  }
  return from_vector(res, out_shape, TensorOptions(dt));
}
}  // namespace ref


}  // namespace athanor::cpu
#endif  // ATHANOR_ISA_PRIMARY
