// Flash-attention CPU kernels (see attention.h for the invariants) and the naive reference.
#include "backend/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <bit>
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
  gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cm, ldc);
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
