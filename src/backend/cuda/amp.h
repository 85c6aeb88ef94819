#pragma once
// GradScaler's device kernels (PyTorch's _amp_foreach_non_finite_check_and_unscale_ and
// _amp_update_scale_): the gradients unscaled and checked in one multi-tensor launch per
// group of tensors, and the scale updated on the device, so a step with f16 autocast issues
// no host synchronisation for its loss scale.
//
// Invariants:
//  - g = f32(g) * f32(1 / scale) rounded once into g's dtype (f32, bf16, f16), the CPU's
//    arithmetic (src/amp/grad_scaler.cpp); a non-finite result sets found_inf = 1 and the
//    tensor's own flag (plain stores of the same value: no atomics, any order gives the
//    same flags);
//  - the update is the CPU's: found_inf: scale = max(scale backoff, min), tracker = 0; else
//    ++tracker, and at growth_interval scale = min(scale growth, max), tracker = 0.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "athanor/core/dtype.h"

namespace athanor::cuda {

// For each tensor t < n_tensors: g[t][0..n[t]) *= 1 / *scale (scale f32 on the device; 1 when
// null), found_inf[0] = 1 and flags[t] = 1 (i32) where a result is not finite. found_inf and
// flags must be zeroed by the caller (they accumulate over calls).
void unscale_multi_tensor(void* const* g, const DType* dtypes, const int64_t* n, int n_tensors, const float* scale,
                          float* found_inf, int32_t* flags, cudaStream_t stream);

struct ScaleUpdate {
  double growth_factor = 2.0, backoff_factor = 0.5, min_scale = 0.0, max_scale = 0.0;
  int64_t growth_interval = 2000;
};
// scale (f32) and counters (f64 [2]: the growth tracker, the skipped steps) updated from
// found_inf (f32, 0 or 1), all on the device.
void update_scale(float* scale, double* counters, const float* found_inf, const ScaleUpdate& u, cudaStream_t stream);

// The trainer's skip decision on the device (the CPU's: src/train/trainer_step.cpp), one
// thread: norm = sqrt(*sumsq); skip = 1 when norm or *loss is not finite or *found_inf != 0
// (found_inf, loss may be null); grad_scale = the clip coefficient min(1, max_norm / (norm +
// 1e-6)) for max_norm > 0 and a finite norm (optim::clip_coefficient), else 1. Writes
// *skip (f32 0/1), out[0] = grad_scale, out[1] = norm, out[2] += skip (the skipped steps).
void step_guard(const double* sumsq, const float* found_inf, const float* loss, double max_norm, float* skip,
                double* out, cudaStream_t stream);

}  // namespace athanor::cuda
