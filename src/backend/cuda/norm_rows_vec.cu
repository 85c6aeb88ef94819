// The warp-per-row norm kernels of norm_rows_vec.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "athanor/core/error.h"
#include "backend/cuda/norm_rows_vec.h"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {

constexpr int kWarps = 8;  // rows per block

// A sum over the warp, every lane gets it (a butterfly: a fixed order).
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float4 ld4(const float* p, int64_t i) { return reinterpret_cast<const float4*>(p)[i]; }
__device__ __forceinline__ void st4(float* p, int64_t i, float4 v) { reinterpret_cast<float4*>(p)[i] = v; }
__device__ __forceinline__ float4 ld4_or(const float* p, int64_t i, float fill) {
  return p ? ld4(p, i) : make_float4(fill, fill, fill, fill);
}

// The 4 values as bf16 or f16 (rounded to nearest even), 8 bytes at element 4 i of `low`.
__device__ __forceinline__ void store_low4(void* low, DType dt, int64_t i, float4 v) {
  uint2 u;
  if (dt == DType::bf16) {
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
    h[0] = __halves2bfloat162(__float2bfloat16_rn(v.x), __float2bfloat16_rn(v.y));
    h[1] = __halves2bfloat162(__float2bfloat16_rn(v.z), __float2bfloat16_rn(v.w));
  } else {
    __half2* h = reinterpret_cast<__half2*>(&u);
    h[0] = __halves2half2(__float2half_rn(v.x), __float2half_rn(v.y));
    h[1] = __halves2half2(__float2half_rn(v.z), __float2half_rn(v.w));
  }
  reinterpret_cast<uint2*>(low)[i] = u;
}

// Row r of the block's warp; false for the padding warps of the last block.
__device__ __forceinline__ bool warp_row(int64_t rows, int64_t& r, int& lane) {
  r = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  lane = threadIdx.x % 32;
  return r < rows;
}

// rms: RMSNorm (no mean, no bias).
template <bool kRms>
__global__ void __launch_bounds__(32 * kWarps) norm_fwd_vec_kernel(const float* x, const float* w, const float* b,
                                                                   float* y, float* mean, float* rstd, int64_t rows,
                                                                   int64_t cols, float eps, void* y_low, DType low_dt) {
  int64_t r;
  int lane;
  if (!warp_row(rows, r, lane)) return;
  const int64_t n4 = cols / 4;
  const float* xr = x + r * cols;
  float mu = 0;
  if (!kRms) {
    float s = 0;
    for (int64_t i = lane; i < n4; i += 32) {
      const float4 v = ld4(xr, i);
      s += (v.x + v.y) + (v.z + v.w);
    }
    mu = warp_sum(s) / cols;
  }
  float ss = 0;  // two passes for layer norm: (x - mean)^2 loses nothing to a large common offset
  for (int64_t i = lane; i < n4; i += 32) {
    const float4 v = ld4(xr, i);
    const float d0 = v.x - mu, d1 = v.y - mu, d2 = v.z - mu, d3 = v.w - mu;
    ss += (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3);
  }
  const float rs = rsqrtf(warp_sum(ss) / cols + eps);
  float* yr = y + r * cols;
  void* lowr = y_low ? static_cast<char*>(y_low) + r * cols * 2 : nullptr;
  for (int64_t i = lane; i < n4; i += 32) {
    const float4 v = ld4(xr, i), wv = ld4_or(w, i, 1.0f), bv = kRms ? make_float4(0, 0, 0, 0) : ld4_or(b, i, 0.0f);
    float4 o;
    o.x = (v.x - mu) * rs * wv.x + bv.x;
    o.y = (v.y - mu) * rs * wv.y + bv.y;
    o.z = (v.z - mu) * rs * wv.z + bv.z;
    o.w = (v.w - mu) * rs * wv.w + bv.w;
    st4(yr, i, o);
    if (lowr) store_low4(lowr, low_dt, i, o);
  }
  if (lane == 0) {
    if (!kRms) mean[r] = mu;
    rstd[r] = rs;
  }
}

// ---- dx with the parameter gradients (layer_norm_backward_vectorized) ----------------------
// A block takes kChunkRows rows, each warp every kWarps-th of them; a lane keeps its columns'
// sums of dy xhat and dy in registers (float4 i = lane + 32 j, j < kMaxJ), the warps' sums are
// added in warp order through shared memory into the chunk's partial, and a second kernel adds
// the chunks in order.
constexpr int kChunkRows = 64;
constexpr int kMaxJ = static_cast<int>(kNormFusedMaxCols / 128);

__device__ __forceinline__ void add4(float4& a, float4 b) { a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w; }

// The warps' column sums (acc) added in warp order into out[c] for the block's chunk.
__device__ void block_columns_to(const float4 (&acc)[kMaxJ], float* out, int64_t cols,
                                 float (*red)[kNormFusedMaxCols]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n4 = cols / 4;
  __syncthreads();  // red may still be read by the previous round
#pragma unroll
  for (int j = 0; j < kMaxJ; ++j) {
    const int64_t i = lane + 32 * j;
    if (i < n4) reinterpret_cast<float4*>(red[warp])[i] = acc[j];
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float t = 0;
    for (int w = 0; w < kWarps; ++w) t += red[w][c];
    out[c] = t;
  }
}

template <bool kRms>
__global__ void __launch_bounds__(32 * kWarps) norm_bwd_fused_kernel(const float* dy, const float* x, const float* w,
                                                                     const float* mean, const float* rstd, float* dx,
                                                                     float* part_w, float* part_b, int64_t rows,
                                                                     int64_t cols, bool acc) {
  __shared__ __align__(16) float red[kWarps][kNormFusedMaxCols];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n4 = cols / 4;
  float4 aw[kMaxJ], ab[kMaxJ];
#pragma unroll
  for (int j = 0; j < kMaxJ; ++j) aw[j] = ab[j] = make_float4(0, 0, 0, 0);
  const int64_t r0 = blockIdx.x * static_cast<int64_t>(kChunkRows);
  const int64_t r1 = r0 + kChunkRows < rows ? r0 + kChunkRows : rows;
  for (int64_t r = r0 + warp; r < r1; r += kWarps) {
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    const float mu = kRms ? 0.0f : mean[r], rs = rstd[r];
    float a = 0, bs = 0;  // Σ dn, Σ dn xhat
#pragma unroll
    for (int j = 0; j < kMaxJ; ++j) {
      const int64_t i = lane + 32 * j;
      if (i >= n4) continue;
      const float4 g = ld4(dyr, i), v = ld4(xr, i), wv = ld4_or(w, i, 1.0f);
      const float4 xh = make_float4((v.x - mu) * rs, (v.y - mu) * rs, (v.z - mu) * rs, (v.w - mu) * rs);
      const float n0 = g.x * wv.x, n1 = g.y * wv.y, n2 = g.z * wv.z, n3 = g.w * wv.w;
      a += (n0 + n1) + (n2 + n3);
      bs += (n0 * xh.x + n1 * xh.y) + (n2 * xh.z + n3 * xh.w);
      add4(aw[j], make_float4(g.x * xh.x, g.y * xh.y, g.z * xh.z, g.w * xh.w));
      if (!kRms) add4(ab[j], g);
    }
    if (!dx) continue;
    const float mdn = kRms ? 0.0f : warp_sum(a) / cols;
    const float mdnx = warp_sum(bs) / cols;
    float* dxr = dx + r * cols;
#pragma unroll
    for (int j = 0; j < kMaxJ; ++j) {
      const int64_t i = lane + 32 * j;
      if (i >= n4) continue;
      const float4 g = ld4(dyr, i), v = ld4(xr, i), wv = ld4_or(w, i, 1.0f);
      float4 o;
      o.x = rs * (g.x * wv.x - mdn - (v.x - mu) * rs * mdnx);
      o.y = rs * (g.y * wv.y - mdn - (v.y - mu) * rs * mdnx);
      o.z = rs * (g.z * wv.z - mdn - (v.z - mu) * rs * mdnx);
      o.w = rs * (g.w * wv.w - mdn - (v.w - mu) * rs * mdnx);
      if (acc) {  // the gradient waiting at x plus this one: one rounded add each, as autograd's sum
        const float4 p = ld4(dxr, i);
        o = make_float4(__fadd_rn(p.x, o.x), __fadd_rn(p.y, o.y), __fadd_rn(p.z, o.z), __fadd_rn(p.w, o.w));
      }
      st4(dxr, i, o);
    }
  }
  if (part_w) block_columns_to(aw, part_w + blockIdx.x * cols, cols, red);
  if (part_b) block_columns_to(ab, part_b + blockIdx.x * cols, cols, red);
}

// out[c] = Σ_k part[k][c] in chunk order.
__global__ void norm_chunks_finish_kernel(const float* part_w, const float* part_b, int64_t chunks, int64_t cols,
                                          float* dw, float* db) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  float tw = 0, tb = 0;
  for (int64_t k = 0; k < chunks; ++k) {
    if (dw) tw += part_w[k * cols + c];
    if (db) tb += part_b[k * cols + c];
  }
  if (dw) dw[c] = tw;
  if (db) db[c] = tb;
}

int64_t chunks_of(int64_t rows) { return (rows + kChunkRows - 1) / kChunkRows; }

unsigned blocks_for(int64_t rows) { return static_cast<unsigned>((rows + kWarps - 1) / kWarps); }
bool aligned(const void* p, unsigned bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

void check_supported(const char* op, bool ok, int64_t cols) {
  ATH_CHECK(ok, op, "the warp-per-row kernel was given rows it does not take (", cols, " columns)",
            Hint{"check norm_rows_vectorized_supported first (an internal error)"});
}
void check_low(const char* op, void* y_low, DType dt) {
  ATH_CHECK(!y_low || dt == DType::bf16 || dt == DType::f16, op, "the low-precision copy must be bf16 or f16, not ",
            dtype_name(dt), Hint{"an internal error"});
}

}  // namespace

bool norm_rows_vectorized_supported(int64_t cols, const void* a, const void* b, const void* c, const void* d,
                                    const void* e, const void* y_low) {
  return cols > 0 && cols % 4 == 0 && aligned(a, 16) && aligned(b, 16) && aligned(c, 16) && aligned(d, 16) &&
         aligned(e, 16) && aligned(y_low, 8);
}

void layer_norm_forward_vectorized(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                                   int64_t rows, int64_t cols, double eps, cudaStream_t stream, void* y_low,
                                   DType y_low_dtype) {
  check_supported("layer_norm", norm_rows_vectorized_supported(cols, x, w, b, y, nullptr, y_low), cols);
  check_low("layer_norm", y_low, y_low_dtype);
  if (rows == 0) return;
  norm_fwd_vec_kernel<false><<<blocks_for(rows), 32 * kWarps, 0, stream>>>(x, w, b, y, mean, rstd, rows, cols,
                                                                          static_cast<float>(eps), y_low, y_low_dtype);
  ATH_CUDA_LAUNCHED("norm_fwd_vec_kernel");
}

int64_t norm_rows_workspace_bytes(int64_t rows, int64_t cols) {
  return rows <= 0 ? 0 : 2 * chunks_of(rows) * cols * static_cast<int64_t>(sizeof(float));
}

namespace {
template <bool kRms>
void norm_backward_fused(const char* op, const float* dy, const float* x, const float* w, const float* mean,
                         const float* rstd, float* dx, float* dw, float* db, int64_t rows, int64_t cols, void* workspace,
                         cudaStream_t stream, bool acc) {
  check_supported(op, norm_rows_vectorized_supported(cols, dy, x, w, dx, workspace) && cols <= kNormFusedMaxCols, cols);
  ATH_CHECK(workspace || (!dw && !db), op, "the parameter gradients need the workspace", Hint{"an internal error"});
  if (rows == 0) return;
  const int64_t chunks = chunks_of(rows);
  float* part_w = dw ? static_cast<float*>(workspace) : nullptr;
  float* part_b = db ? static_cast<float*>(workspace) + chunks * cols : nullptr;
  norm_bwd_fused_kernel<kRms><<<static_cast<unsigned>(chunks), 32 * kWarps, 0, stream>>>(dy, x, w, mean, rstd, dx, part_w,
                                                                                         part_b, rows, cols, acc);
  ATH_CUDA_LAUNCHED("norm_bwd_fused_kernel");
  if (dw || db) {
    norm_chunks_finish_kernel<<<static_cast<unsigned>((cols + 255) / 256), 256, 0, stream>>>(part_w, part_b, chunks, cols,
                                                                                            dw, db);
    ATH_CUDA_LAUNCHED("norm_chunks_finish_kernel");
  }
}
}  // namespace

void layer_norm_backward_vectorized(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                                    float* dx, float* dw, float* db, int64_t rows, int64_t cols, void* workspace,
                                    cudaStream_t stream, bool accumulate_dx) {
  norm_backward_fused<false>("layer_norm backward", dy, x, w, mean, rstd, dx, dw, db, rows, cols, workspace, stream,
                             accumulate_dx);
}

void rms_norm_backward_vectorized(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                                  int64_t rows, int64_t cols, void* workspace, cudaStream_t stream, bool accumulate_dx) {
  norm_backward_fused<true>("rms_norm backward", dy, x, w, nullptr, rstd, dx, dw, nullptr, rows, cols, workspace, stream,
                            accumulate_dx);
}

void rms_norm_forward_vectorized(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t cols,
                                 double eps, cudaStream_t stream, void* y_low, DType y_low_dtype) {
  check_supported("rms_norm", norm_rows_vectorized_supported(cols, x, w, y, nullptr, nullptr, y_low), cols);
  check_low("rms_norm", y_low, y_low_dtype);
  if (rows == 0) return;
  norm_fwd_vec_kernel<true><<<blocks_for(rows), 32 * kWarps, 0, stream>>>(x, w, nullptr, y, nullptr, rstd, rows, cols,
                                                                         static_cast<float>(eps), y_low, y_low_dtype);
  ATH_CUDA_LAUNCHED("norm_fwd_vec_kernel");
}

}  // namespace athanor::cuda
