// The vectorized cross-entropy kernels of cross_entropy_vec.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "athanor/core/error.h"
#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/cross_entropy_vec.h"
#include "backend/cuda/float_access.cuh"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {

constexpr int kThreads = 256;

// 16 bytes of T as floats (element j of the vector is f[j]: the lower address first; a 32-bit
// word holds two 16-bit elements, the lower one in its low half) and back, rounding to nearest
// even as __float2bfloat16_rn / __float2half_rn do.
template <class T> struct Lanes;
template <> struct Lanes<float> {
  static constexpr int kN = 4;
  __device__ static void unpack(const uint4& u, float* f) {
    f[0] = __uint_as_float(u.x), f[1] = __uint_as_float(u.y), f[2] = __uint_as_float(u.z), f[3] = __uint_as_float(u.w);
  }
  __device__ static uint4 pack(const float* f) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
  }
};
// 16-bit lanes: 4 pairs (H2 = __nv_bfloat162 or __half2) a vector.
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 h) { return __bfloat1622float2(h); }
__device__ __forceinline__ float2 to_float2(__half2 h) { return __half22float2(h); }
template <class H2> __device__ __forceinline__ H2 pair_rn(float a, float b);
template <> __device__ __forceinline__ __nv_bfloat162 pair_rn<__nv_bfloat162>(float a, float b) {
  return __halves2bfloat162(__float2bfloat16_rn(a), __float2bfloat16_rn(b));
}
template <> __device__ __forceinline__ __half2 pair_rn<__half2>(float a, float b) {
  return __halves2half2(__float2half_rn(a), __float2half_rn(b));
}
template <class H2> struct Lanes16 {
  static constexpr int kN = 8;
  __device__ static void unpack(const uint4& u, float* f) {
    const H2* h = reinterpret_cast<const H2*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 p = to_float2(h[i]);
      f[2 * i] = p.x, f[2 * i + 1] = p.y;
    }
  }
  __device__ static uint4 pack(const float* f) {
    uint4 u;
    H2* h = reinterpret_cast<H2*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = pair_rn<H2>(f[2 * i], f[2 * i + 1]);
    return u;
  }
};
template <> struct Lanes<__nv_bfloat16> : Lanes16<__nv_bfloat162> {};
template <> struct Lanes<__half> : Lanes16<__half2> {};


// loss = logsum - (1 - eps)(x[t] - max) - eps mean_c(x[c] - max), one block per row.
template <class T>
__global__ void __launch_bounds__(kThreads) ce_fwd_vec_kernel(const T* logits, const int64_t* target, float* stats,
                                                              float* loss, int64_t C, int64_t ignore_index,
                                                              float smoothing) {
  using L = Lanes<T>;
  __shared__ float sh[32];
  const int64_t n = blockIdx.x;
  const int64_t t = target[n];
  if (t == ignore_index) {
    if (threadIdx.x == 0) stats[2 * n] = stats[2 * n + 1] = loss[n] = 0;
    return;
  }
  const T* xr = logits + n * C;
  const uint4* xv = reinterpret_cast<const uint4*>(xr);
  const int64_t nv = C / L::kN;
  // Each thread: its running max mt, the sum st of exp(v - mt) over its elements (rescaled once
  // per vector when the vector raises the max) and the plain sum sv (label smoothing's mean).
  // fmaxf ignores a NaN, so mt is never NaN; a NaN logit reaches st through expf (the loss is
  // NaN, as with the established kernel); a -inf logit adds nothing.
  float mt = -INFINITY, st = 0, sv = 0;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    float f[L::kN];
    L::unpack(xv[i], f);
    float vmax = f[0];
#pragma unroll
    for (int j = 1; j < L::kN; ++j) vmax = fmaxf(vmax, f[j]);
    const float m_new = fmaxf(mt, vmax);
    if (m_new != mt) st *= expf(mt - m_new);  // m_new > mt: 0 when mt is -inf (st is 0 then too)
    mt = m_new;
#pragma unroll
    for (int j = 0; j < L::kN; ++j) {
      if (f[j] != -INFINITY) st += expf(f[j] - mt);
      sv += f[j];
    }
  }
  const float m = block_max(mt, sh);
  // A thread whose max is still -inf saw no finite logit: its st is 0 (nothing, or only -inf)
  // or NaN (a NaN logit), which must reach the loss, so it adds st itself.
  const float logsum = logf(block_sum(mt == -INFINITY ? st : st * expf(mt - m), sh));
  const float mean_shifted = block_sum(sv, sh) / C - m;
  if (threadIdx.x == 0) {
    stats[2 * n] = m;
    stats[2 * n + 1] = logsum;
    // Without smoothing the mean is not used at all (a -inf logit makes it -inf; 0 * -inf is NaN).
    loss[n] = logsum - (1.0f - smoothing) * (widen(xr[t]) - m) - (smoothing != 0.0f ? smoothing * mean_shifted : 0.0f);
  }
}

// dlogits = factor (softmax - (1 - eps)[c == t] - eps / C): element by element the established
// kernel's arithmetic; every vector is read before it is written (in place is fine).
template <class T>
__global__ void __launch_bounds__(kThreads) ce_bwd_vec_kernel(const T* logits, const int64_t* target, const float* stats,
                                                              const float* factor, int64_t factor_stride, T* dlogits,
                                                              int64_t C, int64_t ignore_index, float smoothing) {
  using L = Lanes<T>;
  const int64_t n = blockIdx.x;
  const int64_t t = target[n];
  const int64_t nv = C / L::kN;
  const uint4* xv = reinterpret_cast<const uint4*>(logits + n * C);
  uint4* dv = reinterpret_cast<uint4*>(dlogits + n * C);
  if (t == ignore_index) {
    for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) dv[i] = make_uint4(0u, 0u, 0u, 0u);  // +0 in every dtype
    return;
  }
  const float m = stats[2 * n], logsum = stats[2 * n + 1];
  const float scale = factor[n * factor_stride];
  const float uniform = smoothing / C;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    float f[L::kN];
    L::unpack(xv[i], f);
#pragma unroll
    for (int j = 0; j < L::kN; ++j) {
      const int64_t c = i * L::kN + j;
      const float p = expf((f[j] - m) - logsum);
      f[j] = scale * (p - (c == t ? 1.0f - smoothing : 0.0f) - uniform);
    }
    dv[i] = L::pack(f);
  }
}

int vector_width(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::bf16:
    case DType::f16: return 8;
    default: return 0;
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool cross_entropy_vectorized_supported(const void* logits, DType dtype, int64_t C, const void* dlogits) {
  const int w = vector_width(dtype);
  return w > 0 && C > 0 && C % w == 0 && aligned16(logits) && (dlogits == nullptr || aligned16(dlogits));
}

namespace {
// f(T{}) with T the logits' C++ type (cross_entropy_vectorized_supported has excluded the rest).
template <class F> void with_logits_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: f(float{}); break;
    case DType::bf16: f(__nv_bfloat16{}); break;
    default: f(__half{}); break;
  }
}
}  // namespace

void cross_entropy_forward_vectorized(const void* logits, DType dtype, const int64_t* target, float* stats, float* loss,
                                      int64_t N, int64_t C, int64_t ignore_index, double label_smoothing,
                                      cudaStream_t stream) {
  ATH_CHECK(cross_entropy_vectorized_supported(logits, dtype, C, nullptr), "cross_entropy",
            "the vectorized kernel was given logits it does not take (", dtype_name(dtype), ", C = ", C, ")",
            Hint{"check cross_entropy_vectorized_supported first (an internal error)"});
  if (N == 0) return;
  with_logits_type(dtype, [&](auto t) {
    using T = decltype(t);
    ce_fwd_vec_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        static_cast<const T*>(logits), target, stats, loss, C, ignore_index, static_cast<float>(label_smoothing));
  });
  ATH_CUDA_LAUNCHED("ce_fwd_vec_kernel");
}

void cross_entropy_backward_vectorized(const void* logits, DType dtype, const int64_t* target, const float* stats,
                                       const float* factor, int64_t factor_stride, void* dlogits, int64_t N, int64_t C,
                                       int64_t ignore_index, double label_smoothing, cudaStream_t stream) {
  ATH_CHECK(cross_entropy_vectorized_supported(logits, dtype, C, dlogits), "cross_entropy backward",
            "the vectorized kernel was given logits it does not take (", dtype_name(dtype), ", C = ", C, ")",
            Hint{"check cross_entropy_vectorized_supported first (an internal error)"});
  if (N == 0) return;
  with_logits_type(dtype, [&](auto t) {
    using T = decltype(t);
    ce_bwd_vec_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        static_cast<const T*>(logits), target, stats, factor, factor_stride, static_cast<T*>(dlogits), C, ignore_index,
        static_cast<float>(label_smoothing));
  });
  ATH_CUDA_LAUNCHED("ce_bwd_vec_kernel");
}

}  // namespace athanor::cuda
