// Narrow f32 GEMMs (see narrow_gemm.h). Three register-blocked AVX-512 kernels, each
// keeping <= 24 accumulators of 16 lanes in registers:
//
//  - "kstat" (K <= 12, op(B) row-major): op(B)'s K x 16*JB slice stays in registers
//    while the kernel walks down 16 rows of C, K broadcasts and K*JB FMAs per row
//    (dx = g W, K = 10).
//  - "bcast" (M <= 16, K > 12, op(B) row-major): a tile of all M rows x JB vectors of C
//    stays in registers while k runs over the whole reduction; each step loads JB vectors
//    of op(B)'s row k and broadcasts M scalars of op(A) (dW = g^T x, M = 10: x streams
//    through once).
//  - "dot" (NT, K >= 64: A and B rows both contiguous along K): the narrow operand is
//    packed in 16-float chunks of K; a tile of RW wide rows x NP narrow rows keeps one
//    16-lane partial sum per element of C, summed at the end (y = x W^T, N = 10).
// NT and TT with K <= 8 pack op(B) into a K x N row-major buffer and run kstat. Which
// shapes go where, and what stays on oneDNN: choose_path.
//
// On linear 1024 -> 10 at batch 128 this path beats oneDNN in the forward and dW, and ties
// in dx (bench/RESULTS.md): dx writes 512 KiB of C for 1.3M multiply-adds, so on one
// thread both libraries sit at the FMA time plus the write traffic.
//
// Each element of C is summed by one thread in a fixed order (kstat, bcast: k = 0..K-1;
// dot: 16 lane sums over k, then a fixed tree), so results do not depend on the tiling or
// on the thread count. Threads take contiguous runs of tiles (disjoint blocks of C).
#include "backend/cpu/narrow_gemm.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cpu/bcast_tile.h"
#include "backend/cpu/vec_math.h"  // vec::tail_mask

namespace athanor::cpu {

namespace {

// Multiply-adds per extra thread: kNarrowWorkPerThread (narrow_gemm.h).
constexpr int64_t kWorkPerThread = kNarrowWorkPerThread;
// Which shapes take which kernel. Chosen from a sweep against oneDNN (1 and 2 threads, all
// four transposes, the narrow size in {1, 4, 7..12, 16} in each position, the others from
// {128 x 1024, 1024 x 1024, 4096 x 256}; /tmp harness, +-10% noise): only the kinds that
// won or tied are routed here (the sweep's time ratios narrow / oneDNN in brackets: they
// are why each rule is there; the absolute times are in bench/RESULTS.md). Known small losses
// left in: 4 x 128 x 1024 NN/TN on one thread (+1-2 us, [1.1-1.3]; [0.2-0.4] on two),
// 4096 x 256 x {1, 4} on two threads ([1.1-1.2]; [0.6-0.7] on one).
//  - K <= 12, op(B) row-major, M*N*K <= 4M: kstat [0.31-1.04 on one thread; 0.54-0.66 on
//    two, where oneDNN pays the workers' wake-up and kstat runs on one]. At K = 16 kstat
//    holds one vector per row (16 broadcasts per 16 FMAs) and lost [1.5-1.7]: K 13..16
//    stay on oneDNN; so do larger products (1024 x 1024 x 10, 4096 x 256 x 10: C no
//    longer fits in L2, and oneDNN was 10-30% faster on two threads).
//  - K <= 8 with tb (NT, TT), M >= 4, M*N*K <= 4M: op(B) packed (K x N, cheap), then
//    kstat [0.37-0.48]; at K = 10 it was a wash [0.94-1.18].
//  - M <= 16, K > 12, op(B) row-major (NN, TN): bcast with all of M in one tile [0.60-1.00].
//  - NT with min(M, N) <= 12 and K >= 64: dot [0.15-0.98]; a narrow side of 16 lost at
//    K = 256 [1.5].
// Not routed: a narrow N with K > 12 in NN/TN (one masked vector per row, as many
// broadcasts as FMAs: [0.64-1.55]) and TT with a narrow M or N (packing N x K op(B)
// with strided writes cost up to 40x).
constexpr int64_t kKstatMaxK = 12, kPackedKstatMaxK = 8, kKstatMaxWork = int64_t{4} * 1024 * 1024;
constexpr int64_t kDotMinK = 64, kDotMaxNarrow = 12;

enum class Path { none, kstat, pack_then_kstat, bcast, dot };

Path choose_path(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha) {
  if (M <= 0 || N <= 0 || K <= 0 || alpha == 0.0f) return Path::none;
  if (std::min({M, N, K}) > kNarrowMaxDim) return Path::none;
  if (M * N * K < kNarrowMinWork) return Path::none;
  if (K <= kKstatMaxK) {
    if (M * N * K > kKstatMaxWork) return Path::none;
    if (!tb) return Path::kstat;
    return K <= kPackedKstatMaxK && M >= 4 ? Path::pack_then_kstat : Path::none;
  }
  if (!tb) return M <= kNarrowMaxDim ? Path::bcast : Path::none;
  if (!ta && K >= kDotMinK && std::min(M, N) <= kDotMaxNarrow) return Path::dot;
  return Path::none;
}

int threads_for(int64_t work, int64_t tiles) {
  const int64_t by_work = std::max<int64_t>(1, work / kWorkPerThread);
  return static_cast<int>(std::max<int64_t>(1, std::min({int64_t{omp_get_max_threads()}, by_work, tiles})));
}

// The thread's buffer for a packed op(B) (grown on demand, kept for the thread's life).
float* pack_buffer(int64_t n) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  return buf.data();
}

// op(B) for tb = true (B stored N x K) as a K x N row-major matrix.
const float* pack_b_transposed(int64_t N, int64_t K, const float* B, int64_t ldb) {
  float* p = pack_buffer(N * K);
  for (int64_t j = 0; j < N; ++j)
    for (int64_t k = 0; k < K; ++k) p[k * N + j] = B[j * ldb + k];
  return p;
}

}  // namespace
}  // namespace athanor::cpu

ATHANOR_ISA_BEGIN
namespace {

#if ATHANOR_CPU_AVX512

// Runs prepare(i, n) on each thread i of n, then (after a barrier) tile(t) for t in
// [0, ntiles): thread i takes the i-th contiguous run.
template <class Prepare, class Tile>
void run_tiles(int64_t ntiles, int nthreads, const Prepare& prepare, const Tile& tile) {
  if (nthreads <= 1) {
    prepare(0, 1);
    for (int64_t t = 0; t < ntiles; ++t) tile(t);
    return;
  }
#pragma omp parallel num_threads(nthreads)
  {
    const int64_t n = omp_get_num_threads(), i = omp_get_thread_num();
    prepare(i, n);
#pragma omp barrier
    for (int64_t t = ntiles * i / n; t < ntiles * (i + 1) / n; ++t) tile(t);
  }
}
constexpr auto kNothingToPrepare = [](int64_t, int64_t) {};

// Narrow K (<= 16): C[i0 .. i1, j0 .. j0+16*JB) with op(B)'s K x 16*JB slice held in
// registers for the whole row range; each row of C is then K broadcasts, K * JB FMAs and
// JB stores, and consecutive rows are independent work for the out-of-order core. (The
// bcast tile re-reads B and refills its accumulators every K = 10 steps: there the
// start-up latency of each tile showed, and it lost to oneDNN on dx = g W.)
template <int KK, int JB> void kstat_tile(const TileOperands& o, int64_t i0, int64_t i1, int64_t j0, __mmask16 last) {
  const int64_t a_rs = o.a_rs, a_ks = o.a_ks, ldb = o.ldb, ldc = o.ldc;
  const TileEpilogue e{o.alpha, o.beta, o.bias};
  const float* const A = o.A;
  float* const C = o.C;
  __m512 bw[KK][JB];
#pragma GCC unroll 16
  for (int k = 0; k < KK; ++k)
#pragma GCC unroll 4
    for (int v = 0; v < JB; ++v) {
      const float* src = o.B + k * ldb + j0 + 16 * v;
      bw[k][v] = v == JB - 1 ? _mm512_maskz_loadu_ps(last, src) : _mm512_loadu_ps(src);
    }
  for (int64_t i = i0; i < i1; ++i) {
    const float* a = A + i * a_rs;
    __m512 acc[JB];
#pragma GCC unroll 4
    for (int v = 0; v < JB; ++v) acc[v] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int k = 0; k < KK; ++k) {
      const __m512 av = _mm512_set1_ps(a[k * a_ks]);
#pragma GCC unroll 4
      for (int v = 0; v < JB; ++v) acc[v] = _mm512_fmadd_ps(av, bw[k][v], acc[v]);
    }
#pragma GCC unroll 4
    for (int v = 0; v < JB; ++v)
      store_tile_result(e, acc[v], e.bias ? e.bias + j0 + 16 * v : nullptr, C + i * ldc + j0 + 16 * v,
                   v == JB - 1 ? last : __mmask16(0xffff));
  }
}

// Sum of the 16 lanes (halving tree). Not _mm512_reduce_add_ps nor
// _mm512_castps512_ps256: GCC 12 builds both on _mm256_undefined_pd(), which trips
// -Wuninitialized once inlined into unrolled loops; the zero-masking extract does not.
inline float sum_lanes(__m512 v) {
  const __m256 lo = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xff, _mm512_castps_pd(v), 0));
  const __m256 hi = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xff, _mm512_castps_pd(v), 1));
  const __m256 s8 = _mm256_add_ps(lo, hi);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s4, _mm_movehdup_ps(s4)));
}

// The dot kernel's operands: the wide one W (rows contiguous along K, as stored) and the
// narrow one packed: chunk kc (16 values of k, the last zero-padded) of narrow row s at
// P[kc * p_chunk + s * 16], so a step reads the narrow side's vectors from consecutive
// lines. Read in place, B's rows (4 KiB apart for K = 1024) all fall in one L1 set: with
// the wide rows that is 12 lines in a 12-way set at every step.
// C element (w, s) is C[w * c_ws + s * c_ps]; its bias bias[w * bias_ws + s * bias_ps].
struct DotOperands {
  int64_t K;
  float alpha, beta;
  const float* W;
  int64_t ldw;
  const float* P;
  int64_t p_chunk;
  float* C;
  int64_t c_ws, c_ps;
  const float* bias;
  int64_t bias_ws, bias_ps;
};

// Wide rows w0 .. w0+RW x narrow rows s0 .. s0+NP.
template <int RW, int NP> void dot_tile(const DotOperands& o, int64_t w0, int64_t s0) {
  __m512 acc[RW][NP];
#pragma GCC unroll 12
  for (int r = 0; r < RW; ++r)
#pragma GCC unroll 12
    for (int c = 0; c < NP; ++c) acc[r][c] = _mm512_setzero_ps();
  const int64_t K = o.K, ldw = o.ldw, p_chunk = o.p_chunk;  // locals, loops unrolled: see bcast_tile
  const float* w = o.W + w0 * ldw;
  const float* p = o.P + s0 * 16;
  auto step = [&](int64_t kc, __mmask16 m, auto full) {
    __m512 wv[RW];
#pragma GCC unroll 12
    for (int r = 0; r < RW; ++r)
      wv[r] = full ? _mm512_loadu_ps(w + r * ldw + kc * 16) : _mm512_maskz_loadu_ps(m, w + r * ldw + kc * 16);
#pragma GCC unroll 12
    for (int c = 0; c < NP; ++c) {
      __m512 pv = _mm512_loadu_ps(p + kc * p_chunk + c * 16);
      // One load per vector, kept in a register: GCC otherwise folds it into each FMA
      // (RW loads), and a core sustains only one or two 64-byte loads per cycle.
      __asm__("" : "+v"(pv));
#pragma GCC unroll 12
      for (int r = 0; r < RW; ++r) acc[r][c] = _mm512_fmadd_ps(wv[r], pv, acc[r][c]);
    }
  };
  const int64_t full_chunks = K / 16;
  for (int64_t kc = 0; kc < full_chunks; ++kc) step(kc, __mmask16(0xffff), std::true_type{});
  if (K % 16) step(full_chunks, vec::tail_mask(K % 16), std::false_type{});  // masked lanes load as 0
  const float alpha = o.alpha, beta = o.beta;  // locals: see TileEpilogue
  const float* const bias = o.bias;
  float* const C = o.C;
  const int64_t c_ws = o.c_ws, c_ps = o.c_ps, bias_ws = o.bias_ws, bias_ps = o.bias_ps;
#pragma GCC unroll 12
  for (int r = 0; r < RW; ++r)
#pragma GCC unroll 12
    for (int c = 0; c < NP; ++c) {
      float* out = C + (w0 + r) * c_ws + (s0 + c) * c_ps;
      float v = alpha * sum_lanes(acc[r][c]);
      if (bias) v += bias[(w0 + r) * bias_ws + (s0 + c) * bias_ps];
      if (beta != 0.0f) v += beta * *out;
      *out = v;
    }
}

// Rows [s_begin, s_end) of the narrow operand X (n rows of K, row stride ldx), chunks
// [kc_begin, kc_end), into the packed layout of DotOperands.
void pack_narrow(const float* X, int64_t ldx, int64_t n, int64_t K, int64_t kc_begin, int64_t kc_end, float* P) {
  for (int64_t kc = kc_begin; kc < kc_end; ++kc) {
    const __mmask16 m = vec::tail_mask(K - kc * 16);
    for (int64_t s = 0; s < n; ++s)
      _mm512_storeu_ps(P + (kc * n + s) * 16, _mm512_maskz_loadu_ps(m, X + s * ldx + kc * 16));
  }
}

constexpr int kBcastMaxRows = 12, kBcastMaxVecs = 4, kKstatMaxVecs = 4, kDotMaxSide = 9, kDotWholeNarrow = 9;
constexpr int kMaxAccumulators = 24;  // of 32 zmm registers: the rest hold op(A)/op(B) values
// Rows of C per kstat tile. With rows 4 KiB apart (N = 1024) more rows per tile made
// dx = g W's time bimodal (the rows' lines share L1 sets); 16 rows ran steadily.
constexpr int64_t kKstatRows = 16;

using BcastTile = void (*)(const TileOperands&, int64_t, int64_t, __mmask16);
using DotTile = void (*)(const DotOperands&, int64_t, int64_t);
template <int RM, int JB> constexpr BcastTile bcast_entry() {
  if constexpr (RM * JB <= kMaxAccumulators) return &bcast_tile<RM, JB>;
  else return nullptr;
}
template <int... I> constexpr std::array<BcastTile, sizeof...(I)> bcast_table(std::integer_sequence<int, I...>) {
  return {bcast_entry<I / kBcastMaxVecs + 1, I % kBcastMaxVecs + 1>()...};
}
template <int RM, int NB> constexpr DotTile dot_entry() {
  if constexpr (RM * NB <= kMaxAccumulators) return &dot_tile<RM, NB>;
  else return nullptr;
}
template <int... I> constexpr std::array<DotTile, sizeof...(I)> dot_table(std::integer_sequence<int, I...>) {
  return {dot_entry<I / kDotMaxSide + 1, I % kDotMaxSide + 1>()...};
}
using KstatTile = void (*)(const TileOperands&, int64_t, int64_t, int64_t, __mmask16);
template <int KK, int JB> constexpr KstatTile kstat_entry() {
  if constexpr (KK * JB <= kMaxAccumulators) return &kstat_tile<KK, JB>;
  else return nullptr;
}
template <int... I> constexpr std::array<KstatTile, sizeof...(I)> kstat_table(std::integer_sequence<int, I...>) {
  return {kstat_entry<I / kKstatMaxVecs + 1, I % kKstatMaxVecs + 1>()...};
}
// [K - 1][JB - 1]; null where K * JB > kMaxAccumulators.
constexpr auto kKstatTiles = kstat_table(std::make_integer_sequence<int, kKstatMaxK * kKstatMaxVecs>{});
// [RM - 1][JB - 1]; null where RM * JB > kMaxAccumulators.
constexpr auto kBcastTiles = bcast_table(std::make_integer_sequence<int, kBcastMaxRows * kBcastMaxVecs>{});
// [RM - 1][NB - 1]; null where RM * NB > kMaxAccumulators.
constexpr auto kDotTiles = dot_table(std::make_integer_sequence<int, kDotMaxSide * kDotMaxSide>{});

// n split into nb blocks whose sizes differ by at most one: block b starts at split(n, nb, b).
inline int64_t split(int64_t n, int64_t nb, int64_t b) { return n * b / nb; }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// M <= 16: all of M in one row block (two when M > 12), so op(B) streams through once
// (for M = 10 one block or two of 5 ran the same); column blocks
// of JB vectors with rows * JB <= 24; row blocks inner (they share the column block's
// slice of op(B) from cache).
void run_bcast(const TileOperands& o, int64_t M, int64_t N) {
  const int64_t nrb = ceil_div(M, kBcastMaxRows), rows = ceil_div(M, nrb);
  const int64_t jb = std::min<int64_t>(kBcastMaxVecs, kMaxAccumulators / rows), width = 16 * jb;
  const int64_t ncb = ceil_div(N, width);
  run_tiles(nrb * ncb, threads_for(M * N * o.K, nrb * ncb), kNothingToPrepare, [&](int64_t t) {
    const int64_t rb = t % nrb, cb = t / nrb;
    const int64_t i0 = split(M, nrb, rb), rm = split(M, nrb, rb + 1) - i0;
    const int64_t j0 = cb * width, cols = std::min(width, N - j0), nv = ceil_div(cols, 16);
    kBcastTiles[(rm - 1) * kBcastMaxVecs + (nv - 1)](o, i0, j0, vec::tail_mask(cols - 16 * (nv - 1)));
  });
}

// K <= 12: column blocks of JB vectors (K * JB <= 24) x row ranges of kKstatRows.
void run_kstat(const TileOperands& o, int64_t M, int64_t N) {
  const int64_t K = o.K, jb = std::min<int64_t>(kKstatMaxVecs, kMaxAccumulators / K), width = 16 * jb;
  const int64_t ncb = ceil_div(N, width), nrb = ceil_div(M, kKstatRows);
  // Column blocks inner: C is written row strip by row strip; op(B) (K x N) is small.
  run_tiles(nrb * ncb, threads_for(M * N * K, nrb * ncb), kNothingToPrepare, [&](int64_t t) {
    const int64_t rb = t / ncb, cb = t % ncb;
    const int64_t i0 = split(M, nrb, rb), i1 = split(M, nrb, rb + 1);
    const int64_t j0 = cb * width, cols = std::min(width, N - j0), nv = ceil_div(cols, 16);
    kKstatTiles[(K - 1) * kKstatMaxVecs + (nv - 1)](o, i0, i1, j0, vec::tail_mask(cols - 16 * (nv - 1)));
  });
}

// NT: C = alpha A B^T (+ bias) (+ beta C), A rows and B rows contiguous along K.
void run_dot(bool n_is_narrow, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
             const float* B, int64_t ldb, float beta, const float* bias, float* C, int64_t ldc) {
  const int64_t narrow = n_is_narrow ? N : M, wide = n_is_narrow ? M : N;
  const int64_t chunks = ceil_div(K, 16);
  float* packed = pack_buffer(chunks * 16 * narrow);
  DotOperands o{K, alpha, beta, n_is_narrow ? A : B, n_is_narrow ? lda : ldb, packed, narrow * 16, C,
                n_is_narrow ? ldc : 1, n_is_narrow ? 1 : ldc, bias, n_is_narrow ? 0 : 1, n_is_narrow ? 1 : 0};
  const float* X = n_is_narrow ? B : A;
  const int64_t ldx = n_is_narrow ? ldb : lda;
  // The narrow side whole up to 9 (NP = narrow), else in two blocks (N = 10: 5 + 5); the
  // wide side in blocks of <= 24 / NP (<= 8): 4 x 5 tiles for linear 1024 -> 10, 9 vector
  // loads per 20 FMAs, which ran faster than 2 x 10 tiles; tiles with NP = 4 (two blocks of
  // 4 for N = 8, or 5 + 4 for N = 9) ran at half the speed of NP = 5..9, hence the whole
  // narrow side up to 9 (figures in bench/RESULTS.md).
  const int64_t nnb = narrow <= kDotWholeNarrow ? 1 : 2, narrow_block = ceil_div(narrow, nnb);
  const int64_t nwb = ceil_div(wide, std::min<int64_t>(8, kMaxAccumulators / narrow_block));
  run_tiles(
      nwb * nnb, threads_for(M * N * K, nwb * nnb),
      [&](int64_t i, int64_t n) {  // each thread packs its share of the chunks, then a barrier
        pack_narrow(X, ldx, narrow, K, split(chunks, n, i), split(chunks, n, i + 1), packed);
      },
      [&](int64_t t) {  // narrow blocks inner: they reuse the wide block from L1
        const int64_t wb = t / nnb, nb = t % nnb;
        const int64_t w0 = split(wide, nwb, wb), rw = split(wide, nwb, wb + 1) - w0;
        const int64_t s0 = split(narrow, nnb, nb), np = split(narrow, nnb, nb + 1) - s0;
        kDotTiles[(rw - 1) * kDotMaxSide + (np - 1)](o, w0, s0);
      });
}

#endif  // ATHANOR_CPU_AVX512

}  // namespace

bool narrow_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, const float* bias, float* C, int64_t ldc) {
  if (!narrow_gemm_enabled()) return false;
  const Path path = choose_path(ta, tb, M, N, K, alpha);
  if (path == Path::none) return false;
#if ATHANOR_CPU_AVX512
  TileOperands o{K, alpha, beta, A, ta ? 1 : lda, ta ? lda : 1, B, ldb, bias, C, ldc};
  if (path == Path::dot) {
    run_dot(N <= M, M, N, K, alpha, A, lda, B, ldb, beta, bias, C, ldc);
  } else if (path == Path::bcast) {
    run_bcast(o, M, N);
  } else {
    if (path == Path::pack_then_kstat) {
      o.B = pack_b_transposed(N, K, B, ldb);
      o.ldb = N;
    }
    run_kstat(o, M, N);
  }
#else
  detail::narrow_gemm_portable(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, bias, C, ldc);
#endif
  return true;
}

ATHANOR_ISA_END

#if ATHANOR_ISA_PRIMARY
namespace athanor::cpu {

namespace {
// ATHANOR_NARROW_GEMM=0 starts with the path off (A/B timing of whole runs on one binary).
std::atomic<bool> g_enabled{[] {
  const char* v = std::getenv("ATHANOR_NARROW_GEMM");
  return !(v && std::string(v) == "0");
}()};

}  // namespace

namespace detail {

void narrow_gemm_portable(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                          const float* B, int64_t ldb, float beta, const float* bias, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0 || K <= 0) return;
  const float* b = tb ? pack_b_transposed(N, K, B, ldb) : B;  // op(B) row-major, row stride bs
  const int64_t bs = tb ? N : ldb;
  const int64_t a_rs = ta ? 1 : lda, a_ks = ta ? lda : 1;
  // One row of C per iteration, accumulated over k = 0..K-1 in order (the inner j loop
  // vectorises).
  const int nthreads = threads_for(M * N * K, M);
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    std::vector<float> acc(N);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < M; ++i) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k = 0; k < K; ++k) {
        const float a = A[i * a_rs + k * a_ks];
        const float* bk = b + k * bs;
        for (int64_t j = 0; j < N; ++j) acc[j] += a * bk[j];
      }
      float* c = C + i * ldc;
      for (int64_t j = 0; j < N; ++j) {
        float out = alpha * acc[j];
        if (bias) out += bias[j];
        if (beta != 0.0f) out += beta * c[j];
        c[j] = out;
      }
    }
  }
}

}  // namespace detail

bool narrow_gemm_applies(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha) {
  return choose_path(ta, tb, M, N, K, alpha) != Path::none;
}

void set_narrow_gemm_enabled(bool enabled) { g_enabled.store(enabled, std::memory_order_relaxed); }
bool narrow_gemm_enabled() { return g_enabled.load(std::memory_order_relaxed); }

ATHANOR_ISA_DECLARE(bool narrow_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                                int64_t lda, const float* B, int64_t ldb, float beta, const float* bias, float* C,
                                int64_t ldc);)

bool narrow_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, const float* bias, float* C, int64_t ldc) {
  ATHANOR_ISA_CALL(narrow_gemm, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, bias, C, ldc);
}

}  // namespace athanor::cpu
#endif  // ATHANOR_ISA_PRIMARY
