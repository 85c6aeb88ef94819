#pragma once
// Elementwise reads and writes of f32/bf16/f16 device buffers through f32, for the kernels that
// take any of the three dtypes at run time (the math is f32 inside, rounding to nearest even on
// the way out, as the CPU's casts do).
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

}  // namespace athanor::cuda
