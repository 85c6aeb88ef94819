#pragma once
// Block-wide reductions in a fixed order (a butterfly in each warp, then warp 0 over the warps'
// partials): the same bits every run, no atomics. `shared` holds 32 values; every thread of the
// block must call, and every thread gets the result. T is the accumulation type (float or double).
#include <cuda_runtime.h>

#include <cmath>

namespace athanor::cuda {

// The block size of the one-block-per-row kernels (norms, softmax, cross-entropy).
inline constexpr int kRowThreads = 256;

__device__ __forceinline__ float max_of(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_of(double a, double b) { return fmax(a, b); }

template <class T>
__device__ __forceinline__ T block_sum(T v, T* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int nwarps = blockDim.x / 32;
  v = lane < nwarps ? shared[lane] : T(0);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// (max_of ignores a NaN operand, as fmaxf / fmax do.)
template <class T>
__device__ __forceinline__ T block_max(T v, T* shared) {
  for (int o = 16; o > 0; o >>= 1) v = max_of(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int nwarps = blockDim.x / 32;
  v = lane < nwarps ? shared[lane] : T(-INFINITY);
  for (int o = 16; o > 0; o >>= 1) v = max_of(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace athanor::cuda
