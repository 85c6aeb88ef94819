#pragma once
// The cross-entropy kernels of kernels.h (cross_entropy_forward / cross_entropy_backward: the
// same arguments, formulas and outputs) reading and writing each row 16 bytes at a time (8
// bf16/f16 or 4 f32 logits a load): a candidate (Candidate::cross_entropy_vectorized,
// candidates.h). The established kernels read 2 bytes a load per thread: at GPT-2's [B*T, 50304]
// bf16 logits they ran at about a third of the memory bandwidth (bench/RESULTS.md).
//
// Invariants:
//  - the backward's arithmetic per element is the established kernel's: from the same row
//    statistics it writes the same bits (also in place: dlogits may be logits);
//  - the forward's row max is the same; the row's sum of exp is added in another order (each
//    thread takes whole vectors), so log-sum-exp and the loss differ in the last bits from the
//    established kernel's (the gpu tests bound it); NaN and -inf logits behave as there;
//  - only rows whose every start is 16-byte aligned: cross_entropy_vectorized_supported says
//    when (the caller falls back to the established kernels otherwise).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "athanor/core/dtype.h"

namespace athanor::cuda {

// logits (and dlogits, when not null) 16-byte aligned, dtype f32/bf16/f16, C a multiple of the
// vector width (16 bytes / element size), so every row starts aligned. Host logic only.
bool cross_entropy_vectorized_supported(const void* logits, DType dtype, int64_t C, const void* dlogits);

void cross_entropy_forward_vectorized(const void* logits, DType dtype, const int64_t* target, float* stats, float* loss,
                                      int64_t N, int64_t C, int64_t ignore_index, double label_smoothing,
                                      cudaStream_t stream);
void cross_entropy_backward_vectorized(const void* logits, DType dtype, const int64_t* target, const float* stats,
                                       const float* factor, int64_t factor_stride, void* dlogits, int64_t N, int64_t C,
                                       int64_t ignore_index, double label_smoothing, cudaStream_t stream);

}  // namespace athanor::cuda
