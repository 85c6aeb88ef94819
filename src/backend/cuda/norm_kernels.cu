// The layer_norm / rms_norm kernels of norm_kernels.h: one block per row (f32 and f64), the
// parameter gradients' deterministic two-pass column sums, and the routing of the f32 entry
// points to the warp-per-row kernels under the candidate norm_vectorized (norm_rows_vec.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "athanor/core/error.h"
#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/candidates.h"
#include "backend/cuda/float_access.cuh"
#include "backend/cuda/norm_kernels.h"
#include "backend/cuda/norm_rows_vec.h"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {

unsigned grid_rows(int64_t rows) { return static_cast<unsigned>(rows); }

// ---- LayerNorm / RMSNorm ----------------------------------------------------------------
// Templated on the element type T (float or double): statistics and every sum in T, so the
// f64 kernels are the f32 ones in double (f64 gradchecks on the GPU). The f32 instantiations
// (without a 16-bit copy) compile to the PTX of the f32 kernels before the template.

template <class T> __device__ __forceinline__ T rsqrt_of(T v);
template <> __device__ __forceinline__ float rsqrt_of<float>(float v) { return rsqrtf(v); }
template <> __device__ __forceinline__ double rsqrt_of<double>(double v) { return 1.0 / sqrt(v); }  // the CPU's f64 formula
// One rounded add, never contracted with the multiply before it (accumulate_dx: autograd's sum).
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

// kLow (f32 only): y rounded to bf16 (y_low_bf16) or f16 into y_low in the same pass. Without it
// the kernel is the one before the copies existed, instruction for instruction.
template <class T, bool kLow>
__global__ void layer_norm_fwd_kernel(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t cols, T eps,
                                      void* y_low, bool y_low_bf16) {
  __shared__ T sh[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  T s = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c];
  const T mu = block_sum(s, sh) / cols;
  T ss = 0;  // two passes: (x - mean)^2 loses nothing to a large common offset
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const T d = xr[c] - mu;
    ss += d * d;
  }
  const T r = rsqrt_of(block_sum(ss, sh) / cols + eps);
  T* yr = y + row * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const T v = (xr[c] - mu) * r;
    const T out = v * (w ? w[c] : T(1)) + (b ? b[c] : T(0));
    yr[c] = out;
    if constexpr (kLow) store_lowp(y_low, y_low_bf16, row * cols + c, out);
  }
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = r;
  }
}

// dnorm = dy w;  dx = rstd (dnorm - mean(dnorm) - xhat mean(dnorm xhat))  (acc: dx += that, accumulate_dx)
template <class T>
__global__ void layer_norm_bwd_dx_kernel(const T* dy, const T* x, const T* w, const T* mean, const T* rstd, T* dx,
                                         int64_t cols, bool acc) {
  __shared__ T sh[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  const T* dyr = dy + row * cols;
  const T mu = mean[row], r = rstd[row];
  T a = 0, bsum = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const T dn = dyr[c] * (w ? w[c] : T(1)), xh = (xr[c] - mu) * r;
    a += dn;
    bsum += dn * xh;
  }
  const T mdn = block_sum(a, sh) / cols;
  const T mdnx = block_sum(bsum, sh) / cols;
  T* dxr = dx + row * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const T dn = dyr[c] * (w ? w[c] : T(1)), xh = (xr[c] - mu) * r;
    const T v = r * (dn - mdn - xh * mdnx);
    dxr[c] = acc ? add_rn(dxr[c], v) : v;
  }
}

// dw[c] = Σ_rows dy xhat, db[c] = Σ_rows dy in two passes with a fixed order of additions
// (deterministic, no atomics). Pass 1: block (column tile of 32, chunk of rows); each warp takes
// every 8th row of the chunk with a lane per column (coalesced), then warp 0 adds the 8 warps'
// sums in warp order into the chunk's partial. Pass 2: one thread per column adds the chunks'
// partials in chunk order. mean == nullptr: RMSNorm's xhat.
constexpr int kDwWarps = 8;
template <class T>
__global__ void norm_bwd_dw_partial_kernel(const T* dy, const T* x, const T* mean, const T* rstd, T* part_w, T* part_b,
                                           int64_t rows, int64_t cols, int64_t chunk_rows) {
  __shared__ T sw[kDwWarps][33], sb[kDwWarps][33];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t c = blockIdx.x * 32LL + lane;
  const int64_t r0 = blockIdx.y * chunk_rows, r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  T aw = 0, ab = 0;
  if (c < cols)
    for (int64_t r = r0 + warp; r < r1; r += kDwWarps) {
      const T g = dy[r * cols + c];
      aw += g * ((x[r * cols + c] - (mean ? mean[r] : T(0))) * rstd[r]);
      ab += g;
    }
  sw[warp][lane] = aw;
  sb[warp][lane] = ab;
  __syncthreads();
  if (warp == 0 && c < cols) {
    T tw = 0, tb = 0;
    for (int w = 0; w < kDwWarps; ++w) tw += sw[w][lane], tb += sb[w][lane];
    part_w[blockIdx.y * cols + c] = tw;
    part_b[blockIdx.y * cols + c] = tb;
  }
}
template <class T>
__global__ void norm_bwd_dw_finish_kernel(const T* part_w, const T* part_b, int64_t chunks, int64_t cols, T* dw, T* db) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  T tw = 0, tb = 0;
  for (int64_t k = 0; k < chunks; ++k) tw += part_w[k * cols + c], tb += part_b[k * cols + c];
  if (dw) dw[c] = tw;
  if (db) db[c] = tb;
}

template <class T, bool kLow>  // kLow: as layer_norm_fwd_kernel's
__global__ void rms_norm_fwd_kernel(const T* x, const T* w, T* y, T* rstd, int64_t cols, T eps, void* y_low,
                                    bool y_low_bf16) {
  __shared__ T sh[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  T ss = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) ss += xr[c] * xr[c];
  const T r = rsqrt_of(block_sum(ss, sh) / cols + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const T out = xr[c] * r * (w ? w[c] : T(1));
    y[row * cols + c] = out;
    if constexpr (kLow) store_lowp(y_low, y_low_bf16, row * cols + c, out);
  }
  if (threadIdx.x == 0) rstd[row] = r;
}

// dn = dy w;  dx = rstd (dn - xhat mean(dn xhat)),  xhat = x rstd  (acc: dx += that)
template <class T>
__global__ void rms_norm_bwd_dx_kernel(const T* dy, const T* x, const T* w, const T* rstd, T* dx, int64_t cols,
                                       bool acc) {
  __shared__ T sh[32];
  const int64_t row = blockIdx.x;
  const T r = rstd[row];
  T a = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    a += dy[row * cols + c] * (w ? w[c] : T(1)) * x[row * cols + c] * r;
  const T m = block_sum(a, sh) / cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const T dn = dy[row * cols + c] * (w ? w[c] : T(1)), xh = x[row * cols + c] * r;
    const T v = r * (dn - xh * m);
    dx[row * cols + c] = acc ? add_rn(dx[row * cols + c], v) : v;
  }
}

}  // namespace

namespace {
void check_lowp_copy(void* y_low, DType y_low_dtype, const char* op) {
  ATH_CHECK(!y_low || y_low_dtype == DType::bf16 || y_low_dtype == DType::f16, op, "the low-precision copy of the output is ",
            dtype_name(y_low_dtype), Hint{"this is a bug in athanor (the copy is bf16 or f16); please report it"});
}

template <class T>
void layer_norm_forward_t(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t rows, int64_t cols, double eps,
                          cudaStream_t stream, void* y_low, bool y_low_bf16) {
  if (rows == 0) return;
  if constexpr (std::is_same_v<T, float>)  // (the copy is of an f32 output only)
    if (y_low) {
      layer_norm_fwd_kernel<T, true><<<grid_rows(rows), kRowThreads, 0, stream>>>(x, w, b, y, mean, rstd, cols,
                                                                                  static_cast<T>(eps), y_low, y_low_bf16);
      ATH_CUDA_LAUNCHED("layer_norm_fwd_kernel");
      return;
    }
  layer_norm_fwd_kernel<T, false><<<grid_rows(rows), kRowThreads, 0, stream>>>(x, w, b, y, mean, rstd, cols,
                                                                               static_cast<T>(eps), nullptr, false);
  ATH_CUDA_LAUNCHED("layer_norm_fwd_kernel");
}
}  // namespace

// The f32 norms take the warp-per-row kernels (norm_rows_vec.h) under the candidate
// norm_vectorized, where those take the rows.
namespace {
bool norm_rows(int64_t cols, const void* a, const void* b, const void* c, const void* d, const void* e,
               const void* y_low = nullptr) {
  return candidate_enabled(Candidate::norm_vectorized) && norm_rows_vectorized_supported(cols, a, b, c, d, e, y_low);
}
}  // namespace

void layer_norm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                        int64_t rows, int64_t cols, double eps, cudaStream_t stream, void* y_low, DType y_low_dtype) {
  check_lowp_copy(y_low, y_low_dtype, "layer_norm");
  if (norm_rows(cols, x, w, b, y, nullptr, y_low))
    return layer_norm_forward_vectorized(x, w, b, y, mean, rstd, rows, cols, eps, stream, y_low, y_low_dtype);
  layer_norm_forward_t(x, w, b, y, mean, rstd, rows, cols, eps, stream, y_low, y_low_dtype == DType::bf16);
}
void layer_norm_forward(const double* x, const double* w, const double* b, double* y, double* mean, double* rstd,
                        int64_t rows, int64_t cols, double eps, cudaStream_t stream) {
  layer_norm_forward_t(x, w, b, y, mean, rstd, rows, cols, eps, stream, nullptr, false);
}

namespace {
// Rows per chunk of the parameter-gradient pass: at least 256 (8 warps x 32 rows), at most 1024
// chunks (the scratch stays 8 KB per column in f32, 16 KB in f64).
int64_t dw_chunk_rows(int64_t rows) { return std::max<int64_t>(256, (rows + 1023) / 1024); }
int64_t dw_chunks(int64_t rows) { return (rows + dw_chunk_rows(rows) - 1) / dw_chunk_rows(rows); }

template <class T>
void norm_backward_params(const T* dy, const T* x, const T* mean, const T* rstd, T* dw, T* db, int64_t rows, int64_t cols,
                          T* workspace, cudaStream_t stream) {
  const int64_t chunks = dw_chunks(rows);
  T* part_w = workspace;
  T* part_b = workspace + chunks * cols;
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(chunks));
  norm_bwd_dw_partial_kernel<T><<<grid, 32 * kDwWarps, 0, stream>>>(dy, x, mean, rstd, part_w, part_b, rows, cols,
                                                                    dw_chunk_rows(rows));
  ATH_CUDA_LAUNCHED("norm_bwd_dw_partial_kernel");
  norm_bwd_dw_finish_kernel<T><<<static_cast<unsigned>((cols + 255) / 256), 256, 0, stream>>>(part_w, part_b, chunks, cols,
                                                                                              dw, db);
  ATH_CUDA_LAUNCHED("norm_bwd_dw_finish_kernel");
}

template <class T>
void layer_norm_backward_t(const T* dy, const T* x, const T* w, const T* mean, const T* rstd, T* dx, T* dw, T* db,
                           int64_t rows, int64_t cols, void* workspace, cudaStream_t stream, bool acc) {
  if (rows == 0) return;
  if (dx) {
    layer_norm_bwd_dx_kernel<T><<<grid_rows(rows), kRowThreads, 0, stream>>>(dy, x, w, mean, rstd, dx, cols, acc);
    ATH_CUDA_LAUNCHED("layer_norm_bwd_dx_kernel");
  }
  if (dw || db) norm_backward_params(dy, x, mean, rstd, dw, db, rows, cols, static_cast<T*>(workspace), stream);
}

template <class T>
void rms_norm_forward_t(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t cols, double eps, cudaStream_t stream,
                        void* y_low, bool y_low_bf16) {
  if (rows == 0) return;
  if constexpr (std::is_same_v<T, float>)  // (the copy is of an f32 output only)
    if (y_low) {
      rms_norm_fwd_kernel<T, true><<<grid_rows(rows), kRowThreads, 0, stream>>>(x, w, y, rstd, cols, static_cast<T>(eps),
                                                                                y_low, y_low_bf16);
      ATH_CUDA_LAUNCHED("rms_norm_fwd_kernel");
      return;
    }
  rms_norm_fwd_kernel<T, false><<<grid_rows(rows), kRowThreads, 0, stream>>>(x, w, y, rstd, cols, static_cast<T>(eps),
                                                                             nullptr, false);
  ATH_CUDA_LAUNCHED("rms_norm_fwd_kernel");
}

template <class T>
void rms_norm_backward_t(const T* dy, const T* x, const T* w, const T* rstd, T* dx, T* dw, int64_t rows, int64_t cols,
                         void* workspace, cudaStream_t stream, bool acc) {
  if (rows == 0) return;
  if (dx) {
    rms_norm_bwd_dx_kernel<T><<<grid_rows(rows), kRowThreads, 0, stream>>>(dy, x, w, rstd, dx, cols, acc);
    ATH_CUDA_LAUNCHED("rms_norm_bwd_dx_kernel");
  }
  if (dw) norm_backward_params<T>(dy, x, nullptr, rstd, dw, nullptr, rows, cols, static_cast<T*>(workspace), stream);
}
}  // namespace

int64_t norm_backward_workspace_bytes(int64_t rows, int64_t cols, DType dtype) {
  const int64_t elem = dtype == DType::f64 ? static_cast<int64_t>(sizeof(double)) : static_cast<int64_t>(sizeof(float));
  const int64_t bytes = rows <= 0 ? 0 : 2 * dw_chunks(rows) * cols * elem;
  // (the warp-per-row kernels' chunks are smaller, so more of them)
  if (dtype != DType::f64 && candidate_enabled(Candidate::norm_vectorized))
    return std::max(bytes, norm_rows_workspace_bytes(rows, cols));
  return bytes;
}

namespace {
// The fused backward (dx, dw, db from one read) where the rows fit its registers.
bool norm_rows_backward(int64_t cols, const void* dy, const void* x, const void* w, const void* dx, const void* ws) {
  return cols <= kNormFusedMaxCols && norm_rows(cols, dy, x, w, dx, ws);
}
}  // namespace

void layer_norm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                         float* dx, float* dw, float* db, int64_t rows, int64_t cols, void* workspace, cudaStream_t stream,
                         bool accumulate_dx) {
  if (norm_rows_backward(cols, dy, x, w, dx, workspace))
    return layer_norm_backward_vectorized(dy, x, w, mean, rstd, dx, dw, db, rows, cols, workspace, stream, accumulate_dx);
  layer_norm_backward_t(dy, x, w, mean, rstd, dx, dw, db, rows, cols, workspace, stream, accumulate_dx);
}
void layer_norm_backward(const double* dy, const double* x, const double* w, const double* mean, const double* rstd,
                         double* dx, double* dw, double* db, int64_t rows, int64_t cols, void* workspace, cudaStream_t stream,
                         bool accumulate_dx) {
  layer_norm_backward_t(dy, x, w, mean, rstd, dx, dw, db, rows, cols, workspace, stream, accumulate_dx);
}

void rms_norm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t cols, double eps,
                      cudaStream_t stream, void* y_low, DType y_low_dtype) {
  check_lowp_copy(y_low, y_low_dtype, "rms_norm");
  if (norm_rows(cols, x, w, y, nullptr, nullptr, y_low))
    return rms_norm_forward_vectorized(x, w, y, rstd, rows, cols, eps, stream, y_low, y_low_dtype);
  rms_norm_forward_t(x, w, y, rstd, rows, cols, eps, stream, y_low, y_low_dtype == DType::bf16);
}
void rms_norm_forward(const double* x, const double* w, double* y, double* rstd, int64_t rows, int64_t cols, double eps,
                      cudaStream_t stream) {
  rms_norm_forward_t(x, w, y, rstd, rows, cols, eps, stream, nullptr, false);
}

void rms_norm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                       int64_t rows, int64_t cols, void* workspace, cudaStream_t stream, bool accumulate_dx) {
  if (norm_rows_backward(cols, dy, x, w, dx, workspace))
    return rms_norm_backward_vectorized(dy, x, w, rstd, dx, dw, rows, cols, workspace, stream, accumulate_dx);
  rms_norm_backward_t(dy, x, w, rstd, dx, dw, rows, cols, workspace, stream, accumulate_dx);
}
void rms_norm_backward(const double* dy, const double* x, const double* w, const double* rstd, double* dx, double* dw,
                       int64_t rows, int64_t cols, void* workspace, cudaStream_t stream, bool accumulate_dx) {
  rms_norm_backward_t(dy, x, w, rstd, dx, dw, rows, cols, workspace, stream, accumulate_dx);
}

}  // namespace athanor::cuda
