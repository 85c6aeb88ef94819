#pragma once
// The optimizers' step over CUDA parameters: the multi-tensor Adam/AdamW and SGD kernels of
// src/backend/cuda/kernels.h (the CPU's arithmetic, rounding for rounding), and the global
// gradient norm's sum of squares, on the parameters' own device and compute stream.
// Compiled in every build; without CUDA each function is an internal error (no tensor can
// live on a CUDA device in such a build).
#include <cstdint>
#include <vector>

#include "athanor/core/tensor.h"
#include "backend/cpu/optimizer_update.h"

namespace athanor::optim::detail {

struct AdamDeviceWork {
  float* w;
  const float* g;
  float *m, *v;
  int64_t n;
  cpu::AdamConsts k;
};
struct SgdDeviceWork {
  float* w;
  const float* g;
  float* b;  // momentum buffer, or null
  int64_t n;
  cpu::SgdConsts k;
};
// One launch per run of consecutive tensors with equal constants (one per parameter group
// and step count in practice). Asynchronous on the device's compute stream.
void adam_on_device(int device, const std::vector<AdamDeviceWork>& work);
void sgd_on_device(int device, const std::vector<SgdDeviceWork>& work);
// Σ g² over the f32 gradients (device pointers) in f64, in a fixed order; reads back the one
// double (the step's single host sync, for the norm the caller returns and logs).
double sum_squares_on_device(int device, const std::vector<const float*>& grads, const std::vector<int64_t>& sizes);
// g *= coef on the device, for each gradient (clip_grad_norm's scaling).
void scale_on_device(int device, const std::vector<float*>& grads, const std::vector<int64_t>& sizes, double coef);

}  // namespace athanor::optim::detail
