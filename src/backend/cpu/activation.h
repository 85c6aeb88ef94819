#pragma once
// Activation kernels (tanh, sigmoid, relu, gelu exact / tanh-approximate, silu):
// forward and fused backward, on contiguous buffers of one floating dtype.
//
// Invariants (as in unary.h): with AVX-512, f32 runs the vector-math kernels of
// cpu::vec and bf16/f16 compute in f32 and round once; f64 (and every type in
// the avx2 level) uses std:: math in double. The backward kernels take the tensor the op
// saved: the output y for tanh, sigmoid and relu, the input x for gelu and silu.
#include <cstdint>
#include <type_traits>

#include "athanor/core/tensor.h"

namespace athanor::cpu {

enum class Activation { tanh, sigmoid, relu, gelu, gelu_tanh, silu };
const char* activation_name(Activation a);
// True when the backward is computed from the output y (else from the input x).
bool activation_backward_uses_output(Activation a);

// y[i] = f(x[i]).
template <class T> void activation_forward(Activation a, const T* x, T* y, int64_t n);
// dx[i] = g[i] * f'(x[i]), with f' written in terms of `saved` (y or x, see above).
template <class T> void activation_backward(Activation a, const T* saved, const T* g, T* dx, int64_t n);

// linear_relu's backward from the ReLU's output y, over row-major [M, N] buffers, in one
// pass: g = dy ⊙ [y > 0] and, when db is not null, db[j] = Σ_i g[i, j] (the bias gradient),
// accumulated and written in rowsum_acc_t<T>: f32 for f32/bf16/f16 (the caller rounds it
// to a 16-bit dtype if it wants one), f64 for double. g may alias dy.
// Threads split the columns: each keeps its columns' sums in registers across all rows.
template <class T> using rowsum_acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;
template <class T> void relu_backward_rowsum(const T* y, const T* dy, T* g, rowsum_acc_t<T>* db, int64_t M, int64_t N);

// gelu_linear's fused backward (ops/gelu_linear.cpp), with the gelu_tanh kernels' own
// formulas, so the results are bit-identical to the composition of those kernels:
// whether this level has them fused (the avx512 levels; elsewhere the op takes its plain
// path, and these compute per element in double);
bool gelu_tanh_fused_slope();
// h[i] = gelu_tanh(x[i]) rounded to T and s[i] = gelu_tanh'(x[i]) in f32 (T: f32, bf16, f16);
template <class T> void gelu_tanh_value_and_slope(const T* x, T* h, float* s, int64_t n);
// g[i] = g[i] s[i], rounded to T;
template <class T> void multiply_by_slope(T* g, const float* s, int64_t n);
// on one thread: h[i] = gelu_tanh(x[i]) (skipped when h is null) and g[i] *= gelu_tanh'(x[i]).
void gelu_tanh_value_and_apply_slope(const float* x, float* h, float* g, int64_t n);

namespace ref {
// Scalar loops in double over the logical elements; result in x's dtype.
//   tanh      y = tanh x                            dy/dx = 1 - y²
//   sigmoid   y = 1 / (1 + e^-x)                     dy/dx = y (1 - y)
//   relu      y = max(x, 0)                          dy/dx = [y > 0]   (0 at x = 0)
//   gelu      y = x Phi(x) = x/2 (1 + erf(x/√2))     dy/dx = Phi(x) + x phi(x)
//   gelu_tanh y = x/2 (1 + tanh u), u = √(2/π)(x + 0.044715 x³)
//                                                    dy/dx = (1 + tanh u)/2 + x/2 (1 - tanh² u) u'
//   silu      y = x sigmoid(x)                       dy/dx = s (1 + x (1 - s)), s = sigmoid(x)
Tensor activation_forward(Activation a, const Tensor& x);
Tensor activation_backward(Activation a, const Tensor& saved, const Tensor& g);
}  // namespace ref

}  // namespace athanor::cpu
