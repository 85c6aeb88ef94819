// Max / average pooling kernels (see pool.h) and the naive reference.
#include "backend/cpu/pool.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "athanor/core/convert.h"

namespace athanor::cpu {
namespace {
constexpr int64_t kParallelGrain = 1 << 14;  // output elements below which one thread does it all
template <class T> using pool_acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// A zeroed gradient plane to accumulate into in the compute type: dx itself for f32/f64, an f32
// buffer for half types, rounded into dx once when the plane is done.
template <class T> class Plane {
 public:
  using C = pool_acc_t<T>;
  Plane(T* dst, int64_t n) : dst_(dst), n_(n) {
    if constexpr (std::is_same_v<T, C>) std::fill(dst, dst + n, T(0));
    else buf_.assign(n, C(0));
  }
  ~Plane() {
    if constexpr (!std::is_same_v<T, C>)
      for (int64_t i = 0; i < n_; ++i) dst_[i] = cast_value<T>(buf_[i]);
  }
  C& operator[](int64_t i) {
    if constexpr (std::is_same_v<T, C>) return dst_[i];
    else return buf_[i];
  }

 private:
  T* dst_;
  int64_t n_;
  std::vector<C> buf_;
};

// Clipped window [lo, hi) along one axis for output position o.
inline void window(int64_t o, int64_t stride, int64_t pad, int64_t k, int64_t in, int64_t& lo, int64_t& hi) {
  const int64_t s = o * stride - pad;
  lo = std::max<int64_t>(s, 0);
  hi = std::min<int64_t>(s + k, in);
}
}  // namespace

template <class T> void max_pool2d_forward(const T* x, T* y, int64_t* idx, const Pool2dGeom& g) {
  using C = pool_acc_t<T>;
  const int64_t planes = g.N * g.C, HW = g.H * g.W, P = g.OH * g.OW;
#pragma omp parallel for if (planes * P > kParallelGrain) schedule(static)
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T* xp = x + pl * HW;
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      int64_t h0, h1;
      window(oh, g.sh, g.ph, g.KH, g.H, h0, h1);
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        int64_t w0, w1;
        window(ow, g.sw, g.pw, g.KW, g.W, w0, w1);
        C best = -std::numeric_limits<C>::infinity();
        int64_t arg = -1;  // stays -1 only for a window entirely in the padding
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) {
            const C v = cast_value<C>(xp[ih * g.W + iw]);
            if (v > best || (std::isnan(v) && !std::isnan(best)) || arg < 0) best = v, arg = ih * g.W + iw;
          }
        y[pl * P + oh * g.OW + ow] = cast_value<T>(best);
        idx[pl * P + oh * g.OW + ow] = arg;
      }
    }
  }
}

template <class T> void max_pool2d_backward(const T* dy, const int64_t* idx, T* dx, const Pool2dGeom& g) {
  using C = pool_acc_t<T>;
  const int64_t planes = g.N * g.C, HW = g.H * g.W, P = g.OH * g.OW;
#pragma omp parallel for if (planes * P > kParallelGrain) schedule(static)
  for (int64_t pl = 0; pl < planes; ++pl) {
    Plane<T> acc(dx + pl * HW, HW);  // overlapping windows may send several gradients to one element
    for (int64_t p = 0; p < P; ++p) {
      const int64_t a = idx[pl * P + p];
      if (a >= 0) acc[a] += cast_value<C>(dy[pl * P + p]);  // d max / d x_argmax = 1
    }
  }
}

template <class T> void avg_pool2d_forward(const T* x, T* y, const Pool2dGeom& g) {
  using C = pool_acc_t<T>;
  const int64_t planes = g.N * g.C, HW = g.H * g.W, P = g.OH * g.OW;
  const C inv = C(1) / static_cast<C>(g.KH * g.KW);  // count_include_pad
#pragma omp parallel for if (planes * P > kParallelGrain) schedule(static)
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T* xp = x + pl * HW;
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      int64_t h0, h1;
      window(oh, g.sh, g.ph, g.KH, g.H, h0, h1);
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        int64_t w0, w1;
        window(ow, g.sw, g.pw, g.KW, g.W, w0, w1);
        C s = 0;
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) s += cast_value<C>(xp[ih * g.W + iw]);
        y[pl * P + oh * g.OW + ow] = cast_value<T>(s * inv);
      }
    }
  }
}

template <class T> void avg_pool2d_backward(const T* dy, T* dx, const Pool2dGeom& g) {
  using C = pool_acc_t<T>;
  const int64_t planes = g.N * g.C, HW = g.H * g.W, P = g.OH * g.OW;
  const C inv = C(1) / static_cast<C>(g.KH * g.KW);
#pragma omp parallel for if (planes * P > kParallelGrain) schedule(static)
  for (int64_t pl = 0; pl < planes; ++pl) {
    Plane<T> acc(dx + pl * HW, HW);
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      int64_t h0, h1;
      window(oh, g.sh, g.ph, g.KH, g.H, h0, h1);
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        int64_t w0, w1;
        window(ow, g.sw, g.pw, g.KW, g.W, w0, w1);
        const C gv = cast_value<C>(dy[pl * P + oh * g.OW + ow]) * inv;  // d avg / d x = 1 / (KH KW) in the window
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) acc[ih * g.W + iw] += gv;
      }
    }
  }
}

#define ATHANOR_INSTANTIATE_POOL(T)                                                          \
  template void max_pool2d_forward<T>(const T*, T*, int64_t*, const Pool2dGeom&);           \
  template void max_pool2d_backward<T>(const T*, const int64_t*, T*, const Pool2dGeom&);    \
  template void avg_pool2d_forward<T>(const T*, T*, const Pool2dGeom&);                     \
  template void avg_pool2d_backward<T>(const T*, T*, const Pool2dGeom&);
ATHANOR_INSTANTIATE_POOL(float)
ATHANOR_INSTANTIATE_POOL(double)
ATHANOR_INSTANTIATE_POOL(bfloat16)
ATHANOR_INSTANTIATE_POOL(float16)
#undef ATHANOR_INSTANTIATE_POOL

namespace ref {
namespace {
// Visits every in-bounds element of window (n, c, oh, ow) in row-major order: f(input offset).
template <class F> void each_in_window(const Pool2dGeom& g, int64_t n, int64_t c, int64_t oh, int64_t ow, F&& f) {
  for (int64_t kh = 0; kh < g.KH; ++kh)
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      const int64_t ih = oh * g.sh - g.ph + kh, iw = ow * g.sw - g.pw + kw;
      if (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) f(((n * g.C + c) * g.H + ih) * g.W + iw);
    }
}
int64_t first_max(const std::vector<double>& xv, const Pool2dGeom& g, int64_t n, int64_t c, int64_t oh, int64_t ow) {
  int64_t best = -1;
  each_in_window(g, n, c, oh, ow, [&](int64_t i) {
    if (best < 0 || xv[i] > xv[best]) best = i;
  });
  return best;
}
Tensor f64_tensor(const std::vector<double>& v, const Shape& s) { return from_vector(v, s, TensorOptions(DType::f64)); }
}  // namespace

Tensor max_pool2d(const Tensor& x, const Pool2dGeom& g) {
  const auto xv = x.to_vector();
  std::vector<double> y(g.N * g.C * g.OH * g.OW);
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const int64_t b = first_max(xv, g, n, c, oh, ow);
          y[((n * g.C + c) * g.OH + oh) * g.OW + ow] = b < 0 ? -std::numeric_limits<double>::infinity() : xv[b];
        }
  return f64_tensor(y, {g.N, g.C, g.OH, g.OW});
}

Tensor max_pool2d_backward(const Tensor& x, const Tensor& dy, const Pool2dGeom& g) {
  const auto xv = x.to_vector(), gv = dy.to_vector();
  std::vector<double> dx(xv.size(), 0.0);
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const int64_t b = first_max(xv, g, n, c, oh, ow);
          if (b >= 0) dx[b] += gv[((n * g.C + c) * g.OH + oh) * g.OW + ow];
        }
  return f64_tensor(dx, x.sizes());
}

Tensor avg_pool2d(const Tensor& x, const Pool2dGeom& g) {
  const auto xv = x.to_vector();
  std::vector<double> y(g.N * g.C * g.OH * g.OW);
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          double s = 0;
          each_in_window(g, n, c, oh, ow, [&](int64_t i) { s += xv[i]; });
          y[((n * g.C + c) * g.OH + oh) * g.OW + ow] = s / static_cast<double>(g.KH * g.KW);
        }
  return f64_tensor(y, {g.N, g.C, g.OH, g.OW});
}

Tensor avg_pool2d_backward(const Tensor& dy, const Pool2dGeom& g) {
  const auto gv = dy.to_vector();
  std::vector<double> dx(g.N * g.C * g.H * g.W, 0.0);
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const double v = gv[((n * g.C + c) * g.OH + oh) * g.OW + ow] / static_cast<double>(g.KH * g.KW);
          each_in_window(g, n, c, oh, ow, [&](int64_t i) { dx[i] += v; });
        }
  return f64_tensor(dx, {g.N, g.C, g.H, g.W});
}
}  // namespace ref

}  // namespace athanor::cpu
