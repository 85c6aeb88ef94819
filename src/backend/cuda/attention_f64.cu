// The kernels of attention_f64.h: plain loops, double throughout.
#include <cuda_runtime.h>

#include <cmath>

#include "athanor/core/error.h"
#include "backend/cuda/attention_f64.h"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {

constexpr int kRows = 64;  // threads per block: rows of one (b, head)

// The dims and layout as the kernels read them (AttentionDims' helpers are host-only).
struct Args {
  int64_t B, H, Hkv, group, Tq, Tk, D, Dv;
  AttentionLayout l;
  bool causal;
  double scale;
};

__device__ __forceinline__ const double* row(const double* p, const AttentionStrides& s, int64_t b, int64_t h, int64_t t) {
  return p + b * s.b + h * s.h + t * s.t;
}
__device__ __forceinline__ double* row(double* p, const AttentionStrides& s, int64_t b, int64_t h, int64_t t) {
  return p + b * s.b + h * s.h + t * s.t;
}
__device__ __forceinline__ double dot(const double* x, const double* y, int64_t n) {
  double s = 0.0;
  for (int64_t c = 0; c < n; ++c) s += x[c] * y[c];
  return s;
}
// The keys query i sees: [0, i] when causal (top-left aligned), else all of them.
__device__ __forceinline__ int64_t keys_seen(const Args& a, int64_t i) {
  return a.causal ? (i + 1 < a.Tk ? i + 1 : a.Tk) : a.Tk;
}

// Grid (query tiles, H, B): thread = query row i of head h, batch b.
__global__ void forward_kernel(const double* q, const double* k, const double* v, double* o, double* lse, Args a) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(kRows) + threadIdx.x;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  if (i >= a.Tq) return;
  const int64_t hk = h / a.group, n = keys_seen(a, i);
  const double* qi = row(q, a.l.q, b, h, i);
  double m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) m = fmax(m, a.scale * dot(qi, row(k, a.l.k, b, hk, j), a.D));
  double l = 0.0;
  for (int64_t j = 0; j < n; ++j) l += exp(a.scale * dot(qi, row(k, a.l.k, b, hk, j), a.D) - m);
  const double L = m + log(l);
  double* oi = row(o, a.l.o, b, h, i);
  for (int64_t c = 0; c < a.Dv; ++c) oi[c] = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const double p = exp(a.scale * dot(qi, row(k, a.l.k, b, hk, j), a.D) - L);
    const double* vj = row(v, a.l.v, b, hk, j);
    for (int64_t c = 0; c < a.Dv; ++c) oi[c] += p * vj[c];
  }
  lse[(b * a.H + h) * a.Tq + i] = L;
}

// Delta_i = dO_i . O_i (grid as the forward's).
__global__ void delta_kernel(const double* o, const double* dout, double* delta, Args a) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(kRows) + threadIdx.x;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  if (i >= a.Tq) return;
  delta[(b * a.H + h) * a.Tq + i] = dot(row(dout, a.l.o, b, h, i), row(o, a.l.o, b, h, i), a.Dv);
}

// dQ_i = scale Σ_j dS_ij k_j (grid as the forward's).
__global__ void dq_kernel(const double* q, const double* k, const double* v, const double* dout, const double* lse,
                          const double* delta, double* dq, Args a) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(kRows) + threadIdx.x;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  if (i >= a.Tq) return;
  const int64_t hk = h / a.group, n = keys_seen(a, i), r = (b * a.H + h) * a.Tq + i;
  const double L = lse[r], Di = delta[r];
  const double* qi = row(q, a.l.q, b, h, i);
  const double* doi = row(dout, a.l.o, b, h, i);
  double* dqi = row(dq, a.l.q, b, h, i);
  for (int64_t c = 0; c < a.D; ++c) dqi[c] = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const double* kj = row(k, a.l.k, b, hk, j);
    const double p = exp(a.scale * dot(qi, kj, a.D) - L);
    const double ds = p * (dot(doi, row(v, a.l.v, b, hk, j), a.Dv) - Di);
    for (int64_t c = 0; c < a.D; ++c) dqi[c] += a.scale * ds * kj[c];
  }
}

// Grid (key tiles, Hkv, B): thread = key row j of kv head hk; over the group's query heads in
// order, and their query rows that see key j in order.
__global__ void dkv_kernel(const double* q, const double* k, const double* v, const double* dout, const double* lse,
                           const double* delta, double* dk, double* dv, Args a) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(kRows) + threadIdx.x;
  const int64_t hk = blockIdx.y, b = blockIdx.z;
  if (j >= a.Tk) return;
  const double* kj = row(k, a.l.k, b, hk, j);
  const double* vj = row(v, a.l.v, b, hk, j);
  double* dkj = row(dk, a.l.k, b, hk, j);
  double* dvj = row(dv, a.l.v, b, hk, j);
  for (int64_t c = 0; c < a.D; ++c) dkj[c] = 0.0;
  for (int64_t c = 0; c < a.Dv; ++c) dvj[c] = 0.0;
  for (int64_t h = hk * a.group; h < (hk + 1) * a.group; ++h) {
    for (int64_t i = a.causal ? j : 0; i < a.Tq; ++i) {
      const int64_t r = (b * a.H + h) * a.Tq + i;
      const double* qi = row(q, a.l.q, b, h, i);
      const double* doi = row(dout, a.l.o, b, h, i);
      const double p = exp(a.scale * dot(qi, kj, a.D) - lse[r]);
      for (int64_t c = 0; c < a.Dv; ++c) dvj[c] += p * doi[c];
      const double ds = p * (dot(doi, vj, a.Dv) - delta[r]);
      for (int64_t c = 0; c < a.D; ++c) dkj[c] += a.scale * ds * qi[c];
    }
  }
}

Args args_of(const AttentionDims& d, const AttentionLayout& l, bool causal, double scale) {
  const int64_t hkv = d.kv_heads();
  return Args{d.B, d.H, hkv, d.H / hkv, d.Tq, d.Tk, d.D, d.Dv, l, causal, scale};
}
dim3 grid_of(int64_t rows, int64_t heads, int64_t batch) {
  return dim3(static_cast<unsigned>((rows + kRows - 1) / kRows), static_cast<unsigned>(heads), static_cast<unsigned>(batch));
}

}  // namespace

void attention_f64_check(const AttentionDims& d, const char* op) {
  const int64_t hkv = d.kv_heads();
  ATH_CHECK(d.B >= 0 && d.H >= 1 && hkv >= 1 && d.H % hkv == 0 && d.Tq >= 0 && d.Tk >= 0 && d.D >= 1 && d.Dv >= 1, op,
            "bad attention dims B=", d.B, " H=", d.H, " Hkv=", hkv, " Tq=", d.Tq, " Tk=", d.Tk, " D=", d.D, " Dv=", d.Dv,
            Hint{"heads and head dims must be >= 1 and Hkv must divide H"});
  // The grid's y and z dims (heads, batch) are at most 65535.
  ATH_CHECK(d.H <= 65535 && d.B <= 65535, op, "the f64 attention kernel takes at most 65535 heads and batches (H=", d.H,
            ", B=", d.B, ")", Hint{"split the batch"});
}

void attention_f64_forward(const double* q, const double* k, const double* v, double* o, double* lse,
                           const AttentionDims& d, const AttentionLayout& layout, bool causal, double scale,
                           cudaStream_t stream) {
  attention_f64_check(d, "cuda attention f64");
  if (d.B == 0 || d.Tq == 0) return;
  forward_kernel<<<grid_of(d.Tq, d.H, d.B), kRows, 0, stream>>>(q, k, v, o, lse, args_of(d, layout, causal, scale));
  ATH_CUDA_LAUNCHED("attention f64 forward_kernel");
}

void attention_f64_backward(const double* q, const double* k, const double* v, const double* o, const double* dout,
                            const double* lse, double* dq, double* dk, double* dv, const AttentionDims& d,
                            const AttentionLayout& layout, bool causal, double scale, double* delta,
                            cudaStream_t stream) {
  attention_f64_check(d, "cuda attention f64");
  if (d.B == 0) return;
  const Args a = args_of(d, layout, causal, scale);
  if (d.Tq > 0) {
    delta_kernel<<<grid_of(d.Tq, d.H, d.B), kRows, 0, stream>>>(o, dout, delta, a);
    ATH_CUDA_LAUNCHED("attention f64 delta_kernel");
    dq_kernel<<<grid_of(d.Tq, d.H, d.B), kRows, 0, stream>>>(q, k, v, dout, lse, delta, dq, a);
    ATH_CUDA_LAUNCHED("attention f64 dq_kernel");
  }
  if (d.Tk > 0) {
    dkv_kernel<<<grid_of(d.Tk, a.Hkv, d.B), kRows, 0, stream>>>(q, k, v, dout, lse, delta, dk, dv, a);
    ATH_CUDA_LAUNCHED("attention f64 dkv_kernel");
  }
}

}  // namespace athanor::cuda
