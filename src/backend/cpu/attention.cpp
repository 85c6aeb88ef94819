// Flash-attention CPU kernels (see attention.h for the invariants), compiled once per ISA
// level (isa_kernel.h), and the naive reference.
#include "backend/cpu/attention.h"

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
#include "backend/cpu/attention_tiles.h"
#include "backend/cpu/workspace.h"

ATHANOR_ISA_BEGIN

namespace {

using namespace attention_tiles;  // the tile products (attention_tiles.h)

#if ATHANOR_CPU_AVX512  // bf16 tiles: vdpbf16ps, or its sums in FMAs at the avx512 level
// D and Dv must be even (pairs along them are read straight from q, k, v, dO).
bool bf16_tiles_apply(const AttentionDims& d) { return d.D % 2 == 0 && d.Dv % 2 == 0 && d.D > 0 && d.Dv > 0; }

void attention_forward_bf16(const bfloat16* q, const bfloat16* k, const bfloat16* v, bfloat16* o, float* lse,
                            const AttentionDims& d, const AttentionLayout& L, bool causal, float scale,
                            AttentionTiles tiles) {
  using bf16t::up;
  const int64_t BH = d.B * d.H, Tq = d.Tq, Tk = d.Tk, D = d.D, Dv = d.Dv;
  const int64_t Br = std::max<int64_t>(1, tiles.q), Bc = std::max<int64_t>(1, tiles.k);
  const int64_t nq = (Tq + Br - 1) / Br, nk = (Tk + Bc - 1) / Bc, ldS = up(Bc, 16), Dv16 = up(Dv, 16),
                Bc2 = up(Bc, 2), kt_size = D * ldS, v_size = Bc2 * Dv16;  // bf16 elements per packed key tile
  // Per-thread scratch in floats: S, acc, m, l, the bf16 P tile and V pack, then the bf16 K^T
  // packs of every key tile of the (b, h) slice the thread is on: tasks are (b, h)-major and
  // handed out a slice at a time, so a slice's K^T (a transpose) is built once, not once per
  // query tile. V (an interleave of row pairs, cheap) is packed per tile, which keeps the
  // scratch at one bf16 copy of K per thread.
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
    // key tiles [0, packed_tiles) of kv slice packed_bh are packed (a group's query heads reuse them)
    int64_t packed_bh = -1, packed_tiles = 0;
#pragma omp for schedule(dynamic, chunk)
    for (int64_t task = 0; task < BH * nq; ++task) {
      const int64_t bh = task / nq, i0 = (task % nq) * Br, br = std::min(Br, Tq - i0);
      const bfloat16* Q = q + slice_at(L.q, bh, d.H) + i0 * L.q.t;
      if (d.kv_slice(bh) != packed_bh) packed_bh = d.kv_slice(bh), packed_tiles = 0;
      std::fill(m, m + br, kNegInf);
      std::fill(l, l + br, 0.0f);
      std::fill(acc, acc + br * Dv16, 0.0f);
      const int64_t kend = causal ? std::min(Tk, i0 + br) : Tk;
      for (int64_t j0 = 0; j0 < kend; j0 += Bc) {
        // The tile's extent in the packs is its full extent in the slice (a causal tile cut at
        // kend for this query tile is a prefix of it; the extra keys are masked below).
        const int64_t tile = j0 / Bc, bc = std::min(Bc, kend - j0), bc16 = up(std::min(Bc, Tk - j0), 16),
                      bc2 = up(bc, 2);
        for (; packed_tiles <= tile; ++packed_tiles) {
          const int64_t t0 = packed_tiles * Bc, tb = std::min(Bc, Tk - t0);
          bf16t::pack_cols(k + kv_at(L.k, d, bh) + t0 * L.k.t, L.k.t, D, tb, up(tb, 16),
                           KpAll + packed_tiles * kt_size);
        }
        bf16t::mm(br, bc16, D / 2, scale, Q, L.q.t, KpAll + tile * kt_size, false, S, ldS);  // S = scale Q K^T
        for (int64_t r = 0; r < br; ++r) {  // online softmax, as in the f32 kernel
          float* s = S + r * ldS;
          const int64_t nv = visible(causal, i0 + r, j0, bc);
          const float mnew = std::max(m[r], row_max(s, nv));
          if (mnew == kNegInf) {
            std::fill(s, s + bc, 0.0f);
            continue;
          }
          const float corr = exp_f32(m[r] - mnew);
          l[r] = l[r] * corr + row_exp(s, nv, bc, mnew);
          m[r] = mnew;
          if (corr != 1.0f) row_scale(acc + r * Dv16, Dv, corr);
        }
        bf16t::a_from(S, ldS, br, bc, bc2, Pb);  // columns [bc, bc2) are zero: masked keys
        bf16t::pack_rows(v + kv_at(L.v, d, bh) + j0 * L.v.t, L.v.t, std::min(Bc, Tk - j0), Dv, Dv16, Vp);
        bf16t::mm(br, Dv16, bc2 / 2, 1.0f, Pb, bc2, Vp, true, acc, Dv16);  // acc += P V
      }
      for (int64_t r = 0; r < br; ++r) {
        bf16t::store_row(acc + r * Dv16, Dv, 1.0f / l[r], o + slice_at(L.o, bh, d.H) + (i0 + r) * L.o.t);
        lse[bh * Tq + i0 + r] = m[r] + std::log(l[r]);
      }
    }
  }
}

void attention_backward_bf16(const bfloat16* q, const bfloat16* k, const bfloat16* v, const bfloat16* o,
                             const bfloat16* dout, const float* lse, bfloat16* dq, bfloat16* dk, bfloat16* dv,
                             const AttentionDims& d, const AttentionLayout& L, bool causal, float scale,
                             AttentionTiles tiles) {
  using bf16t::up;
  const int64_t BH = d.B * d.H, Tq = d.Tq, Tk = d.Tk, D = d.D, Dv = d.Dv;
  const int64_t Br = std::max<int64_t>(1, tiles.q), Bc = std::max<int64_t>(1, tiles.k);
  const int64_t nq = (Tq + Br - 1) / Br, ldS = up(Bc, 16), D16 = up(D, 16), Dv16 = up(Dv, 16), Br2 = up(Br, 2),
                Bc2 = up(Bc, 2);
  // Per-thread scratch (floats): P, dS, Delta, f32 dQ/dK/dV of the slice, then bf16 packs:
  // every query tile of Q and dO (B operands along rows), K^T, V^T, K of the key tile, and
  // the bf16 A operands P^T and dS^T (pair layout, see bf16t::pairs_from) and dS.
  const int64_t oP = 0, odS = oP + round16(Br * ldS), oDelta = odS + round16(Br * ldS), odQ = oDelta + round16(Tq),
                odK = odQ + round16(Tq * D16), odV = odK + round16(Tk * D16), oQp = odV + round16(Tk * Dv16),
                odOp = oQp + round16(nq * Br2 * D16 / 2), oKT = odOp + round16(nq * Br2 * Dv16 / 2),
                oVT = oKT + round16(D * ldS / 2), oKp = oVT + round16(Dv * ldS / 2), oPT = oKp + round16(Bc2 * D16 / 2),
                odSb = oPT + round16(Br2 * ldS / 2), odST = odSb + round16(Br * Bc2 / 2), per = odST + round16(Br2 * ldS / 2);
  const int64_t Hkv = d.kv_heads(), G = d.group(), BKV = d.B * Hkv;
  const bool par = parallel_worth(BKV, BH * Tq * Tk * (D + Dv));
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
    // A task is one kv slice and the G query heads that read it: dK, dV accumulate over them.
#pragma omp for schedule(dynamic, 1)  // slices are independent: dynamic keeps a slowed thread from holding up the rest
    for (int64_t bkv = 0; bkv < BKV; ++bkv) {
      const int64_t ldq = L.q.t, ldk = L.k.t, ldv = L.v.t, ldo = L.o.t;
      const bfloat16 *K = k + slice_at(L.k, bkv, Hkv), *V = v + slice_at(L.v, bkv, Hkv);
      std::fill(dK, dK + Tk * D16, 0.0f);
      std::fill(dV, dV + Tk * Dv16, 0.0f);
      for (int64_t gi = 0; gi < G; ++gi) {
        const int64_t bh = bkv / Hkv * d.H + bkv % Hkv * G + gi;
        const bfloat16 *Q = q + slice_at(L.q, bh, d.H), *dO = dout + slice_at(L.o, bh, d.H), *O = o + slice_at(L.o, bh, d.H);
        const float* Lse = lse + bh * Tq;
        std::fill(dQ, dQ + Tq * D16, 0.0f);
        for (int64_t i = 0; i < Tq; ++i) {  // Delta_i = dO_i . O_i
          __m512 s = _mm512_setzero_ps();
          for (int64_t c = 0; c < Dv; c += 16) {
            const __mmask16 m = vec::tail_mask(Dv - c);
            s = _mm512_fmadd_ps(vec::load16(dO + i * ldo + c, m), vec::load16(O + i * ldo + c, m), s);
          }
          Delta[i] = _mm512_reduce_add_ps(s);
        }
        for (int64_t t = 0; t < nq; ++t) {  // Q_i and dO_i as B operands (K-dim = the tile's rows)
          const int64_t i0 = t * Br, br = std::min(Br, Tq - i0);
          bf16t::pack_rows(Q + i0 * ldq, ldq, br, D, D16, Qp + t * Br2 * D16);
          bf16t::pack_rows(dO + i0 * ldo, ldo, br, Dv, Dv16, dOp + t * Br2 * Dv16);
        }
        for (int64_t j0 = 0; j0 < Tk; j0 += Bc) {
          const int64_t bc = std::min(Bc, Tk - j0), bc16 = up(bc, 16), bc2 = up(bc, 2);
          bf16t::pack_cols(K + j0 * ldk, ldk, D, bc, bc16, KT);   // for S = Q K_j^T
          bf16t::pack_cols(V + j0 * ldv, ldv, Dv, bc, bc16, VT);  // for dP = dO V_j^T
          bf16t::pack_rows(K + j0 * ldk, ldk, bc, D, D16, Kp);    // for dQ += dS K_j
          for (int64_t i0 = causal ? j0 / Br * Br : 0; i0 < Tq; i0 += Br) {
            const int64_t br = std::min(Br, Tq - i0), br2 = up(br, 2), t = i0 / Br;
            bf16t::mm(br, bc16, D / 2, scale, Q + i0 * ldq, ldq, KT, false, P, ldS);  // S = scale Q_i K_j^T
            for (int64_t r = 0; r < br; ++r)  // P = exp(S - L), masked keys 0
              row_exp(P + r * ldS, visible(causal, i0 + r, j0, bc), bc, Lse[i0 + r]);
            bf16t::pairs_from(P, ldS, br, bc, bc16, PT);  // dV_j += P^T dO_i
            bf16t::mm(bc, Dv16, br2 / 2, 1.0f, PT, 2, 2 * bc16, dOp + t * Br2 * Dv16, true, dV + j0 * Dv16, Dv16);
            bf16t::mm(br, bc16, Dv / 2, 1.0f, dO + i0 * ldo, ldo, VT, false, dS, ldS);  // dP = dO_i V_j^T
            for (int64_t r = 0; r < br; ++r) {  // dS = P * (dP - Delta)
              float* ds = dS + r * ldS;
              const float* p = P + r * ldS;
              const float del = Delta[i0 + r];
#pragma omp simd
              for (int64_t c = 0; c < bc; ++c) ds[c] = p[c] * (ds[c] - del);
            }
            bf16t::a_from(dS, ldS, br, bc, bc2, dSb);  // dQ_i += scale dS K_j
            bf16t::mm(br, D16, bc2 / 2, scale, dSb, bc2, Kp, true, dQ + i0 * D16, D16);
            bf16t::pairs_from(dS, ldS, br, bc, bc16, dST);  // dK_j += scale dS^T Q_i
            bf16t::mm(bc, D16, br2 / 2, scale, dST, 2, 2 * bc16, Qp + t * Br2 * D16, true, dK + j0 * D16, D16);
          }
        }
        bfloat16* dQo = dq + slice_at(L.q, bh, d.H);
        for (int64_t i = 0; i < Tq; ++i) bf16t::store_row(dQ + i * D16, D, 1.0f, dQo + i * ldq);
      }  // query heads of the group
      bfloat16 *dKo = dk + slice_at(L.k, bkv, Hkv), *dVo = dv + slice_at(L.v, bkv, Hkv);
      for (int64_t j = 0; j < Tk; ++j) {
        bf16t::store_row(dK + j * D16, D, 1.0f, dKo + j * ldk);
        bf16t::store_row(dV + j * Dv16, Dv, 1.0f, dVo + j * ldv);
      }
    }
  }
}
#endif  // ATHANOR_CPU_AVX512 (bf16 tiles)

}  // namespace

template <class T>
void attention_forward(const T* q, const T* k, const T* v, T* o, attn_acc_t<T>* lse, const AttentionDims& d,
                       const AttentionLayout& L, bool causal, double scale_d, AttentionTiles tiles) {
  using C = attn_acc_t<T>;
  constexpr bool kConvert = !std::is_same_v<T, C>;
  constexpr bool kFusedSoftmax = ATHANOR_CPU_AVX512 && std::is_same_v<C, float>;  // f32t::scores_softmax
  const int64_t BH = d.B * d.H, Tq = d.Tq, Tk = d.Tk, D = d.D, Dv = d.Dv;
  if (BH == 0 || Tq == 0) return;
  if (Tk == 0) {  // no keys: empty sum -> zero output, lse = -inf
    for (int64_t bh = 0; bh < BH; ++bh)
      for (int64_t i = 0; i < Tq; ++i) {
        T* orow = o + slice_at(L.o, bh, d.H) + i * L.o.t;
        std::fill(orow, orow + Dv, cast_value<T>(0.0f));
      }
    std::fill(lse, lse + BH * Tq, -std::numeric_limits<C>::infinity());
    return;
  }
#if ATHANOR_CPU_AVX512
  if constexpr (std::is_same_v<T, bfloat16>)
    if (bf16_tiles_apply(d))
      return attention_forward_bf16(q, k, v, o, lse, d, L, causal, static_cast<float>(scale_d), tiles);
#endif
  const C scale = static_cast<C>(scale_d);
  const int64_t Br = std::max<int64_t>(1, tiles.q), Bc = std::max<int64_t>(1, tiles.k);
  const int64_t nq = (Tq + Br - 1) / Br, nk = (Tk + Bc - 1) / Bc, Bc16 = round16(Bc), kt_size = D * Bc16;
  // Per-thread scratch: score/probability tile S, output accumulator, running max m and sum l,
  // (half inputs) the converted q/k tiles, then K^T of every key tile and a dense V (see
  // dense_rows) of the (b, h) slice the thread is on: tasks are (b, h)-major and handed out a
  // slice at a time where there are enough slices, so a slice's K^T and V are built once, not
  // once per query tile.
  const int64_t oS = 0, oAcc = oS + round16(Br * Bc16), oM = oAcc + round16(Br * Dv), oL = oM + round16(Br),
                oCorr = round16(Br), oQ = oL + 2 * round16(Br), oK = oQ + (kConvert ? round16(Br * D) : 0),
                oKt = oK + (kConvert ? round16(Bc * D) : 0), oVd = oKt + round16(nk * kt_size),
                per = oVd + round16(Tk * Dv);
  const bool par = parallel_worth(BH * nq, BH * Tq * Tk * (D + Dv));
  const int nthreads = par ? omp_get_max_threads() : 1;
  const int64_t chunk = BH >= 2 * nthreads ? nq : 1;
  Workspace ws(static_cast<std::size_t>(nthreads * per) * sizeof(C));

#pragma omp parallel if (par)
  {
    C* base = ws.as<C>() + omp_get_thread_num() * per;
    C *S = base + oS, *acc = base + oAcc, *m = base + oM, *l = base + oL, *KtAll = base + oKt, *Vd = base + oVd;
    // key tiles [0, packed_tiles) of kv slice packed_bh are in KtAll, Vd (a group's query heads reuse them)
    int64_t packed_bh = -1, packed_tiles = 0;
#pragma omp for schedule(dynamic, chunk)
    for (int64_t task = 0; task < BH * nq; ++task) {
      const int64_t bh = task / nq, i0 = (task % nq) * Br, br = std::min(Br, Tq - i0);
      const Rows<C> Q = load_rows<C>(q + slice_at(L.q, bh, d.H) + i0 * L.q.t, L.q.t, br, D, base + oQ);
      if (d.kv_slice(bh) != packed_bh) packed_bh = d.kv_slice(bh), packed_tiles = 0;
      // Ahead of use: this task's O rows; the next query tile's Q rows (the thread's next task
      // when it runs whole slices), or after a slice's last tile, the first tiles of the slice
      // a thread usually takes next.
      prefetch_rows(o + slice_at(L.o, bh, d.H) + i0 * L.o.t, L.o.t, br, Dv, true);
      if (i0 + Br < Tq) {
        prefetch_rows(q + slice_at(L.q, bh, d.H) + (i0 + Br) * L.q.t, L.q.t, std::min(Br, Tq - i0 - Br), D);
      } else if (bh + nthreads < BH) {
        const int64_t nb = bh + nthreads, rows = std::min(Br, Tq), krows = std::min(Bc, Tk);
        prefetch_rows(q + slice_at(L.q, nb, d.H), L.q.t, rows, D);
        prefetch_rows(k + kv_at(L.k, d, nb), L.k.t, krows, D);
        prefetch_rows(v + kv_at(L.v, d, nb), L.v.t, krows, Dv);
      }
      std::fill(m, m + br, -std::numeric_limits<C>::infinity());
      std::fill(l, l + br, C(0));
      std::fill(acc, acc + br * Dv, C(0));
      // Causal: keys past the tile's last query row are masked for every row -> not visited.
      const int64_t kend = causal ? std::min(Tk, i0 + br) : Tk;
      for (int64_t j0 = 0; j0 < kend; j0 += Bc) {
        const int64_t tile = j0 / Bc, bc = std::min(Bc, kend - j0);
        for (; packed_tiles <= tile; ++packed_tiles) {  // K^T of the tile's full extent in the slice
          const int64_t t0 = packed_tiles * Bc, tb = std::min(Bc, Tk - t0);
          const Rows<C> K = load_rows<C>(k + kv_at(L.k, d, bh) + t0 * L.k.t, L.k.t, tb, D, base + oK);
          pack_transposed(K.p, K.ld, tb, D, round16(tb), KtAll + packed_tiles * kt_size);
          dense_rows<C>(v + kv_at(L.v, d, bh) + t0 * L.v.t, L.v.t, tb, Dv, Vd + t0 * Dv);
          if (t0 + Bc < Tk) {  // the next key tile, packed with the next query tile
            const int64_t nrows = std::min(Bc, Tk - t0 - Bc);
            prefetch_rows(k + kv_at(L.k, d, bh) + (t0 + Bc) * L.k.t, L.k.t, nrows, D);
            prefetch_rows(v + kv_at(L.v, d, bh) + (t0 + Bc) * L.v.t, L.v.t, nrows, Dv);
          }
        }
        // Causal tiles on the diagonal: row r sees keys c <= r + (i0 - j0); the products skip
        // score columns no row of a 4-row block sees and the P V terms past the diagonal.
        const int64_t diag = i0 - j0;
        const Causal cols{.cols = causal ? diag : Causal::kAll}, khi{.khi = causal ? diag : Causal::kAll};
        const int64_t ldkt = round16(std::min(Bc, Tk - j0));
        const bool fused_softmax = kFusedSoftmax && bc <= 64;
        C* corr = l + oCorr;  // per row: rescale of what was accumulated under the old max
        if (fused_softmax) {  // scores and softmax in one pass (see f32t::scores_softmax)
#if ATHANOR_CPU_AVX512
          if constexpr (kFusedSoftmax)
            f32t::scores_softmax_tile(br, bc, D, scale, Q.p, Q.ld, KtAll + tile * kt_size, ldkt,
                                      causal ? diag : Causal::kAll, S, Bc16, m, l, corr);
#endif
        } else {
          // S = scale * Q K^T   [br, bc]
          mm(false, false, br, bc, D, scale, Q.p, Q.ld, KtAll + tile * kt_size, ldkt, C(0), S, Bc16, cols);
          for (int64_t r = 0; r < br; ++r)  // online softmax, one row at a time; only s[0, nv) was computed
            corr[r] = softmax_row(S + r * Bc16, visible(causal, i0 + r, j0, bc), bc, m[r], l[r]);
        }
        for (int64_t r = 0; r < br; ++r)
          if (corr[r] != C(1)) row_scale(acc + r * Dv, Dv, corr[r]);
        mm(false, false, br, Dv, bc, C(1), S, Bc16, Vd + j0 * Dv, Dv, C(1), acc, Dv, khi);  // acc += P V
      }
      for (int64_t r = 0; r < br; ++r) {  // O = acc / l, L = m + log l
        const C inv = C(1) / l[r];
        T* orow = o + slice_at(L.o, bh, d.H) + (i0 + r) * L.o.t;
        const C* a = acc + r * Dv;
        for (int64_t c = 0; c < Dv; ++c) orow[c] = cast_value<T>(a[c] * inv);
        lse[bh * Tq + i0 + r] = m[r] + std::log(l[r]);
      }
    }
  }
}

template <class T>
void attention_backward(const T* q, const T* k, const T* v, const T* o, const T* dout, const attn_acc_t<T>* lse,
                        T* dq, T* dk, T* dv, const AttentionDims& d, const AttentionLayout& L, bool causal,
                        double scale_d, AttentionTiles tiles) {
  using C = attn_acc_t<T>;
  constexpr bool kConvert = !std::is_same_v<T, C>;
  constexpr bool kFused = ATHANOR_CPU_AVX512 && std::is_same_v<C, float>;  // f32t::probs_tile, dscores_tile
  const int64_t BH = d.B * d.H, Tq = d.Tq, Tk = d.Tk, D = d.D, Dv = d.Dv;
  if (Tq == 0 || Tk == 0) {  // no score entries: every gradient is zero
    auto zero = [&](T* x, const AttentionStrides& st, int64_t heads, int64_t rows, int64_t cols) {
      for (int64_t bh = 0; bh < d.B * heads; ++bh)
        for (int64_t i = 0; i < rows; ++i) {
          T* row = x + slice_at(st, bh, heads) + i * st.t;
          std::fill(row, row + cols, cast_value<T>(0.0f));
        }
    };
    zero(dq, L.q, d.H, Tq, D), zero(dk, L.k, d.kv_heads(), Tk, D), zero(dv, L.v, d.kv_heads(), Tk, Dv);
    return;
  }
#if ATHANOR_CPU_AVX512
  if constexpr (std::is_same_v<T, bfloat16>)
    if (bf16_tiles_apply(d))
      return attention_backward_bf16(q, k, v, o, dout, lse, dq, dk, dv, d, L, causal, static_cast<float>(scale_d),
                                     tiles);
#endif
  const C scale = static_cast<C>(scale_d);
  const int64_t Br = std::max<int64_t>(1, tiles.q), Bc = std::max<int64_t>(1, tiles.k), Bc16 = round16(Bc);
  // Per-thread scratch: P and dP/dS tiles, K_j^T and V_j^T of the key tile (packed once per key
  // tile, read by every query tile), Delta for every query row of the (b, h) slice, and for half
  // inputs an f32 copy of the slice's v. Q, K and dO are B operands of tile products and dQ, dK,
  // dV their accumulated C operands: always dense (see dense_rows), the gradients written out
  // at the end of the slice.
  const int64_t oP = 0, odP = oP + round16(Br * Bc16), oKt = odP + round16(Br * Bc16), oVt = oKt + round16(D * Bc16),
                oDelta = oVt + round16(Dv * Bc16), oQ = oDelta + round16(Tq), cv = kConvert ? round16(Tk * Dv) : 0,
                oK = oQ + round16(Tq * D), oV = oK + round16(Tk * D), odO = oV + cv, odQ = odO + round16(Tq * Dv),
                odK = odQ + round16(Tq * D), odV = odK + round16(Tk * D), per = odV + round16(Tk * Dv);
  const int64_t Hkv = d.kv_heads(), G = d.group(), BKV = d.B * Hkv;
  const bool par = parallel_worth(BKV, BH * Tq * Tk * (D + Dv));
  const int nthreads = par ? omp_get_max_threads() : 1;
  Workspace ws(static_cast<std::size_t>(nthreads * per) * sizeof(C));
  int64_t npairs = 0;  // tile pairs (key tile, query tile) per slice
  for (int64_t j0 = 0; j0 < Tk; j0 += Bc) npairs += (Tq - (causal ? std::min(Tq, j0 / Br * Br) : 0) + Br - 1) / Br;

#pragma omp parallel if (par)
  {
    C* base = ws.as<C>() + omp_get_thread_num() * per;
    C *P = base + oP, *dS = base + odP, *Kt = base + oKt, *Vt = base + oVt, *Delta = base + oDelta;
    // A task is one kv slice and the G query heads that read it (grouped-query attention; G = 1
    // otherwise): K and V are loaded once, dK and dV accumulate over the group's heads.
#pragma omp for schedule(dynamic, 1)  // slices are independent: dynamic keeps a slowed thread from holding up the rest
    for (int64_t bkv = 0; bkv < BKV; ++bkv) {
      const Rows<C> K = dense_rows<C>(k + slice_at(L.k, bkv, Hkv), L.k.t, Tk, D, base + oK);
      const Rows<C> V = load_rows<C>(v + slice_at(L.v, bkv, Hkv), L.v.t, Tk, Dv, base + oV);
      C *dQ = base + odQ, *dK = base + odK, *dV = base + odV;
      const int64_t lq = D, lk = D, lv = Dv;
      std::fill(dK, dK + Tk * D, C(0));
      std::fill(dV, dV + Tk * Dv, C(0));
      for (int64_t gi = 0; gi < G; ++gi) {
        const int64_t bh = bkv / Hkv * d.H + bkv % Hkv * G + gi;
        const Rows<C> Q = dense_rows<C>(q + slice_at(L.q, bh, d.H), L.q.t, Tq, D, base + oQ);
        const Rows<C> dO = dense_rows<C>(dout + slice_at(L.o, bh, d.H), L.o.t, Tq, Dv, base + odO);
        const T* O = o + slice_at(L.o, bh, d.H);
        const C* Lse = lse + bh * Tq;
        std::fill(dQ, dQ + Tq * D, C(0));
        // Delta_i = sum_c dO_ic O_ic = sum_j P_ij dP_ij: the softmax Jacobian's rank-one term.
        for (int64_t i = 0; i < Tq; ++i) {
          const T* orow = O + i * L.o.t;
          const C* grow = dO.p + i * dO.ld;
          C s = 0;
#pragma omp simd reduction(+ : s)  // on vectors: an in-order sum is a serial chain of Dv adds
          for (int64_t c = 0; c < Dv; ++c) s += grow[c] * static_cast<C>(cast_value<C>(orow[c]));
          Delta[i] = s;
        }
        // The inputs and outputs of the query head a thread takes next (the group's next head, or
        // with kv slices of equal cost, the first head of kv slice bkv + nthreads, and then its k
        // and v too), asked for ahead of use in equal parts at each tile pair.
        const int64_t next_kv = gi + 1 < G ? bkv : bkv + nthreads;
        const int64_t next = gi + 1 < G ? bh + 1 : next_kv / Hkv * d.H + next_kv % Hkv * G;
        int64_t pair = 0;
        auto prefetch_next = [&](int64_t part) {
          if (next_kv >= BKV) return;
          const int64_t r0 = part * Tq / npairs, r1 = (part + 1) * Tq / npairs, k0 = part * Tk / npairs,
                        k1 = (part + 1) * Tk / npairs;
          prefetch_rows<1>(q + slice_at(L.q, next, d.H) + r0 * L.q.t, L.q.t, r1 - r0, D);
          prefetch_rows<1>(dout + slice_at(L.o, next, d.H) + r0 * L.o.t, L.o.t, r1 - r0, Dv);
          prefetch_rows<1>(o + slice_at(L.o, next, d.H) + r0 * L.o.t, L.o.t, r1 - r0, Dv);
          prefetch_rows<1>(dq + slice_at(L.q, next, d.H) + r0 * L.q.t, L.q.t, r1 - r0, D, true);
          if (next_kv == bkv) return;
          prefetch_rows<1>(k + slice_at(L.k, next_kv, Hkv) + k0 * L.k.t, L.k.t, k1 - k0, D);
          prefetch_rows<1>(v + slice_at(L.v, next_kv, Hkv) + k0 * L.v.t, L.v.t, k1 - k0, Dv);
          prefetch_rows<1>(dk + slice_at(L.k, next_kv, Hkv) + k0 * L.k.t, L.k.t, k1 - k0, D, true);
          prefetch_rows<1>(dv + slice_at(L.v, next_kv, Hkv) + k0 * L.v.t, L.v.t, k1 - k0, Dv, true);
        };
        for (int64_t j0 = 0; j0 < Tk; j0 += Bc) {  // key tile j: dK_j, dV_j accumulate over query tiles
          const int64_t bc = std::min(Bc, Tk - j0), bc16 = round16(bc);
          const C *Kj = K.p + j0 * K.ld, *Vj = V.p + j0 * V.ld;
          pack_transposed(Kj, K.ld, bc, D, bc16, Kt);   // for S = Q_i K_j^T
          pack_transposed(Vj, V.ld, bc, Dv, bc16, Vt);  // for dP = dO_i V_j^T
          // Causal: query rows i < j0 see none of these keys; start at the tile holding row j0.
          const bool fused = kFused && bc <= 64;  // products with the exp / dS in their epilogue
          for (int64_t i0 = causal ? j0 / Br * Br : 0; i0 < Tq; i0 += Br) {
            const int64_t br = std::min(Br, Tq - i0);
            const C *Qi = Q.p + i0 * Q.ld, *dOi = dO.p + i0 * dO.ld;
            prefetch_next(pair++);
            // Diagonal tiles: query row r sees keys c <= r + diag. The score products skip columns
            // no row of a 4-row block sees; the key-row products (dV, dK) skip query rows before
            // the block's first key; dQ skips keys past the block's last row (P, dS are 0 there).
            const int64_t diag = causal ? i0 - j0 : Causal::kAll;
            const Causal cols{.cols = diag}, khi{.khi = diag}, klo{.klo = diag};
            // S = scale Q_i K_j^T, then P = exp(S - L): the forward's softmax, recomputed from lse.
            if (fused) {
#if ATHANOR_CPU_AVX512
              if constexpr (kFused) f32t::probs_tile(br, bc, D, scale, Qi, Q.ld, Kt, bc16, diag, Lse + i0, P, Bc16);
#endif
            } else {
              mm(false, false, br, bc, D, scale, Qi, Q.ld, Kt, bc16, C(0), P, Bc16, cols);
              for (int64_t r = 0; r < br; ++r)  // reads p[0, nv), zeroes p[nv, bc)
                row_exp(P + r * Bc16, visible(causal, i0 + r, j0, bc), bc, Lse[i0 + r]);
            }
            // dV_j += P^T dO_i            (O = P V)
            mm(true, false, bc, Dv, br, C(1), P, Bc16, dOi, dO.ld, C(1), dV + j0 * lv, lv, klo);
            // dP = dO_i V_j^T, dS = P * (dP - Delta)   (softmax backward; masked entries 0)
            if (fused) {
#if ATHANOR_CPU_AVX512
              if constexpr (kFused) f32t::dscores_tile(br, bc, Dv, dOi, dO.ld, Vt, bc16, diag, Delta + i0, P, Bc16, dS, Bc16);
#endif
            } else {
              mm(false, false, br, bc, Dv, C(1), dOi, dO.ld, Vt, bc16, C(0), dS, Bc16, cols);
              for (int64_t r = 0; r < br; ++r) {  // dP was computed on [0, nv) only
                C* ds = dS + r * Bc16;
                const C* p = P + r * Bc16;
                const C del = Delta[i0 + r];
                const int64_t nv = visible(causal, i0 + r, j0, bc);
#pragma omp simd
                for (int64_t c = 0; c < nv; ++c) ds[c] = p[c] * (ds[c] - del);
                std::fill(ds + std::max<int64_t>(nv, 0), ds + bc, C(0));
              }
            }
            // dQ_i += scale dS K_j         (S = scale Q K^T)
            mm(false, false, br, D, bc, scale, dS, Bc16, Kj, K.ld, C(1), dQ + i0 * lq, lq, khi);
            // dK_j += scale dS^T Q_i
            mm(true, false, bc, D, br, scale, dS, Bc16, Qi, Q.ld, C(1), dK + j0 * lk, lk, klo);
          }
        }
        store_rows(dQ, Tq, D, dq + slice_at(L.q, bh, d.H), L.q.t);
      }  // query heads of the group
      store_rows(dK, Tk, D, dk + slice_at(L.k, bkv, Hkv), L.k.t);
      store_rows(dV, Tk, Dv, dv + slice_at(L.v, bkv, Hkv), L.v.t);
    }
  }
}

#define ATHANOR_INSTANTIATE_ATTENTION(T)                                                                        \
  template void attention_forward<T>(const T*, const T*, const T*, T*, attn_acc_t<T>*, const AttentionDims&,     \
                                     const AttentionLayout&, bool, double, AttentionTiles);                     \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, const T*, const attn_acc_t<T>*, T*,  \
                                      T*, T*, const AttentionDims&, const AttentionLayout&, bool, double,        \
                                      AttentionTiles);
ATHANOR_INSTANTIATE_ATTENTION(float)
ATHANOR_INSTANTIATE_ATTENTION(double)
ATHANOR_INSTANTIATE_ATTENTION(bfloat16)
ATHANOR_INSTANTIATE_ATTENTION(float16)

ATHANOR_ISA_END

#if ATHANOR_ISA_PRIMARY
namespace athanor::cpu {

AttentionLayout AttentionLayout::contiguous(const AttentionDims& d) {
  auto dense = [&](int64_t H, int64_t T, int64_t D) { return AttentionStrides{H * T * D, T * D, D}; };
  const int64_t Hkv = d.kv_heads();
  return {dense(d.H, d.Tq, d.D), dense(Hkv, d.Tk, d.D), dense(Hkv, d.Tk, d.Dv), dense(d.H, d.Tq, d.Dv)};
}

AttentionLayout AttentionLayout::packed_qkv(const AttentionDims& d) {
  ATH_CHECK(d.Tq == d.Tk && d.D == d.Dv && d.kv_heads() == d.H, "cpu::AttentionLayout::packed_qkv",
            "packed q, k, v need Tq == Tk, D == Dv and as many kv heads as query heads, got Tq ", d.Tq, ", Tk ", d.Tk,
            ", D ", d.D, ", Dv ", d.Dv, ", H ", d.H, ", Hkv ", d.kv_heads());
  const int64_t width = d.H * d.D;  // one of q, k, v per token
  const AttentionStrides in{d.Tq * 3 * width, d.D, 3 * width};
  // The column offsets of k (width) and v (2 width) are in the callers' base pointers.
  return {in, in, in, AttentionStrides{d.Tq * width, d.D, width}};
}

ATHANOR_ISA_DECLARE(
    template <class T>
    void attention_forward(const T* q, const T* k, const T* v, T* o, attn_acc_t<T>* lse, const AttentionDims& d,
                           const AttentionLayout& layout, bool causal, double scale, AttentionTiles tiles);
    template <class T>
    void attention_backward(const T* q, const T* k, const T* v, const T* o, const T* dout, const attn_acc_t<T>* lse,
                            T* dq, T* dk, T* dv, const AttentionDims& d, const AttentionLayout& layout, bool causal,
                            double scale, AttentionTiles tiles);)

template <class T>
void attention_forward(const T* q, const T* k, const T* v, T* o, attn_acc_t<T>* lse, const AttentionDims& d,
                       const AttentionLayout& L, bool causal, double scale, AttentionTiles tiles) {
  ATHANOR_ISA_CALL(attention_forward<T>, q, k, v, o, lse, d, L, causal, scale, tiles);
}
template <class T>
void attention_backward(const T* q, const T* k, const T* v, const T* o, const T* dout, const attn_acc_t<T>* lse,
                        T* dq, T* dk, T* dv, const AttentionDims& d, const AttentionLayout& L, bool causal,
                        double scale, AttentionTiles tiles) {
  ATHANOR_ISA_CALL(attention_backward<T>, q, k, v, o, dout, lse, dq, dk, dv, d, L, causal, scale, tiles);
}
ATHANOR_INSTANTIATE_ATTENTION(float)
ATHANOR_INSTANTIATE_ATTENTION(double)
ATHANOR_INSTANTIATE_ATTENTION(bfloat16)
ATHANOR_INSTANTIATE_ATTENTION(float16)

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
#endif  // ATHANOR_ISA_PRIMARY
