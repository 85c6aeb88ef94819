#pragma once
// Convolution and max pooling on the device: im2col / col2im around cuBLASLt GEMMs (the
// conv op in src/ops/cuda/conv.cpp), and max pooling with its argmax. Index arithmetic in
// conv_index.h (shared with the CPU tests). Contiguous NCHW buffers in f32, bf16 or f16 (the
// column buffers of the backward in f32), or f64 throughout (math in f64); nothing here
// synchronises, and no atomics: every sum is a gather in a fixed order.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "athanor/core/dtype.h"
#include "backend/cuda/conv_index.h"

namespace athanor::cuda {

// cols [N OH OW, C KH KW] (x's dtype) from the group of channels [c0, c0 + g.C) of x [N, C_total, H, W].
void im2col(const void* x, DType dtype, const ConvGeom& g, int64_t C_total, int64_t c0, void* cols, cudaStream_t stream);
// dx[:, c0 .. c0 + g.C) (dx's dtype, the group's channels; every element written) = the
// adjoint of im2col applied to dcols [N OH OW, C KH KW] (f32).
void col2im(const float* dcols, const ConvGeom& g, int64_t C_total, int64_t c0, void* dx, DType dtype, cudaStream_t stream);
// The same for f64: dcols and dx in f64, summed in f64.
void col2im(const double* dcols, const ConvGeom& g, int64_t C_total, int64_t c0, double* dx, cudaStream_t stream);
// y [N, C, OH, OW] = the window maxima of x (g.C: all channels), idx = ih W + iw of the first
// maximum in row-major window order (a NaN wins; the CPU's rule); -1 for an all-padding window.
void max_pool2d_forward(const void* x, DType dtype, const ConvGeom& g, void* y, int64_t* idx, cudaStream_t stream);
// dx[n, c, ih, iw] = Σ dy over the windows whose argmax is (ih, iw), in window order.
void max_pool2d_backward(const void* dy, const int64_t* idx, DType dtype, const ConvGeom& g, void* dx, cudaStream_t stream);

}  // namespace athanor::cuda
