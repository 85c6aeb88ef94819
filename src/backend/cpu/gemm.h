#pragma once
// Row-major GEMM: C = alpha * op(A) @ op(B) + beta * C, op = transpose when ta/tb.
// op(A) is M x K, op(B) is K x N; lda/ldb/ldc are row strides of the stored matrices.
// f32 and bf16 go to oneDNN matmul primitives (JIT AVX-512 / AVX512_BF16, f32
// accumulation), cached by dtype/shape/transposition/strides/alpha/beta/bias, with
// their scratchpad in a per-thread buffer (no malloc, no page faults in warm
// steps); f32 GEMMs with one dimension <= 16 that beat oneDNN go to register-blocked
// AVX-512 kernels (narrow_gemm.h); f32 GEMMs under 16^3 multiply-adds go to dnnl_sgemm, bf16 where oneDNN has
// no bf16 matmul to the f32 path; a bf16 GEMM with many rows and a plain (not transposed)
// B, such as a weight gradient dW = dy^T x, packs B once into oneDNN's blocked layout
// first (gemm.cpp says why). f64 goes to OpenBLAS. f16 is converted to f32
// (exact semantics; f16 speed comes from GPUs). gemm.cpp says why, with the figures.
#include <cstddef>
#include <cstdint>
#include <string>

#include "athanor/core/half.h"

namespace athanor::cpu {

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc);
// A small f32 GEMM called from inside a parallel region (attention tiles): dnnl_sgemm
// directly. Per call its setup is an order of magnitude below a matmul primitive's
// (memory objects, argument map, stream wait), which dominated 64x64 tiles.
void gemm_tile(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc);
template <class T>  // T = bfloat16 or float16; accumulates in f32
void gemm_lowp(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B,
               int64_t ldb, float beta, T* C, int64_t ldc);

// bf16 inputs, f32 output (accumulates in f32; beta scales the f32 C).
void gemm_bf16_f32out(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A, int64_t lda,
                      const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc);
// C = op(A) @ op(B) + bias, bias [N] added to every row (null: no bias); C is written,
// not read. linear's forward: on a oneDNN primitive (f32, bf16) the bias is added in the
// GEMM's epilogue; otherwise C rows are set to the bias and the GEMM accumulates (beta = 1).
template <class T>  // T = float, double, bfloat16, float16
void gemm_bias(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
               const T* bias, T* C, int64_t ldc);

struct PackedLayout;  // weight_packing.h
// C[M, N] = A[M, K] B + bias (bias [N] on every row, or null), B [K, N] packed in layout
// `l` (weight_packing.h), T = float (f32 layout) or bfloat16 (bf16 layout); C is written,
// not read. Returns false, touching nothing, when oneDNN would not run this GEMM on
// exactly that layout: the caller then runs its plain-B GEMM.
template <class T>
bool gemm_packed(int64_t M, const T* A, int64_t lda, const PackedLayout& l, const T* B, const T* bias, T* C, int64_t ldc);
// Whether a GEMM A[M, K] op(B) with this shape should take a packed B: oneDNN reads the
// packed layout on this CPU (gemm_packed_supported), and the GEMM runs on its blocked
// kernels (not narrow_gemm or sgemm) with enough rows (M >= 256) to repay writing the
// packed copy once per optimizer step (figures in gemm.cpp).
bool gemm_prefers_packed_b(bool bf16, bool tb, int64_t M, int64_t N, int64_t K);
// Whether oneDNN's matmul takes B in the packed layout at all on this CPU (its ISA:
// AVX-512 for f32; AVX512_BF16 or AMX for bf16). Where it does not, gemm_packed returns false.
bool gemm_packed_supported(bool bf16);

// Number of cached oneDNN matmul primitives with bf16 (true) or f32 (false) inputs (tests).
size_t gemm_cached_primitives(bool bf16_inputs);
size_t gemm_bf16_cached_primitives();  // gemm_cached_primitives(true)

std::string gemm_backend_name();  // e.g. "oneDNN 2.6.3 (f32), OpenBLAS (f64)"

namespace ref {
// Naive triple loop, accumulating in double.
template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, double beta, T* C, int64_t ldc);
}  // namespace ref

}  // namespace athanor::cpu
