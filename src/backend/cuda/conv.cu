// The kernels of conv.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "athanor/core/error.h"
#include "backend/cuda/conv.h"
#include "backend/cuda/float_access.cuh"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {
constexpr int kThreads = 256;
unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65536 * 8 ? b : 65536 * 8);
}
#define ATH_GRID_LOOP(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// A: the math's type (float_access.cuh's load_as / store_as).
template <class A>
__global__ void im2col_kernel(const void* x, DType dt, ConvGeom g, int64_t C_total, int64_t c0, void* cols) {
  const int64_t K = g.C * g.KH * g.KW, total = g.N * g.OH * g.OW * K;
  ATH_GRID_LOOP(i, total) {
    const int64_t p = i / K, k = i % K;
    const int64_t src = im2col_source(g, C_total, c0, p, k);
    store_as(cols, dt, i, src < 0 ? A(0) : load_as<A>(x, dt, src));
  }
}

template <class A>
__global__ void col2im_kernel(const A* dcols, ConvGeom g, int64_t C_total, int64_t c0, void* dx, DType dt) {
  const int64_t K = g.C * g.KH * g.KW, total = g.N * g.C * g.H * g.W;
  ATH_GRID_LOOP(i, total) {
    const int64_t iw = i % g.W, ih = (i / g.W) % g.H, c = (i / (g.W * g.H)) % g.C, n = i / (g.W * g.H * g.C);
    A acc = A(0);
    col2im_sources(g, n, c, ih, iw, [&](int64_t p, int64_t k) { acc += dcols[p * K + k]; });
    store_as(dx, dt, ((n * C_total + c0 + c) * g.H + ih) * g.W + iw, acc);
  }
}

template <class A>
__global__ void maxpool_fwd_kernel(const void* x, DType dt, ConvGeom g, void* y, int64_t* idx) {
  const int64_t P = g.OH * g.OW, total = g.N * g.C * P;
  ATH_GRID_LOOP(i, total) {
    const int64_t pl = i / P, ow = i % g.OW, oh = (i / g.OW) % g.OH;
    const int64_t h0 = max(oh * g.sh - g.ph, int64_t{0}), h1 = min(oh * g.sh - g.ph + g.KH, g.H);
    const int64_t w0 = max(ow * g.sw - g.pw, int64_t{0}), w1 = min(ow * g.sw - g.pw + g.KW, g.W);
    A best = A(-INFINITY);
    int64_t arg = -1;
    for (int64_t ih = h0; ih < h1; ++ih)
      for (int64_t iw = w0; iw < w1; ++iw) {
        const A v = load_as<A>(x, dt, pl * g.H * g.W + ih * g.W + iw);
        if (v > best || (isnan(v) && !isnan(best)) || arg < 0) best = v, arg = ih * g.W + iw;
      }
    store_as(y, dt, i, best);
    idx[i] = arg;
  }
}

template <class A>
__global__ void maxpool_bwd_kernel(const void* dy, const int64_t* idx, DType dt, ConvGeom g, void* dx) {
  const int64_t HW = g.H * g.W, P = g.OH * g.OW, total = g.N * g.C * HW;
  ATH_GRID_LOOP(i, total) {
    const int64_t pl = i / HW, ih = (i % HW) / g.W, iw = i % g.W, me = ih * g.W + iw;
    A acc = A(0);
    pool_windows_of(g, ih, iw, [&](int64_t o) {
      if (idx[pl * P + o] == me) acc += load_as<A>(dy, dt, pl * P + o);
    });
    store_as(dx, dt, i, acc);
  }
}

bool ok(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16 || d == DType::f64; }
void check(DType d, const char* op) {
  ATH_CHECK(ok(d), op, "dtype ", dtype_name(d), " on cuda", Hint{"the CUDA kernels take f32, bf16, f16 and f64"});
}
}  // namespace

void im2col(const void* x, DType dtype, const ConvGeom& g, int64_t C_total, int64_t c0, void* cols, cudaStream_t stream) {
  check(dtype, "conv2d");
  const int64_t total = g.N * g.OH * g.OW * g.C * g.KH * g.KW;
  if (total == 0) return;
  if (dtype == DType::f64) im2col_kernel<double><<<grid_for(total), kThreads, 0, stream>>>(x, dtype, g, C_total, c0, cols);
  else im2col_kernel<float><<<grid_for(total), kThreads, 0, stream>>>(x, dtype, g, C_total, c0, cols);
  ATH_CUDA_LAUNCHED("im2col_kernel");
}
void col2im(const float* dcols, const ConvGeom& g, int64_t C_total, int64_t c0, void* dx, DType dtype, cudaStream_t stream) {
  check(dtype, "conv2d backward");
  const int64_t total = g.N * g.C * g.H * g.W;
  if (total == 0) return;
  col2im_kernel<<<grid_for(total), kThreads, 0, stream>>>(dcols, g, C_total, c0, dx, dtype);
  ATH_CUDA_LAUNCHED("col2im_kernel");
}
void col2im(const double* dcols, const ConvGeom& g, int64_t C_total, int64_t c0, double* dx, cudaStream_t stream) {
  const int64_t total = g.N * g.C * g.H * g.W;
  if (total == 0) return;
  col2im_kernel<<<grid_for(total), kThreads, 0, stream>>>(dcols, g, C_total, c0, dx, DType::f64);
  ATH_CUDA_LAUNCHED("col2im_kernel f64");
}
void max_pool2d_forward(const void* x, DType dtype, const ConvGeom& g, void* y, int64_t* idx, cudaStream_t stream) {
  check(dtype, "max_pool2d");
  const int64_t total = g.N * g.C * g.OH * g.OW;
  if (total == 0) return;
  if (dtype == DType::f64) maxpool_fwd_kernel<double><<<grid_for(total), kThreads, 0, stream>>>(x, dtype, g, y, idx);
  else maxpool_fwd_kernel<float><<<grid_for(total), kThreads, 0, stream>>>(x, dtype, g, y, idx);
  ATH_CUDA_LAUNCHED("maxpool_fwd_kernel");
}
void max_pool2d_backward(const void* dy, const int64_t* idx, DType dtype, const ConvGeom& g, void* dx, cudaStream_t stream) {
  check(dtype, "max_pool2d backward");
  const int64_t total = g.N * g.C * g.H * g.W;
  if (total == 0) return;
  if (dtype == DType::f64) maxpool_bwd_kernel<double><<<grid_for(total), kThreads, 0, stream>>>(dy, idx, dtype, g, dx);
  else maxpool_bwd_kernel<float><<<grid_for(total), kThreads, 0, stream>>>(dy, idx, dtype, g, dx);
  ATH_CUDA_LAUNCHED("maxpool_bwd_kernel");
}

}  // namespace athanor::cuda
