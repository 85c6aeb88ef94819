#pragma once
// The "bcast" register tile of the f32 GEMMs that keep a tile of C in registers over the
// whole reduction (narrow_gemm's M <= 16 path, small_batch_gemm's NN / TN "outer" tiles):
// RM rows x JB vectors of 16 columns of C, each step loading JB vectors of a row of op(B)
// and broadcasting RM values of op(A). Row-major, leading dimensions honoured; C = alpha
// op(A) op(B) + bias[j] + beta C (bias may be null; beta == 0: C is not read), summed over
// k = 0..K-1 in order. For the per-level kernel files (isa_kernel.h): the tile is
// defined in athanor::cpu::<level>, at the avx512 levels.
#include <cstdint>

#include "backend/cpu/isa_kernel.h"

namespace athanor::cpu {

// Everything a tile needs besides its position. op(A)(i, k) = A[i * a_rs + k * a_ks];
// op(B)(k, j) = B[k * ldb + j] (narrow_gemm's kstat tile reads it the same way).
struct TileOperands {
  int64_t K;
  float alpha, beta;
  const float* A;
  int64_t a_rs, a_ks;
  const float* B;
  int64_t ldb;
  const float* bias;
  float* C;
  int64_t ldc;
};

}  // namespace athanor::cpu

ATHANOR_ISA_BEGIN
#if ATHANOR_CPU_AVX512

// The epilogue's scalars, copied out of TileOperands: stores to C are float stores, which
// may alias TileOperands' float fields as far as the compiler knows, so reading them through
// the struct reloads them after every store.
struct TileEpilogue {
  float alpha, beta;
  const float* bias;
};

// acc (op(A) op(B), unscaled) -> C[0..15] under mask m: alpha acc + bias + beta C.
inline void store_tile_result(const TileEpilogue& e, __m512 acc, const float* bias, float* c, __mmask16 m) {
  __m512 out = e.alpha == 1.0f ? acc : _mm512_mul_ps(_mm512_set1_ps(e.alpha), acc);
  if (bias) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(m, bias));
  if (e.beta != 0.0f) out = _mm512_fmadd_ps(_mm512_set1_ps(e.beta), _mm512_maskz_loadu_ps(m, c), out);
  _mm512_mask_storeu_ps(c, m, out);
}

// C[i0 .. i0+RM, j0 .. j0+16*JB) (the last vector under `last`).
template <int RM, int JB> inline void bcast_tile(const TileOperands& o, int64_t i0, int64_t j0, __mmask16 last) {
  __m512 acc[RM][JB];
#pragma GCC unroll 12
  for (int r = 0; r < RM; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < JB; ++v) acc[r][v] = _mm512_setzero_ps();
  // Locals, and every loop over the tile unrolled: the accumulators must live in
  // registers (GCC otherwise keeps the array on the stack and stores it every step).
  const int64_t K = o.K, a_rs = o.a_rs, a_ks = o.a_ks, ldb = o.ldb, ldc = o.ldc;
  const TileEpilogue e{o.alpha, o.beta, o.bias};
  float* const C = o.C;
  const float* a = o.A + i0 * a_rs;
  const float* b = o.B + j0;
  for (int64_t k = 0; k < K; ++k) {
    __m512 bv[JB];
#pragma GCC unroll 8
    for (int v = 0; v < JB; ++v)
      bv[v] = v == JB - 1 ? _mm512_maskz_loadu_ps(last, b + k * ldb + 16 * v) : _mm512_loadu_ps(b + k * ldb + 16 * v);
#pragma GCC unroll 12
    for (int r = 0; r < RM; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * a_rs + k * a_ks]);
#pragma GCC unroll 8
      for (int v = 0; v < JB; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < RM; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < JB; ++v)
      store_tile_result(e, acc[r][v], e.bias ? e.bias + j0 + 16 * v : nullptr, C + (i0 + r) * ldc + j0 + 16 * v,
                   v == JB - 1 ? last : __mmask16(0xffff));
}

#endif  // ATHANOR_CPU_AVX512
ATHANOR_ISA_END
