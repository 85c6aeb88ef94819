// im2col + GEMM convolution kernels (see conv.h) and the naive reference.
#include "backend/cpu/conv.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "athanor/core/allocator.h"
#include "athanor/core/error.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/workspace.h"

namespace athanor::cpu {
namespace {


constexpr int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

// Output columns ow whose input column iw = ow * sw + iw0 lies in [0, W): [lo, hi).
inline void valid_range(int64_t iw0, int64_t sw, int64_t W, int64_t OW, int64_t& lo, int64_t& hi) {
  lo = iw0 >= 0 ? 0 : (-iw0 + sw - 1) / sw;
  hi = W - 1 - iw0 >= 0 ? (W - 1 - iw0) / sw + 1 : 0;
  lo = std::min(lo, OW);
  hi = std::clamp(hi, lo, OW);
}

// x: one group of one image [Cg, H, W] -> col [Cg * KH * KW, OH * OW] (zero where padded).
template <class T> void im2col(const T* x, T* col, const Conv2dGeom& g, int64_t Cg) {
  const int64_t P = g.OH * g.OW;
  for (int64_t c = 0; c < Cg; ++c)
    for (int64_t kh = 0; kh < g.KH; ++kh)
      for (int64_t kw = 0; kw < g.KW; ++kw) {
        T* row = col + ((c * g.KH + kh) * g.KW + kw) * P;
        const int64_t iw0 = kw * g.dw - g.pw;
        int64_t lo, hi;
        valid_range(iw0, g.sw, g.W, g.OW, lo, hi);
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          T* r = row + oh * g.OW;
          const int64_t ih = oh * g.sh - g.ph + kh * g.dh;
          if (ih < 0 || ih >= g.H) {
            std::fill(r, r + g.OW, T(0));
            continue;
          }
          const T* xr = x + (c * g.H + ih) * g.W;
          std::fill(r, r + lo, T(0));
          if (g.sw == 1) {
            std::copy(xr + iw0 + lo, xr + iw0 + hi, r + lo);
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) r[ow] = xr[iw0 + ow * g.sw];
          }
          std::fill(r + hi, r + g.OW, T(0));
        }
      }
}

// The adjoint of im2col: dx [Cg, H, W] += scatter of dcol (dx must be zeroed by the caller).
template <class T> void col2im(const T* col, T* dx, const Conv2dGeom& g, int64_t Cg) {
  const int64_t P = g.OH * g.OW;
  for (int64_t c = 0; c < Cg; ++c)
    for (int64_t kh = 0; kh < g.KH; ++kh)
      for (int64_t kw = 0; kw < g.KW; ++kw) {
        const T* row = col + ((c * g.KH + kh) * g.KW + kw) * P;
        const int64_t iw0 = kw * g.dw - g.pw;
        int64_t lo, hi;
        valid_range(iw0, g.sw, g.W, g.OW, lo, hi);
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          const int64_t ih = oh * g.sh - g.ph + kh * g.dh;
          if (ih < 0 || ih >= g.H) continue;
          const T* r = row + oh * g.OW;
          T* xr = dx + (c * g.H + ih) * g.W;
          for (int64_t ow = lo; ow < hi; ++ow) xr[iw0 + ow * g.sw] += r[ow];
        }
      }
}

inline bool is_direct(const Conv2dGeom& g) {  // 1x1, stride 1, no padding: the image is its own column matrix
  return g.KH == 1 && g.KW == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
}
// Threads over the batch only for f32 (oneDNN runs single-threaded inside our region); f64 stays
// serial over images so the pthread OpenBLAS is never entered from several threads at once.
// Tiny convolutions (< ~64k multiply-adds) stay on the calling thread.
template <class T> bool parallel_batch(const Conv2dGeom& g) {
  const int64_t macs = g.N * g.OC * g.OH * g.OW * (g.C / g.groups) * g.KH * g.KW;
  return std::is_same_v<T, float> && g.N > 1 && macs > (int64_t{1} << 16);
}

}  // namespace

int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil) {
  const int64_t span = in + 2 * pad - dil * (k - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

template <class T> void conv2d_forward(const T* x, const T* w, const T* bias, T* y, const Conv2dGeom& g) {
  const int64_t Cg = g.C / g.groups, OCg = g.OC / g.groups, K = Cg * g.KH * g.KW, P = g.OH * g.OW;
  if (g.N == 0 || P == 0 || g.OC == 0) return;
  const bool direct = is_direct(g), par = parallel_batch<T>(g);
  const int nt = par ? omp_get_max_threads() : 1;
  const int64_t per = direct ? 0 : round16(K * P);
  Workspace ws(static_cast<std::size_t>(nt * per) * sizeof(T));
#pragma omp parallel if (par)
  {
    T* col = ws.as<T>() + omp_get_thread_num() * per;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const T* xg = x + (n * g.C + grp * Cg) * g.H * g.W;
        T* yg = y + (n * g.OC + grp * OCg) * P;
        if (!direct) im2col(xg, col, g, Cg);
        T beta = 0;
        if (bias) {  // output rows start as the bias; the GEMM adds W col on top
          for (int64_t oc = 0; oc < OCg; ++oc) std::fill(yg + oc * P, yg + (oc + 1) * P, bias[grp * OCg + oc]);
          beta = 1;
        }
        // y_g [OCg, P] = W_g [OCg, K] @ col [K, P]
        gemm(false, false, OCg, P, K, T(1), w + grp * OCg * K, K, direct ? xg : col, P, beta, yg, P);
      }
  }
}

template <class T>
void conv2d_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, const Conv2dGeom& g) {
  const int64_t Cg = g.C / g.groups, OCg = g.OC / g.groups, K = Cg * g.KH * g.KW, P = g.OH * g.OW;
  const bool direct = is_direct(g), par = parallel_batch<T>(g);
  const int nt = par ? omp_get_max_threads() : 1;
  if (db) {  // db[oc] = sum_{n, p} dy[n, oc, p]
#pragma omp parallel for if (g.OC * g.N * P > (1 << 15)) schedule(static)
    for (int64_t oc = 0; oc < g.OC; ++oc) {
      T s = 0;
      for (int64_t n = 0; n < g.N; ++n) {
        const T* r = dy + (n * g.OC + oc) * P;
#pragma omp simd reduction(+ : s)
        for (int64_t p = 0; p < P; ++p) s += r[p];
      }
      db[oc] = s;
    }
  }
  if (dx) {  // dx_n,g = col2im(W_g^T dy_n,g); each image's slice is written by one thread
    std::fill(dx, dx + g.N * g.C * g.H * g.W, T(0));
    const int64_t per = direct ? 0 : round16(K * P);
    Workspace ws(static_cast<std::size_t>(nt * per) * sizeof(T));
    if (P > 0 && g.OC > 0) {
#pragma omp parallel if (par)
      {
        T* dcol = ws.as<T>() + omp_get_thread_num() * per;
#pragma omp for schedule(static)
        for (int64_t n = 0; n < g.N; ++n)
          for (int64_t grp = 0; grp < g.groups; ++grp) {
            const T* dyg = dy + (n * g.OC + grp * OCg) * P;
            T* dxg = dx + (n * g.C + grp * Cg) * g.H * g.W;
            // dcol [K, P] = W_g^T [K, OCg] @ dy_g [OCg, P]   (direct: dcol is dx_g itself)
            gemm(true, false, K, P, OCg, T(1), w + grp * OCg * K, K, dyg, P, T(0), direct ? dxg : dcol, P);
            if (!direct) col2im(dcol, dxg, g, Cg);
          }
      }
    }
  }
  if (dw) {  // dw_g = sum_n dy_n,g [OCg, P] @ col_n,g^T [P, K], per-thread partials reduced in thread order
    const int64_t percol = direct ? 0 : round16(K * P), perpart = round16(g.OC * K);
    Workspace ws(static_cast<std::size_t>(nt * (percol + perpart)) * sizeof(T));
#pragma omp parallel if (par)
    {
      const int tid = omp_get_thread_num(), team = omp_get_num_threads();
      T* col = ws.as<T>() + tid * (percol + perpart);
      T* part = col + percol;
      std::fill(part, part + g.OC * K, T(0));
#pragma omp for schedule(static)
      for (int64_t n = 0; n < g.N; ++n)
        for (int64_t grp = 0; grp < g.groups; ++grp) {
          if (P == 0) continue;
          const T* xg = x + (n * g.C + grp * Cg) * g.H * g.W;
          if (!direct) im2col(xg, col, g, Cg);
          gemm(false, true, OCg, K, P, T(1), dy + (n * g.OC + grp * OCg) * P, P, direct ? xg : col, P, T(1),
               part + grp * OCg * K, K);
        }
      // implicit barrier: every partial is complete
#pragma omp for schedule(static)
      for (int64_t e = 0; e < g.OC * K; ++e) {
        T s = 0;
        for (int t = 0; t < team; ++t) s += ws.as<T>()[t * (percol + perpart) + percol + e];
        dw[e] = s;
      }
    }
  }
}

template void conv2d_forward<float>(const float*, const float*, const float*, float*, const Conv2dGeom&);
template void conv2d_forward<double>(const double*, const double*, const double*, double*, const Conv2dGeom&);
template void conv2d_backward<float>(const float*, const float*, const float*, float*, float*, float*,
                                     const Conv2dGeom&);
template void conv2d_backward<double>(const double*, const double*, const double*, double*, double*, double*,
                                      const Conv2dGeom&);

namespace ref {
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeom& g) {
  const auto xv = x.to_vector(), wv = w.to_vector();
  const std::vector<double> bv = bias.defined() ? bias.to_vector() : std::vector<double>(g.OC, 0.0);
  const int64_t Cg = g.C / g.groups, OCg = g.OC / g.groups;
  std::vector<double> y(g.N * g.OC * g.OH * g.OW);
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t oc = 0; oc < g.OC; ++oc)
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          double s = bv[oc];
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t kh = 0; kh < g.KH; ++kh)
              for (int64_t kw = 0; kw < g.KW; ++kw) {
                const int64_t ih = oh * g.sh - g.ph + kh * g.dh, iw = ow * g.sw - g.pw + kw * g.dw;
                if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) continue;
                const int64_t ci = oc / OCg * Cg + c;
                s += wv[((oc * Cg + c) * g.KH + kh) * g.KW + kw] * xv[((n * g.C + ci) * g.H + ih) * g.W + iw];
              }
          y[((n * g.OC + oc) * g.OH + oh) * g.OW + ow] = s;
        }
  return from_vector(y, {g.N, g.OC, g.OH, g.OW}, TensorOptions(DType::f64));
}

std::array<Tensor, 3> conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Conv2dGeom& g) {
  const auto xv = x.to_vector(), wv = w.to_vector(), gv = dy.to_vector();
  const int64_t Cg = g.C / g.groups, OCg = g.OC / g.groups;
  std::vector<double> dx(xv.size(), 0.0), dw(wv.size(), 0.0), db(g.OC, 0.0);
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t oc = 0; oc < g.OC; ++oc)
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const double go = gv[((n * g.OC + oc) * g.OH + oh) * g.OW + ow];
          db[oc] += go;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t kh = 0; kh < g.KH; ++kh)
              for (int64_t kw = 0; kw < g.KW; ++kw) {
                const int64_t ih = oh * g.sh - g.ph + kh * g.dh, iw = ow * g.sw - g.pw + kw * g.dw;
                if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) continue;
                const int64_t xi = ((n * g.C + oc / OCg * Cg + c) * g.H + ih) * g.W + iw;
                const int64_t wi = ((oc * Cg + c) * g.KH + kh) * g.KW + kw;
                dx[xi] += wv[wi] * go;  // dy/dx = w
                dw[wi] += xv[xi] * go;  // dy/dw = x
              }
        }
  const TensorOptions f64(DType::f64);
  return {from_vector(dx, x.sizes(), f64), from_vector(dw, w.sizes(), f64), from_vector(db, {g.OC}, f64)};
}
}  // namespace ref

}  // namespace athanor::cpu
