#pragma once
// Row-major GEMM: C = alpha * op(A) @ op(B) + beta * C, op = transpose when ta/tb.
// op(A) is M x K, op(B) is K x N; lda/ldb/ldc are row strides of the stored matrices.
// f32 goes to oneDNN (dnnl_sgemm: JIT AVX-512, unaffected by OPENBLAS_CORETYPE);
// f64 to OpenBLAS. bf16 goes to oneDNN's matmul primitive (AVX512_BF16, f32
// accumulation; primitives cached by shape/transposition/dtype/alpha/beta; falls
// back to the f32 path where oneDNN has no bf16 matmul). f16 is converted to f32
// (exact semantics; f16 speed comes from GPUs).
#include <cstddef>
#include <cstdint>
#include <string>

#include "athanor/core/half.h"

namespace athanor::cpu {

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc);
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc);
template <class T>  // T = bfloat16 or float16; accumulates in f32
void gemm_lowp(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B,
               int64_t ldb, float beta, T* C, int64_t ldc);

// bf16 inputs, f32 output (accumulates in f32; beta scales the f32 C).
void gemm_bf16_f32out(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A, int64_t lda,
                      const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc);
size_t gemm_bf16_cached_primitives();  // number of oneDNN bf16 matmul primitives in the cache (tests)

std::string gemm_backend_name();  // e.g. "oneDNN 2.6.3 (f32), OpenBLAS (f64)"
std::string cpu_isa_name();       // e.g. "AVX-512 + AVX512_BF16"

namespace ref {
// Naive triple loop, accumulating in double.
template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, double beta, T* C, int64_t ldc);
}  // namespace ref

}  // namespace athanor::cpu
