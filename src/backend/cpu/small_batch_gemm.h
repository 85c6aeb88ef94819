#pragma once
// f32 GEMMs of a small batch (64-256 rows) against a wide weight: the three GEMMs of a
// linear layer at batch 128 (the MLP's 784 -> 1024 -> 1024):
//   forward  y = x W^T   (NT, M = batch, K >= 512): "dot" tiles read W in place, rows
//            contiguous along K, no copy of the weight (oneDNN copies it into a blocked
//            layout per call, and ran at half speed when its rows were 4 KiB apart);
//   dx = g W             (NN, M = batch): "outer" tiles over a 256 x 64 panel of W
//            copied into L1-sized scratch, used by every row of the batch;
//   dW = g^T x           (TN, K = batch): the same outer tiles.
// Figures (against cpu::gemm's oneDNN path, and in the MLP's step) in small_batch_gemm.cpp.
//
// Semantics are those of cpu::gemm / cpu::gemm_bias (row-major, leading dimensions
// honoured): C = alpha op(A) op(B) + bias[j] + beta C; bias may be null; beta == 0 means
// C is not read (NaN there does not leak). Each element of C is summed by one thread in
// a fixed order, so results are the same run to run and for any number of threads.
#include <cstdint>

namespace athanor::cpu {

// Computes the GEMM and returns true when it is a shape this path handles (see
// small_batch_gemm_applies); otherwise returns false and touches nothing. relu: C =
// max(alpha op(A) op(B) + bias + beta C, 0), for linear_relu's forward; only the NT shapes
// take it (the others return false with relu set).
bool small_batch_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float beta, const float* bias, float* C, int64_t ldc,
                      bool relu = false);

// Whether small_batch_gemm would take this shape (independent of the switch below). False
// at the avx2 level (isa.h): the tiles are AVX-512 kernels.
bool small_batch_gemm_applies(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, bool relu = false);

// Process-wide switch (default on; ATHANOR_SMALL_BATCH_GEMM=0 starts it off): off makes
// small_batch_gemm return false, so cpu::gemm takes its oneDNN path (A/B timing, tests).
void set_small_batch_gemm_enabled(bool enabled);
bool small_batch_gemm_enabled();

}  // namespace athanor::cpu
