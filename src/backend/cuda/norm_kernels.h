#pragma once
// LayerNorm and RMSNorm on the GPU (the twins of cpu/norm.h on device pointers), launched
// asynchronously on `stream`; nothing here synchronises.
//
// Invariants:
//  - statistics and accumulations in the data's type (f32, or f64 throughout for the f64
//    overloads), as on the CPU;
//  - every reduction has a fixed order (one block per row, a tree in shared memory of a fixed
//    shape; column sums over rows in a fixed two-pass order), so results are bit-identical run to
//    run, and no float atomics are used.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "athanor/core/dtype.h"

namespace athanor::cuda {

// LayerNorm over rows of [rows, cols] in f32 or f64 (statistics and math in the same type):
// y = (x - mean) rstd w + b; w, b may be null. f32 only: y_low (null: none) receives y rounded
// to y_low_dtype (bf16 or f16) in the same pass, by the cast kernel's rounding (to nearest even,
// __float2bfloat16_rn / __float2half_rn), so y_low == cast(y) bit for bit (autocast's offered
// cast; Candidate::lowp_copies).
void layer_norm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                        int64_t rows, int64_t cols, double eps, cudaStream_t stream, void* y_low = nullptr,
                        DType y_low_dtype = DType::bf16);
void layer_norm_forward(const double* x, const double* w, const double* b, double* y, double* mean, double* rstd,
                        int64_t rows, int64_t cols, double eps, cudaStream_t stream);
// dx, dw, db may each be null; dw/db are column sums over the rows in a fixed order (chunks of
// rows, then the chunks in order), through `workspace`: norm_backward_workspace_bytes(rows, cols,
// dtype) bytes of device memory, 16-byte aligned (needed when dw or db is asked for).
// accumulate_dx: dx holds a gradient already (the residual stream's sum waiting at x,
// Node::take_pending_grad) and receives dx + its own gradient, added once in the storage type
// (never fused into a multiply-add), so the result is bit for bit the sum autograd would form.
int64_t norm_backward_workspace_bytes(int64_t rows, int64_t cols, DType dtype = DType::f32);
void layer_norm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                         float* dx, float* dw, float* db, int64_t rows, int64_t cols, void* workspace, cudaStream_t stream,
                         bool accumulate_dx = false);
void layer_norm_backward(const double* dy, const double* x, const double* w, const double* mean, const double* rstd,
                         double* dx, double* dw, double* db, int64_t rows, int64_t cols, void* workspace, cudaStream_t stream,
                         bool accumulate_dx = false);
// RMSNorm: y = x rstd w, rstd = 1 / sqrt(mean(x^2) + eps); f32 or f64, y_low as layer_norm's.
void rms_norm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t cols, double eps,
                      cudaStream_t stream, void* y_low = nullptr, DType y_low_dtype = DType::bf16);
void rms_norm_forward(const double* x, const double* w, double* y, double* rstd, int64_t rows, int64_t cols, double eps,
                      cudaStream_t stream);
void rms_norm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                       int64_t rows, int64_t cols, void* workspace, cudaStream_t stream, bool accumulate_dx = false);
void rms_norm_backward(const double* dy, const double* x, const double* w, const double* rstd, double* dx, double* dw,
                       int64_t rows, int64_t cols, void* workspace, cudaStream_t stream, bool accumulate_dx = false);

}  // namespace athanor::cuda
