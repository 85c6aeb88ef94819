#pragma once
// 2-D convolution kernels on contiguous NCHW buffers (f32, f64):
//   y[n, oc, oh, ow] = b[oc] + sum_{c in group(oc), kh, kw} w[oc, c, kh, kw] x[n, c, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw]
// (out-of-range input positions are zero padding).
//
// Fast path: per image and group, im2col into a [Cg*KH*KW, OH*OW] column buffer (skipped for a
// 1x1 / stride 1 / no padding kernel, where the image itself is the column matrix), then one
// cpu::gemm. OpenMP over the batch (column buffers are per thread, from the tagged allocator,
// MemTag::workspace). Backward: dx by col2im of W^T dY; dw = sum_n dY col^T, accumulated in
// per-thread partial buffers that are reduced in a fixed order (deterministic); db = sum dY.
#include <array>
#include <cstdint>

#include "athanor/core/tensor.h"

namespace athanor::cpu {

struct Conv2dGeom {
  int64_t N = 0, C = 0, H = 0, W = 0;   // input
  int64_t OC = 0, KH = 0, KW = 0;       // weight [OC, C / groups, KH, KW]
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
  int64_t OH = 0, OW = 0;               // output, from conv_out_size
};
// floor((in + 2 pad - dil (k - 1) - 1) / stride) + 1; <= 0 when the kernel does not fit.
int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil);

// bias may be null.
template <class T> void conv2d_forward(const T* x, const T* w, const T* bias, T* y, const Conv2dGeom& g);
// Any of dx, dw, db may be null (that gradient is skipped).
template <class T>
void conv2d_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, const Conv2dGeom& g);

namespace ref {
// Naive 7-loop convolution in double; inputs of any floating dtype and layout (bias may be
// undefined); results are f64 tensors.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeom& g);
// {dx, dw, db} (f64) by the same loops, scattering dy.
std::array<Tensor, 3> conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Conv2dGeom& g);
}  // namespace ref

}  // namespace athanor::cpu
