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

// One thread per pair (row, i < D/2); rows are (b, t, h) in row-major order.
__global__ void rope_kernel(const RopeArgs a, int64_t pairs) {
  const int64_t half = a.D / 2;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pairs; p += step) {
    const int64_t i = p % half, row = p / half;
    const int64_t h = row % a.H, t = (row / a.H) % a.T, b = row / (a.H * a.T);
    const int64_t base = b * a.sb + t * a.st + h * a.sh;
    const float x1 = load_as_f32(a.x, a.dtype, base + i * a.sd), x2 = load_as_f32(a.x, a.dtype, base + (i + half) * a.sd);
    const float c = a.cos[t * half + i], s = a.sign > 0 ? a.sin[t * half + i] : -a.sin[t * half + i];
    store_from_f32(a.out, a.dtype, row * a.D + i, x1 * c - x2 * s);
    store_from_f32(a.out, a.dtype, row * a.D + i + half, x2 * c + x1 * s);
  }
}
}  // namespace

void rope_apply(const RopeArgs& a, cudaStream_t stream) {
  ATH_CHECK(a.dtype == DType::f32 || a.dtype == DType::bf16 || a.dtype == DType::f16, "rope",
            "dtype ", dtype_name(a.dtype), " on cuda", Hint{"the CUDA rope takes f32, bf16 and f16"});
  const int64_t pairs = a.B * a.T * a.H * (a.D / 2);
  if (pairs == 0) return;
  const int64_t blocks = (pairs + 255) / 256;
  rope_kernel<<<static_cast<unsigned>(blocks < 65536 * 4 ? blocks : 65536 * 4), 256, 0, stream>>>(a, pairs);
  ATH_CUDA_LAUNCHED("rope_kernel");
}

}  // namespace athanor::cuda
