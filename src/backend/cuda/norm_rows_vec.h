#pragma once
// Layer norm and RMSNorm over f32 rows, one warp per row with 16-byte loads and stores: the
// forward and the backward of kernels.h's layer_norm / rms_norm (the same arguments and
// formulas; the backward's dx, dw and db from one read of dy and x), a candidate
// (Candidate::norm_vectorized, candidates.h). The established kernels run a 256-thread block per
// row (GPT-2's 768 columns: 3 elements a thread, two block-wide reductions with their barriers
// per pass); here a warp holds a row and reduces with shuffles alone.
//
// Invariants:
//  - statistics in f32; a row's sums are taken in another order than the established kernels'
//    (each lane 4 consecutive columns at a time), so mean, rstd, y and dx may differ from theirs
//    in the last bits (the gpu tests bound it against them and the CPU); the same bits run to run;
//  - y_low (null: none) receives y rounded to bf16/f16 to nearest even, so y_low == cast(y) bit
//    for bit (autocast's offered cast, as kernels.h's layer_norm_forward);
//  - only where norm_rows_vectorized_supported says (the callers keep the established kernels
//    otherwise).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "athanor/core/dtype.h"

namespace athanor::cuda {

// cols a multiple of 4 and every given pointer 16-byte aligned (y_low: 8-byte), so each row
// starts aligned; null pointers are fine. Host logic only.
bool norm_rows_vectorized_supported(int64_t cols, const void* a, const void* b = nullptr, const void* c = nullptr,
                                    const void* d = nullptr, const void* e = nullptr, const void* y_low = nullptr);

void layer_norm_forward_vectorized(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                                   int64_t rows, int64_t cols, double eps, cudaStream_t stream, void* y_low = nullptr,
                                   DType y_low_dtype = DType::bf16);
// dx = rstd (dn - mean(dn) - xhat mean(dn xhat)), dn = dy w (RMSNorm: dx = rstd (dn - xhat
// mean(dn xhat)), xhat = x rstd; dx may be null) and, when dw / db are not null, the parameter gradients dw = Σ_rows dy xhat,
// db = Σ_rows dy from the same read of dy and x: each block sums its chunk of rows (its warps'
// partials added in warp order) into `workspace`, then the chunks are added in chunk order (a
// fixed order: the same bits run to run). cols at most kNormFusedMaxCols; workspace:
// norm_rows_workspace_bytes(rows, cols), 16-byte aligned. accumulate_dx as norm_kernels.h's.
inline constexpr int64_t kNormFusedMaxCols = 1024;
int64_t norm_rows_workspace_bytes(int64_t rows, int64_t cols);
void layer_norm_backward_vectorized(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                                    float* dx, float* dw, float* db, int64_t rows, int64_t cols, void* workspace,
                                    cudaStream_t stream, bool accumulate_dx = false);
void rms_norm_backward_vectorized(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                                  int64_t rows, int64_t cols, void* workspace, cudaStream_t stream,
                                  bool accumulate_dx = false);
void rms_norm_forward_vectorized(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t cols,
                                 double eps, cudaStream_t stream, void* y_low = nullptr, DType y_low_dtype = DType::bf16);

}  // namespace athanor::cuda
