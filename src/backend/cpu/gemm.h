#pragma once
// Row-major GEMM: C = alpha * op(A) @ op(B) + beta * C, op = transpose when ta/tb.
// op(A) is M x K, op(B) is K x N; lda/ldb/ldc are row strides of the stored matrices.
// f32 goes to oneDNN (dnnl_sgemm: JIT AVX-512, unaffected by OPENBLAS_CORETYPE);
// f64 to OpenBLAS. bf16/f16 are converted to f32 here (the mixed-precision issue
// moves bf16 onto oneDNN's AVX512_BF16 matmul).
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

std::string gemm_backend_name();  // e.g. "oneDNN 2.6.3 (f32), OpenBLAS (f64)"
std::string cpu_isa_name();       // e.g. "AVX-512 + AVX512_BF16"

namespace ref {
// Naive triple loop, accumulating in double.
template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, double beta, T* C, int64_t ldc);
}  // namespace ref

}  // namespace athanor::cpu
