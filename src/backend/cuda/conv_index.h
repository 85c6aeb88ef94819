#pragma once
// The index arithmetic of the CUDA convolution and max-pool kernels (conv.h), in plain C++ so
// the CPU tests run the kernels' own functions (tests/gpu/test_gpu_conv_index.cpp).
//
// Geometry (PyTorch's): output (oh, ow) reads input rows oh sh - ph + kh dh and columns
// ow sw - pw + kw dw; max pooling has dilation 1.
#include <cstdint>

#include "backend/cuda/strided_index.h"

namespace athanor::cuda {

struct ConvGeom {
  int64_t N = 0, C = 0, H = 0, W = 0;  // input [N, C, H, W] (C: the channels of one group)
  int64_t KH = 1, KW = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  int64_t OH = 0, OW = 0;
};

// im2col: column k = (c KH + kh) KW + kw of row p = (n OH + oh) OW + ow. Returns the input
// offset (n, c, ih, iw) in a contiguous [N, C_total, H, W] buffer whose group starts at channel
// c0, or -1 where the window lies in the padding (the column is 0 there).
ATH_HOST_DEVICE inline int64_t im2col_source(const ConvGeom& g, int64_t C_total, int64_t c0, int64_t p, int64_t k) {
  const int64_t kw = k % g.KW, kh = (k / g.KW) % g.KH, c = k / (g.KW * g.KH);
  const int64_t ow = p % g.OW, oh = (p / g.OW) % g.OH, n = p / (g.OW * g.OH);
  const int64_t ih = oh * g.sh - g.ph + kh * g.dh, iw = ow * g.sw - g.pw + kw * g.dw;
  if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) return -1;
  return ((n * C_total + c0 + c) * g.H + ih) * g.W + iw;
}

// col2im as a gather, the adjoint of im2col with no atomics: input element (n, c, ih, iw) of
// the group is the sum of the columns that read it, visited in (kh, kw) order. For each (kh,
// kw) the one output position reading it, when there is one: visit(p, k) is called with the
// row and column indices.
template <class Visit>
ATH_HOST_DEVICE inline void col2im_sources(const ConvGeom& g, int64_t n, int64_t c, int64_t ih, int64_t iw, Visit&& visit) {
  for (int64_t kh = 0; kh < g.KH; ++kh) {
    const int64_t hh = ih + g.ph - kh * g.dh;  // = oh sh
    if (hh < 0 || hh % g.sh != 0) continue;
    const int64_t oh = hh / g.sh;
    if (oh >= g.OH) continue;
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      const int64_t ww = iw + g.pw - kw * g.dw;
      if (ww < 0 || ww % g.sw != 0) continue;
      const int64_t ow = ww / g.sw;
      if (ow >= g.OW) continue;
      visit((n * g.OH + oh) * g.OW + ow, (c * g.KH + kh) * g.KW + kw);
    }
  }
}

// Max pool backward as a gather: the output windows (oh, ow) containing input (ih, iw), in
// row-major order; visit(oh * OW + ow) for each.
template <class Visit>
ATH_HOST_DEVICE inline void pool_windows_of(const ConvGeom& g, int64_t ih, int64_t iw, Visit&& visit) {
  // oh sh - ph <= ih < oh sh - ph + KH  <=>  (ih + ph - KH) / sh < oh <= (ih + ph) / sh
  const int64_t hi_h = (ih + g.ph) / g.sh, hi_w = (iw + g.pw) / g.sw;
  const int64_t lo_h_num = ih + g.ph - g.KH + 1, lo_w_num = iw + g.pw - g.KW + 1;
  const int64_t lo_h = lo_h_num <= 0 ? 0 : (lo_h_num + g.sh - 1) / g.sh;
  const int64_t lo_w = lo_w_num <= 0 ? 0 : (lo_w_num + g.sw - 1) / g.sw;
  for (int64_t oh = lo_h; oh <= hi_h && oh < g.OH; ++oh)
    for (int64_t ow = lo_w; ow <= hi_w && ow < g.OW; ++ow) visit(oh * g.OW + ow);
}

}  // namespace athanor::cuda
