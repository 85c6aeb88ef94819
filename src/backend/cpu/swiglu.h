#pragma once
// SwiGLU's elementwise passes (ops/swiglu.cpp runs the GEMMs around them), on contiguous
// buffers of n elements. f32/bf16/f16 compute in f32 and round once to T; f64 in f64.
//   forward   y = silu(g) u = g sigmoid(g) u
//   backward  dg = dy u silu'(g),  silu'(g) = s (1 + g (1 - s)), s = sigmoid(g)
//             du = dy silu(g)
#include <cstdint>

namespace athanor::cpu {

template <class T> void swiglu_forward(const T* g, const T* u, T* y, int64_t n);
template <class T> void swiglu_backward(const T* dy, const T* g, const T* u, T* dg, T* du, int64_t n);
// a[i] += b[i] (in f32 for bf16/f16, rounded once): the backward's dx = dg W_gate + du W_up.
template <class T> void swiglu_sum_into(T* a, const T* b, int64_t n);

}  // namespace athanor::cpu
