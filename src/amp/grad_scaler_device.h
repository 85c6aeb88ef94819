#pragma once
// GradScaler's device half (src/backend/cuda/amp.h through tensors): compiled to real calls
// in a CUDA build; in a CPU-only build no CUDA tensor can exist and these are never reached
// (they throw, naming themselves, if they were). Not public API.
#include <vector>

#include "athanor/amp/grad_scaler.h"
#include "athanor/core/tensor.h"

namespace athanor::detail {

// Every tensor in `grads` (CUDA, one device) unscaled in place by 1 / scale (scale: a 0-d f32
// device tensor, or undefined for 1) in one multi-tensor pass; `found_inf` (0-d f32) and
// `flags` (i32 [grads.size()]) zeroed by the caller, set where a result is not finite.
void unscale_on_device(const std::vector<Tensor>& grads, const Tensor& scale, const Tensor& found_inf, const Tensor& flags);
// scale (0-d f32) and counters (f64 [2]: growth tracker, skipped steps) updated on the device.
void update_scale_on_device(const Tensor& scale, const Tensor& counters, const Tensor& found_inf, const GradScalerOptions& o);

}  // namespace athanor::detail
