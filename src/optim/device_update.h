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
  double lr = 0;           // the group's (the step guard computes the bias corrections from it)
  double* step = nullptr;  // the step guard's step count of this parameter (f64, on the device)
  void* copy = nullptr;    // the weight's bf16/f16 copy written in the pass (device_copies_enabled), or null
};
struct SgdDeviceWork {
  float* w;
  const float* g;
  float* b;  // momentum buffer, or null
  int64_t n;
  cpu::SgdConsts k;
  double* step = nullptr;  // as in AdamDeviceWork
  void* copy = nullptr;    // as in AdamDeviceWork
};
// The step guard (Optimizer::set_device_guard): skip (f32, 1 = skip) and the gradient scale
// (f64) on the device, read by the kernels instead of the host's decision and constants.
struct DeviceStepGuard {
  const float* skip = nullptr;
  const double* grad_scale = nullptr;
};
// One launch per run of consecutive tensors with equal constants (one per parameter group
// and step count in practice). Asynchronous on the device's compute stream. With a guard,
// each work item's `step` must be set; the counts advance (unless skipped) after the update.
// Work items with a `copy` get it written in the same pass, in `copy_dtype` (bf16 or f16),
// rounded as the cast kernel rounds (backend/cuda/kernels.h: WeightCopies).
void adam_on_device(int device, const std::vector<AdamDeviceWork>& work, DType copy_dtype,
                    const DeviceStepGuard* guard = nullptr, double beta1 = 0, double beta2 = 0);
void sgd_on_device(int device, const std::vector<SgdDeviceWork>& work, DType copy_dtype,
                   const DeviceStepGuard* guard = nullptr);
// Whether the device update passes write the low-precision weight copies (the CUDA candidate
// lowp_copies, backend/cuda/candidates.h); false in a build without CUDA.
bool device_copies_enabled();
// copy = cast(p) on p's device (the copies' first fill, before any update pass writes them).
void narrow_on_device(const Tensor& p, const Tensor& copy);
// *steps[i] += 1 unless *skip (the optimizer's total count with the parameters').
void advance_steps_on_device(int device, const std::vector<double*>& steps, const float* skip);
// Σ g² as above, left on the device: a 1-element f64 tensor (no host read).
Tensor sum_squares_tensor_on_device(int device, const std::vector<const float*>& grads, const std::vector<int64_t>& sizes);
// The trainer's skip decision on the device (backend/cuda/amp.h: step_guard): from Σ g²
// (sum_squares_tensor_on_device), GradScaler's found_inf and the step's loss (f32, 1 element;
// either may be undefined) into skip (f32, 1 element) and out (f64 [3]: the clip coefficient
// to fold, the norm, the skipped-step count it adds to).
void step_guard_on_device(const Tensor& sumsq, const Tensor& found_inf, const Tensor& loss, double max_norm,
                          const Tensor& skip, const Tensor& out);
// Σ g² over the f32 gradients (device pointers) in f64, in a fixed order; reads back the one
// double (the step's single host sync, for the norm the caller returns and logs).
double sum_squares_on_device(int device, const std::vector<const float*>& grads, const std::vector<int64_t>& sizes);
// g *= coef on the device, for each gradient (clip_grad_norm's scaling).
void scale_on_device(int device, const std::vector<float*>& grads, const std::vector<int64_t>& sizes, double coef);

}  // namespace athanor::optim::detail
