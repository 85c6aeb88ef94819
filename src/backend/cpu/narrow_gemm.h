#pragma once
// f32 GEMMs with one narrow dimension (min(M, N, K) <= 16), e.g. a classifier head
// linear(1024 -> 10) at batch 128: its forward (NT, N = 10), dx (NN, K = 10) and dW
// (TN, M = 10). oneDNN runs these far below its peak, on two threads (it blocks for
// square-ish shapes); register-blocked AVX-512 kernels that keep the narrow dimension
// whole in registers run faster on one (figures in bench/RESULTS.md).
//
// Semantics are those of cpu::gemm / cpu::gemm_bias (row-major, leading dimensions
// honoured): C = alpha op(A) op(B) + bias[j] + beta C; bias may be null; beta == 0
// means C is not read (NaN there does not leak). Accumulation in f32; each element
// of C is summed by one thread in a fixed order, so results are the same run to run
// and for any number of OpenMP threads.
#include <cstdint>

namespace athanor::cpu {

// Computes the GEMM and returns true when it is a shape this path handles; otherwise
// returns false and touches nothing (the caller takes its usual path). Handled: f32,
// M*N*K >= kNarrowMinWork multiply-adds, alpha != 0, and one of
//   K <= 12 with tb = false, or K <= 8 with tb = true and M >= 4 (both up to 4M);
//   M <= 16 with tb = false;  NT (ta = false, tb = true) with min(M, N) <= 12, K >= 64
// (the kinds that beat oneDNN in a sweep; narrow_gemm.cpp, choose_path). At the avx2
// level (isa.h) it runs detail::narrow_gemm_portable on the same shapes.
bool narrow_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, const float* bias, float* C, int64_t ldc);

// Whether narrow_gemm would take this shape (independent of the enable switch below).
bool narrow_gemm_applies(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha);

// Process-wide switch (default on; the environment variable ATHANOR_NARROW_GEMM=0 starts
// it off): off makes narrow_gemm return false, so cpu::gemm takes its oneDNN path (A/B
// timing, tests comparing the two paths).
void set_narrow_gemm_enabled(bool enabled);
bool narrow_gemm_enabled();

inline constexpr int64_t kNarrowMaxDim = 16;
inline constexpr int64_t kNarrowMinWork = int64_t{64} * 1024;
// Multiply-adds per OpenMP thread: a GEMM runs on min(omp_get_max_threads(),
// work / this) threads. Waking the sleeping workers (the trainer's passive wait policy)
// takes about as long as a GEMM of linear 1024 -> 10's size (1.3M multiply-adds) on one
// thread, so those run on one; from a few million multiply-adds on the split pays
// (figures in bench/RESULTS.md).
//
inline constexpr int64_t kNarrowWorkPerThread = int64_t{2} * 1024 * 1024;

namespace detail {
// The portable kernel (what narrow_gemm runs at the avx2 level), callable at every level
// so that tests cover it: same semantics, any shape with K > 0.
void narrow_gemm_portable(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                          const float* B, int64_t ldb, float beta, const float* bias, float* C, int64_t ldc);
}  // namespace detail

}  // namespace athanor::cpu
