// Flash-attention CUDA kernels (see attention.h for the invariants).
//
// Shape of every kernel: W warps, each owning 16 rows of the block's "own" operand (query rows
// in the forward and the dQ pass, key rows in the dK/dV pass) for the whole kernel; the other
// operand streams through shared memory one tile of `Bi` rows at a time. A warp's scores,
// probabilities and f32 accumulators live in its own rows of shared-memory tiles, so between
// the tile products only __syncwarp is needed; __syncthreads guards the streamed tiles alone.
// The tile products are warp_mm below: WMMA 16x16x16 on the tensor cores for bf16/f16, plain
// FMAs for f32 (the reference path). Accumulators stay in shared memory (not fragments) because
// the online softmax rescales them by row, and a WMMA fragment's element-to-row map is opaque.
// Template argument Dp is the padded head dim the tiles have (32, 64, 128, 256); Args::D is the
// operands' head dim D <= Dp: global memory is touched in columns [0, D) only, and the shared
// tiles' columns [D, Dp) hold zeros (attention.h).
#include "backend/cuda/attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "athanor/core/error.h"
#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/attention_fast.h"
#include "backend/cuda/candidates.h"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <class T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <class T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }

__device__ __forceinline__ float warp_sum(float v) {  // a fixed butterfly: the same bits every run
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Row strides (in elements) of the shared-memory tiles. WMMA needs 32-byte aligned fragment
// pointers and strides of 16 bytes; the padding (16 bytes on the tensor-core path, one word on
// the f32 path) also moves consecutive rows to different banks.
template <class T> struct Pad {
  static constexpr bool kTensorCores = !std::is_same_v<T, float>;
  static constexpr int kT = kTensorCores ? 8 : 1;  // tiles of T
  static constexpr int kF = kTensorCores ? 4 : 1;  // f32 tiles
};

// Byte offsets of the shared-memory tiles, each 128-byte aligned; the same code on the host
// (launch size) and the device.
struct Carver {
  unsigned off = 0;
  __host__ __device__ constexpr unsigned take(unsigned bytes) {
    const unsigned at = off;
    off = (off + bytes + 127u) / 128u * 128u;
    return at;
  }
};

// ---- the warp's tile product ------------------------------------------------------------
// C[16 x N] (= or +=) A[16 x K] op(B), op(B)(k, n) = kBT ? B[n ldb + k] : B[k ldb + n];
// A and B in shared memory (T), C in shared memory (f32). All 32 lanes of the warp call it.
template <bool kBT, bool kAcc, int N, int K, class T>
__device__ __forceinline__ void warp_mm(const T* A, int lda, const T* B, int ldb, float* C, int ldc) {
  if constexpr (std::is_same_v<T, float>) {
    // A lane owns columns n = lane, lane + 32, ... and their 16 rows: one B element feeds
    // 16 FMAs, A is a broadcast.
    const int lane = threadIdx.x & 31;
#pragma unroll 1
    for (int n = lane; n < N; n += 32) {
      float acc[16];
#pragma unroll
      for (int r = 0; r < 16; ++r) acc[r] = kAcc ? C[r * ldc + n] : 0.0f;
#pragma unroll 4
      for (int k = 0; k < K; ++k) {
        const float b = kBT ? B[n * ldb + k] : B[k * ldb + n];
#pragma unroll
        for (int r = 0; r < 16; ++r) acc[r] = fmaf(A[r * lda + k], b, acc[r]);
      }
#pragma unroll
      for (int r = 0; r < 16; ++r) C[r * ldc + n] = acc[r];
    }
  } else {
    using namespace nvcuda;
    using BLayout = std::conditional_t<kBT, wmma::col_major, wmma::row_major>;
    // The warp's A (16 x K, at most 16 x 128: 8 fragments, 32 registers) is loaded once and
    // reused for every 16 columns of C.
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a[K / 16];
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, BLayout> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) wmma::load_matrix_sync(a[kk], A + kk * 16, lda);
#pragma unroll 1
    for (int n0 = 0; n0 < N; n0 += 16) {
      if constexpr (kAcc)
        wmma::load_matrix_sync(c, C + n0, ldc, wmma::mem_row_major);
      else
        wmma::fill_fragment(c, 0.0f);
#pragma unroll
      for (int kk = 0; kk < K / 16; ++kk) {
        wmma::load_matrix_sync(b, kBT ? B + n0 * ldb + kk * 16 : B + kk * 16 * ldb + n0, ldb);
        wmma::mma_sync(c, a[kk], b, c);
      }
      wmma::store_matrix_sync(C + n0, c, ldc, wmma::mem_row_major);
    }
  }
}

// Block-wide copy of rows [0, rows) of a strided operand (row stride st, `dh` elements a row)
// into a shared tile of `rows_total` rows of Dp columns (stride ld); rows past `rows` and
// columns past `dh` are zero, and nothing past column dh of a row is read. `vec`: 16-byte
// loads (the pointer, the strides and dh allow them, checked on the host; then every chunk
// lies wholly inside or wholly past dh).
template <int Dp, class T>
__device__ __forceinline__ void load_rows(T* dst, int ld, const T* src, int64_t st, int rows, int rows_total, int dh,
                                          bool vec) {
  if (vec) {
    constexpr int kPer = 16 / sizeof(T), kChunks = Dp / kPer;
    for (int i = threadIdx.x; i < rows_total * kChunks; i += blockDim.x) {
      const int r = i / kChunks, c = (i % kChunks) * kPer;
      uint4 raw = make_uint4(0, 0, 0, 0);
      if (r < rows && c < dh) raw = *reinterpret_cast<const uint4*>(src + r * st + c);
      if constexpr (Pad<T>::kT * sizeof(T) % 16 == 0) {
        *reinterpret_cast<uint4*>(dst + r * ld + c) = raw;
      } else {
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int j = 0; j < kPer; ++j) dst[r * ld + c + j] = e[j];
      }
    }
  } else {
    for (int i = threadIdx.x; i < rows_total * Dp; i += blockDim.x) {
      const int r = i / Dp, c = i % Dp;
      dst[r * ld + c] = r < rows && c < dh ? src[r * st + c] : from_f<T>(0.0f);
    }
  }
}

template <class T> struct Args {
  const T *q, *k, *v, *o, *dout;
  T *out, *dq, *dk, *dv;
  const float* lse_in;
  float *lse_out, *delta;
  AttentionStrides sq, sk, sv, so;
  int H, group, Tq, Tk;
  int D;  // the head dim of the operands; the kernels run at a padded Dp >= D (attention.h)
  float scale, scale_log2;
  bool causal, vec;
};

// ---- forward ----------------------------------------------------------------------------

template <class T, int Dp, int W, int Bc> struct FwdSmem {
  static constexpr int kBr = 16 * W, kLd = Dp + Pad<T>::kT, kLdS = Bc + Pad<T>::kF, kLdP = Bc + Pad<T>::kT,
                       kLdO = Dp + Pad<T>::kF;
  unsigned q = 0, k = 0, v = 0, s = 0, p = 0, o = 0, m = 0, l = 0, bytes = 0;
  __host__ __device__ constexpr FwdSmem() {
    Carver c;
    q = c.take(kBr * kLd * sizeof(T));
    k = c.take(Bc * kLd * sizeof(T));
    v = c.take(Bc * kLd * sizeof(T));
    s = c.take(kBr * kLdS * sizeof(float));
    p = c.take(kBr * kLdP * sizeof(T));
    o = c.take(kBr * kLdO * sizeof(float));
    m = c.take(kBr * sizeof(float));
    l = c.take(kBr * sizeof(float));
    bytes = c.off;
  }
};

template <class T, int Dp, int W, int Bc>
__global__ void __launch_bounds__(32 * W) attn_fwd_kernel(Args<T> a) {
  using S = FwdSmem<T, Dp, W, Bc>;
  constexpr int Br = S::kBr, LD = S::kLd, LDS = S::kLdS, LDP = S::kLdP, LDO = S::kLdO;
  extern __shared__ __align__(128) unsigned char smem[];
  const S lay;
  T *Qs = reinterpret_cast<T*>(smem + lay.q), *Ks = reinterpret_cast<T*>(smem + lay.k),
    *Vs = reinterpret_cast<T*>(smem + lay.v), *Ps = reinterpret_cast<T*>(smem + lay.p);
  float *Ss = reinterpret_cast<float*>(smem + lay.s), *Os = reinterpret_cast<float*>(smem + lay.o),
        *Ms = reinterpret_cast<float*>(smem + lay.m), *Ls = reinterpret_cast<float*>(smem + lay.l);

  const int h = blockIdx.y, b = blockIdx.z, hk = h / a.group, i0 = blockIdx.x * Br;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r0 = warp * 16;
  const T* q = a.q + b * a.sq.b + h * a.sq.h + i0 * a.sq.t;
  const T* k = a.k + b * a.sk.b + hk * a.sk.h;
  const T* v = a.v + b * a.sv.b + hk * a.sv.h;

  load_rows<Dp>(Qs, LD, q, a.sq.t, min(Br, a.Tq - i0), Br, a.D, a.vec);
  for (int i = threadIdx.x; i < Br * Dp; i += blockDim.x) Os[(i / Dp) * LDO + i % Dp] = 0.0f;
  for (int i = threadIdx.x; i < Br; i += blockDim.x) Ms[i] = -INFINITY, Ls[i] = 0.0f;

  const int kend = a.causal ? min(a.Tk, i0 + Br) : a.Tk;  // causal: tiles above the diagonal skipped
  for (int j0 = 0; j0 < kend; j0 += Bc) {
    __syncthreads();  // the previous K/V tiles are no longer read (and Q, O, m, l are written)
    load_rows<Dp>(Ks, LD, k + j0 * a.sk.t, a.sk.t, min(Bc, a.Tk - j0), Bc, a.D, a.vec);
    load_rows<Dp>(Vs, LD, v + j0 * a.sv.t, a.sv.t, min(Bc, a.Tk - j0), Bc, a.D, a.vec);
    __syncthreads();
    warp_mm<true, false, Bc, Dp>(Qs + r0 * LD, LD, Ks, LD, Ss + r0 * LDS, LDS);  // S = Q K^T
    __syncwarp();
    // Online softmax of the warp's 16 rows (in log2 units): lanes 2r and 2r+1 share row r, each
    // on half of its columns (visited from a per-row rotation, so the lanes of a warp hit
    // different banks); one shuffle joins the halves' max and sum.
    {
      constexpr int kHalfBc = Bc / 2, kHalfD = Dp / 2;
      const int rr = lane / 2, half = lane % 2, row = r0 + rr, qi = i0 + row;
      float* srow = Ss + row * LDS + half * kHalfBc;
      T* prow = Ps + row * LDP + half * kHalfBc;
      const int kbase = j0 + half * kHalfBc;
      float mx = -INFINITY;
      for (int t = 0; t < kHalfBc; ++t) {
        const int j = (t + rr) % kHalfBc, kj = kbase + j;
        const bool vis = kj < a.Tk && (!a.causal || kj <= qi);
        const float x = vis ? srow[j] * a.scale_log2 : -INFINITY;
        srow[j] = x;
        mx = fmaxf(mx, x);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      const float mold = Ms[row], mnew = fmaxf(mold, mx);
      float corr = 1.0f, sum = 0.0f;
      if (mnew != -INFINITY) {  // else every key so far is masked: nothing to add yet
        corr = exp2f(mold - mnew);  // 0 when mold is -inf
        for (int t = 0; t < kHalfBc; ++t) {
          const int j = (t + rr) % kHalfBc;
          const float p = exp2f(srow[j] - mnew);  // masked: exp2(-inf) = 0
          sum += p;
          prow[j] = from_f<T>(p);
        }
      } else {
        for (int j = 0; j < kHalfBc; ++j) prow[j] = from_f<T>(0.0f);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      if (corr != 1.0f) {
        float* orow = Os + row * LDO + half * kHalfD;
        for (int t = 0; t < kHalfD; ++t) orow[(t + rr) % kHalfD] *= corr;
      }
      __syncwarp();  // both lanes of the row have read Ms[row]
      if (half == 0) {
        Ms[row] = mnew;
        Ls[row] = Ls[row] * corr + sum;
      }
    }
    __syncwarp();
    warp_mm<false, true, Dp, Bc>(Ps + r0 * LDP, LDP, Vs, LD, Os + r0 * LDO, LDO);  // O += P V
    __syncwarp();
  }
  __syncthreads();  // (also orders the block-wide initialisation before the reads below)
  T* o = a.out + b * a.so.b + h * a.so.h;
  for (int r = 0; r < 16; ++r) {
    const int row = r0 + r, qi = i0 + row;
    if (qi >= a.Tq) break;
    const float l = Ls[row], inv = 1.0f / l;
    for (int c = lane; c < a.D; c += 32) o[qi * a.so.t + c] = from_f<T>(Os[row * LDO + c] * inv);
    if (lane == 0) a.lse_out[(static_cast<int64_t>(b) * a.H + h) * a.Tq + qi] = (Ms[row] + log2f(l)) * kLn2;
  }
}

// ---- backward ---------------------------------------------------------------------------

// Delta_i = dO_i . O_i (f32), one warp per row of [B, H, Tq].
template <class T>
__global__ void attn_delta_kernel(Args<T> a, int64_t rows) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t i = row % a.Tq, h = row / a.Tq % a.H, b = row / a.Tq / a.H;
  const int64_t at = b * a.so.b + h * a.so.h + i * a.so.t;
  float s = 0.0f;
  for (int c = lane; c < a.D; c += 32) s = fmaf(to_f(a.dout[at + c]), to_f(a.o[at + c]), s);
  s = warp_sum(s);
  if (lane == 0) a.delta[row] = s;
}

template <class T, int Dp, int W, int Bi> struct BwdSmem {
  // own: the warps' 16-row blocks (Bo rows); streamed: Bi rows of two operands.
  static constexpr int kBo = 16 * W, kLd = Dp + Pad<T>::kT, kLdS = Bi + Pad<T>::kF, kLdP = Bi + Pad<T>::kT,
                       kLdA = Dp + Pad<T>::kF;
  unsigned own0 = 0, own1 = 0, in0 = 0, in1 = 0, s = 0, dp = 0, p = 0, ds = 0, acc0 = 0, acc1 = 0, lse = 0, delta = 0,
           bytes = 0;
  __host__ __device__ constexpr explicit BwdSmem(bool two_acc) {
    Carver c;
    own0 = c.take(kBo * kLd * sizeof(T));
    own1 = c.take(kBo * kLd * sizeof(T));
    in0 = c.take(Bi * kLd * sizeof(T));
    in1 = c.take(Bi * kLd * sizeof(T));
    s = c.take(kBo * kLdS * sizeof(float));
    dp = c.take(kBo * kLdS * sizeof(float));
    p = c.take(two_acc ? kBo * kLdP * sizeof(T) : 0);
    ds = c.take(kBo * kLdP * sizeof(T));
    acc0 = c.take(kBo * kLdA * sizeof(float));
    acc1 = c.take(two_acc ? kBo * kLdA * sizeof(float) : 0);
    lse = c.take(kBo * sizeof(float) > Bi * sizeof(float) ? kBo * sizeof(float) : Bi * sizeof(float));
    delta = c.take(kBo * sizeof(float) > Bi * sizeof(float) ? kBo * sizeof(float) : Bi * sizeof(float));
    bytes = c.off;
  }
};

// dQ = scale dS K, dS = P (dP - Delta), P = exp(scale Q K^T - lse), dP = dO V^T.
// One block per (b, h, query tile); the warps own query rows; key tiles stream in order.
template <class T, int Dp, int W, int Bc>
__global__ void __launch_bounds__(32 * W) attn_bwd_dq_kernel(Args<T> a) {
  using S = BwdSmem<T, Dp, W, Bc>;
  constexpr int Br = S::kBo, LD = S::kLd, LDS = S::kLdS, LDP = S::kLdP, LDA = S::kLdA;
  extern __shared__ __align__(128) unsigned char smem[];
  const S lay(false);
  T *Qs = reinterpret_cast<T*>(smem + lay.own0), *dOs = reinterpret_cast<T*>(smem + lay.own1),
    *Ks = reinterpret_cast<T*>(smem + lay.in0), *Vs = reinterpret_cast<T*>(smem + lay.in1),
    *dSs = reinterpret_cast<T*>(smem + lay.ds);
  float *Ss = reinterpret_cast<float*>(smem + lay.s), *dPs = reinterpret_cast<float*>(smem + lay.dp),
        *dQs = reinterpret_cast<float*>(smem + lay.acc0), *lse2 = reinterpret_cast<float*>(smem + lay.lse),
        *delta = reinterpret_cast<float*>(smem + lay.delta);

  const int h = blockIdx.y, b = blockIdx.z, hk = h / a.group, i0 = blockIdx.x * Br;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r0 = warp * 16;
  const int rows = min(Br, a.Tq - i0);
  const int64_t bh = static_cast<int64_t>(b) * a.H + h;
  load_rows<Dp>(Qs, LD, a.q + b * a.sq.b + h * a.sq.h + i0 * a.sq.t, a.sq.t, rows, Br, a.D, a.vec);
  load_rows<Dp>(dOs, LD, a.dout + b * a.so.b + h * a.so.h + i0 * a.so.t, a.so.t, rows, Br, a.D, a.vec);
  for (int i = threadIdx.x; i < Br; i += blockDim.x) {
    lse2[i] = i < rows ? a.lse_in[bh * a.Tq + i0 + i] * kLog2e : 0.0f;
    delta[i] = i < rows ? a.delta[bh * a.Tq + i0 + i] : 0.0f;
  }
  for (int i = threadIdx.x; i < Br * Dp; i += blockDim.x) dQs[(i / Dp) * LDA + i % Dp] = 0.0f;
  const T* k = a.k + b * a.sk.b + hk * a.sk.h;
  const T* v = a.v + b * a.sv.b + hk * a.sv.h;

  const int kend = a.causal ? min(a.Tk, i0 + Br) : a.Tk;
  for (int j0 = 0; j0 < kend; j0 += Bc) {
    __syncthreads();
    load_rows<Dp>(Ks, LD, k + j0 * a.sk.t, a.sk.t, min(Bc, a.Tk - j0), Bc, a.D, a.vec);
    load_rows<Dp>(Vs, LD, v + j0 * a.sv.t, a.sv.t, min(Bc, a.Tk - j0), Bc, a.D, a.vec);
    __syncthreads();
    warp_mm<true, false, Bc, Dp>(Qs + r0 * LD, LD, Ks, LD, Ss + r0 * LDS, LDS);    // S = Q K^T
    warp_mm<true, false, Bc, Dp>(dOs + r0 * LD, LD, Vs, LD, dPs + r0 * LDS, LDS);  // dP = dO V^T
    __syncwarp();
    for (int e = lane; e < 16 * Bc; e += 32) {
      const int row = r0 + e / Bc, c = e % Bc, qi = i0 + row, kj = j0 + c;
      const bool vis = qi < a.Tq && kj < a.Tk && (!a.causal || kj <= qi);
      const float p = vis ? exp2f(Ss[row * LDS + c] * a.scale_log2 - lse2[row]) : 0.0f;
      dSs[row * LDP + c] = from_f<T>(p * (dPs[row * LDS + c] - delta[row]));
    }
    __syncwarp();
    warp_mm<false, true, Dp, Bc>(dSs + r0 * LDP, LDP, Ks, LD, dQs + r0 * LDA, LDA);  // dQ += dS K
    __syncwarp();
  }
  __syncthreads();
  T* dq = a.dq + b * a.sq.b + h * a.sq.h;
  for (int r = 0; r < 16; ++r) {
    const int row = r0 + r, qi = i0 + row;
    if (qi >= a.Tq) break;
    for (int c = lane; c < a.D; c += 32) dq[qi * a.sq.t + c] = from_f<T>(dQs[row * LDA + c] * a.scale);
  }
}

// dV = P^T dO, dK = scale dS^T Q, summed over every query tile of every query head that reads
// this kv head. One block per (b, kv head, key tile); the warps own key rows and work on the
// transposed tiles S^T = K Q^T, dP^T = V dO^T directly.
template <class T, int Dp, int W, int Bq>
__global__ void __launch_bounds__(32 * W) attn_bwd_dkdv_kernel(Args<T> a) {
  using S = BwdSmem<T, Dp, W, Bq>;
  constexpr int Bk = S::kBo, LD = S::kLd, LDS = S::kLdS, LDP = S::kLdP, LDA = S::kLdA;
  extern __shared__ __align__(128) unsigned char smem[];
  const S lay(true);
  T *Ks = reinterpret_cast<T*>(smem + lay.own0), *Vs = reinterpret_cast<T*>(smem + lay.own1),
    *Qs = reinterpret_cast<T*>(smem + lay.in0), *dOs = reinterpret_cast<T*>(smem + lay.in1),
    *Ps = reinterpret_cast<T*>(smem + lay.p), *dSs = reinterpret_cast<T*>(smem + lay.ds);
  float *Ss = reinterpret_cast<float*>(smem + lay.s), *dPs = reinterpret_cast<float*>(smem + lay.dp),
        *dKs = reinterpret_cast<float*>(smem + lay.acc0), *dVs = reinterpret_cast<float*>(smem + lay.acc1),
        *lse2 = reinterpret_cast<float*>(smem + lay.lse), *delta = reinterpret_cast<float*>(smem + lay.delta);

  const int hk = blockIdx.y, b = blockIdx.z, k0 = blockIdx.x * Bk;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r0 = warp * 16;
  const int krows = min(Bk, a.Tk - k0);
  load_rows<Dp>(Ks, LD, a.k + b * a.sk.b + hk * a.sk.h + k0 * a.sk.t, a.sk.t, krows, Bk, a.D, a.vec);
  load_rows<Dp>(Vs, LD, a.v + b * a.sv.b + hk * a.sv.h + k0 * a.sv.t, a.sv.t, krows, Bk, a.D, a.vec);
  for (int i = threadIdx.x; i < Bk * Dp; i += blockDim.x)
    dKs[(i / Dp) * LDA + i % Dp] = dVs[(i / Dp) * LDA + i % Dp] = 0.0f;

  // Causal: query rows below k0 see none of these keys.
  const int qstart = a.causal ? k0 / Bq * Bq : 0;
  for (int g = 0; g < a.group; ++g) {
    const int h = hk * a.group + g;
    const int64_t bh = static_cast<int64_t>(b) * a.H + h;
    const T* q = a.q + b * a.sq.b + h * a.sq.h;
    const T* dout = a.dout + b * a.so.b + h * a.so.h;
    for (int i0 = qstart; i0 < a.Tq; i0 += Bq) {
      const int rows = min(Bq, a.Tq - i0);
      __syncthreads();
      load_rows<Dp>(Qs, LD, q + i0 * a.sq.t, a.sq.t, rows, Bq, a.D, a.vec);
      load_rows<Dp>(dOs, LD, dout + i0 * a.so.t, a.so.t, rows, Bq, a.D, a.vec);
      for (int i = threadIdx.x; i < Bq; i += blockDim.x) {
        lse2[i] = i < rows ? a.lse_in[bh * a.Tq + i0 + i] * kLog2e : 0.0f;
        delta[i] = i < rows ? a.delta[bh * a.Tq + i0 + i] : 0.0f;
      }
      __syncthreads();
      warp_mm<true, false, Bq, Dp>(Ks + r0 * LD, LD, Qs, LD, Ss + r0 * LDS, LDS);    // S^T = K Q^T
      warp_mm<true, false, Bq, Dp>(Vs + r0 * LD, LD, dOs, LD, dPs + r0 * LDS, LDS);  // dP^T = V dO^T
      __syncwarp();
      for (int e = lane; e < 16 * Bq; e += 32) {
        const int row = r0 + e / Bq, c = e % Bq, kj = k0 + row, qi = i0 + c;
        const bool vis = qi < a.Tq && kj < a.Tk && (!a.causal || kj <= qi);
        const float p = vis ? exp2f(Ss[row * LDS + c] * a.scale_log2 - lse2[c]) : 0.0f;
        Ps[row * LDP + c] = from_f<T>(p);
        dSs[row * LDP + c] = from_f<T>(p * (dPs[row * LDS + c] - delta[c]));
      }
      __syncwarp();
      warp_mm<false, true, Dp, Bq>(Ps + r0 * LDP, LDP, dOs, LD, dVs + r0 * LDA, LDA);  // dV += P^T dO
      warp_mm<false, true, Dp, Bq>(dSs + r0 * LDP, LDP, Qs, LD, dKs + r0 * LDA, LDA);  // dK += dS^T Q
      __syncwarp();
    }
  }
  __syncthreads();  // a causal key tile past the last query has no iteration: order the zeroing
  T* dk = a.dk + b * a.sk.b + hk * a.sk.h;
  T* dv = a.dv + b * a.sv.b + hk * a.sv.h;
  for (int r = 0; r < 16; ++r) {
    const int row = r0 + r, kj = k0 + row;
    if (kj >= a.Tk) break;
    for (int c = lane; c < a.D; c += 32) {
      dk[kj * a.sk.t + c] = from_f<T>(dKs[row * LDA + c] * a.scale);
      dv[kj * a.sv.t + c] = from_f<T>(dVs[row * LDA + c]);
    }
  }
}

// ---- host side --------------------------------------------------------------------------

// The tile shapes per element type and padded head dim: warps (forward, backward) and
// streamed rows. f32 tiles are twice the bytes, so its blocks are half as tall; at Dp = 256
// the blocks shrink again (bf16/f16 two warps, f32's backward one), so that every shape's
// shared memory fits an A100's 163 KiB (asserted below).
template <class T, int Dp> struct Config {
  static constexpr bool kHalf = !std::is_same_v<T, float>;
  static constexpr int kFwdW = kHalf && Dp <= 128 ? 4 : 2;
  static constexpr int kBwdW = kHalf ? (Dp <= 128 ? 4 : 2) : (Dp <= 128 ? 2 : 1);
  static constexpr int kFwdBc = kHalf ? 64 : 32;
  static constexpr int kBwdBi = 32;
};
constexpr unsigned kA100SmemOptin = 163 * 1024;
template <class T, int Dp> constexpr bool fits_a100() {
  using C = Config<T, Dp>;
  return FwdSmem<T, Dp, C::kFwdW, C::kFwdBc>().bytes <= kA100SmemOptin &&
         BwdSmem<T, Dp, C::kBwdW, C::kBwdBi>(true).bytes <= kA100SmemOptin &&
         BwdSmem<T, Dp, C::kBwdW, C::kBwdBi>(false).bytes <= kA100SmemOptin;
}

template <class K>
void prepare(K kernel, unsigned bytes, const char* name) {
  int dev = 0;
  ATH_CUDA(cudaGetDevice(&dev));
  int optin = 0;
  ATH_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  ATH_CHECK(static_cast<int>(bytes) <= optin, "cuda attention", name, " needs ", bytes,
            " bytes of shared memory per block, cuda:", dev, " allows ", optin,
            Hint{"this GPU is older than the kernels' target (sm_80+); use the CPU attention"});
  ATH_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

unsigned tiles(int64_t n, int64_t tile) { return static_cast<unsigned>((n + tile - 1) / tile); }

template <class T>
Args<T> make_args(const AttentionDims& d, const AttentionLayout& L, bool causal, double scale) {
  Args<T> a{};
  a.sq = L.q, a.sk = L.k, a.sv = L.v, a.so = L.o;
  a.H = static_cast<int>(d.H);
  a.group = static_cast<int>(d.group());
  a.Tq = static_cast<int>(d.Tq), a.Tk = static_cast<int>(d.Tk);
  a.D = static_cast<int>(d.D);
  a.scale = static_cast<float>(scale);
  a.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  a.causal = causal;
  return a;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
bool strides_vec(const AttentionStrides& s, int64_t per) { return s.b % per == 0 && s.h % per == 0 && s.t % per == 0; }

template <class T, int Dp>
void forward_impl(const void* q, const void* k, const void* v, void* o, float* lse, const AttentionDims& d,
                  const AttentionLayout& L, bool causal, double scale, cudaStream_t stream) {
  using C = Config<T, Dp>;
  static_assert(fits_a100<T, Dp>(), "an attention tile shape needs more shared memory than an A100 has");
  Args<T> a = make_args<T>(d, L, causal, scale);
  a.q = static_cast<const T*>(q), a.k = static_cast<const T*>(k), a.v = static_cast<const T*>(v);
  a.out = static_cast<T*>(o), a.lse_out = lse;
  const int64_t per = 16 / sizeof(T);
  a.vec = d.D % per == 0 && aligned16(q) && aligned16(k) && aligned16(v) && strides_vec(L.q, per) &&
          strides_vec(L.k, per) && strides_vec(L.v, per);
  const FwdSmem<T, Dp, C::kFwdW, C::kFwdBc> lay;
  auto kernel = attn_fwd_kernel<T, Dp, C::kFwdW, C::kFwdBc>;
  prepare(kernel, lay.bytes, "attn_fwd_kernel");
  const dim3 grid(tiles(d.Tq, 16 * C::kFwdW), static_cast<unsigned>(d.H), static_cast<unsigned>(d.B));
  kernel<<<grid, 32 * C::kFwdW, lay.bytes, stream>>>(a);
  ATH_CUDA_LAUNCHED("attn_fwd_kernel");
}

template <class T, int Dp>
void backward_impl(const void* q, const void* k, const void* v, const void* o, const void* dout, const float* lse,
                   void* dq, void* dk, void* dv, const AttentionDims& d, const AttentionLayout& L, bool causal,
                   double scale, void* workspace, cudaStream_t stream) {
  using C = Config<T, Dp>;
  Args<T> a = make_args<T>(d, L, causal, scale);
  a.q = static_cast<const T*>(q), a.k = static_cast<const T*>(k), a.v = static_cast<const T*>(v);
  a.o = static_cast<const T*>(o), a.dout = static_cast<const T*>(dout), a.lse_in = lse;
  a.dq = static_cast<T*>(dq), a.dk = static_cast<T*>(dk), a.dv = static_cast<T*>(dv);
  a.delta = static_cast<float*>(workspace);
  const int64_t per = 16 / sizeof(T);
  a.vec = d.D % per == 0 && aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dout) &&
          strides_vec(L.q, per) && strides_vec(L.k, per) && strides_vec(L.v, per) && strides_vec(L.o, per);

  const int64_t rows = d.B * d.H * d.Tq;
  attn_delta_kernel<T><<<tiles(rows, 4), 128, 0, stream>>>(a, rows);
  ATH_CUDA_LAUNCHED("attn_delta_kernel");

  const BwdSmem<T, Dp, C::kBwdW, C::kBwdBi> kv_lay(true), q_lay(false);
  auto dkdv = attn_bwd_dkdv_kernel<T, Dp, C::kBwdW, C::kBwdBi>;
  prepare(dkdv, kv_lay.bytes, "attn_bwd_dkdv_kernel");
  const dim3 kv_grid(tiles(d.Tk, 16 * C::kBwdW), static_cast<unsigned>(d.kv_heads()), static_cast<unsigned>(d.B));
  dkdv<<<kv_grid, 32 * C::kBwdW, kv_lay.bytes, stream>>>(a);
  ATH_CUDA_LAUNCHED("attn_bwd_dkdv_kernel");

  auto dqk = attn_bwd_dq_kernel<T, Dp, C::kBwdW, C::kBwdBi>;
  prepare(dqk, q_lay.bytes, "attn_bwd_dq_kernel");
  const dim3 q_grid(tiles(d.Tq, 16 * C::kBwdW), static_cast<unsigned>(d.H), static_cast<unsigned>(d.B));
  dqk<<<q_grid, 32 * C::kBwdW, q_lay.bytes, stream>>>(a);
  ATH_CUDA_LAUNCHED("attn_bwd_dq_kernel");
}

// The dtype and padded head dim (D checked before) as template arguments: 3 x 4 instantiations.
template <class T>
void forward_t(const void* q, const void* k, const void* v, void* o, float* lse, const AttentionDims& d,
               const AttentionLayout& L, bool causal, double scale, cudaStream_t stream) {
  switch (attention_padded_head_dim(d.D)) {
    case 32: forward_impl<T, 32>(q, k, v, o, lse, d, L, causal, scale, stream); break;
    case 64: forward_impl<T, 64>(q, k, v, o, lse, d, L, causal, scale, stream); break;
    case 128: forward_impl<T, 128>(q, k, v, o, lse, d, L, causal, scale, stream); break;
    default: forward_impl<T, 256>(q, k, v, o, lse, d, L, causal, scale, stream); break;
  }
}
template <class T>
void backward_t(const void* q, const void* k, const void* v, const void* o, const void* dout, const float* lse,
                void* dq, void* dk, void* dv, const AttentionDims& d, const AttentionLayout& L, bool causal,
                double scale, void* workspace, cudaStream_t stream) {
  switch (attention_padded_head_dim(d.D)) {
    case 32: backward_impl<T, 32>(q, k, v, o, dout, lse, dq, dk, dv, d, L, causal, scale, workspace, stream); break;
    case 64: backward_impl<T, 64>(q, k, v, o, dout, lse, dq, dk, dv, d, L, causal, scale, workspace, stream); break;
    case 128: backward_impl<T, 128>(q, k, v, o, dout, lse, dq, dk, dv, d, L, causal, scale, workspace, stream); break;
    default: backward_impl<T, 256>(q, k, v, o, dout, lse, dq, dk, dv, d, L, causal, scale, workspace, stream); break;
  }
}

}  // namespace

int64_t attention_padded_head_dim(int64_t D) {
  if (D < 1 || D > kAttentionMaxHeadDim) return 0;
  int64_t p = 32;
  while (p < D) p *= 2;
  return p;
}

AttentionLayout AttentionLayout::contiguous(const AttentionDims& d) {
  const int64_t Hkv = d.kv_heads();
  AttentionLayout L;
  L.q = {d.H * d.Tq * d.D, d.Tq * d.D, d.D};
  L.k = {Hkv * d.Tk * d.D, d.Tk * d.D, d.D};
  L.v = {Hkv * d.Tk * d.Dv, d.Tk * d.Dv, d.Dv};
  L.o = {d.H * d.Tq * d.Dv, d.Tq * d.Dv, d.Dv};
  return L;
}

AttentionLayout AttentionLayout::packed_qkv(const AttentionDims& d) {
  ATH_CHECK(d.Tq == d.Tk && d.D == d.Dv, "cuda::AttentionLayout::packed_qkv",
            "a packed qkv needs Tq == Tk and D == Dv, got Tq=", d.Tq, " Tk=", d.Tk, " D=", d.D, " Dv=", d.Dv,
            Hint{"pass separate q, k, v with AttentionLayout::contiguous or explicit strides"});
  const int64_t Hkv = d.kv_heads(), row = (d.H + 2 * Hkv) * d.D, T = d.Tq;
  AttentionLayout L;
  L.q = {T * row, d.D, row};
  L.k = {T * row, d.D, row};
  L.v = {T * row, d.D, row};
  L.o = {T * d.H * d.D, d.D, d.H * d.D};
  return L;
}

void attention_check(const AttentionDims& d, const AttentionLayout& L, DType dtype, const char* op) {
  const int64_t Hkv = d.kv_heads();
  ATH_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, op, "dtype ", dtype_name(dtype),
            " is not supported by the CUDA attention kernels", Hint{"use f32, bf16 or f16 (f64 runs on the CPU)"});
  ATH_CHECK(d.B >= 1 && d.H >= 1 && d.Tq >= 1 && d.Tk >= 1, op, "bad sizes B=", d.B, " H=", d.H, " Tq=", d.Tq,
            " Tk=", d.Tk, Hint{"every size must be at least 1"});
  ATH_CHECK(d.D == d.Dv, op, "head dims differ: q/k have D=", d.D, ", v has Dv=", d.Dv,
            Hint{"the CUDA attention kernels need D == Dv"});
  ATH_CHECK(attention_padded_head_dim(d.D) > 0, op, "head dim D=", d.D,
            " is not supported by the CUDA attention kernels (they take 1 <= D <= ", kAttentionMaxHeadDim, ")",
            Hint{"pick n_embd / n_head of at most 256 (shared memory bounds the tiles), or run attention on the CPU"});
  ATH_CHECK(d.H % Hkv == 0, op, "kv heads Hkv=", Hkv, " do not divide the query heads H=", d.H,
            Hint{"grouped-query attention needs H to be a multiple of Hkv"});
  ATH_CHECK(d.Tq < (int64_t{1} << 30) && d.Tk < (int64_t{1} << 30) && d.H <= 65535 && d.B <= 65535, op,
            "sizes too large for the CUDA attention grid: B=", d.B, " H=", d.H, " Tq=", d.Tq, " Tk=", d.Tk,
            Hint{"split the batch"});
  for (const AttentionStrides* s : {&L.q, &L.k, &L.v, &L.o})
    ATH_CHECK(s->b >= 0 && s->h >= 0 && s->t >= 0, op, "negative stride in the layout (b=", s->b, ", h=", s->h,
              ", t=", s->t, ")", Hint{"operands must be laid out with non-negative strides and contiguous rows"});
}

void attention_forward(const void* q, const void* k, const void* v, void* o, float* lse, const AttentionDims& d,
                       const AttentionLayout& layout, bool causal, double scale, DType dtype, cudaStream_t stream) {
  attention_check(d, layout, dtype, "cuda attention forward");
  ATH_CHECK(q && k && v && o && lse, "cuda attention forward", "null operand pointer",
            Hint{"pass device buffers for q, k, v, o and lse"});
  // Candidate attention_cudnn (attention_cudnn.h): cuDNN's fused attention where it takes the
  // call; false (no plan for the graph) falls through to our kernels. "reference" stays ours.
  if (candidate_enabled(Candidate::attention_cudnn) && attention_impl() != AttentionImpl::reference &&
      attention_cudnn_supported(q, k, v, o, d, layout, dtype) &&
      attention_cudnn_forward(q, k, v, o, lse, d, layout, causal, scale, dtype, stream))
    return;
  // ATHANOR_CUDA_ATTENTION=fast (the default) or fast_fwd: bf16/f16 at D 64/128 with 16-byte aligned operands
  // run on the register-resident kernel (attention_fast.h); it saves the same lse, so either
  // backward takes its output. Everything else, and f32 always, stays here.
  if (attention_impl() != AttentionImpl::reference && attention_fast_supported(q, k, v, o, d, layout, dtype)) {
    attention_fast_forward(q, k, v, o, lse, d, layout, causal, scale, dtype, stream);
    return;
  }
  switch (dtype) {
    case DType::bf16: forward_t<__nv_bfloat16>(q, k, v, o, lse, d, layout, causal, scale, stream); break;
    case DType::f16: forward_t<__half>(q, k, v, o, lse, d, layout, causal, scale, stream); break;
    default: forward_t<float>(q, k, v, o, lse, d, layout, causal, scale, stream); break;
  }
}

int64_t attention_backward_workspace(const AttentionDims& d) { return (d.B * d.H * d.Tq * 4 + 15) / 16 * 16; }

void attention_backward(const void* q, const void* k, const void* v, const void* o, const void* dout,
                        const float* lse, void* dq, void* dk, void* dv, const AttentionDims& d,
                        const AttentionLayout& layout, bool causal, double scale, DType dtype, void* workspace,
                        cudaStream_t stream) {
  attention_check(d, layout, dtype, "cuda attention backward");
  ATH_CHECK(q && k && v && o && dout && lse && dq && dk && dv && workspace, "cuda attention backward",
            "null operand pointer", Hint{"pass device buffers for every operand and the workspace"});
  if (candidate_enabled(Candidate::attention_cudnn) && attention_impl() != AttentionImpl::reference &&
      attention_cudnn_supported(q, k, v, o, d, layout, dtype) &&
      attention_cudnn_backward(q, k, v, o, dout, lse, dq, dk, dv, d, layout, causal, scale, dtype, workspace, stream))
    return;
  // ATHANOR_CUDA_ATTENTION=fast: the fast backward where it takes the call (attention_fast.h);
  // it reads the same Delta workspace size and the lse of either forward.
  if (attention_impl() == AttentionImpl::fast &&
      attention_fast_backward_supported(q, k, v, o, dout, dq, dk, dv, d, layout, dtype)) {
    attention_fast_backward(q, k, v, o, dout, lse, dq, dk, dv, d, layout, causal, scale, dtype, workspace, stream);
    return;
  }
  switch (dtype) {
    case DType::bf16:
      backward_t<__nv_bfloat16>(q, k, v, o, dout, lse, dq, dk, dv, d, layout, causal, scale, workspace, stream);
      break;
    case DType::f16:
      backward_t<__half>(q, k, v, o, dout, lse, dq, dk, dv, d, layout, causal, scale, workspace, stream);
      break;
    default: backward_t<float>(q, k, v, o, dout, lse, dq, dk, dv, d, layout, causal, scale, workspace, stream); break;
  }
}

}  // namespace athanor::cuda
