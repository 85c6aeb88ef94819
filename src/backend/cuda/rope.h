#pragma once
// Rotary position embedding on the device (Hugging Face's rotate_half convention, the CPU's
// cpu/rope.h): for x [B, T, H, D] at any strides (in elements) and element i < D/2 of a row,
//   out[i] = x[i] cos - sign x[i + D/2] sin,   out[i + D/2] = x[i + D/2] cos + sign x[i] sin,
// with cos, sin [T, D/2] (f32, the CPU's table uploaded) and sign -1 for the backward (the
// inverse rotation). Math in f32, one rounding into out (contiguous, x's dtype: f32, bf16, f16);
// f64 x: math and table (cos64, sin64) in f64.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "athanor/core/dtype.h"

namespace athanor::cuda {

struct RopeArgs {
  const void* x = nullptr;
  DType dtype = DType::f32;
  int64_t B = 0, T = 0, H = 0, D = 0;
  int64_t sb = 0, st = 0, sh = 0, sd = 1;  // x's strides
  const float* cos = nullptr;
  const float* sin = nullptr;
  int sign = 1;
  void* out = nullptr;
  const double* cos64 = nullptr;  // f64 data: the table in f64 (the CPU's f64 table)
  const double* sin64 = nullptr;
};
void rope_apply(const RopeArgs& a, cudaStream_t stream);

}  // namespace athanor::cuda
