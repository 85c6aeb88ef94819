#pragma once
// Elementwise reads and writes of f32/bf16/f16 device buffers through f32, for the kernels that
// take any of the three dtypes at run time (the math is f32 inside, rounding to nearest even on
// the way out, as the CPU's casts do); and of f64/f32/bf16/f16 buffers through f64 for the
// kernels whose math is f64.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "athanor/core/dtype.h"

namespace athanor::cuda {

__device__ __forceinline__ float load_as_f32(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::f16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store_from_f32(void* p, DType dt, int64_t i, float v) {
  switch (dt) {
    case DType::bf16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    case DType::f16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

__device__ __forceinline__ double load_as_f64(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::bf16: return static_cast<double>(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
    case DType::f16: return static_cast<double>(__half2float(static_cast<const __half*>(p)[i]));
    default: return static_cast<double>(static_cast<const float*>(p)[i]);
  }
}

// To 16 bits through f32 (round to nearest even twice), as the CPU's cast_value
// (core/convert.h) rounds f64 to bf16/f16: not __double2bfloat16, which rounds once.
__device__ __forceinline__ void store_from_f64(void* p, DType dt, int64_t i, double v) {
  switch (dt) {
    case DType::f64: static_cast<double*>(p)[i] = v; break;
    case DType::bf16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(__double2float_rn(v)); break;
    case DType::f16: static_cast<__half*>(p)[i] = __float2half_rn(__double2float_rn(v)); break;
    default: static_cast<float*>(p)[i] = __double2float_rn(v); break;
  }
}

// A value of a typed buffer in its math type: f32 for f32, bf16 and f16 (exact), f64 for f64.
__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
__device__ __forceinline__ double widen(double v) { return v; }

// The 16-bit copy of an f32 value written beside it (a norm's offered cast, an updated weight's
// copy): rounded to nearest even by the same intrinsics as the cast kernel (copy.cu's narrow),
// so it is cast(value) bit for bit.
__device__ __forceinline__ void store_lowp(void* p, bool bf16, int64_t i, float v) {
  if (bf16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else static_cast<__half*>(p)[i] = __float2half_rn(v);
}

// Through the math's type A of a kernel templated on it: float for f32, bf16 and f16 data, double
// for f64 data.
template <class A> __device__ __forceinline__ A load_as(const void* p, DType dt, int64_t i);
template <> __device__ __forceinline__ float load_as<float>(const void* p, DType dt, int64_t i) { return load_as_f32(p, dt, i); }
template <> __device__ __forceinline__ double load_as<double>(const void* p, DType dt, int64_t i) {
  return load_as_f64(p, dt, i);
}
__device__ __forceinline__ void store_as(void* p, DType dt, int64_t i, float v) { store_from_f32(p, dt, i, v); }
__device__ __forceinline__ void store_as(void* p, DType dt, int64_t i, double v) { store_from_f64(p, dt, i, v); }

}  // namespace athanor::cuda
