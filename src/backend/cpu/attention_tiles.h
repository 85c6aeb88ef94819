#pragma once
// The tile products of the flash-attention kernels (attention.cpp): f32 tiles on AVX-512
// FMA micro-kernels, bf16 tiles on bf16-pair dot products with their packing (AVX512_BF16's
// vdpbf16ps, or the same sums in two f32 FMAs at the avx512 level), the online softmax's
// row passes, and the strided-slice helpers. Internal to attention.cpp; defined in
// athanor::cpu::<level>::attention_tiles (isa_kernel.h).

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "athanor/core/convert.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/vec_math.h"

ATHANOR_ISA_BEGIN
namespace attention_tiles {

constexpr int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }  // keeps per-thread slices 64-byte aligned

// exp for f32 that vectorizes under `omp simd`: exp(x) = 2^n exp(r), n = round(x / ln 2),
// |r| <= ln2 / 2, exp(r) by its degree-7 Taylor polynomial (truncation < 1e-8 relative,
// ~1 ulp overall). x <= -87 (incl. -inf) gives 0; NaN stays NaN. Only used for x <= 0.
inline float exp_f32(float x) {
  const float xc = x < -87.0f ? -87.0f : x;
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  const float r = (xc - n * 0.693145751953125f) - n * 1.42860682030941723212e-6f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return x < -87.0f ? 0.0f : p * scale;
}
inline float exp_c(float x) { return exp_f32(x); }
inline double exp_c(double x) { return std::exp(x); }

// Which parts of a tile product C = op(A) op(B) a causal tile needs. Row i of C (rows in
// 4-row blocks [m0, m1)) needs only columns n < m1 + cols (scores S and dP: key n visible to
// query row m when n <= m + cols), only k < m1 + khi (P V and dS K: P and dS are zero past the
// diagonal), or only k >= m0 - klo (P^T dO and dS^T Q, whose rows are keys). A product may
// compute more than it needs: limits only skip work whose results are never read (score
// columns past a row's visible keys) or are exact zeros (products with masked P or dS).
struct Causal {
  static constexpr int64_t kAll = int64_t{1} << 40;
  int64_t cols = kAll, khi = kAll, klo = kAll;
};
constexpr int64_t kRowBlock = 4;  // rows per micro-kernel call, the granularity of the limits
struct BlockRange {
  int64_t k0, k1, n1;  // k in [k0, k1), columns [0, n1)
};
inline BlockRange block_range(const Causal& lim, int64_t m0, int64_t m1, int64_t K, int64_t N) {
  return {std::clamp<int64_t>(m0 - lim.klo, 0, K), std::clamp<int64_t>(m1 + lim.khi, 0, K),
          std::clamp<int64_t>(m1 + lim.cols, 0, N)};
}

#if ATHANOR_CPU_AVX512
// r[i] holds 16 32-bit words of row i; afterwards r[c] holds column c (word c of every row).
inline void transpose16x16_words(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4 i + c], 128-bit lane l: column 4 l + c of rows 4 i .. 4 i + 3
    r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  __m512i out[16];
  for (int c = 0; c < 4; ++c) {  // gather lane l of r[c], r[4 + c], r[8 + c], r[12 + c]: column 4 l + c
    const __m512i ab_lo = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44), ab_hi = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xEE);
    const __m512i cd_lo = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44),
                  cd_hi = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xEE);
    out[c] = _mm512_shuffle_i32x4(ab_lo, cd_lo, 0x88);
    out[4 + c] = _mm512_shuffle_i32x4(ab_lo, cd_lo, 0xDD);
    out[8 + c] = _mm512_shuffle_i32x4(ab_hi, cd_hi, 0x88);
    out[12 + c] = _mm512_shuffle_i32x4(ab_hi, cd_hi, 0xDD);
  }
  for (int c = 0; c < 16; ++c) r[c] = out[c];
}

// dst[k * N16 + n] = word k of row n, for n < N16 (rows past N zero) and k < K, where word k of
// row n is the 32 bits at src + n * ld + k * step (E units: a float, or a pair of bf16).
// 16 x 16 blocks through registers.
template <class E>
void transpose_words(const E* src, int64_t ld, int64_t step, int64_t N, int64_t K, int64_t N16, uint32_t* dst) {
  for (int64_t n0 = 0; n0 < N16; n0 += 16)
    for (int64_t k0 = 0; k0 < K; k0 += 16) {
      const __mmask16 m = vec::tail_mask(K - k0);
      __m512i r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = n0 + i < N ? _mm512_maskz_loadu_epi32(m, src + (n0 + i) * ld + k0 * step) : _mm512_setzero_si512();
      transpose16x16_words(r);
      for (int c = 0; c < 16 && k0 + c < K; ++c) _mm512_storeu_si512(dst + (k0 + c) * N16 + n0, r[c]);
    }
}

// ---- f32 tiles on AVX-512 FMA: the flash kernels' 64 x 64 products without a library call.
// C(m, n) = alpha sum_k A(m, k) B(k, n) + (accumulate ? C : 0) for n < 16 NR (the last vector
// masked by nlast); A(m, k) at A[m * am + k * ak] (a transposed A is just other strides),
// B(k, n) at B[k * ldb + n].
namespace f32t {
template <int MR, int NR>
void micro(int64_t K, float alpha, const float* __restrict A, int64_t am, int64_t ak, const float* __restrict B,
           int64_t ldb, __mmask16 nlast, bool accumulate, float* C, int64_t ldc) {
  // __restrict: A and B are float*, which GCC otherwise assumes may alias the accumulators
  // (__m512 is a may_alias type), storing all of them to the stack on every k.
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512 b[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      b[j] = _mm512_maskz_loadu_ps(j == NR - 1 ? nlast : __mmask16(0xffff), B + k * ldb + 16 * j);
      // Pins b[j] in a register: otherwise GCC folds the load into each of the MR FMAs that
      // use it (MR loads instead of one), which makes the loop load-bound (measured ~1.5x).
      asm("" : "+v"(b[j]));
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(A[i * am + k * ak]);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(a, b[j], acc[i][j]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      float* c = C + i * ldc + 16 * j;
      __m512 r = _mm512_mul_ps(acc[i][j], va);
      if (j < NR - 1) {
        if (accumulate) r = _mm512_add_ps(r, _mm512_loadu_ps(c));
        _mm512_storeu_ps(c, r);
      } else {
        if (accumulate) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(nlast, c));
        _mm512_mask_storeu_ps(c, nlast, r);
      }
    }
}
using MicroFn = void (*)(int64_t, float, const float*, int64_t, int64_t, const float*, int64_t, __mmask16, bool, float*,
                         int64_t);
template <int MR> constexpr std::array<MicroFn, 4> row_of = {micro<MR, 1>, micro<MR, 2>, micro<MR, 3>, micro<MR, 4>};
// Up to 4 rows x 64 columns: 16 accumulators (with 6 rows GCC spills some of the 24 to the stack).
constexpr int kMR = 4;
constexpr std::array<std::array<MicroFn, 4>, kMR> kMicro = {row_of<1>, row_of<2>, row_of<3>, row_of<4>};
constexpr int64_t kMaxPacked = 64 * 64;  // floats of B^T packed on the stack; larger tiles go to gemm_tile

// The tile product of mm() below for beta 0 or 1; false when it does not apply (then gemm_tile).
// Row blocks get the ranges of `lim` (see Causal): beta 0 blocks with an empty k range are
// zeroed, beta 1 blocks left as they are.
inline bool mm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
        int64_t ldb, float beta, float* C, int64_t ldc, const Causal& lim) {
  const int64_t N16 = (N + 15) / 16 * 16;
  if ((beta != 0.0f && beta != 1.0f) || (tb && K * N16 > kMaxPacked)) return false;
  alignas(64) float packed[kMaxPacked];  // 16 KiB of stack, written only for tb
  if (tb) {  // B(k, n) = B[n * ldb + k]: transpose into packed[k * N16 + n]
    transpose_words(B, ldb, 1, N, K, N16, reinterpret_cast<uint32_t*>(packed));
    B = packed, ldb = N16;
  }
  const int64_t am = ta ? 1 : lda, ak = ta ? lda : 1;
  static_assert(kMR == kRowBlock);
  for (int64_t m0 = 0; m0 < M; m0 += kMR) {
    const int64_t mr = std::min<int64_t>(kMR, M - m0);
    const BlockRange r = block_range(lim, m0, m0 + mr, K, N);
    if (r.k0 >= r.k1) {
      if (beta == 0.0f)
        for (int64_t i = m0; i < m0 + mr; ++i) std::fill(C + i * ldc, C + i * ldc + r.n1, 0.0f);
      continue;
    }
    for (int64_t n0 = 0; n0 < r.n1; n0 += 64) {
      const int64_t nr = std::min<int64_t>(4, (r.n1 - n0 + 15) / 16);
      const __mmask16 nlast = vec::tail_mask(r.n1 - n0 - 16 * (nr - 1));
      kMicro[mr - 1][nr - 1](r.k1 - r.k0, alpha, A + m0 * am + r.k0 * ak, am, ak, B + r.k0 * ldb + n0, ldb, nlast,
                             beta != 0.0f, C + m0 * ldc + n0, ldc);
    }
  }
  return true;
}

// ---- Score-shaped products with a fused epilogue: C = A B for the rows of a tile, each 4-row
// block kept in registers and handed row by row to an epilogue (softmax, exp, dS), so the
// scores are never stored and re-read between passes (separate row passes over S cost the f32
// kernels ~1/3 of their time outside the products). B is a packed operand whose rows are
// padded to a multiple of 16 (K^T, V^T).
// The block's rows: epi(i, acc, nr) with acc[0, nr) the row's 16-column vectors (nr a
// std::integral_constant, 0 when the block needs no column). B rows must be readable for 16 nr
// columns (padded).
template <int MR, int NR, class Epi>
inline void product_rows(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, int64_t m0, Epi& epi) {
  // The block goes through a 1-KiB buffer in L1 rather than straight from the accumulators: with
  // the epilogue inlined beside the k loop, its constants (exp's polynomial) push the
  // accumulators out of the 32 registers (measured 2x slower).
  alignas(64) float blk[MR * 64];
  kMicro[MR - 1][NR - 1](K, 1.0f, A, lda, 1, B, ldb, __mmask16(0xffff), false, blk, 64);
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    __m512 row[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) row[j] = _mm512_load_ps(blk + i * 64 + 16 * j);
    epi(m0 + i, row, std::integral_constant<int, NR>{});
  }
}
template <int MR, class Epi>
inline void product_rows(int nr, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, int64_t m0,
                         Epi& epi) {
  switch (nr) {
    case 0:
      for (int i = 0; i < MR; ++i) epi(m0 + i, static_cast<const __m512*>(nullptr), std::integral_constant<int, 0>{});
      return;
    case 1: return product_rows<MR, 1>(K, A, lda, B, ldb, m0, epi);
    case 2: return product_rows<MR, 2>(K, A, lda, B, ldb, m0, epi);
    case 3: return product_rows<MR, 3>(K, A, lda, B, ldb, m0, epi);
    default: return product_rows<MR, 4>(K, A, lda, B, ldb, m0, epi);
  }
}
// Rows [0, M) of A[M, K] B[K, N <= 64]; row block [m0, m1) computes the vectors covering
// columns n < m1 + diag (the causal limit of Causal::cols; Causal::kAll: all N).
template <class Epi>
inline void product_rows_tile(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                              int64_t ldb, int64_t diag, Epi&& epi) {
  for (int64_t m0 = 0; m0 < M; m0 += kMR) {
    const int64_t mr = std::min<int64_t>(kMR, M - m0);
    const int nr = static_cast<int>((block_range(Causal{.cols = diag}, m0, m0 + mr, K, N).n1 + 15) / 16);
    const float* a = A + m0 * lda;
    switch (mr) {
      case 1: product_rows<1>(nr, K, a, lda, B, ldb, m0, epi); break;
      case 2: product_rows<2>(nr, K, a, lda, B, ldb, m0, epi); break;
      case 3: product_rows<3>(nr, K, a, lda, B, ldb, m0, epi); break;
      default: product_rows<4>(nr, K, a, lda, B, ldb, m0, epi); break;
    }
  }
}
inline __mmask16 live_mask(int64_t nv, int j) { return 16 * j < nv ? vec::tail_mask(nv - 16 * j) : __mmask16(0); }
// Row r of a fused product: vectors [0, NR) from v (lanes outside live_mask(nv, j) zero), zeros
// after them up to n: every row of P and dS is defined on the whole tile width, which the
// key-row products read (see Causal).
template <int NR, class F> inline void store_row(float* row, int64_t n, F&& vec_j) {
#pragma GCC unroll 4
  for (int j = 0; j < NR; ++j) _mm512_storeu_ps(row + 16 * j, vec_j(j));
  if (16 * NR < n) std::fill(row + 16 * NR, row + n, 0.0f);
}

// The forward's score tile and online softmax in one pass, for key tiles of up to 64 keys: P =
// the tile's probabilities under the updated running max m and sum l of each row, corr the
// factor by which each row's accumulated output must be rescaled (1: none). Query row r of the
// tile sees keys c <= r + diag (Causal::kAll: all), Q rows at A, K^T packed at B.
inline void scores_softmax_tile(int64_t br, int64_t bc, int64_t D, float scale, const float* A, int64_t lda,
                                const float* B, int64_t ldb, int64_t diag, float* P, int64_t ldp, float* m, float* l,
                                float* corr) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const __m512 vscale = _mm512_set1_ps(scale);
  product_rows_tile(br, bc, D, A, lda, B, ldb, diag, [&](int64_t r, const __m512* acc, auto nr_c) {
    constexpr int NR = decltype(nr_c)::value;
    const int64_t nv = std::clamp<int64_t>(r + diag + 1, 0, bc);
    __m512 x[NR > 0 ? NR : 1];
    __m512 mx = _mm512_set1_ps(kNegInf);
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      x[j] = _mm512_mul_ps(acc[j], vscale);
      mx = _mm512_mask_max_ps(mx, live_mask(nv, j), mx, x[j]);
    }
    const float mnew = std::max(m[r], _mm512_reduce_max_ps(mx));
    const __m512 vm = _mm512_set1_ps(mnew);
    __m512 sum = _mm512_setzero_ps();
    store_row<NR>(P + r * ldp, bc, [&](int j) {  // masked lanes 0 (also when mnew = -inf: nothing visible yet)
      const __m512 p = _mm512_maskz_mov_ps(live_mask(nv, j), vec::exp(_mm512_sub_ps(x[j], vm)));
      sum = _mm512_add_ps(sum, p);
      return p;
    });
    if (mnew == kNegInf) {
      corr[r] = 1.0f;
      return;
    }
    corr[r] = m[r] == kNegInf ? 1.0f : exp_f32(m[r] - mnew);  // m = -inf: nothing accumulated
    l[r] = l[r] * corr[r] + _mm512_reduce_add_ps(sum);
    m[r] = mnew;
  });
}

// The backward's recomputed probabilities: P = exp(scale Q K^T - lse) (0 where masked).
inline void probs_tile(int64_t br, int64_t bc, int64_t D, float scale, const float* A, int64_t lda, const float* B,
                       int64_t ldb, int64_t diag, const float* lse, float* P, int64_t ldp) {
  const __m512 vscale = _mm512_set1_ps(scale);
  product_rows_tile(br, bc, D, A, lda, B, ldb, diag, [&](int64_t r, const __m512* acc, auto nr_c) {
    constexpr int NR = decltype(nr_c)::value;
    const int64_t nv = std::clamp<int64_t>(r + diag + 1, 0, bc);
    const __m512 shift = _mm512_set1_ps(lse[r]);
    store_row<NR>(P + r * ldp, bc, [&](int j) {
      return _mm512_maskz_mov_ps(live_mask(nv, j), vec::exp(_mm512_fmsub_ps(acc[j], vscale, shift)));
    });
  });
}

// The backward's dS = P * (dO V^T - Delta) (0 where masked), dO rows at A, V^T packed at B.
inline void dscores_tile(int64_t br, int64_t bc, int64_t Dv, const float* A, int64_t lda, const float* B, int64_t ldb,
                         int64_t diag, const float* delta, const float* P, int64_t ldp, float* dS, int64_t ldds) {
  product_rows_tile(br, bc, Dv, A, lda, B, ldb, diag, [&](int64_t r, const __m512* acc, auto nr_c) {
    constexpr int NR = decltype(nr_c)::value;
    const int64_t nv = std::clamp<int64_t>(r + diag + 1, 0, bc);
    const __m512 del = _mm512_set1_ps(delta[r]);
    store_row<NR>(dS + r * ldds, bc, [&](int j) {
      const __mmask16 live = live_mask(nv, j);
      return _mm512_maskz_mul_ps(live, _mm512_maskz_loadu_ps(live, P + r * ldp + 16 * j), _mm512_sub_ps(acc[j], del));
    });
  });
}
}  // namespace f32t
#endif

// Tile products C = alpha op(A) op(B) + beta C, with the causal limits of `lim` (work outside
// them may be skipped). f32: the AVX-512 micro-kernels above (measured faster than a oneDNN
// sgemm call per 64 x 64 tile), else the oneDNN sgemm (single-threaded inside our parallel
// region, limits ignored); f64 (gradchecks, small) uses a plain loop over the same row blocks
// and limits as the f32 kernels, rather than calling the pthread OpenBLAS from several
// OpenMP threads at once.
inline void mm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* Cm, int64_t ldc, const Causal& lim = {}) {
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) Cm[i * ldc + j] = beta == 0.0f ? 0.0f : beta * Cm[i * ldc + j];
    return;
  }
#if ATHANOR_CPU_AVX512
  if (f32t::mm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cm, ldc, lim)) return;
#endif
  gemm_tile(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cm, ldc);
}
inline void mm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
               const double* B, int64_t ldb, double beta, double* Cm, int64_t ldc, const Causal& lim = {}) {
  for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
    const int64_t m1 = std::min(M, m0 + kRowBlock);
    const BlockRange r = block_range(lim, m0, m1, K, N);
    for (int64_t i = m0; i < m1; ++i)
      for (int64_t j = 0; j < r.n1; ++j) {
        double acc = 0;
        for (int64_t k = r.k0; k < r.k1; ++k)
          acc += (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
        Cm[i * ldc + j] = alpha * acc + (beta == 0.0 ? 0.0 : beta * Cm[i * ldc + j]);
      }
  }
}

// B operand for S = Q K^T from key rows: dst[c * N16 + n] = src[n * ld + c] for n < N (zero up
// to N16, a multiple of 16) and c < K, so the score products read K^T row-major.
inline void pack_transposed(const float* src, int64_t ld, int64_t N, int64_t K, int64_t N16, float* dst) {
#if ATHANOR_CPU_AVX512
  transpose_words(src, ld, 1, N, K, N16, reinterpret_cast<uint32_t*>(dst));
#else
  for (int64_t c = 0; c < K; ++c)
    for (int64_t n = 0; n < N16; ++n) dst[c * N16 + n] = n < N ? src[n * ld + c] : 0.0f;
#endif
}
inline void pack_transposed(const double* src, int64_t ld, int64_t N, int64_t K, int64_t N16, double* dst) {
  for (int64_t c = 0; c < K; ++c)
    for (int64_t n = 0; n < N16; ++n) dst[c * N16 + n] = n < N ? src[n * ld + c] : 0.0;
}

// The first n elements of src in the compute type C: src itself when T == C, else converted into buf.
// rows x cols elements, row r at p + r * ld.
template <class C> struct Rows {
  const C* p;
  int64_t ld;
};
// The rows of src (row stride ld) in the compute type C: src itself when T == C, else
// converted into buf (dense, ld = cols).
template <class C, class T> inline Rows<C> load_rows(const T* src, int64_t ld, int64_t rows, int64_t cols, C* buf) {
  if constexpr (std::is_same_v<T, C>) {
    return {src, ld};
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) buf[r * cols + c] = static_cast<C>(static_cast<float>(src[r * ld + c]));
    return {buf, cols};
  }
}
// The rows of src as a dense rows x cols copy in buf, converted to C: tile products read their B
// operand row by row, and rows a packed-qkv stride (3 H D floats) apart alias in the L1 cache
// (the products run measurably slower on them than on dense rows).
template <class C, class T> inline Rows<C> dense_rows(const T* src, int64_t ld, int64_t rows, int64_t cols, C* buf) {
  if constexpr (std::is_same_v<T, C>) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(buf + r * cols, src + r * ld, cols * sizeof(C));
    return {buf, cols};
  } else {
    return load_rows<C>(src, ld, rows, cols, buf);
  }
}
// Dense rows x cols src into dst with row stride ld, converted to T.
template <class T, class C> inline void store_rows(const C* src, int64_t rows, int64_t cols, T* dst, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    if constexpr (std::is_same_v<T, C>) {
      std::memcpy(dst + r * ld, src + r * cols, cols * sizeof(C));
    } else {
      for (int64_t c = 0; c < cols; ++c) dst[r * ld + c] = cast_value<T>(src[r * cols + c]);
    }
  }
}

// Offset of slice bh = b H + h of an operand with strides st.
inline int64_t slice_at(const AttentionStrides& st, int64_t bh, int64_t H) { return bh / H * st.b + bh % H * st.h; }
// Offset of the k (v) slice that query slice bh reads (grouped-query attention: AttentionDims::Hkv).
inline int64_t kv_at(const AttentionStrides& st, const AttentionDims& d, int64_t bh) {
  return slice_at(st, d.kv_slice(bh), d.kv_heads());
}

// Asks the cache for rows [0, rows) of cols elements at p (row stride ld) ahead of their use
// (for writing when `write`). Operands come from strided rows 3 H D floats apart that the
// hardware prefetchers do not follow well: measured, one (b, h) slice in cache ran at ~124
// GFLOP/s and 32 slices from memory at ~95 per thread.
template <int locality = 3, class T>
inline void prefetch_rows(const T* p, int64_t ld, int64_t rows, int64_t cols, bool write = false) {
  const int64_t bytes = cols * static_cast<int64_t>(sizeof(T));
  for (int64_t r = 0; r < rows; ++r) {
    const char* row = reinterpret_cast<const char*>(p + r * ld);
    for (int64_t b = 0; b < bytes; b += 64) {
      if (write)
        __builtin_prefetch(row + b, 1, locality);
      else
        __builtin_prefetch(row + b, 0, locality);
    }
  }
}

// Threads only pay off with more than one task and enough multiply-adds (~256k is ~50
// microseconds); tiny calls (gradchecks, decoding) stay on the calling thread.
inline bool parallel_worth(int64_t tasks, int64_t macs) { return tasks > 1 && macs > (int64_t{1} << 18); }

// Number of keys of tile [j0, j0 + bc) that query row i may see.
inline int64_t visible(bool causal, int64_t i, int64_t j0, int64_t bc) {
  return causal ? std::clamp<int64_t>(i - j0 + 1, 0, bc) : bc;
}

// The online softmax's row passes: the max of s[0, n); s[c] := exp(s[c] - shift) for c < nv and
// 0 for nv <= c < n, returning the sum of the new s; a[0, n) *= mul. Scalar for f64 (and f32
// at the avx2 level); f32 on 16 lanes with masked tails and vec::exp (<= 2 ulp) below.
template <class C> inline C row_max(const C* s, int64_t n) {
  C mx = -std::numeric_limits<C>::infinity();
  for (int64_t c = 0; c < n; ++c) mx = std::max(mx, s[c]);
  return mx;
}
template <class C> inline C row_exp(C* s, int64_t nv, int64_t n, C shift) {
  C sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < nv; ++c) {
    const C p = exp_c(s[c] - shift);
    s[c] = p;
    sum += p;
  }
  std::fill(s + std::max<int64_t>(nv, 0), s + n, C(0));
  return sum;
}
template <class C> inline void row_scale(C* a, int64_t n, C mul) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) a[c] *= mul;
}
#if ATHANOR_CPU_AVX512
inline float row_max(const float* s, int64_t n) {
  __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 m = vec::tail_mask(n - c);
    mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, s + c));
  }
  return _mm512_reduce_max_ps(mx);
}
// s[c] := exp(s[c] - shift) for c < nv and 0 for nv <= c < n; returns the sum of the new s.
inline float row_exp(float* s, int64_t nv, int64_t n, float shift) {
  const __m512 vs = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 store = vec::tail_mask(n - c), live = c < nv ? vec::tail_mask(nv - c) : __mmask16(0);
    const __m512 p = _mm512_maskz_mov_ps(live, vec::exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, s + c), vs)));
    sum = _mm512_add_ps(sum, p);
    _mm512_mask_storeu_ps(s + c, store, p);
  }
  return _mm512_reduce_add_ps(sum);
}
inline void row_scale(float* a, int64_t n, float mul) {
  const __m512 vm = _mm512_set1_ps(mul);
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 m = vec::tail_mask(n - c);
    _mm512_mask_storeu_ps(a + c, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + c), vm));
  }
}
#endif

// One row of the forward's online softmax over a key tile: s[0, nv) holds the row's visible
// scores (s[nv, n) is masked and may hold anything). Updates the running max m and sum l,
// writes s := exp(s - m) (0 where masked) and returns the factor by which what the row
// accumulated so far must be rescaled (1: nothing to do).
template <class C> inline C softmax_row(C* s, int64_t nv, int64_t n, C& m, C& l) {
  const C mnew = std::max(m, row_max(s, nv));
  if (mnew == -std::numeric_limits<C>::infinity()) {  // nothing visible yet in this row
    std::fill(s, s + n, C(0));
    return C(1);
  }
  // Nothing accumulated yet (m = -inf): no rescale (the accumulators are 0).
  const C corr = m == -std::numeric_limits<C>::infinity() ? C(1) : exp_c(m - mnew);
  l = l * corr + row_exp(s, nv, n, mnew);
  m = mnew;
  return corr;
}
#if ATHANOR_CPU_AVX512
// Rows of up to 64 keys (the default tiles) in registers: one load and one store per score
// instead of the three passes of row_max, row_exp (whose per-row overhead was a large part
// of the f32 forward's time outside the tile products).
inline float softmax_row(float* s, int64_t nv, int64_t n, float& m, float& l) {
  if (n > 64) return softmax_row<float>(s, nv, n, m, l);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  __m512 x[4];
  __mmask16 live[4];
  __m512 mx = _mm512_set1_ps(kNegInf);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    live[j] = 16 * j < nv ? vec::tail_mask(nv - 16 * j) : __mmask16(0);
    x[j] = _mm512_maskz_loadu_ps(live[j], s + 16 * j);
    mx = _mm512_mask_max_ps(mx, live[j], mx, x[j]);
  }
  const float mnew = std::max(m, _mm512_reduce_max_ps(mx));
  const __m512 vs = _mm512_set1_ps(mnew);
  __m512 sum = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    if (16 * j >= n) break;
    // Masked lanes: 0 (also when mnew = -inf, where nothing is visible and exp would see NaN).
    const __m512 p = _mm512_maskz_mov_ps(live[j], vec::exp(_mm512_sub_ps(x[j], vs)));
    sum = _mm512_add_ps(sum, p);
    _mm512_mask_storeu_ps(s + 16 * j, vec::tail_mask(n - 16 * j), p);
  }
  if (mnew == kNegInf) return 1.0f;
  const float corr = m == kNegInf ? 1.0f : exp_f32(m - mnew);
  l = l * corr + _mm512_reduce_add_ps(sum);
  m = mnew;
  return corr;
}
#endif

#if ATHANOR_CPU_AVX512
// ---- bf16 tiles: the products of the flash kernels on bf16-pair dot products ----------------
// vdpbf16ps multiplies bf16 pairs and accumulates in f32: C[m, n] += A[m, 2k] B[2k, n] +
// A[m, 2k+1] B[2k+1, n]; without AVX512_BF16, dpbf16 below makes the same sums. A is read row-major with pairs along K (rows of K padded to even
// length); B is packed "VNNI": Bp[k2][n][e] = B(2 k2 + e, n), n padded to a multiple of 16.
// Softmax and every accumulator stay f32; only the operands of the products are bf16
// (P and dS are rounded to bf16 before their products, as in FlashAttention's bf16 kernels).
namespace bf16t {
constexpr int64_t up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
using vec::tail_mask;

// acc + a.hi b.hi + a.lo b.lo in each 32-bit lane of bf16 pairs: vdpbf16ps, or at the avx512
// level two FMAs in the instruction's order (odd element first). A product of two bf16 is
// exact in f32, so each step rounds once either way: the results agree bit for bit, but
// for subnormals, which the instruction flushes to zero and the FMAs keep.
inline __m512 dpbf16(__m512 acc, __m512i a, __m512i b) {
#if ATHANOR_CPU_AVX512BF16
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
#else
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(a, hi)), _mm512_castsi512_ps(_mm512_and_si512(b, hi)), acc);
  return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(a, 16)), _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)),
                         acc);
#endif
}

// A's pair (m, k2), i.e. A[m][2 k2], A[m][2 k2 + 1], is the 32-bit word at A + m lda + k2 lda2
// (bf16 units): lda2 = 2 for a row-major A; lda = 2, lda2 = 2 M16 for an A stored in pair
// layout (as pack_rows / pairs_from write it), which is how the transposed operands P^T
// and dS^T of the backward are built without a transpose.
template <int MR, int NR>
void micro(int64_t K2, float alpha, const bfloat16* A, int64_t lda, int64_t lda2, const bfloat16* Bp, int64_t ldb16,
           bool accumulate, float* C, int64_t ldc) {
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k2 = 0; k2 < K2; ++k2) {
    __m512i b[NR];
    for (int j = 0; j < NR; ++j) b[j] = _mm512_loadu_si512(Bp + (k2 * ldb16 + 16 * j) * 2);
    for (int i = 0; i < MR; ++i) {
      int32_t pair;
      std::memcpy(&pair, A + i * lda + k2 * lda2, sizeof pair);
      const __m512i a = _mm512_set1_epi32(pair);
      for (int j = 0; j < NR; ++j) acc[i][j] = dpbf16(acc[i][j], a, b[j]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      float* c = C + i * ldc + 16 * j;
      __m512 r = _mm512_mul_ps(acc[i][j], va);
      if (accumulate) r = _mm512_add_ps(r, _mm512_loadu_ps(c));
      _mm512_storeu_ps(c, r);
    }
}

using MicroFn = void (*)(int64_t, float, const bfloat16*, int64_t, int64_t, const bfloat16*, int64_t, bool, float*,
                         int64_t);
template <int MR> constexpr std::array<MicroFn, 4> row_of = {micro<MR, 1>, micro<MR, 2>, micro<MR, 3>, micro<MR, 4>};
constexpr std::array<std::array<MicroFn, 4>, 4> kMicro = {row_of<1>, row_of<2>, row_of<3>, row_of<4>};

// C[M, N16] = alpha A[M, 2 K2] B + (accumulate ? C : 0), N16 a multiple of 16 (C has that many
// columns). A addressed as in micro (lda2 = 2: row-major).
inline void mm(int64_t M, int64_t N16, int64_t K2, float alpha, const bfloat16* A, int64_t lda, int64_t lda2,
        const bfloat16* Bp, bool accumulate, float* C, int64_t ldc) {
  for (int64_t m0 = 0; m0 < M; m0 += 4) {
    const int64_t mr = std::min<int64_t>(4, M - m0);
    for (int64_t n0 = 0; n0 < N16; n0 += 64) {
      const int64_t nr = std::min<int64_t>(4, (N16 - n0) / 16);
      kMicro[mr - 1][nr - 1](K2, alpha, A + m0 * lda, lda, lda2, Bp + n0 * 2, N16, accumulate, C + m0 * ldc + n0,
                             ldc);
    }
  }
}
inline void mm(int64_t M, int64_t N16, int64_t K2, float alpha, const bfloat16* A, int64_t lda, const bfloat16* Bp,
        bool accumulate, float* C, int64_t ldc) {
  mm(M, N16, K2, alpha, A, lda, 2, Bp, accumulate, C, ldc);
}

// Word indices that interleave two vectors of 16-bit elements: (a0 b0 a1 b1 ...) from a's and
// b's first 16 (kLo) or last 16 (kHi) elements, for _mm512_permutex2var_epi16(a, idx, b).
inline __m512i interleave_idx(int first) {
  alignas(64) int16_t idx[32];
  for (int i = 0; i < 16; ++i) idx[2 * i] = static_cast<int16_t>(first + i), idx[2 * i + 1] = static_cast<int16_t>(32 + first + i);
  return _mm512_load_si512(idx);
}

// Bp for B(k, n) = src[k * ld + n] (K along src's rows), k < K, n < N; zero padding up to N16
// (a multiple of 16). Interleaves pairs of rows, 32 columns at a time.
inline void pack_rows(const bfloat16* src, int64_t ld, int64_t K, int64_t N, int64_t N16, bfloat16* Bp) {
  const __m512i lo = interleave_idx(0), hi = interleave_idx(16);
  for (int64_t k2 = 0; k2 < up(K, 2) / 2; ++k2) {
    const bfloat16* r0 = src + 2 * k2 * ld;
    const bfloat16* r1 = 2 * k2 + 1 < K ? r0 + ld : nullptr;
    bfloat16* dst = Bp + k2 * N16 * 2;
    for (int64_t n0 = 0; n0 < N16; n0 += 32) {
      const int64_t left = N - n0;
      const __mmask32 m = left >= 32 ? ~__mmask32(0) : left <= 0 ? __mmask32(0) : (__mmask32(1) << left) - 1;
      const __m512i a = _mm512_maskz_loadu_epi16(m, r0 + n0);
      const __m512i b = r1 ? _mm512_maskz_loadu_epi16(m, r1 + n0) : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + 2 * n0, _mm512_permutex2var_epi16(a, lo, b));
      if (n0 + 16 < N16) _mm512_storeu_si512(dst + 2 * n0 + 32, _mm512_permutex2var_epi16(a, hi, b));
    }
  }
}

// Pair layout from an f32 tile, rounded to bf16: dst[(r2 Cpad + c) 2 + e] = bf16(src[(2 r2 + e) ld + c])
// for rows r < R (a missing odd row is zero), c < C, zero up to Cpad (a multiple of 16). The B
// operand "K along src's rows" of pack_rows, and also the A operand src^T (lda 2, lda2 2 Cpad).
inline void pairs_from(const float* src, int64_t ld, int64_t R, int64_t C, int64_t Cpad, bfloat16* dst) {
  alignas(64) int16_t idx[32];
  for (int i = 0; i < 16; ++i) idx[2 * i] = static_cast<int16_t>(i), idx[2 * i + 1] = static_cast<int16_t>(16 + i);
  const __m512i il = _mm512_load_si512(idx);
  for (int64_t r2 = 0; r2 < up(R, 2) / 2; ++r2) {
    const float* s0 = src + 2 * r2 * ld;
    const float* s1 = 2 * r2 + 1 < R ? s0 + ld : nullptr;
    bfloat16* out = dst + r2 * Cpad * 2;
    for (int64_t c0 = 0; c0 < Cpad; c0 += 16) {
      const __mmask16 m = c0 < C ? tail_mask(C - c0) : __mmask16(0);
      const __m512 a = _mm512_maskz_loadu_ps(m, s0 + c0);
      const __m512 b = s1 ? _mm512_maskz_loadu_ps(m, s1 + c0) : _mm512_setzero_ps();
      // a in words 0..15, b in 16..31, each rounded to nearest even
#if ATHANOR_CPU_AVX512BF16
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(b, a);
#else
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(vec::narrow_bf16(a)), vec::narrow_bf16(b), 1);
#endif
      _mm512_storeu_si512(out + 2 * c0, _mm512_permutexvar_epi16(il, both));
    }
  }
}

// Bp for B(k, n) = src[n * ld + k] (B = src^T: K along src's columns), K even: each (k, k+1)
// pair is one 32-bit word of src, so this is a transpose of 32-bit words; rows n in [N, N16)
// are zero.
inline void pack_cols(const bfloat16* src, int64_t ld, int64_t K, int64_t N, int64_t N16, bfloat16* Bp) {
  transpose_words(src, ld, 2, N, K / 2, N16, reinterpret_cast<uint32_t*>(Bp));
}

// A operand from an f32 tile, row-major: A[m][k] = bf16(src[m * ld + k]), k < K, zero up to
// Kpad. Rounds to nearest even, as cast_value<bfloat16>.
inline void a_from(const float* src, int64_t ld, int64_t M, int64_t K, int64_t Kpad, bfloat16* A) {
  const bfloat16 zero = cast_value<bfloat16>(0.0f);
  for (int64_t m = 0; m < M; ++m) {
    const float* s = src + m * ld;
    bfloat16* a = A + m * Kpad;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
#if ATHANOR_CPU_AVX512BF16
      const __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s + k));
#else
      const __m256i h = vec::narrow_bf16(_mm512_loadu_ps(s + k));
#endif
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a + k), h);
    }
    for (; k < K; ++k) a[k] = cast_value<bfloat16>(s[k]);
    for (; k < Kpad; ++k) a[k] = zero;
  }
}

// Row i's f32 accumulator (n values) times mul, rounded to bf16 into dst.
inline void store_row(const float* src, int64_t n, float mul, bfloat16* dst) {
  const __m512 vm = _mm512_set1_ps(mul);
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 m = tail_mask(n - c);
    vec::store16(dst + c, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, src + c), vm));
  }
}
}  // namespace bf16t
#endif  // ATHANOR_CPU_AVX512 (bf16 tiles)

}  // namespace attention_tiles
ATHANOR_ISA_END
