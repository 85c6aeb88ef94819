#pragma once
// 2-D pooling kernels on contiguous NCHW buffers (f32, f64, bf16, f16; half types compare and
// sum in f32). Window (oh, ow) covers rows oh*sh - ph .. + KH and columns ow*sw - pw .. + KW.
//  - max: padding acts as -inf; idx records the argmax as ih * W + iw within its plane (the
//    first maximum in row-major window order; a NaN wins); backward sends dy to that element.
//  - avg: count_include_pad = true, so every window divides by KH * KW.
// Parallel over (n, c) planes: each plane's dx is written by one thread (no races).
#include <cstdint>

#include "athanor/core/tensor.h"

namespace athanor::cpu {

struct Pool2dGeom {
  int64_t N = 0, C = 0, H = 0, W = 0;
  int64_t KH = 1, KW = 1, sh = 1, sw = 1, ph = 0, pw = 0;
  int64_t OH = 0, OW = 0;
};

template <class T> void max_pool2d_forward(const T* x, T* y, int64_t* idx, const Pool2dGeom& g);
template <class T> void max_pool2d_backward(const T* dy, const int64_t* idx, T* dx, const Pool2dGeom& g);
template <class T> void avg_pool2d_forward(const T* x, T* y, const Pool2dGeom& g);
template <class T> void avg_pool2d_backward(const T* dy, T* dx, const Pool2dGeom& g);

namespace ref {
// Naive loops in double with a bounds check per window element; any floating dtype and layout in,
// f64 tensors out.
Tensor max_pool2d(const Tensor& x, const Pool2dGeom& g);
Tensor max_pool2d_backward(const Tensor& x, const Tensor& dy, const Pool2dGeom& g);  // re-finds the first max
Tensor avg_pool2d(const Tensor& x, const Pool2dGeom& g);
Tensor avg_pool2d_backward(const Tensor& dy, const Pool2dGeom& g);
}  // namespace ref

}  // namespace athanor::cpu
