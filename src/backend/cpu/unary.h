#pragma once
// Unary elementwise kernels (exp, log, sqrt, rsqrt, abs, square, pow, clamp),
// where/masked select, and comparisons, on contiguous buffers of one dtype.
//
// Invariants:
//  - fast kernels take contiguous buffers; the op layer makes inputs contiguous
//    (and materializes broadcasts) first;
//  - at the avx512 levels (isa.h): f32 is computed in f32 by the polynomial kernels
//    of vec_math.h; bf16/f16 are read from their 16-bit storage, computed in f32 and
//    rounded once (RNE), bit-identical to cast_value<T>(f32 result); f64 uses std::
//    math in double. At the avx2 level every type is computed per element with std::
//    math in double and rounded once (through f32 for bf16/f16, as cast_value does);
//  - ref:: kernels are the independent references: scalar loops in double over
//    the logical elements (any strides), results converted to the output dtype.
//
// This header also holds the block-parallel driver shared with the other
// elementwise kernels (vec::parallel_blocks); the vector math is in vec_math.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "athanor/core/convert.h"
#include "athanor/core/tensor.h"

namespace athanor::cpu {

enum class UnaryOp { exp, log, sqrt, rsqrt, abs, square };
const char* unary_op_name(UnaryOp op);

// out[i] = op(x[i]). T: float, double, bfloat16, float16; abs and square also int32_t, int64_t.
template <class T> void unary(UnaryOp op, const T* x, T* out, int64_t n);
// out[i] = x[i]^p (floating T). p in {0, 1, 2, 3, 0.5, -0.5, -1} take exact shortcuts.
template <class T> void pow_scalar(const T* x, double p, T* out, int64_t n);
// out[i] = x[i]^y[i] (floating T; the op materializes broadcasts).
template <class T> void pow_tensor(const T* x, const T* y, T* out, int64_t n);
// out[i] = min(max(x[i], lo), hi); a NaN bound is no bound; NaN x stays NaN. Floating and integer T.
template <class T> void clamp(const T* x, double lo, double hi, T* out, int64_t n);
// Backward helpers (g: incoming gradient, same length):
//   abs:   out = g * sign(x), sign(0) = 0
//   clamp: out = g where lo <= x <= hi (a NaN bound is always satisfied), else 0
template <class T> void abs_backward(const T* x, const T* g, T* out, int64_t n);
template <class T> void clamp_backward(const T* x, double lo, double hi, const T* g, T* out, int64_t n);

// The dtype conversions of autocast (f32 <-> bf16, f32 <-> f16) on contiguous data:
// out[i] = x[i] rounded exactly as cast_value rounds (nearest even, denormals kept, NaN
// quieted), 16 lanes at a time. Returns false, touching nothing, for any other pair of
// dtypes (the caller's generic conversion takes them).
bool convert(DType from, DType to, const void* x, void* out, int64_t n);

// out[i] = cond[i] != 0 ? a[i] : b[i]; a (b) is read at index 0 for every i when a_scalar (b_scalar).
// Any dtype (bool is read as its byte).
template <class T> void where(const uint8_t* cond, const T* a, bool a_scalar, const T* b, bool b_scalar, T* out, int64_t n);

enum class CompareOp { eq, gt, lt };
// out[i] = a[i] op b[i] (b[0] when b_scalar), compared in double. Any dtype.
template <class T> void compare(CompareOp op, const T* a, const T* b, bool b_scalar, bool* out, int64_t n);
// out[i] = a[i] op s, compared in double.
template <class T> void compare_scalar(CompareOp op, const T* a, double s, bool* out, int64_t n);

namespace ref {
// Each returns a new contiguous tensor of the input's dtype (comparisons: bool),
// computed element by element in double from the logical values (any strides).
Tensor unary(UnaryOp op, const Tensor& x);
Tensor pow(const Tensor& x, double p);
Tensor pow(const Tensor& x, const Tensor& y);  // broadcasting; dtype promote(x, y)
Tensor clamp(const Tensor& x, double lo, double hi);
Tensor abs_backward(const Tensor& x, const Tensor& g);
Tensor clamp_backward(const Tensor& x, double lo, double hi, const Tensor& g);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);  // broadcasting; dtype promote(a, b)
Tensor compare(CompareOp op, const Tensor& a, const Tensor& b);     // broadcasting
}  // namespace ref

// ---------------------------------------------------------------------------
// The block-parallel driver of the elementwise kernels (unary.cpp, activation.cpp, …).
namespace vec {

// Elements per parallel block, and the size below which a kernel runs on one thread.
inline constexpr int64_t kBlock = 8192;
inline constexpr int64_t kGrainCheap = 1 << 16;       // memory-bound ops (abs, clamp, where)
inline constexpr int64_t kGrainTranscendental = 1 << 14;  // exp, tanh, gelu, … (~0.3-0.9 ns/element)

// Runs body(begin, end) over [0, n) in kBlock pieces, in parallel when n > grain.
template <class Body> void parallel_blocks(int64_t n, int64_t grain, const Body& body) {
  if (n <= grain) {
    if (n > 0) body(int64_t{0}, n);
    return;
  }
  const int64_t nb = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nb; ++b) body(b * kBlock, std::min(n, (b + 1) * kBlock));
}

}  // namespace vec
}  // namespace athanor::cpu
