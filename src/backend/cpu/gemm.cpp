#include "backend/cpu/gemm.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <mutex>
#include <optional>
#include <tuple>
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

namespace {

// f16 (and the bf16 fallback): convert to f32, run the f32 GEMM, convert back.
template <class T, class TC>
void gemm_via_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B,
                  int64_t ldb, float beta, TC* C, int64_t ldc) {
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
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = TC(c[i * N + j]);
}

// bf16 x bf16 -> bf16/f32 through oneDNN's matmul primitive (AVX512_BF16 dot
// products, f32 accumulation). Transposes are expressed as strides of the
// memory descriptors (no copies); alpha is an output scale, beta a sum post-op.
// Primitives are cached by everything that defines them.
using MatmulKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float, bool>;

struct DnnlState {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mu;
  std::map<MatmulKey, std::optional<dnnl::matmul>> cache;  // nullopt: oneDNN has no bf16 matmul for this key
};
DnnlState& dnnl_state() {
  static DnnlState s;
  return s;
}

// Returns false when oneDNN has no bf16 matmul here (the caller then converts to f32).
template <class TC>
bool gemm_bf16_dnnl(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A, int64_t lda,
                    const bfloat16* B, int64_t ldb, float beta, TC* C, int64_t ldc) {
  using dt = dnnl::memory::data_type;
  constexpr bool out_f32 = std::is_same_v<TC, float>;
  DnnlState& st = dnnl_state();
  const dnnl::memory::desc a_md({M, K}, dt::bf16, ta ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1});
  const dnnl::memory::desc b_md({K, N}, dt::bf16, tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
  const dnnl::memory::desc c_md({M, N}, out_f32 ? dt::f32 : dt::bf16, dnnl::memory::dims{ldc, 1});
  dnnl::matmul prim;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    const MatmulKey key{ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, out_f32};
    auto it = st.cache.find(key);
    if (it == st.cache.end()) {
      try {
        dnnl::primitive_attr attr;
        if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
        if (beta != 0.0f) {
          dnnl::post_ops po;
          po.append_sum(beta);
          attr.set_post_ops(po);
        }
        const dnnl::matmul::desc d(a_md, b_md, c_md);
        const dnnl::matmul::primitive_desc pd(d, attr, st.engine);
        it = st.cache.emplace(key, dnnl::matmul(pd)).first;
      } catch (const dnnl::error&) {  // no implementation (old ISA, unsupported strides): the f32 path
        it = st.cache.emplace(key, std::nullopt).first;
      }
    }
    if (!it->second) return false;
    prim = *it->second;
  }
  thread_local dnnl::stream stream(dnnl_state().engine);
  dnnl::memory am(a_md, st.engine, const_cast<bfloat16*>(A)), bm(b_md, st.engine, const_cast<bfloat16*>(B)),
      cm(c_md, st.engine, C);
  prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  stream.wait();
  return true;
}

}  // namespace

template <class T>
void gemm_lowp(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B,
               int64_t ldb, float beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if constexpr (std::is_same_v<T, bfloat16>) {
    if (K > 0 && gemm_bf16_dnnl<bfloat16>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
  }
  gemm_via_f32<T, T>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
template void gemm_lowp<bfloat16>(bool, bool, int64_t, int64_t, int64_t, float, const bfloat16*, int64_t,
                                  const bfloat16*, int64_t, float, bfloat16*, int64_t);
template void gemm_lowp<float16>(bool, bool, int64_t, int64_t, int64_t, float, const float16*, int64_t,
                                 const float16*, int64_t, float, float16*, int64_t);

void gemm_bf16_f32out(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A, int64_t lda,
                      const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K > 0 && gemm_bf16_dnnl<float>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
  gemm_via_f32<bfloat16, float>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

size_t gemm_bf16_cached_primitives() {
  std::lock_guard<std::mutex> lock(dnnl_state().mu);
  return dnnl_state().cache.size();
}

std::string gemm_backend_name() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         " (f32 sgemm, bf16 matmul, JIT " + std::string(v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other runtime") +
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
