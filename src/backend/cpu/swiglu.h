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

}  // namespace athanor::cpu
