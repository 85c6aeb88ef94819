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
#include "backend/cpu/attention_tiles.h"
#include "backend/cpu/unary.h"
#include "backend/cpu/workspace.h"

namespace athanor::cpu {
namespace {

// GCC 12 flags the deliberately self-initialized _mm512_undefined_*() inside AVX-512 intrinsics
// (unpacks, roundscale, the bf16 narrowing) as maybe-uninitialized once they are inlined into
// the kernels below: a known false positive, silenced for the kernels only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"


using namespace attention_tiles;  // the tile products (attention_tiles.h)

#if defined(__AVX512BF16__)
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
    int64_t packed_bh = -1, packed_tiles = 0;  // key tiles [0, packed_tiles) of slice packed_bh are packed
#pragma omp for schedule(dynamic, chunk)
    for (int64_t task = 0; task < BH * nq; ++task) {
      const int64_t bh = task / nq, i0 = (task % nq) * Br, br = std::min(Br, Tq - i0);
      const bfloat16* Q = q + slice_at(L.q, bh, d.H) + i0 * L.q.t;
      if (bh != packed_bh) packed_bh = bh, packed_tiles = 0;
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
          bf16t::pack_cols(k + slice_at(L.k, bh, d.H) + t0 * L.k.t, L.k.t, D, tb, up(tb, 16),
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
        bf16t::pack_rows(v + slice_at(L.v, bh, d.H) + j0 * L.v.t, L.v.t, std::min(Bc, Tk - j0), Dv, Dv16, Vp);
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
#pragma omp for schedule(dynamic, 1)  // slices are independent: dynamic keeps a slowed thread from holding up the rest
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int64_t ldq = L.q.t, ldk = L.k.t, ldv = L.v.t, ldo = L.o.t;
      const bfloat16 *Q = q + slice_at(L.q, bh, d.H), *K = k + slice_at(L.k, bh, d.H), *V = v + slice_at(L.v, bh, d.H),
                     *dO = dout + slice_at(L.o, bh, d.H), *O = o + slice_at(L.o, bh, d.H);
      const float* Lse = lse + bh * Tq;
      std::fill(dQ, dQ + Tq * D16, 0.0f);
      std::fill(dK, dK + Tk * D16, 0.0f);
      std::fill(dV, dV + Tk * Dv16, 0.0f);
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
      bfloat16 *dQo = dq + slice_at(L.q, bh, d.H), *dKo = dk + slice_at(L.k, bh, d.H), *dVo = dv + slice_at(L.v, bh, d.H);
      for (int64_t i = 0; i < Tq; ++i) bf16t::store_row(dQ + i * D16, D, 1.0f, dQo + i * ldq);
      for (int64_t j = 0; j < Tk; ++j) {
        bf16t::store_row(dK + j * D16, D, 1.0f, dKo + j * ldk);
        bf16t::store_row(dV + j * Dv16, Dv, 1.0f, dVo + j * ldv);
      }
    }
  }
}
#endif  // __AVX512BF16__

#pragma GCC diagnostic pop

}  // namespace

AttentionLayout AttentionLayout::contiguous(const AttentionDims& d) {
  auto dense = [&](int64_t T, int64_t D) { return AttentionStrides{d.H * T * D, T * D, D}; };
  return {dense(d.Tq, d.D), dense(d.Tk, d.D), dense(d.Tk, d.Dv), dense(d.Tq, d.Dv)};
}

AttentionLayout AttentionLayout::packed_qkv(const AttentionDims& d) {
  ATH_CHECK(d.Tq == d.Tk && d.D == d.Dv, "cpu::AttentionLayout::packed_qkv",
            "packed q, k, v need Tq == Tk and D == Dv, got Tq ", d.Tq, ", Tk ", d.Tk, ", D ", d.D, ", Dv ", d.Dv);
  const int64_t width = d.H * d.D;  // one of q, k, v per token
  const AttentionStrides in{d.Tq * 3 * width, d.D, 3 * width};
  // The column offsets of k (width) and v (2 width) are in the callers' base pointers.
  return {in, in, in, AttentionStrides{d.Tq * width, d.D, width}};
}

template <class T>
void attention_forward(const T* q, const T* k, const T* v, T* o, attn_acc_t<T>* lse, const AttentionDims& d,
                       const AttentionLayout& L, bool causal, double scale_d, AttentionTiles tiles) {
  using C = attn_acc_t<T>;
  constexpr bool kConvert = !std::is_same_v<T, C>;
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
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, bfloat16>)
    if (bf16_tiles_apply(d))
      return attention_forward_bf16(q, k, v, o, lse, d, L, causal, static_cast<float>(scale_d), tiles);
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
      const Rows<C> Q = load_rows<C>(q + slice_at(L.q, bh, d.H) + i0 * L.q.t, L.q.t, br, D, base + oQ);
      std::fill(m, m + br, -std::numeric_limits<C>::infinity());
      std::fill(l, l + br, C(0));
      std::fill(acc, acc + br * Dv, C(0));
      // Causal: keys past the tile's last query row are masked for every row -> not visited.
      const int64_t kend = causal ? std::min(Tk, i0 + br) : Tk;
      for (int64_t j0 = 0; j0 < kend; j0 += Bc) {
        const int64_t bc = std::min(Bc, kend - j0);
        const Rows<C> K = load_rows<C>(k + slice_at(L.k, bh, d.H) + j0 * L.k.t, L.k.t, bc, D, base + oK);
        const Rows<C> V = load_rows<C>(v + slice_at(L.v, bh, d.H) + j0 * L.v.t, L.v.t, bc, Dv, base + oV);
        mm(false, true, br, bc, D, scale, Q.p, Q.ld, K.p, K.ld, C(0), S, bc);  // S = scale * Q K^T   [br, bc]
        for (int64_t r = 0; r < br; ++r) {  // online softmax, one row at a time
          C* s = S + r * bc;
          const int64_t nv = visible(causal, i0 + r, j0, bc);
          const C mnew = std::max(m[r], row_max(s, nv));
          if (mnew == -std::numeric_limits<C>::infinity()) {  // nothing visible yet in this row
            std::fill(s, s + bc, C(0));
            continue;
          }
          const C corr = exp_c(m[r] - mnew);  // rescales what was accumulated under the old max
          l[r] = l[r] * corr + row_exp(s, nv, bc, mnew);  // masked keys get probability 0
          m[r] = mnew;
          if (corr != C(1)) row_scale(acc + r * Dv, Dv, corr);
        }
        mm(false, false, br, Dv, bc, C(1), S, bc, V.p, V.ld, C(1), acc, Dv);  // acc += P V
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
  const int64_t BH = d.B * d.H, Tq = d.Tq, Tk = d.Tk, D = d.D, Dv = d.Dv;
  if (Tq == 0 || Tk == 0) {  // no score entries: every gradient is zero
    auto zero = [&](T* x, const AttentionStrides& st, int64_t rows, int64_t cols) {
      for (int64_t bh = 0; bh < BH; ++bh)
        for (int64_t i = 0; i < rows; ++i) {
          T* row = x + slice_at(st, bh, d.H) + i * st.t;
          std::fill(row, row + cols, cast_value<T>(0.0f));
        }
    };
    zero(dq, L.q, Tq, D), zero(dk, L.k, Tk, D), zero(dv, L.v, Tk, Dv);
    return;
  }
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, bfloat16>)
    if (bf16_tiles_apply(d))
      return attention_backward_bf16(q, k, v, o, dout, lse, dq, dk, dv, d, L, causal, static_cast<float>(scale_d),
                                     tiles);
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
#pragma omp for schedule(dynamic, 1)  // slices are independent: dynamic keeps a slowed thread from holding up the rest
    for (int64_t bh = 0; bh < BH; ++bh) {
      const Rows<C> Q = load_rows<C>(q + slice_at(L.q, bh, d.H), L.q.t, Tq, D, base + oQ);
      const Rows<C> K = load_rows<C>(k + slice_at(L.k, bh, d.H), L.k.t, Tk, D, base + oK);
      const Rows<C> V = load_rows<C>(v + slice_at(L.v, bh, d.H), L.v.t, Tk, Dv, base + oV);
      const Rows<C> dO = load_rows<C>(dout + slice_at(L.o, bh, d.H), L.o.t, Tq, Dv, base + odO);
      const T* O = o + slice_at(L.o, bh, d.H);
      const C* Lse = lse + bh * Tq;
      // Accumulators: the outputs themselves when T == C, else f32 buffers converted at the end.
      T *dqo = dq + slice_at(L.q, bh, d.H), *dko = dk + slice_at(L.k, bh, d.H), *dvo = dv + slice_at(L.v, bh, d.H);
      C *dQ, *dK, *dV;
      int64_t lq = D, lk = D, lv = Dv;
      if constexpr (kConvert) {
        dQ = base + odQ, dK = base + odK, dV = base + odV;
      } else {
        dQ = dqo, dK = dko, dV = dvo, lq = L.q.t, lk = L.k.t, lv = L.v.t;
      }
      for (int64_t i = 0; i < Tq; ++i) std::fill(dQ + i * lq, dQ + i * lq + D, C(0));
      for (int64_t j = 0; j < Tk; ++j) std::fill(dK + j * lk, dK + j * lk + D, C(0));
      for (int64_t j = 0; j < Tk; ++j) std::fill(dV + j * lv, dV + j * lv + Dv, C(0));
      // Delta_i = sum_c dO_ic O_ic = sum_j P_ij dP_ij: the softmax Jacobian's rank-one term.
      for (int64_t i = 0; i < Tq; ++i) {
        const T* orow = O + i * L.o.t;
        const C* grow = dO.p + i * dO.ld;
        C s = 0;
        for (int64_t c = 0; c < Dv; ++c) s += grow[c] * static_cast<C>(cast_value<C>(orow[c]));
        Delta[i] = s;
      }
      for (int64_t j0 = 0; j0 < Tk; j0 += Bc) {  // key tile j: dK_j, dV_j accumulate over query tiles
        const int64_t bc = std::min(Bc, Tk - j0);
        const C *Kj = K.p + j0 * K.ld, *Vj = V.p + j0 * V.ld;
        // Causal: query rows i < j0 see none of these keys; start at the tile holding row j0.
        for (int64_t i0 = causal ? j0 / Br * Br : 0; i0 < Tq; i0 += Br) {
          const int64_t br = std::min(Br, Tq - i0);
          const C *Qi = Q.p + i0 * Q.ld, *dOi = dO.p + i0 * dO.ld;
          // S = scale Q_i K_j^T, then P = exp(S - L): the forward's softmax, recomputed from lse.
          mm(false, true, br, bc, D, scale, Qi, Q.ld, Kj, K.ld, C(0), P, bc);
          for (int64_t r = 0; r < br; ++r) {
            C* p = P + r * bc;
            const int64_t nv = visible(causal, i0 + r, j0, bc);
            row_exp(p, nv, bc, Lse[i0 + r]);
          }
          // dV_j += P^T dO_i            (O = P V)
          mm(true, false, bc, Dv, br, C(1), P, bc, dOi, dO.ld, C(1), dV + j0 * lv, lv);
          // dP = dO_i V_j^T             (dL/dP)
          mm(false, true, br, bc, Dv, C(1), dOi, dO.ld, Vj, V.ld, C(0), dS, bc);
          // dS = P * (dP - Delta)       (softmax backward; masked entries have P = 0)
          for (int64_t r = 0; r < br; ++r) {
            C* ds = dS + r * bc;
            const C* p = P + r * bc;
            const C del = Delta[i0 + r];
#pragma omp simd
            for (int64_t c = 0; c < bc; ++c) ds[c] = p[c] * (ds[c] - del);
          }
          // dQ_i += scale dS K_j         (S = scale Q K^T)
          mm(false, false, br, D, bc, scale, dS, bc, Kj, K.ld, C(1), dQ + i0 * lq, lq);
          // dK_j += scale dS^T Q_i
          mm(true, false, bc, D, br, scale, dS, bc, Qi, Q.ld, C(1), dK + j0 * lk, lk);
        }
      }
      if constexpr (kConvert) {
        store_rows(dQ, Tq, D, dqo, L.q.t);
        store_rows(dK, Tk, D, dko, L.k.t);
        store_rows(dV, Tk, Dv, dvo, L.v.t);
      }
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
