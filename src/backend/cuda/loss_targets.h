#pragma once
// cross_entropy's targets on the device, with no host sync: the class ids validated by a
// kernel (device_error.h reports an out-of-range id at the next read from the device), the
// count of the counted rows kept on the device, and the mean's division done there.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "athanor/core/dtype.h"
#include "backend/cuda/device_error.h"

namespace athanor::cuda {

// ids[n] = target[n] as i64 (target i32 or i64); weight[n] = 1 for a counted row, 0 for
// ignore_index. An id outside [0, C) other than ignore_index is recorded in `err` (the first
// one) and its row treated as ignored: ids[n] = ignore_index, weight 0, so no kernel reads
// past the logits.
void prepare_targets(const void* target, DType dtype, int64_t N, int64_t C, int64_t ignore_index, int64_t* ids,
                     float* weight, DeviceErrorRecord* err, cudaStream_t stream);
// out = sum (mean: sum (1 / count), NaN when count is 0), rounded once to f32.
void loss_reduce(const double* sum, const double* count, bool mean, float* out, cudaStream_t stream);
// factor = g (mean: g (1 / count)): the upstream gradient of a reduced loss per row.
void loss_grad_factor(const float* g, const double* count, bool mean, float* factor, cudaStream_t stream);
// The same for f64 logits: the loss and the factor in f64.
void loss_reduce(const double* sum, const double* count, bool mean, double* out, cudaStream_t stream);
void loss_grad_factor(const double* g, const double* count, bool mean, double* factor, cudaStream_t stream);

// The fused classifier (issue 22): cross_entropy's backward writes the [N, C] logits gradient
// over its saved logits when nothing else can see them (src/ops/cuda/loss.cpp), instead of
// allocating a second N x C buffer. On unless ATHANOR_CUDA_FUSED_CLASSIFIER=0 (the A/B switch;
// tests set it directly).
bool fused_classifier_enabled();
void set_fused_classifier(bool on);

}  // namespace athanor::cuda
