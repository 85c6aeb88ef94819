// The kernel of rope.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "athanor/core/error.h"
#include "backend/cuda/rope.h"
#include "backend/cuda/float_access.cuh"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {

// A: the math's type (float_access.cuh's load_as / store_as); f64 data uses the f64 table.
template <class A> __device__ __forceinline__ A cos_at(const RopeArgs& a, int64_t i);
template <> __device__ __forceinline__ float cos_at<float>(const RopeArgs& a, int64_t i) { return a.cos[i]; }
template <> __device__ __forceinline__ double cos_at<double>(const RopeArgs& a, int64_t i) { return a.cos64[i]; }
template <class A> __device__ __forceinline__ A sin_at(const RopeArgs& a, int64_t i);
template <> __device__ __forceinline__ float sin_at<float>(const RopeArgs& a, int64_t i) { return a.sin[i]; }
template <> __device__ __forceinline__ double sin_at<double>(const RopeArgs& a, int64_t i) { return a.sin64[i]; }

// One thread per pair (row, i < D/2); rows are (b, t, h) in row-major order.
template <class A>
__global__ void rope_kernel(const RopeArgs a, int64_t pairs) {
  const int64_t half = a.D / 2;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pairs; p += step) {
    const int64_t i = p % half, row = p / half;
    const int64_t h = row % a.H, t = (row / a.H) % a.T, b = row / (a.H * a.T);
    const int64_t base = b * a.sb + t * a.st + h * a.sh;
    const A x1 = load_as<A>(a.x, a.dtype, base + i * a.sd), x2 = load_as<A>(a.x, a.dtype, base + (i + half) * a.sd);
    const A c = cos_at<A>(a, t * half + i), s = a.sign > 0 ? sin_at<A>(a, t * half + i) : -sin_at<A>(a, t * half + i);
    store_as(a.out, a.dtype, row * a.D + i, x1 * c - x2 * s);
    store_as(a.out, a.dtype, row * a.D + i + half, x2 * c + x1 * s);
  }
}
}  // namespace

void rope_apply(const RopeArgs& a, cudaStream_t stream) {
  ATH_CHECK(a.dtype == DType::f32 || a.dtype == DType::bf16 || a.dtype == DType::f16 || a.dtype == DType::f64, "rope",
            "dtype ", dtype_name(a.dtype), " on cuda", Hint{"the CUDA rope takes f32, bf16, f16 and f64"});
  const bool f64 = a.dtype == DType::f64;
  ATH_CHECK(f64 ? (a.cos64 && a.sin64) : (a.cos && a.sin), "rope", "no ", f64 ? "f64" : "f32", " cos/sin table for ",
            dtype_name(a.dtype), " data", Hint{"this is a bug in athanor; please report it"});
  const int64_t pairs = a.B * a.T * a.H * (a.D / 2);
  if (pairs == 0) return;
  const int64_t blocks = (pairs + 255) / 256;
  const unsigned grid = static_cast<unsigned>(blocks < 65536 * 4 ? blocks : 65536 * 4);
  if (f64) rope_kernel<double><<<grid, 256, 0, stream>>>(a, pairs);
  else rope_kernel<float><<<grid, 256, 0, stream>>>(a, pairs);
  ATH_CUDA_LAUNCHED("rope_kernel");
}

}  // namespace athanor::cuda
