// Flash-attention CPU kernels (see attention.h for the invariants) and the naive reference.
#include "backend/cpu/attention.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <cmath>
#include <limits>
#include <vector>

#include "athanor/core/allocator.h"
#include "athanor/core/error.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/workspace.h"

namespace athanor::cpu {
namespace {


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

// Tile products C = alpha op(A) op(B) + beta C. f32 goes to the oneDNN sgemm (single-threaded
// inside our parallel region); f64 (gradchecks, small) uses a plain loop rather than calling
// the pthread OpenBLAS from several OpenMP threads at once.
inline void mm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* Cm, int64_t ldc) {
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) Cm[i * ldc + j] = beta == 0.0f ? 0.0f : beta * Cm[i * ldc + j];
    return;
  }
  gemm_tile(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cm, ldc);
}
inline void mm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
               const double* B, int64_t ldb, double beta, double* Cm, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
      Cm[i * ldc + j] = alpha * acc + (beta == 0.0 ? 0.0 : beta * Cm[i * ldc + j]);
    }
}

// The first n elements of src in the compute type C: src itself when T == C, else converted into buf.
template <class C, class T> inline const C* load(const T* src, int64_t n, C* buf) {
  if constexpr (std::is_same_v<T, C>) {
    return src;
  } else {
    for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<C>(static_cast<float>(src[i]));
    return buf;
  }
}
template <class T, class C> inline void store(const C* src, int64_t n, T* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = cast_value<T>(src[i]);
}

// Threads only pay off with more than one task and enough multiply-adds (~256k is ~50
// microseconds); tiny calls (gradchecks, decoding) stay on the calling thread.
inline bool parallel_worth(int64_t tasks, int64_t macs) { return tasks > 1 && macs > (int64_t{1} << 18); }

// Number of keys of tile [j0, j0 + bc) that query row i may see.
inline int64_t visible(bool causal, int64_t i, int64_t j0, int64_t bc) {
  return causal ? std::clamp<int64_t>(i - j0 + 1, 0, bc) : bc;
}

#if defined(__AVX512BF16__)
// ---- bf16 tiles: the products of the flash kernels on AVX512_BF16 dot products -------------
// vdpbf16ps multiplies bf16 pairs and accumulates in f32: C[m, n] += A[m, 2k] B[2k, n] +
// A[m, 2k+1] B[2k+1, n]. A is read row-major with pairs along K (rows of K padded to even
// length); B is packed "VNNI": Bp[k2][n][e] = B(2 k2 + e, n), n padded to a multiple of 16.
// Softmax and every accumulator stay f32; only the operands of the products are bf16
// (P and dS are rounded to bf16 before their products, as in FlashAttention's bf16 kernels).
namespace bf16t {
constexpr int64_t up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

template <int MR, int NR>
void micro(int64_t K2, float alpha, const bfloat16* A, int64_t lda, const bfloat16* Bp, int64_t ldb16,
           bool accumulate, float* C, int64_t ldc) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k2 = 0; k2 < K2; ++k2) {
    __m512bh b[NR];
    for (int j = 0; j < NR; ++j) b[j] = (__m512bh)_mm512_loadu_si512(Bp + (k2 * ldb16 + 16 * j) * 2);
    for (int i = 0; i < MR; ++i) {
      int32_t pair;
      std::memcpy(&pair, A + i * lda + 2 * k2, sizeof pair);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, b[j]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float* c = C + i * ldc + 16 * j;
      __m512 r = _mm512_mul_ps(acc[i][j], va);
      if (accumulate) r = _mm512_add_ps(r, _mm512_loadu_ps(c));
      _mm512_storeu_ps(c, r);
    }
}

using MicroFn = void (*)(int64_t, float, const bfloat16*, int64_t, const bfloat16*, int64_t, bool, float*, int64_t);
template <int MR> constexpr std::array<MicroFn, 4> row_of = {micro<MR, 1>, micro<MR, 2>, micro<MR, 3>, micro<MR, 4>};
constexpr std::array<std::array<MicroFn, 4>, 4> kMicro = {row_of<1>, row_of<2>, row_of<3>, row_of<4>};

// C[M, N16] = alpha A[M, 2 K2] B + (accumulate ? C : 0), N16 a multiple of 16 (C has that many columns).
void mm(int64_t M, int64_t N16, int64_t K2, float alpha, const bfloat16* A, int64_t lda, const bfloat16* Bp,
        bool accumulate, float* C, int64_t ldc) {
  for (int64_t m0 = 0; m0 < M; m0 += 4) {
    const int64_t mr = std::min<int64_t>(4, M - m0);
    for (int64_t n0 = 0; n0 < N16; n0 += 64) {
      const int64_t nr = std::min<int64_t>(4, (N16 - n0) / 16);
      kMicro[mr - 1][nr - 1](K2, alpha, A + m0 * lda, lda, Bp + n0 * 2, N16, accumulate, C + m0 * ldc + n0, ldc);
    }
  }
}

// Bp for B(k, n) = src[k * ld + n] (K along src's rows), k < K, n < N; zero padding.
void pack_rows(const bfloat16* src, int64_t ld, int64_t K, int64_t N, int64_t N16, bfloat16* Bp) {
  const bfloat16 zero = cast_value<bfloat16>(0.0f);
  for (int64_t k2 = 0; k2 < up(K, 2) / 2; ++k2) {
    const bfloat16* r0 = src + 2 * k2 * ld;
    const bfloat16* r1 = 2 * k2 + 1 < K ? r0 + ld : nullptr;
    bfloat16* dst = Bp + k2 * N16 * 2;
    if (r1) {
#pragma omp simd
      for (int64_t n = 0; n < N; ++n) dst[2 * n] = r0[n], dst[2 * n + 1] = r1[n];
    } else {
      for (int64_t n = 0; n < N; ++n) dst[2 * n] = r0[n], dst[2 * n + 1] = zero;
    }
    std::fill(dst + 2 * N, dst + 2 * N16, zero);
  }
}
// Bp for B(k, n) = src[n * ld + k] (B = src^T: K along src's columns), K even: each (k, k+1)
// pair is one 32-bit word of src, so this is a transpose of 32-bit words.
void pack_cols(const bfloat16* src, int64_t ld, int64_t K, int64_t N, int64_t N16, bfloat16* Bp) {
  const int64_t K2 = K / 2;
  auto* dst = reinterpret_cast<uint32_t*>(Bp);
  for (int64_t n = 0; n < N; ++n) {
    const bfloat16* row = src + n * ld;
    for (int64_t k2 = 0; k2 < K2; ++k2) std::memcpy(dst + k2 * N16 + n, row + 2 * k2, sizeof(uint32_t));
  }
  for (int64_t k2 = 0; k2 < K2; ++k2) std::fill(dst + k2 * N16 + N, dst + (k2 + 1) * N16, 0u);
}
// A operand from an f32 tile: A[m][k] = bf16(src[m * ld + k]) (transpose: src[k * ld + m]),
// k < K, zero up to Kpad. Rounds to nearest even, as cast_value<bfloat16>.
void a_from(const float* src, int64_t ld, int64_t M, int64_t K, int64_t Kpad, bool transpose, bfloat16* A) {
  const bfloat16 zero = cast_value<bfloat16>(0.0f);
  if (transpose) {
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < K; ++k) A[m * Kpad + k] = cast_value<bfloat16>(src[k * ld + m]);
      for (int64_t k = K; k < Kpad; ++k) A[m * Kpad + k] = zero;
    }
    return;
  }
  for (int64_t m = 0; m < M; ++m) {
    const float* s = src + m * ld;
    bfloat16* a = A + m * Kpad;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(a + k), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s + k)));
    for (; k < K; ++k) a[k] = cast_value<bfloat16>(s[k]);
    for (; k < Kpad; ++k) a[k] = zero;
  }
}
}  // namespace bf16t

// D and Dv must be even (pairs along them are read straight from q, k, v, dO).
bool bf16_tiles_apply(const AttentionDims& d) { return d.D % 2 == 0 && d.Dv % 2 == 0 && d.D > 0 && d.Dv > 0; }

void attention_forward_bf16(const bfloat16* q, const bfloat16* k, const bfloat16* v, bfloat16* o, float* lse,
                            const AttentionDims& d, bool causal, float scale, AttentionTiles tiles) {
  using bf16t::up;
  const int64_t BH = d.B * d.H, Tq = d.Tq, Tk = d.Tk, D = d.D, Dv = d.Dv;
  const int64_t Br = std::max<int64_t>(1, tiles.q), Bc = std::max<int64_t>(1, tiles.k);
  const int64_t nq = (Tq + Br - 1) / Br, nk = (Tk + Bc - 1) / Bc, ldS = up(Bc, 16), Dv16 = up(Dv, 16),
                Bc2 = up(Bc, 2), kt_size = D * ldS, v_size = Bc2 * Dv16;  // bf16 elements per packed key tile
  // Per-thread scratch in floats: S, acc, m, l, the bf16 P tile and V pack, then the bf16 K^T
  // packs of every key tile of the (b, h) slice the thread is on: tasks are (b, h)-major and
  // handed out a slice at a time, so a slice's K^T (a transpose, the costly pack) is built once,
  // not once per query tile. V (a cheap interleave) is packed
  // per tile, which keeps the scratch at one bf16 copy of K per thread.
  const int64_t oS = 0, oAcc = oS + round16(Br * ldS), oM = oAcc + round16(Br * Dv16), oL = oM + round16(Br),
                oPb = oL + round16(Br), oVp = oPb + round16(Br * Bc2 / 2), oKp = oVp + round16(v_size / 2),
                per = oKp + round16(nk * kt_size / 2);
  const bool par = parallel_worth(BH * nq, BH * Tq * Tk * (D + Dv));
  const int nthreads = par ? omp_get_max_threads() : 1;
  // A chunk is one (b, h) slice (its K^T packed once) when there are enough slices to balance
  // the threads; dynamic, so a thread slowed by other work does not hold up the rest.
  const int64_t chunk = BH >= 2 * nthreads ? nq : 1;
  Workspace ws(static_cast<std::size_t>(nthreads * per) * sizeof(float));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
#pragma omp parallel if (par)
  {
    float* base = ws.as<float>() + omp_get_thread_num() * per;
    float *S = base + oS, *acc = base + oAcc, *m = base + oM, *l = base + oL;
    auto* KpAll = reinterpret_cast<bfloat16*>(base + oKp);
    auto* Vp = reinterpret_cast<bfloat16*>(base + oVp);
    auto* Pb = reinterpret_cast<bfloat16*>(base + oPb);
    int64_t packed_bh = -1, packed_tiles = 0;  // key tiles [0, packed_tiles) of slice packed_bh are packed
#pragma omp for schedule(dynamic, chunk)
    for (int64_t task = 0; task < BH * nq; ++task) {
      const int64_t bh = task / nq, i0 = (task % nq) * Br, br = std::min(Br, Tq - i0);
      const bfloat16* Q = q + (bh * Tq + i0) * D;
      if (bh != packed_bh) packed_bh = bh, packed_tiles = 0;
      std::fill(m, m + br, kNegInf);
      std::fill(l, l + br, 0.0f);
      std::fill(acc, acc + br * Dv16, 0.0f);
      const int64_t kend = causal ? std::min(Tk, i0 + br) : Tk;
      for (int64_t j0 = 0; j0 < kend; j0 += Bc) {
        // The tile's extent in the packs is its full extent in the slice (a causal tile cut at
        // kend for this query tile is a prefix of it; the extra keys are masked below).
        const int64_t tile = j0 / Bc, full = std::min(Bc, Tk - j0), bc = std::min(Bc, kend - j0),
                      bc16 = up(full, 16), bc2 = up(full, 2);
        bfloat16* Kp = KpAll + tile * kt_size;
        for (; packed_tiles <= tile; ++packed_tiles) {
          const int64_t t0 = packed_tiles * Bc, tb = std::min(Bc, Tk - t0);
          bf16t::pack_cols(k + (bh * Tk + t0) * D, D, D, tb, up(tb, 16), KpAll + packed_tiles * kt_size);
        }
        bf16t::mm(br, bc16, D / 2, scale, Q, D, Kp, false, S, ldS);  // S = scale Q K^T
        for (int64_t r = 0; r < br; ++r) {  // online softmax, as in the f32 kernel
          float* s = S + r * ldS;
          const int64_t nv = visible(causal, i0 + r, j0, bc);
          float mx = kNegInf;
#pragma omp simd reduction(max : mx)
          for (int64_t c = 0; c < nv; ++c) mx = std::max(mx, s[c]);
          const float mnew = std::max(m[r], mx);
          if (mnew == kNegInf) {
            std::fill(s, s + bc, 0.0f);
            continue;
          }
          const float corr = exp_f32(m[r] - mnew);
          float sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int64_t c = 0; c < nv; ++c) {
            const float p = exp_f32(s[c] - mnew);
            s[c] = p;
            sum += p;
          }
          std::fill(s + nv, s + bc, 0.0f);
          l[r] = l[r] * corr + sum;
          m[r] = mnew;
          if (corr != 1.0f) {
            float* a = acc + r * Dv16;
#pragma omp simd
            for (int64_t c = 0; c < Dv; ++c) a[c] *= corr;
          }
        }
        bf16t::a_from(S, ldS, br, bc, bc2, false, Pb);  // columns [bc, bc2) are zero: masked keys
        bf16t::pack_rows(v + (bh * Tk + j0) * Dv, Dv, full, Dv, Dv16, Vp);
        bf16t::mm(br, Dv16, bc2 / 2, 1.0f, Pb, bc2, Vp, true, acc, Dv16);  // acc += P V
      }
      for (int64_t r = 0; r < br; ++r) {
        const float inv = 1.0f / l[r];
        bfloat16* orow = o + (bh * Tq + i0 + r) * Dv;
        const float* a = acc + r * Dv16;
        for (int64_t c = 0; c < Dv; ++c) orow[c] = cast_value<bfloat16>(a[c] * inv);
        lse[bh * Tq + i0 + r] = m[r] + std::log(l[r]);
      }
    }
  }
}

void attention_backward_bf16(const bfloat16* q, const bfloat16* k, const bfloat16* v, const bfloat16* o,
                             const bfloat16* dout, const float* lse, bfloat16* dq, bfloat16* dk, bfloat16* dv,
                             const AttentionDims& d, bool causal, float scale, AttentionTiles tiles) {
  using bf16t::up;
  const int64_t BH = d.B * d.H, Tq = d.Tq, Tk = d.Tk, D = d.D, Dv = d.Dv;
  const int64_t Br = std::max<int64_t>(1, tiles.q), Bc = std::max<int64_t>(1, tiles.k);
  const int64_t nq = (Tq + Br - 1) / Br, ldS = up(Bc, 16), D16 = up(D, 16), Dv16 = up(Dv, 16), Br2 = up(Br, 2),
                Bc2 = up(Bc, 2);
  // Per-thread scratch (floats): P, dS, Delta, f32 dQ/dK/dV of the slice, then bf16 packs:
  // every query tile of Q and dO (B operands along rows), K^T, V^T, K of the key tile, and
  // the bf16 A operands P^T, dS, dS^T.
  const int64_t oP = 0, odS = oP + round16(Br * ldS), oDelta = odS + round16(Br * ldS), odQ = oDelta + round16(Tq),
                odK = odQ + round16(Tq * D16), odV = odK + round16(Tk * D16), oQp = odV + round16(Tk * Dv16),
                odOp = oQp + round16(nq * Br2 * D16 / 2), oKT = odOp + round16(nq * Br2 * Dv16 / 2),
                oVT = oKT + round16(D * ldS / 2), oKp = oVT + round16(Dv * ldS / 2), oPT = oKp + round16(Bc2 * D16 / 2),
                odSb = oPT + round16(Bc * Br2 / 2), odST = odSb + round16(Br * Bc2 / 2), per = odST + round16(Bc * Br2 / 2);
  const bool par = parallel_worth(BH, BH * Tq * Tk * (D + Dv));
  const int nthreads = par ? omp_get_max_threads() : 1;
  Workspace ws(static_cast<std::size_t>(nthreads * per) * sizeof(float));
#pragma omp parallel if (par)
  {
    float* base = ws.as<float>() + omp_get_thread_num() * per;
    float *P = base + oP, *dS = base + odS, *Delta = base + oDelta, *dQ = base + odQ, *dK = base + odK,
          *dV = base + odV;
    auto bf = [&](int64_t off) { return reinterpret_cast<bfloat16*>(base + off); };
    bfloat16 *Qp = bf(oQp), *dOp = bf(odOp), *KT = bf(oKT), *VT = bf(oVT), *Kp = bf(oKp), *PT = bf(oPT),
             *dSb = bf(odSb), *dST = bf(odST);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const bfloat16 *Q = q + bh * Tq * D, *K = k + bh * Tk * D, *V = v + bh * Tk * Dv, *dO = dout + bh * Tq * Dv;
      const float* L = lse + bh * Tq;
      std::fill(dQ, dQ + Tq * D16, 0.0f);
      std::fill(dK, dK + Tk * D16, 0.0f);
      std::fill(dV, dV + Tk * Dv16, 0.0f);
      for (int64_t i = 0; i < Tq; ++i) {  // Delta_i = dO_i . O_i
        const bfloat16* orow = o + (bh * Tq + i) * Dv;
        float s = 0;
        for (int64_t c = 0; c < Dv; ++c) s += static_cast<float>(dO[i * Dv + c]) * static_cast<float>(orow[c]);
        Delta[i] = s;
      }
      for (int64_t t = 0; t < nq; ++t) {  // Q_i and dO_i as B operands (K-dim = the tile's rows)
        const int64_t i0 = t * Br, br = std::min(Br, Tq - i0);
        bf16t::pack_rows(Q + i0 * D, D, br, D, D16, Qp + t * Br2 * D16);
        bf16t::pack_rows(dO + i0 * Dv, Dv, br, Dv, Dv16, dOp + t * Br2 * Dv16);
      }
      for (int64_t j0 = 0; j0 < Tk; j0 += Bc) {
        const int64_t bc = std::min(Bc, Tk - j0), bc16 = up(bc, 16), bc2 = up(bc, 2);
        bf16t::pack_cols(K + j0 * D, D, D, bc, bc16, KT);     // for S = Q K_j^T
        bf16t::pack_cols(V + j0 * Dv, Dv, Dv, bc, bc16, VT);  // for dP = dO V_j^T
        bf16t::pack_rows(K + j0 * D, D, bc, D, D16, Kp);      // for dQ += dS K_j
        for (int64_t i0 = causal ? j0 / Br * Br : 0; i0 < Tq; i0 += Br) {
          const int64_t br = std::min(Br, Tq - i0), br2 = up(br, 2), t = i0 / Br;
          bf16t::mm(br, bc16, D / 2, scale, Q + i0 * D, D, KT, false, P, ldS);  // S = scale Q_i K_j^T
          for (int64_t r = 0; r < br; ++r) {  // P = exp(S - L)
            float* p = P + r * ldS;
            const int64_t nv = visible(causal, i0 + r, j0, bc);
            const float Lr = L[i0 + r];
#pragma omp simd
            for (int64_t c = 0; c < nv; ++c) p[c] = exp_f32(p[c] - Lr);
            std::fill(p + nv, p + bc, 0.0f);
          }
          bf16t::a_from(P, ldS, bc, br, br2, true, PT);  // dV_j += P^T dO_i
          bf16t::mm(bc, Dv16, br2 / 2, 1.0f, PT, br2, dOp + t * Br2 * Dv16, true, dV + j0 * Dv16, Dv16);
          bf16t::mm(br, bc16, Dv / 2, 1.0f, dO + i0 * Dv, Dv, VT, false, dS, ldS);  // dP = dO_i V_j^T
          for (int64_t r = 0; r < br; ++r) {  // dS = P * (dP - Delta)
            float* ds = dS + r * ldS;
            const float* p = P + r * ldS;
            const float del = Delta[i0 + r];
#pragma omp simd
            for (int64_t c = 0; c < bc; ++c) ds[c] = p[c] * (ds[c] - del);
          }
          bf16t::a_from(dS, ldS, br, bc, bc2, false, dSb);  // dQ_i += scale dS K_j
          bf16t::mm(br, D16, bc2 / 2, scale, dSb, bc2, Kp, true, dQ + i0 * D16, D16);
          bf16t::a_from(dS, ldS, bc, br, br2, true, dST);  // dK_j += scale dS^T Q_i
          bf16t::mm(bc, D16, br2 / 2, scale, dST, br2, Qp + t * Br2 * D16, true, dK + j0 * D16, D16);
        }
      }
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t c = 0; c < D; ++c) dq[(bh * Tq + i) * D + c] = cast_value<bfloat16>(dQ[i * D16 + c]);
      for (int64_t j = 0; j < Tk; ++j) {
        for (int64_t c = 0; c < D; ++c) dk[(bh * Tk + j) * D + c] = cast_value<bfloat16>(dK[j * D16 + c]);
        for (int64_t c = 0; c < Dv; ++c) dv[(bh * Tk + j) * Dv + c] = cast_value<bfloat16>(dV[j * Dv16 + c]);
      }
    }
  }
}
#endif  // __AVX512BF16__

}  // namespace

template <class T>
void attention_forward(const T* q, const T* k, const T* v, T* o, attn_acc_t<T>* lse, const AttentionDims& d,
                       bool causal, double scale_d, AttentionTiles tiles) {
  using C = attn_acc_t<T>;
  constexpr bool kConvert = !std::is_same_v<T, C>;
  const int64_t BH = d.B * d.H, Tq = d.Tq, Tk = d.Tk, D = d.D, Dv = d.Dv;
  if (BH == 0 || Tq == 0) return;
  if (Tk == 0) {  // no keys: empty sum -> zero output, lse = -inf
    std::fill(o, o + BH * Tq * Dv, cast_value<T>(0.0f));
    std::fill(lse, lse + BH * Tq, -std::numeric_limits<C>::infinity());
    return;
  }
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, bfloat16>)
    if (bf16_tiles_apply(d)) return attention_forward_bf16(q, k, v, o, lse, d, causal, static_cast<float>(scale_d), tiles);
#endif
  const C scale = static_cast<C>(scale_d);
  const int64_t Br = std::max<int64_t>(1, tiles.q), Bc = std::max<int64_t>(1, tiles.k);
  const int64_t nq = (Tq + Br - 1) / Br;
  // Per-thread scratch: score/probability tile S, output accumulator, running max m and sum l,
  // and (half inputs) the converted q/k/v tiles.
  const int64_t oS = 0, oAcc = oS + round16(Br * Bc), oM = oAcc + round16(Br * Dv), oL = oM + round16(Br),
                oQ = oL + round16(Br), oK = oQ + (kConvert ? round16(Br * D) : 0),
                oV = oK + (kConvert ? round16(Bc * D) : 0), per = oV + (kConvert ? round16(Bc * Dv) : 0);
  const bool par = parallel_worth(BH * nq, BH * Tq * Tk * (D + Dv));
  const int nthreads = par ? omp_get_max_threads() : 1;
  Workspace ws(static_cast<std::size_t>(nthreads * per) * sizeof(C));

#pragma omp parallel if (par)
  {
    C* base = ws.as<C>() + omp_get_thread_num() * per;
    C *S = base + oS, *acc = base + oAcc, *m = base + oM, *l = base + oL;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < BH * nq; ++task) {
      const int64_t bh = task / nq, i0 = (task % nq) * Br, br = std::min(Br, Tq - i0);
      const C* Q = load<C>(q + (bh * Tq + i0) * D, br * D, base + oQ);
      std::fill(m, m + br, -std::numeric_limits<C>::infinity());
      std::fill(l, l + br, C(0));
      std::fill(acc, acc + br * Dv, C(0));
      // Causal: keys past the tile's last query row are masked for every row -> not visited.
      const int64_t kend = causal ? std::min(Tk, i0 + br) : Tk;
      for (int64_t j0 = 0; j0 < kend; j0 += Bc) {
        const int64_t bc = std::min(Bc, kend - j0);
        const C* K = load<C>(k + (bh * Tk + j0) * D, bc * D, base + oK);
        const C* V = load<C>(v + (bh * Tk + j0) * Dv, bc * Dv, base + oV);
        mm(false, true, br, bc, D, scale, Q, D, K, D, C(0), S, bc);  // S = scale * Q K^T   [br, bc]
        for (int64_t r = 0; r < br; ++r) {  // online softmax, one row at a time
          C* s = S + r * bc;
          const int64_t nv = visible(causal, i0 + r, j0, bc);
          C mx = -std::numeric_limits<C>::infinity();
#pragma omp simd reduction(max : mx)
          for (int64_t c = 0; c < nv; ++c) mx = std::max(mx, s[c]);
          const C mnew = std::max(m[r], mx);
          if (mnew == -std::numeric_limits<C>::infinity()) {  // nothing visible yet in this row
            std::fill(s, s + bc, C(0));
            continue;
          }
          const C corr = exp_c(m[r] - mnew);  // rescales what was accumulated under the old max
          C sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int64_t c = 0; c < nv; ++c) {
            const C p = exp_c(s[c] - mnew);
            s[c] = p;
            sum += p;
          }
          std::fill(s + nv, s + bc, C(0));  // masked keys get probability 0
          l[r] = l[r] * corr + sum;
          m[r] = mnew;
          if (corr != C(1)) {
            C* a = acc + r * Dv;
#pragma omp simd
            for (int64_t c = 0; c < Dv; ++c) a[c] *= corr;
          }
        }
        mm(false, false, br, Dv, bc, C(1), S, bc, V, Dv, C(1), acc, Dv);  // acc += P V
      }
      for (int64_t r = 0; r < br; ++r) {  // O = acc / l, L = m + log l
        const C inv = C(1) / l[r];
        T* orow = o + (bh * Tq + i0 + r) * Dv;
        const C* a = acc + r * Dv;
        for (int64_t c = 0; c < Dv; ++c) orow[c] = cast_value<T>(a[c] * inv);
        lse[bh * Tq + i0 + r] = m[r] + std::log(l[r]);
      }
    }
  }
}

template <class T>
void attention_backward(const T* q, const T* k, const T* v, const T* o, const T* dout, const attn_acc_t<T>* lse,
                        T* dq, T* dk, T* dv, const AttentionDims& d, bool causal, double scale_d, AttentionTiles tiles) {
  using C = attn_acc_t<T>;
  constexpr bool kConvert = !std::is_same_v<T, C>;
  const int64_t BH = d.B * d.H, Tq = d.Tq, Tk = d.Tk, D = d.D, Dv = d.Dv;
  if (Tq == 0 || Tk == 0) {  // no score entries: every gradient is zero
    std::fill(dq, dq + BH * Tq * D, cast_value<T>(0.0f));
    std::fill(dk, dk + BH * Tk * D, cast_value<T>(0.0f));
    std::fill(dv, dv + BH * Tk * Dv, cast_value<T>(0.0f));
    return;
  }
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, bfloat16>)
    if (bf16_tiles_apply(d))
      return attention_backward_bf16(q, k, v, o, dout, lse, dq, dk, dv, d, causal, static_cast<float>(scale_d), tiles);
#endif
  const C scale = static_cast<C>(scale_d);
  const int64_t Br = std::max<int64_t>(1, tiles.q), Bc = std::max<int64_t>(1, tiles.k);
  // Per-thread scratch: P and dP/dS tiles, Delta for every query row of the (b, h) slice, and for
  // half inputs f32 copies of the slice's q, k, v, dO and f32 gradient accumulators.
  const int64_t oP = 0, odP = oP + round16(Br * Bc), oDelta = odP + round16(Br * Bc),
                oQ = oDelta + round16(Tq), cq = kConvert ? round16(Tq * D) : 0, ck = kConvert ? round16(Tk * D) : 0,
                cv = kConvert ? round16(Tk * Dv) : 0, cdo = kConvert ? round16(Tq * Dv) : 0, oK = oQ + cq, oV = oK + ck,
                odO = oV + cv, odQ = odO + cdo, odK = odQ + cq, odV = odK + ck, per = odV + cv;
  const bool par = parallel_worth(BH, BH * Tq * Tk * (D + Dv));
  const int nthreads = par ? omp_get_max_threads() : 1;
  Workspace ws(static_cast<std::size_t>(nthreads * per) * sizeof(C));

#pragma omp parallel if (par)
  {
    C* base = ws.as<C>() + omp_get_thread_num() * per;
    C *P = base + oP, *dS = base + odP, *Delta = base + oDelta;
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const C* Q = load<C>(q + bh * Tq * D, Tq * D, base + oQ);
      const C* K = load<C>(k + bh * Tk * D, Tk * D, base + oK);
      const C* V = load<C>(v + bh * Tk * Dv, Tk * Dv, base + oV);
      const C* dO = load<C>(dout + bh * Tq * Dv, Tq * Dv, base + odO);
      const C* L = lse + bh * Tq;
      C *dQ, *dK, *dV;  // accumulators: the outputs themselves when T == C
      if constexpr (kConvert) {
        dQ = base + odQ, dK = base + odK, dV = base + odV;
      } else {
        dQ = dq + bh * Tq * D, dK = dk + bh * Tk * D, dV = dv + bh * Tk * Dv;
      }
      std::fill(dQ, dQ + Tq * D, C(0));
      std::fill(dK, dK + Tk * D, C(0));
      std::fill(dV, dV + Tk * Dv, C(0));
      // Delta_i = sum_c dO_ic O_ic = sum_j P_ij dP_ij: the softmax Jacobian's rank-one term.
      for (int64_t i = 0; i < Tq; ++i) {
        const T* orow = o + (bh * Tq + i) * Dv;
        const C* grow = dO + i * Dv;
        C s = 0;
        for (int64_t c = 0; c < Dv; ++c) s += grow[c] * static_cast<C>(cast_value<C>(orow[c]));
        Delta[i] = s;
      }
      for (int64_t j0 = 0; j0 < Tk; j0 += Bc) {  // key tile j: dK_j, dV_j accumulate over query tiles
        const int64_t bc = std::min(Bc, Tk - j0);
        const C *Kj = K + j0 * D, *Vj = V + j0 * Dv;
        // Causal: query rows i < j0 see none of these keys; start at the tile holding row j0.
        for (int64_t i0 = causal ? j0 / Br * Br : 0; i0 < Tq; i0 += Br) {
          const int64_t br = std::min(Br, Tq - i0);
          const C *Qi = Q + i0 * D, *dOi = dO + i0 * Dv;
          // S = scale Q_i K_j^T, then P = exp(S - L): the forward's softmax, recomputed from lse.
          mm(false, true, br, bc, D, scale, Qi, D, Kj, D, C(0), P, bc);
          for (int64_t r = 0; r < br; ++r) {
            C* p = P + r * bc;
            const int64_t nv = visible(causal, i0 + r, j0, bc);
            const C Lr = L[i0 + r];
#pragma omp simd
            for (int64_t c = 0; c < nv; ++c) p[c] = exp_c(p[c] - Lr);
            std::fill(p + nv, p + bc, C(0));
          }
          // dV_j += P^T dO_i            (O = P V)
          mm(true, false, bc, Dv, br, C(1), P, bc, dOi, Dv, C(1), dV + j0 * Dv, Dv);
          // dP = dO_i V_j^T             (dL/dP)
          mm(false, true, br, bc, Dv, C(1), dOi, Dv, Vj, Dv, C(0), dS, bc);
          // dS = P * (dP - Delta)       (softmax backward; masked entries have P = 0)
          for (int64_t r = 0; r < br; ++r) {
            C* ds = dS + r * bc;
            const C* p = P + r * bc;
            const C del = Delta[i0 + r];
#pragma omp simd
            for (int64_t c = 0; c < bc; ++c) ds[c] = p[c] * (ds[c] - del);
          }
          // dQ_i += scale dS K_j         (S = scale Q K^T)
          mm(false, false, br, D, bc, scale, dS, bc, Kj, D, C(1), dQ + i0 * D, D);
          // dK_j += scale dS^T Q_i
          mm(true, false, bc, D, br, scale, dS, bc, Qi, D, C(1), dK + j0 * D, D);
        }
      }
      if constexpr (kConvert) {
        store(dQ, Tq * D, dq + bh * Tq * D);
        store(dK, Tk * D, dk + bh * Tk * D);
        store(dV, Tk * Dv, dv + bh * Tk * Dv);
      }
    }
  }
}

#define ATHANOR_INSTANTIATE_ATTENTION(T)                                                                        \
  template void attention_forward<T>(const T*, const T*, const T*, T*, attn_acc_t<T>*, const AttentionDims&, bool, \
                                     double, AttentionTiles);                                                   \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, const T*, const attn_acc_t<T>*, T*,  \
                                      T*, T*, const AttentionDims&, bool, double, AttentionTiles);
ATHANOR_INSTANTIATE_ATTENTION(float)
ATHANOR_INSTANTIATE_ATTENTION(double)
ATHANOR_INSTANTIATE_ATTENTION(bfloat16)
ATHANOR_INSTANTIATE_ATTENTION(float16)
#undef ATHANOR_INSTANTIATE_ATTENTION

namespace ref {
namespace {
struct RefDims {
  int64_t BH, Tq, Tk, D, Dv;
};
RefDims ref_dims(const Tensor& q, const Tensor& k, const Tensor& v, const char* op) {
  ATH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, "expected 4-D q, k, v, got ", q.describe(), ", ",
            k.describe(), ", ", v.describe());
  return {q.size(0) * q.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
}
// Full probability matrix P [Tq, Tk] of slice bh, in double.
std::vector<double> probs(const std::vector<double>& qv, const std::vector<double>& kv, const RefDims& d, int64_t bh,
                          bool causal, double scale) {
  std::vector<double> P(d.Tq * d.Tk);
  for (int64_t i = 0; i < d.Tq; ++i) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < d.Tk; ++j) {
      double s = 0;
      for (int64_t c = 0; c < d.D; ++c) s += qv[(bh * d.Tq + i) * d.D + c] * kv[(bh * d.Tk + j) * d.D + c];
      s = causal && j > i ? -std::numeric_limits<double>::infinity() : s * scale;
      P[i * d.Tk + j] = s;
      mx = std::max(mx, s);
    }
    double sum = 0;
    for (int64_t j = 0; j < d.Tk; ++j) sum += (P[i * d.Tk + j] = std::exp(P[i * d.Tk + j] - mx));
    for (int64_t j = 0; j < d.Tk; ++j) P[i * d.Tk + j] /= sum;
  }
  return P;
}
}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  const RefDims d = ref_dims(q, k, v, "ref::attention");
  const auto qv = q.to_vector(), kv = k.to_vector(), vv = v.to_vector();
  std::vector<double> out(d.BH * d.Tq * d.Dv, 0.0);
  for (int64_t bh = 0; bh < d.BH; ++bh) {
    const auto P = probs(qv, kv, d, bh, causal, scale);
    for (int64_t i = 0; i < d.Tq; ++i)
      for (int64_t c = 0; c < d.Dv; ++c) {
        double s = 0;
        for (int64_t j = 0; j < d.Tk; ++j) s += P[i * d.Tk + j] * vv[(bh * d.Tk + j) * d.Dv + c];
        out[(bh * d.Tq + i) * d.Dv + c] = s;
      }
  }
  return from_vector(out, {q.size(0), q.size(1), d.Tq, d.Dv}, TensorOptions(DType::f64));
}

std::array<Tensor, 3> attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                                         bool causal, double scale) {
  const RefDims d = ref_dims(q, k, v, "ref::attention_backward");
  const auto qv = q.to_vector(), kv = k.to_vector(), vv = v.to_vector(), gv = dout.to_vector();
  std::vector<double> dq(qv.size(), 0.0), dk(kv.size(), 0.0), dvv(vv.size(), 0.0);
  for (int64_t bh = 0; bh < d.BH; ++bh) {
    const auto P = probs(qv, kv, d, bh, causal, scale);
    std::vector<double> dP(d.Tq * d.Tk);
    for (int64_t i = 0; i < d.Tq; ++i)
      for (int64_t j = 0; j < d.Tk; ++j) {
        double s = 0;  // dP_ij = dO_i . v_j ; dv_j += P_ij dO_i
        for (int64_t c = 0; c < d.Dv; ++c) {
          s += gv[(bh * d.Tq + i) * d.Dv + c] * vv[(bh * d.Tk + j) * d.Dv + c];
          dvv[(bh * d.Tk + j) * d.Dv + c] += P[i * d.Tk + j] * gv[(bh * d.Tq + i) * d.Dv + c];
        }
        dP[i * d.Tk + j] = s;
      }
    for (int64_t i = 0; i < d.Tq; ++i) {
      double rowdot = 0;  // softmax Jacobian: dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij')
      for (int64_t j = 0; j < d.Tk; ++j) rowdot += P[i * d.Tk + j] * dP[i * d.Tk + j];
      for (int64_t j = 0; j < d.Tk; ++j) {
        const double ds = P[i * d.Tk + j] * (dP[i * d.Tk + j] - rowdot) * scale;
        for (int64_t c = 0; c < d.D; ++c) {
          dq[(bh * d.Tq + i) * d.D + c] += ds * kv[(bh * d.Tk + j) * d.D + c];
          dk[(bh * d.Tk + j) * d.D + c] += ds * qv[(bh * d.Tq + i) * d.D + c];
        }
      }
    }
  }
  const TensorOptions f64(DType::f64);
  return {from_vector(dq, q.sizes(), f64), from_vector(dk, k.sizes(), f64), from_vector(dvv, v.sizes(), f64)};
}
}  // namespace ref

}  // namespace athanor::cpu
