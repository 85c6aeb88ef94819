#include "backend/cpu/gemm.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <vector>

#include "athanor/core/convert.h"
#include "athanor/core/error.h"

namespace athanor::cpu {

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  ATH_CHECK(st == dnnl_success, "gemm", "oneDNN sgemm failed with status ", static_cast<int>(st), " for M=", M, " N=", N, " K=", K);
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

template <class T>
void gemm_lowp(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B,
               int64_t ldb, float beta, T* C, int64_t ldc) {
  const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  std::vector<float> a(ar * ac), b(br * bc), c(M * N);
  for (int64_t i = 0; i < ar; ++i)
    for (int64_t j = 0; j < ac; ++j) a[i * ac + j] = static_cast<float>(A[i * lda + j]);
  for (int64_t i = 0; i < br; ++i)
    for (int64_t j = 0; j < bc; ++j) b[i * bc + j] = static_cast<float>(B[i * ldb + j]);
  if (beta != 0.0f)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) c[i * N + j] = static_cast<float>(C[i * ldc + j]);
  gemm(ta, tb, M, N, K, alpha, a.data(), ac, b.data(), bc, beta, c.data(), N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = T(c[i * N + j]);
}
template void gemm_lowp<bfloat16>(bool, bool, int64_t, int64_t, int64_t, float, const bfloat16*, int64_t,
                                  const bfloat16*, int64_t, float, bfloat16*, int64_t);
template void gemm_lowp<float16>(bool, bool, int64_t, int64_t, int64_t, float, const float16*, int64_t,
                                 const float16*, int64_t, float, float16*, int64_t);

std::string gemm_backend_name() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         " (f32 sgemm, JIT " + std::string(v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other runtime") +
         "), OpenBLAS (f64)";
}

std::string cpu_isa_name() {
  std::string s;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) s = "AVX-512";
  else if (__builtin_cpu_supports("avx2")) s = "AVX2";
  else s = "SSE";
  if (__builtin_cpu_supports("avx512bf16")) s += " + AVX512_BF16";
  if (__builtin_cpu_supports("f16c")) s += " + F16C";
#if defined(__AVX512F__)
  s += " (kernels compiled for AVX-512)";
#elif defined(__AVX2__)
  s += " (kernels compiled for AVX2)";
#else
  s += " (kernels compiled for baseline x86-64)";
#endif
  return s;
}

namespace ref {
template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, double beta, T* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = cast_value<double>(ta ? A[k * lda + i] : A[i * lda + k]);
        const double b = cast_value<double>(tb ? B[j * ldb + k] : B[k * ldb + j]);
        acc += a * b;
      }
      const double prev = beta == 0.0 ? 0.0 : beta * cast_value<double>(C[i * ldc + j]);
      C[i * ldc + j] = cast_value<T>(alpha * acc + prev);
    }
}
template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, double, const float*, int64_t, const float*, int64_t,
                          double, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*,
                           int64_t, double, double*, int64_t);
template void gemm<bfloat16>(bool, bool, int64_t, int64_t, int64_t, double, const bfloat16*, int64_t, const bfloat16*,
                             int64_t, double, bfloat16*, int64_t);
template void gemm<float16>(bool, bool, int64_t, int64_t, int64_t, double, const float16*, int64_t, const float16*,
                            int64_t, double, float16*, int64_t);
}  // namespace ref

}  // namespace athanor::cpu
