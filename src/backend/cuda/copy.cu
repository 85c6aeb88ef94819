// The kernels of copy.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/candidates.h"
#include "backend/cuda/copy.h"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {
constexpr int kThreads = 256;
unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// Element i (row-major over the sizes) at its dst and src offsets.
__device__ void offsets(const StridedLayout& l, int64_t i, int64_t& d, int64_t& s) {
  d = 0, s = 0;
  for (int k = l.ndim - 1; k >= 0; --k) {
    const int64_t c = i % l.sizes[k];
    i /= l.sizes[k];
    d += c * l.dst_strides[k];
    s += c * l.src_strides[k];
  }
}

template <class T> __device__ float widen(T v);
template <> __device__ float widen<float>(float v) { return v; }
template <> __device__ float widen<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ float widen<__half>(__half v) { return __half2float(v); }
template <class T> __device__ T narrow(float v);
template <> __device__ float narrow<float>(float v) { return v; }
template <> __device__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __half narrow<__half>(float v) { return __float2half_rn(v); }

// Same dtype: the bits, moved as an integer of the element's width.
template <class W>
__global__ void copy_bits_kernel(W* dst, const W* src, StridedLayout l, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  int64_t d, s;
  offsets(l, i, d, s);
  dst[d] = src[s];
}
template <class D, class S>
__global__ void convert_kernel(D* dst, const S* src, StridedLayout l, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  int64_t d, s;
  offsets(l, i, d, s);
  dst[d] = narrow<D>(widen<S>(src[s]));
}
template <class W>
__global__ void fill_kernel(W* dst, W v, StridedLayout l, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  int64_t d, s;
  offsets(l, i, d, s);
  dst[d] = v;
}
template <class T, class Acc>
__global__ void add_kernel(T* acc, const T* g, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) acc[i] = static_cast<T>(static_cast<Acc>(acc[i]) + static_cast<Acc>(g[i]));
}
template <class T>
__global__ void add_lowp_kernel(T* acc, const T* g, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) acc[i] = narrow<T>(widen<T>(acc[i]) + widen<T>(g[i]));
}

// Candidate pointwise_vectorized (candidates.h): the adds above 16 bytes a load where both
// buffers are 16-byte aligned (the gradient accumulation of a residual stream: one of the
// largest passes of a transformer's backward), element by element the same arithmetic; the
// last n mod (16 / sizeof(T)) elements one at a time.
template <class T> __device__ __forceinline__ T add_one(T a, T b) { return narrow<T>(widen<T>(a) + widen<T>(b)); }
template <> __device__ __forceinline__ float add_one<float>(float a, float b) { return a + b; }
template <> __device__ __forceinline__ double add_one<double>(double a, double b) { return a + b; }
template <class T>
__global__ void add_vec_kernel(T* acc, const T* g, int64_t n) {
  constexpr int kV = 16 / sizeof(T);
  const int64_t nv = n / kV, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t v = first; v < nv; v += step) {
    uint4 a = reinterpret_cast<const uint4*>(acc)[v];
    const uint4 b = reinterpret_cast<const uint4*>(g)[v];
    T* ae = reinterpret_cast<T*>(&a);
    const T* be = reinterpret_cast<const T*>(&b);
#pragma unroll
    for (int j = 0; j < kV; ++j) ae[j] = add_one<T>(ae[j], be[j]);
    reinterpret_cast<uint4*>(acc)[v] = a;
  }
  for (int64_t i = nv * kV + first; i < n; i += step) acc[i] = add_one<T>(acc[i], g[i]);
}
template <class T>
void launch_add_vec(void* acc, const void* g, int64_t n, cudaStream_t st) {
  const int64_t threads_wanted = std::max<int64_t>(n / static_cast<int64_t>(16 / sizeof(T)), 1);
  const int64_t blocks = std::min<int64_t>((threads_wanted + kThreads - 1) / kThreads, 8192);  // grid-stride beyond
  add_vec_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, st>>>(static_cast<T*>(acc), static_cast<const T*>(g), n);
}
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool is_float3(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }

template <class S>
void convert_from(void* dst, DType to, const S* src, const StridedLayout& l, int64_t n, cudaStream_t st) {
  switch (to) {
    case DType::f32: convert_kernel<<<blocks_for(n), kThreads, 0, st>>>(static_cast<float*>(dst), src, l, n); break;
    case DType::bf16: convert_kernel<<<blocks_for(n), kThreads, 0, st>>>(static_cast<__nv_bfloat16*>(dst), src, l, n); break;
    case DType::f16: convert_kernel<<<blocks_for(n), kThreads, 0, st>>>(static_cast<__half*>(dst), src, l, n); break;
    default: break;
  }
}
}  // namespace

bool can_copy(DType from, DType to) { return from == to || (is_float3(from) && is_float3(to)); }

void copy_strided(void* dst, DType dst_dtype, const void* src, DType src_dtype, const StridedLayout& l, int64_t n,
                  cudaStream_t st) {
  if (n == 0) return;
  if (dst_dtype == src_dtype) {
    switch (dtype_size(dst_dtype)) {
      case 1: copy_bits_kernel<<<blocks_for(n), kThreads, 0, st>>>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), l, n); break;
      case 2: copy_bits_kernel<<<blocks_for(n), kThreads, 0, st>>>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), l, n); break;
      case 4: copy_bits_kernel<<<blocks_for(n), kThreads, 0, st>>>(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src), l, n); break;
      default: copy_bits_kernel<<<blocks_for(n), kThreads, 0, st>>>(static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(src), l, n); break;
    }
  } else if (src_dtype == DType::f32) {
    convert_from(dst, dst_dtype, static_cast<const float*>(src), l, n, st);
  } else if (src_dtype == DType::bf16) {
    convert_from(dst, dst_dtype, static_cast<const __nv_bfloat16*>(src), l, n, st);
  } else {
    convert_from(dst, dst_dtype, static_cast<const __half*>(src), l, n, st);
  }
  ATH_CUDA_LAUNCHED("copy_strided");
}

void fill_pattern(void* dst, int elem_bytes, uint64_t pattern, const StridedLayout& l, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  switch (elem_bytes) {
    case 1: fill_kernel<<<blocks_for(n), kThreads, 0, st>>>(static_cast<uint8_t*>(dst), static_cast<uint8_t>(pattern), l, n); break;
    case 2: fill_kernel<<<blocks_for(n), kThreads, 0, st>>>(static_cast<uint16_t*>(dst), static_cast<uint16_t>(pattern), l, n); break;
    case 4: fill_kernel<<<blocks_for(n), kThreads, 0, st>>>(static_cast<uint32_t*>(dst), static_cast<uint32_t>(pattern), l, n); break;
    default: fill_kernel<<<blocks_for(n), kThreads, 0, st>>>(static_cast<uint64_t*>(dst), pattern, l, n); break;
  }
  ATH_CUDA_LAUNCHED("fill_pattern");
}

void add_inplace(void* acc, const void* g, DType dtype, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  if (candidate_enabled(Candidate::pointwise_vectorized) && aligned16(acc) && aligned16(g)) {
    switch (dtype) {
      case DType::f32: launch_add_vec<float>(acc, g, n, st); break;
      case DType::f64: launch_add_vec<double>(acc, g, n, st); break;
      case DType::bf16: launch_add_vec<__nv_bfloat16>(acc, g, n, st); break;
      case DType::f16: launch_add_vec<__half>(acc, g, n, st); break;
      default: break;
    }
    ATH_CUDA_LAUNCHED("add_vec_kernel");
    return;
  }
  switch (dtype) {
    case DType::f32: add_kernel<float, float><<<blocks_for(n), kThreads, 0, st>>>(static_cast<float*>(acc), static_cast<const float*>(g), n); break;
    case DType::f64: add_kernel<double, double><<<blocks_for(n), kThreads, 0, st>>>(static_cast<double*>(acc), static_cast<const double*>(g), n); break;
    case DType::bf16: add_lowp_kernel<<<blocks_for(n), kThreads, 0, st>>>(static_cast<__nv_bfloat16*>(acc), static_cast<const __nv_bfloat16*>(g), n); break;
    case DType::f16: add_lowp_kernel<<<blocks_for(n), kThreads, 0, st>>>(static_cast<__half*>(acc), static_cast<const __half*>(g), n); break;
    default: break;
  }
  ATH_CUDA_LAUNCHED("add_inplace");
}

}  // namespace athanor::cuda
