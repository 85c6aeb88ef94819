#pragma once
// What pointwise.cu (the f32 kernels) and pointwise_f64.cu share: dropout's keep bit and the
// f64 kernel's launch.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/philox.cuh"
#include "backend/cuda/pointwise.h"

namespace athanor::cuda {

// Element i is kept iff word i % 4 of philox4x32(seed, offset + i / 4), shifted right by 8,
// is >= threshold: the CPU's stream (cpu/dropout.h), the same for every dtype.
__device__ __forceinline__ bool dropout_keeps(const PointwiseArgs& a, int64_t i) {
  const uint4 r = philox4x32_device(a.seed, a.offset + static_cast<uint64_t>(i / 4));
  const int k = static_cast<int>(i % 4);
  const uint32_t w = k == 0 ? r.x : k == 1 ? r.y : k == 2 ? r.z : r.w;
  return (w >> 8) >= a.threshold;
}

// The generic kernel with the math in double over the n elements of `a` (checked).
void launch_pointwise_f64(const PointwiseArgs& a, int64_t n, cudaStream_t stream);

}  // namespace athanor::cuda
