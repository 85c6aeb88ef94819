// Small-batch f32 GEMMs (see small_batch_gemm.h). Two register-blocked AVX-512 kernels,
// each keeping 24 accumulators of 16 lanes in registers:
//
//  - "dot" (NT: C = A B^T, rows of A and of B contiguous along K): a tile of 3 rows of A
//    x 8 rows of B keeps one 16-lane partial sum per element of C over all of K (<= 1024),
//    then sums the lanes four elements at a time. A step loads 3 + 8 vectors for 24 FMAs;
//    the 8 rows of B (32 KiB at K = 1024) stay in L1 while the tile walks down every row of
//    A (512 KiB at 128 x 1024, in L2). The weight is not copied. Taller tiles (4-6 rows of
//    A x 4 of B) are slower: more L2 traffic per FMA, and more rows in one L1 set when they
//    alias.
//  - "outer" (NN, TN: op(B) row-major): a tile of 5-6 rows x 64 columns of C over a panel
//    of op(B), at most 256 x 64, used by every row of C; op(A) is read in place, one
//    broadcast per row and step (6 broadcasts + 4 vectors per 24 FMAs). TN copies the
//    panel into scratch first, NN reads it in place (run_outer says why).
// In L1 alone both kernels run close to one core's FMA peak. Against oneDNN's matmul on
// the MLP's shapes this path ties on a quiet machine and holds up better on a loaded one,
// and the MLP's step ran faster with it (session 9; the figures are in bench/RESULTS.md).
//
// Each element of C is summed by one thread in a fixed order (dot: 16 lane sums over k,
// then a fixed tree; outer: k = 0..K-1), whatever the tiling or the thread count.
#include "backend/cpu/small_batch_gemm.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "backend/cpu/bcast_tile.h"
#include "backend/cpu/stealing_runs.h"
#include "backend/cpu/vec_math.h"  // vec::tail_mask
#include "backend/cpu/workspace.h"

namespace athanor::cpu {

namespace {

// The batch (rows of C for NT / NN, the reduction for TN) and the other two sizes.
// The dot tiles only where they measured at least as fast as oneDNN: a batch of about 128
// with K 768..1024 and N <= 2048 (at 256 rows A no longer fits L2 beside the block of B:
// 1.26-1.42x oneDNN's time; at K = 512, N = 4096 or 256 x 2304 x 768: 1.03-1.29x; at 64
// rows 0.84-1.30x from run to run). The outer tiles at 64..256 (0.88-1.08x).
constexpr int64_t kMinBatch = 64, kMaxBatch = 256, kMinWide = 256;
constexpr int64_t kDotMinBatch = 96, kDotMaxBatch = 160, kDotMinK = 768, kDotMaxK = 1024, kDotMaxN = 2048;

enum class Path { none, dot, outer };

[[maybe_unused]] Path choose_path(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, bool relu = false) {
  if (alpha == 0.0f || N < kMinWide) return Path::none;
  if (relu && !(!ta && tb)) return Path::none;  // only the dot tiles' epilogue applies it
  auto batch = [](int64_t b) { return b >= kMinBatch && b <= kMaxBatch; };
  if (!ta && tb)
    return M >= kDotMinBatch && M <= kDotMaxBatch && K >= kDotMinK && K <= kDotMaxK && N <= kDotMaxN ? Path::dot
                                                                                                   : Path::none;
  if (!ta && !tb) return batch(M) && K >= kMinWide ? Path::outer : Path::none;
  if (ta && !tb) return batch(K) && M >= kMinWide ? Path::outer : Path::none;
  return Path::none;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace
}  // namespace athanor::cpu

ATHANOR_ISA_BEGIN
namespace {

#if ATHANOR_CPU_AVX512

// ---- dot (NT) ----

constexpr int kDotRowsA = 3, kDotRowsB = 8;

// The 16 lanes of each of v0..v3 summed: {sum v0, sum v1, sum v2, sum v3}.
inline __m128 sum_lanes4(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
  // Zero-masking forms throughout: the plain unpacks and casts build on _mm512_undefined_ps,
  // which trips GCC 12's -Wuninitialized once inlined (see narrow_gemm.cpp's sum_lanes).
  constexpr __mmask16 all = 0xffff;
  const __m512 s01 = _mm512_add_ps(_mm512_maskz_unpacklo_ps(all, v0, v1), _mm512_maskz_unpackhi_ps(all, v0, v1));
  const __m512 s23 = _mm512_add_ps(_mm512_maskz_unpacklo_ps(all, v2, v3), _mm512_maskz_unpackhi_ps(all, v2, v3));
  // Each 128-bit lane of t now holds {v0, v1, v2, v3} partial sums.
  const __m512 t = _mm512_add_ps(_mm512_shuffle_ps(s01, s23, 0x44), _mm512_shuffle_ps(s01, s23, 0xEE));
  const __m256 lo = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xff, _mm512_castps_pd(t), 0));
  const __m256 hi = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xff, _mm512_castps_pd(t), 1));
  const __m256 s = _mm256_add_ps(lo, hi);
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

// C[0..RA) x [0..RB) (row stride ldc) from K columns of RA rows of A and RB rows of B:
// alpha sum + bias + beta C, then max(., 0) when relu.
template <int RA, int RB>
void dot_tile(int64_t K, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
              const float* bias, float alpha, float beta, bool relu) {
  constexpr int RB4 = (RB + 3) / 4 * 4;  // the groups of 4 the lane sums take; the extra ones stay zero
  __m512 acc[RA][RB4];
#pragma GCC unroll 4
  for (int r = 0; r < RA; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < RB4; ++j) acc[r][j] = _mm512_setzero_ps();
  // Locals, and every loop over the tile unrolled: the accumulators must live in registers.
  auto step = [&](int64_t k, __mmask16 m, auto full) {
    __m512 av[RA];
#pragma GCC unroll 4
    for (int r = 0; r < RA; ++r) av[r] = full ? _mm512_loadu_ps(a + r * lda + k) : _mm512_maskz_loadu_ps(m, a + r * lda + k);
#pragma GCC unroll 8
    for (int j = 0; j < RB; ++j) {
      __m512 bv = full ? _mm512_loadu_ps(b + j * ldb + k) : _mm512_maskz_loadu_ps(m, b + j * ldb + k);
      // One load per vector, kept in a register (GCC would fold it into each of RA FMAs).
      __asm__("" : "+v"(bv));
#pragma GCC unroll 4
      for (int r = 0; r < RA; ++r) acc[r][j] = _mm512_fmadd_ps(av[r], bv, acc[r][j]);
    }
  };
  const int64_t full_end = K / 16 * 16;
  for (int64_t k = 0; k < full_end; k += 16) step(k, __mmask16(0xffff), std::true_type{});
  if (K > full_end) step(full_end, vec::tail_mask(K - full_end), std::false_type{});  // masked lanes load as 0
#pragma GCC unroll 4
  for (int r = 0; r < RA; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < RB4; j += 4) {
      const __mmask8 m = static_cast<__mmask8>((1u << std::min(4, RB - j)) - 1u);
      float* out = c + r * ldc + j;
      __m128 s = _mm_mul_ps(_mm_set1_ps(alpha), sum_lanes4(acc[r][j], acc[r][j + 1], acc[r][j + 2], acc[r][j + 3]));
      if (bias) s = _mm_add_ps(s, _mm_maskz_loadu_ps(m, bias + j));
      if (beta != 0.0f) s = _mm_fmadd_ps(_mm_set1_ps(beta), _mm_maskz_loadu_ps(m, out), s);
      if (relu) s = _mm_max_ps(s, _mm_setzero_ps());
      _mm_mask_storeu_ps(out, m, s);
    }
}

using DotTile = void (*)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, const float*, float,
                         float, bool);
template <int... I> constexpr std::array<DotTile, sizeof...(I)> dot_table(std::integer_sequence<int, I...>) {
  return {&dot_tile<I / kDotRowsB + 1, I % kDotRowsB + 1>...};
}
constexpr auto kDotTiles = dot_table(std::make_integer_sequence<int, kDotRowsA * kDotRowsB>{});  // [RA-1][RB-1]

// Whether rows `ld` floats apart alias in L1: at a multiple of 2 KiB, the same column of
// rows 0 and 2 falls in the same set of this 64-set cache (at 4 KiB, of all rows).
inline bool rows_alias(int64_t ld) { return (ld * static_cast<int64_t>(sizeof(float))) % 2048 == 0; }

// Threads take contiguous runs of 8-row blocks of B; each block walks down all of A.
// A whose rows alias (K = 1024 as stored) is first copied with rows 16 floats longer,
// starting half a page away from B's rows: the tile's 3 rows of A would otherwise share
// L1 sets with the 8 resident rows of B at every step. 128 x 1024 x 1024 with both
// operands' rows 4 KiB apart, against the same with them 16 floats longer (same run): A
// read in place 0.48-0.60x the speed, copied at the same offset as B 0.60, copied half a
// page away 0.88-0.99.
void run_dot(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
             float beta, const float* bias, float* C, int64_t ldc, bool relu) {
  const int64_t nbb = ceil_div(N, kDotRowsB);
  const int nthreads = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), nbb));
  const bool copy_a = rows_alias(lda);
  const int64_t lda_copy = copy_a ? ceil_div(K, 16) * 16 + 16 : lda;
  constexpr int64_t kPage = 4096 / sizeof(float);
  Workspace a_copy(copy_a ? static_cast<std::size_t>(M * lda_copy + kPage) * sizeof(float) : 0);
  float* a_base = nullptr;
  if (copy_a) {
    const auto page_offset = [](const float* p) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) / sizeof(float)); };
    a_base = a_copy.as<float>() + ((page_offset(B) + kPage / 2 - page_offset(a_copy.as<float>())) & (kPage - 1));
  }
  const float* const a = copy_a ? a_base : A;
  // The copy of A and the blocks of B both go by StealingRuns (stealing_runs.h): the worker
  // thread often starts late (its core is woken by the host), and the main thread then copies
  // most of A itself instead of sleeping in a barrier until the worker has copied its half.
  constexpr int64_t kCopyRows = 16;
  const int64_t ncopy = copy_a ? ceil_div(M, kCopyRows) : 0;
  StealingRuns copies(ncopy, nthreads), blocks(nbb, nthreads);
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    const int t = omp_get_thread_num();
    copies.run(t, [&](int64_t c) {
      for (int64_t i = c * kCopyRows; i < std::min(M, (c + 1) * kCopyRows); ++i)
        std::copy(A + i * lda, A + i * lda + K, a_base + i * lda_copy);
    });
    copies.wait_all();  // every tile reads all of A
    blocks.run(t, [&](int64_t bb) {
      const int64_t n0 = bb * kDotRowsB, rb = std::min<int64_t>(kDotRowsB, N - n0);
      for (int64_t i0 = 0; i0 < M; i0 += kDotRowsA) {
        const int64_t ra = std::min<int64_t>(kDotRowsA, M - i0);
        kDotTiles[(ra - 1) * kDotRowsB + (rb - 1)](K, a + i0 * lda_copy, lda_copy, B + n0 * ldb, ldb, C + i0 * ldc + n0,
                                                   ldc, bias ? bias + n0 : nullptr, alpha, beta, relu);
      }
    });
  }
}

// ---- outer (NN, TN) ----

constexpr int kOuterRows = 6, kOuterVecs = 4;
constexpr int64_t kPanelCols = 16 * kOuterVecs, kPanelMaxK = 256;

// The outer tiles are bcast_tile (bcast_tile.h), shared with narrow_gemm's M <= 16 path.
using OuterTile = void (*)(const TileOperands&, int64_t, int64_t, __mmask16);
template <int... I> constexpr std::array<OuterTile, sizeof...(I)> outer_table(std::integer_sequence<int, I...>) {
  return {&bcast_tile<I / kOuterVecs + 1, I % kOuterVecs + 1>...};
}
constexpr auto kOuterTiles = outer_table(std::make_integer_sequence<int, kOuterRows * kOuterVecs>{});  // [RM-1][JB-1]

// Rows [k0, k0 + kc) x columns [j0, j0 + cols) of op(B) (row-major, row stride ldb) into
// panel, kPanelCols floats per row apart; the last vector zero past cols. The vectors past
// it are neither written nor read (a tile of cols columns reads ceil(cols / 16) of them).
void pack_panel(const float* B, int64_t ldb, int64_t k0, int64_t kc, int64_t j0, int64_t cols, float* panel) {
  const int64_t nv = ceil_div(cols, 16);  // the tiles read these vectors of each panel row, no more
  for (int64_t k = 0; k < kc; ++k) {
    const float* src = B + (k0 + k) * ldb + j0;
    for (int64_t v = 0; v < nv; ++v)
      _mm512_storeu_ps(panel + k * kPanelCols + 16 * v, _mm512_maskz_loadu_ps(vec::tail_mask(cols - 16 * v), src + 16 * v));
  }
}

// NN reads op(B) (the weight W of dx = g W) in place; TN copies each panel of op(B) (the
// activation x of dW = g^T x) first, each the faster way when measured both ways
// (bench/RESULTS.md): for dx, W's 4 MiB come in once either way, and a copy stalls on them
// before any FMA runs; for dW, x's 128 rows 4 KiB apart thrash L1 without the copy, and each
// panel is used by 85 tiles. Panels of 256 rows: 128 read slower in place.
//
// The work goes in items over StealingRuns (stealing_runs.h): 64-column blocks (all rows,
// every K pass) when they split evenly between the threads, so that no panel is copied
// twice (N = 1024: 16 blocks); otherwise one run of rows per thread, each copying its own
// panels (dW of 784 columns: 13 blocks would split 7 / 6). A thread's rows go in tiles of
// 5-6 (128 = 18 x 6 + 4 x 5, not 21 x 6 + 2).
void run_outer(bool ta, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
               int64_t ldb, float beta, const float* bias, float* C, int64_t ldc) {
  const int64_t a_rs = ta ? 1 : lda, a_ks = ta ? lda : 1;
  const bool in_place = !ta;
  const int64_t ncb = ceil_div(N, kPanelCols), nkb = ceil_div(K, kPanelMaxK);
  const int nthreads = omp_get_max_threads();
  const bool split_columns = ncb % nthreads == 0 || M < 8 * kOuterRows * nthreads;
  Workspace scratch(in_place ? 0 : static_cast<std::size_t>(nthreads) * kPanelMaxK * kPanelCols * sizeof(float));
  float* const panels = scratch.as<float>();
  // Rows [i_begin, i_end) x column blocks [cb0, cb1), every K pass.
  const auto block = [&](float* panel, int64_t i_begin, int64_t i_end, int64_t cb0, int64_t cb1) {
    const int64_t rows = i_end - i_begin, nrb = ceil_div(rows, kOuterRows);
    for (int64_t cb = cb0; cb < cb1; ++cb) {
      const int64_t j0 = cb * kPanelCols, cols = std::min(kPanelCols, N - j0), nv = ceil_div(cols, 16);
      const __mmask16 last = vec::tail_mask(cols - 16 * (nv - 1));
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t k0 = K * kb / nkb, kc = K * (kb + 1) / nkb - k0;
        const float pass_beta = kb == 0 ? beta : 1.0f;
        const float* pass_bias = kb == 0 && bias ? bias + j0 : nullptr;
        if (!in_place) pack_panel(B, ldb, k0, kc, j0, cols, panel);
        // This pass over column block cb: K = kc steps from k0, columns from j0.
        const TileOperands o{kc, alpha, pass_beta, A + k0 * a_ks, a_rs, a_ks, in_place ? B + k0 * ldb + j0 : panel,
                             in_place ? ldb : kPanelCols, pass_bias, C + j0, ldc};
        for (int64_t rb = 0; rb < nrb; ++rb) {
          const int64_t i0 = i_begin + rows * rb / nrb, rm = i_begin + rows * (rb + 1) / nrb - i0;
          kOuterTiles[(rm - 1) * kOuterVecs + (nv - 1)](o, i0, 0, last);
        }
      }
    }
  };
  StealingRuns items(split_columns ? ncb : nthreads, nthreads);
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    const int t = omp_get_thread_num();
    float* const panel = in_place ? nullptr : panels + t * kPanelMaxK * kPanelCols;
    items.run(t, [&](int64_t i) {
      if (split_columns) block(panel, 0, M, i, i + 1);
      else block(panel, M * i / nthreads, M * (i + 1) / nthreads, 0, ncb);
    });
  }
}

#endif  // ATHANOR_CPU_AVX512

}  // namespace

bool small_batch_gemm_applies(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, bool relu) {
#if ATHANOR_CPU_AVX512
  return choose_path(ta, tb, M, N, K, alpha, relu) != Path::none;
#else
  (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)relu;
  return false;
#endif
}

bool small_batch_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float beta, const float* bias, float* C, int64_t ldc, bool relu) {
#if ATHANOR_CPU_AVX512
  if (!small_batch_gemm_enabled()) return false;
  const Path path = choose_path(ta, tb, M, N, K, alpha, relu);
  if (path == Path::dot) run_dot(M, N, K, alpha, A, lda, B, ldb, beta, bias, C, ldc, relu);
  else if (path == Path::outer) run_outer(ta, M, N, K, alpha, A, lda, B, ldb, beta, bias, C, ldc);
  return path != Path::none;
#else
  (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb, (void)beta,
      (void)bias, (void)C, (void)ldc, (void)relu;
  return false;
#endif
}

ATHANOR_ISA_END

#if ATHANOR_ISA_PRIMARY
namespace athanor::cpu {

namespace {
std::atomic<bool> g_enabled{[] {
  const char* v = std::getenv("ATHANOR_SMALL_BATCH_GEMM");
  return !(v && std::string(v) == "0");
}()};

}  // namespace

void set_small_batch_gemm_enabled(bool enabled) { g_enabled.store(enabled, std::memory_order_relaxed); }
bool small_batch_gemm_enabled() { return g_enabled.load(std::memory_order_relaxed); }

ATHANOR_ISA_DECLARE(
    bool small_batch_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                          const float* B, int64_t ldb, float beta, const float* bias, float* C, int64_t ldc, bool relu);
    bool small_batch_gemm_applies(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, bool relu);)

bool small_batch_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float beta, const float* bias, float* C, int64_t ldc, bool relu) {
  ATHANOR_ISA_CALL(small_batch_gemm, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, bias, C, ldc, relu);
}
bool small_batch_gemm_applies(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, bool relu) {
  ATHANOR_ISA_CALL(small_batch_gemm_applies, ta, tb, M, N, K, alpha, relu);
}

}  // namespace athanor::cpu
#endif  // ATHANOR_ISA_PRIMARY
