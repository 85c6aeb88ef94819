// The fast flash-attention forward for bf16/f16 (attention_fast.h has the contract and the
// invariants): FlashAttention-2's forward with the scores, softmax statistics and output
// accumulator in registers.
//
// Fragment layouts relied on (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point
// type" and "Matrix fragments for ldmatrix"; g = lane / 4 (groupID), tg = lane % 4
// (threadID_in_group)):
//  - A (16 x 16, .row, 4 x .b32 each holding two 16-bit elements, the lower column in the low
//    half): a[0] = (row g, cols 2tg, 2tg+1), a[1] = (row g+8, cols 2tg, 2tg+1),
//    a[2] = (row g, cols 2tg+8, 2tg+9), a[3] = (row g+8, cols 2tg+8, 2tg+9);
//  - B (16 x 8, .col, 2 x .b32): b[0] = (rows k = 2tg, 2tg+1; col n = g), b[1] = (rows 2tg+8,
//    2tg+9; col g);
//  - C/D (16 x 8, f32, 4 registers): c[0], c[1] = (row g, cols 2tg, 2tg+1), c[2], c[3] = (row
//    g+8, cols 2tg, 2tg+1);
//  - ldmatrix.m8n8.x4.b16: lanes 8i..8i+7 give the row addresses of matrix i (16 bytes a row),
//    register i receives matrix i; without .trans lane t holds (row t/4, cols 2(t%4), 2(t%4)+1),
//    with .trans it holds (rows 2(t%4), 2(t%4)+1; col t/4).
// Hence: two adjacent C fragments of S (keys 16kk..16kk+7 and 16kk+8..16kk+15) are exactly the
// A fragment of P for the k-step kk of P V (c[0..1] -> a[0], c[2..3] -> a[1] of the first,
// a[2], a[3] of the second); K rows (keys) loaded by ldmatrix without .trans give the B
// fragments of Q K^T (B(k = d, n = key) = K[key][d]); V rows loaded with .trans give those of
// P V (B(k = key, n = d) = V[key][d]).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <cstdint>
#include <type_traits>

#include "athanor/core/error.h"
#include "backend/cuda/attention_fast.h"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {

constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

struct FastArgs {
  const void *q, *k, *v;
  void* out;
  float* lse;
  AttentionStrides sq, sk, sv, so;
  int H, group, Tq, Tk;
  float scale_log2;  // scale * log2(e): scores are kept in log2 units, exp2 is the hardware's
  bool causal;
};

// Tile shape: W warps of M m-tiles of 16 query rows each (Br = 16 M W), key/value tiles of Bc
// rows. Shared rows are D + 8 elements (16 bytes of padding): the 8 rows one ldmatrix reads at
// one column then start in 8 different 16-byte bank groups (row stride 144 or 272 bytes, 16 mod
// 128), so it has no bank conflicts, and every row start stays 16-byte aligned for cp.async.
template <int D, int W, int M, int Bc> struct FastCfg {
  static constexpr int kD = D, kW = W, kM = M, kBr = 16 * M * W, kBc = Bc, kLd = D + 8;
  static constexpr unsigned kQBytes = kBr * kLd * 2, kKVBytes = kBc * kLd * 2;
  static constexpr unsigned kBytes = kQBytes + 4 * kKVBytes;  // Q, K[2], V[2]
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronous; src_bytes 0 writes 16 zero bytes (and reads nothing).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c += A B, m16n8k16, f32 accumulation.
template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T, `lo` in the low 16 bits (the lower column of a fragment register).
template <class T> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    static_assert(sizeof(v) == 4);
    memcpy(&r, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&r, &v, 4);
  }
  return r;
}

// Issues the copies of rows [0, rows) of a strided operand (row stride st elements, D elements
// a row) into a shared tile of `rows_total` rows (stride LD); rows past `rows` are zero-filled.
// 16-byte chunks, spread over the block's threads.
template <class T, int D, int LD>
__device__ __forceinline__ void load_tile(T* dst, const T* src, int64_t st, int rows, int rows_total) {
  constexpr int kChunks = D / 8;  // 8 elements of 2 bytes each
  for (int i = threadIdx.x; i < rows_total * kChunks; i += blockDim.x) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const bool valid = r < rows;
    cp_async16(dst + r * LD + c, valid ? src + r * st + c : src, valid);
  }
}

template <class T, class C>
__global__ void __launch_bounds__(32 * C::kW) attn_fast_fwd_kernel(FastArgs a) {
  constexpr int D = C::kD, M = C::kM, Br = C::kBr, Bc = C::kBc, LD = C::kLd;
  extern __shared__ __align__(128) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem);
  T* Ks = reinterpret_cast<T*>(smem + C::kQBytes);                     // two buffers of Bc x LD
  T* Vs = reinterpret_cast<T*>(smem + C::kQBytes + 2 * C::kKVBytes);  // two buffers of Bc x LD

  // Causal blocks with the most key tiles first (the last query tiles): a better tail.
  const int qtile = a.causal ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z, hk = h / a.group, i0 = qtile * Br;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, tg = lane % 4;  // C-fragment rows g, g + 8 and columns 2 tg, 2 tg + 1
  const T* q = static_cast<const T*>(a.q) + b * a.sq.b + h * a.sq.h + i0 * a.sq.t;
  const T* k = static_cast<const T*>(a.k) + b * a.sk.b + hk * a.sk.h;
  const T* v = static_cast<const T*>(a.v) + b * a.sv.b + hk * a.sv.h;

  // Causal: keys past the block's last query row are masked for every row.
  const int kend = a.causal ? min(a.Tk, i0 + Br) : a.Tk;
  const int ntiles = (kend + Bc - 1) / Bc;  // >= 1: Tk >= 1 and i0 + Br >= 1

  load_tile<T, D, LD>(Qs, q, a.sq.t, min(Br, a.Tq - i0), Br);
  load_tile<T, D, LD>(Ks, k, a.sk.t, min(Bc, a.Tk), Bc);
  load_tile<T, D, LD>(Vs, v, a.sv.t, min(Bc, a.Tk), Bc);
  cp_async_commit();

  // The warp owns M m-tiles of 16 query rows (rows warp * 16M + 16 mt ..); every array below
  // has the m-tile as its first index, and each K/V fragment loaded from shared memory feeds
  // the M m-tiles' MMAs. Per m-tile the arithmetic (and its order) is that of M = 1.
  uint32_t qf[M][D / 16][4];  // the m-tile's 16 query rows as A fragments, one per 16 columns of D
  float o[M][D / 8][4];       // O accumulator: C fragments, one per 8 columns of D
  // Rows g (index 0) and g + 8 (index 1) of each m-tile: running max of the log2-unit scores
  // (the same in the 4 lanes of a row's quad) and this lane's partial sum of exp2(s - max) over
  // its own columns (summed over the quad at the end).
  float m[M][2], l[M][2];
  int row0[M];  // query index of c[0], c[1]; row0 + 8 of c[2], c[3]
#pragma unroll
  for (int mt = 0; mt < M; ++mt) {
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.0f;
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
    row0[mt] = i0 + (warp * M + mt) * 16 + g;
  }

  for (int t = 0; t < ntiles; ++t) {
    const int j0 = t * Bc, buf = t & 1;
    if (t + 1 < ntiles) {  // prefetch the next K/V tile into the other buffer
      const int jn = j0 + Bc;
      load_tile<T, D, LD>(Ks + (buf ^ 1) * Bc * LD, k + jn * a.sk.t, a.sk.t, min(Bc, a.Tk - jn), Bc);
      load_tile<T, D, LD>(Vs + (buf ^ 1) * Bc * LD, v + jn * a.sv.t, a.sv.t, min(Bc, a.Tk - jn), Bc);
      cp_async_commit();
      cp_async_wait<1>();  // everything but the prefetch: tile t (and Q) has landed
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (t == 0) {
#pragma unroll
      for (int mt = 0; mt < M; ++mt)
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)  // matrices: rows 0-7 | 8-15 at cols 0-7, then at cols 8-15
          ldmatrix_x4(qf[mt][kk],
                      Qs + ((warp * M + mt) * 16 + lane % 8 + (lane / 8) % 2 * 8) * LD + kk * 16 + lane / 16 * 8);
    }
    const T* Kt = Ks + buf * Bc * LD;
    const T* Vt = Vs + buf * Bc * LD;

    // S = Q K^T for the m-tiles' 16 rows and the tile's Bc keys: Bc / 8 C fragments each.
    float s[M][Bc / 8][4];
#pragma unroll
    for (int nt = 0; nt < Bc / 8; ++nt) {
#pragma unroll
      for (int mt = 0; mt < M; ++mt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; kk += 2) {
        // Keys nt*8..nt*8+7, columns 16kk + 8i for matrix i: b0, b1 of k-step kk, then of kk+1.
        uint32_t kb[4];
        ldmatrix_x4(kb, Kt + (nt * 8 + lane % 8) * LD + kk * 16 + lane / 8 * 8);
#pragma unroll
        for (int mt = 0; mt < M; ++mt) {
          mma16816<T>(s[mt][nt], qf[mt][kk], kb[0], kb[1]);
          mma16816<T>(s[mt][nt], qf[mt][kk + 1], kb[2], kb[3]);
        }
      }
    }

#pragma unroll
    for (int mt = 0; mt < M; ++mt) {
      // Scale to log2 units; mask keys past Tk and (causal) keys after the row. Only tiles that
      // reach past Tk or past the m-tile's first row need the per-element test.
      const bool need_mask = j0 + Bc > a.Tk || (a.causal && j0 + Bc - 1 > row0[mt] - g);
      float mx[2] = {m[mt][0], m[mt][1]};
#pragma unroll
      for (int nt = 0; nt < Bc / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[mt][nt][e] * a.scale_log2;
          if (need_mask) {
            const int row = row0[mt] + (e >= 2 ? 8 : 0), col = j0 + nt * 8 + 2 * tg + (e & 1);
            if (col >= a.Tk || (a.causal && col > row)) x = -INFINITY;
          }
          s[mt][nt][e] = x;
          mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
      }
      float corr[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // The row's max over its quad (lanes 4g..4g+3 differ in the low two bits).
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        // A row with every key so far masked keeps max -inf: subtract 0 then (all its p are 0).
        const float ms = mx[r] == -INFINITY ? 0.0f : mx[r];
        corr[r] = exp2f(m[mt][r] - ms);  // exp2(-inf) = 0 on the first tile
        m[mt][r] = mx[r];
        mx[r] = ms;
        l[mt][r] *= corr[r];
      }
#pragma unroll
      for (int nt = 0; nt < Bc / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = exp2f(s[mt][nt][e] - mx[e >> 1]);
          s[mt][nt][e] = p;
          l[mt][e >> 1] += p;
        }
      }
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o[mt][dt][0] *= corr[0], o[mt][dt][1] *= corr[0];
        o[mt][dt][2] *= corr[1], o[mt][dt][3] *= corr[1];
      }
    }

    // O += P V: P's C fragments of keys 16kk..16kk+15 are the A fragment of k-step kk.
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      uint32_t pa[M][4];
#pragma unroll
      for (int mt = 0; mt < M; ++mt) {
        pa[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);          // row g,     keys 16kk + 2tg, +1
        pa[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);          // row g + 8, keys 16kk + 2tg, +1
        pa[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);  // row g,     keys 16kk + 8 + 2tg, +1
        pa[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);  // row g + 8, keys 16kk + 8 + 2tg, +1
      }
#pragma unroll
      for (int dt = 0; dt < D / 8; dt += 2) {
        // .trans, matrices: keys 0-7 | 8-15 at columns 8dt..8dt+7, then at 8dt+8..8dt+15:
        // b0, b1 of the n-tile dt, then of dt + 1.
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, Vt + (kk * 16 + lane % 8 + (lane / 8) % 2 * 8) * LD + dt * 8 + lane / 16 * 8);
#pragma unroll
        for (int mt = 0; mt < M; ++mt) {
          mma16816<T>(o[mt][dt], pa[mt], vb[0], vb[1]);
          mma16816<T>(o[mt][dt + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with buffer `buf` before the next prefetch refills it
  }

  T* out = static_cast<T*>(a.out) + b * a.so.b + h * a.so.h;
#pragma unroll
  for (int mt = 0; mt < M; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lr = l[mt][r];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      const int row = row0[mt] + 8 * r;
      if (row >= a.Tq) continue;
      const float inv = 1.0f / lr;  // l >= 1: the row's max contributes exp2(0)
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        const uint32_t packed = pack2<T>(o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
        *reinterpret_cast<uint32_t*>(out + row * a.so.t + dt * 8 + 2 * tg) = packed;
      }
      if (tg == 0) a.lse[(static_cast<int64_t>(b) * a.H + h) * a.Tq + row] = (m[mt][r] + log2f(lr)) * kLn2;
    }
  }
}

// ---- backward ------------------------------------------------------------------------------
// FlashAttention-2's backward in two deterministic passes (no atomics), both register-resident:
//  - dK/dV: one block per (b, kv head, 64 keys), each warp owning 16 keys; the query tiles of
//    every query head of the group stream through shared memory (double-buffered), in a fixed
//    order. The warp computes the transposed tiles directly, S^T = K Q^T and dP^T = V dO^T, so
//    that P^T and dS^T come out in the C layout with keys as rows, which is the A layout of
//    dV += P^T dO and dK += dS^T Q (the forward's C -> A reuse), with dO and Q read by
//    ldmatrix .trans as the B operands (B(k = query, n = d) = dO[query][d]);
//  - dQ: one block per (b, h, 64 query rows), each warp owning 16 rows, key tiles streaming:
//    S = Q K^T, dP = dO V^T, dS = P (dP - Delta), dQ += dS K (K by ldmatrix .trans).
// P = exp2(S scale log2e - lse log2e) from the saved lse; Delta_i = dO_i . O_i from a first small
// kernel. P and dS are rounded to T as product operands, as in attention.cu.

struct BwdArgs {
  const void *q, *k, *v, *o, *dout;
  void *dq, *dk, *dv;
  const float* lse;
  float* delta;
  AttentionStrides sq, sk, sv, so;
  int H, group, Tq, Tk;
  float scale, scale_log2;
  bool causal;
};

// Delta_i = sum_c dO_ic O_ic in f32, one warp per row (a fixed butterfly: the same bits every run).
template <class T, int D>
__global__ void __launch_bounds__(256) attn_fast_delta_kernel(BwdArgs a, int64_t rows) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t i = r % a.Tq, bh = r / a.Tq;
  const int64_t h = bh % a.H, b = bh / a.H;
  const int64_t at = b * a.so.b + h * a.so.h + i * a.so.t;
  const T* o = static_cast<const T*>(a.o) + at;
  const T* dout = static_cast<const T*>(a.dout) + at;
  float acc = 0.0f;
#pragma unroll
  for (int c = lane; c < D; c += 32) acc += to_float(o[c]) * to_float(dout[c]);
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) a.delta[r] = acc;
}

// dK/dV pass tile shape: W warps x M m-tiles of 16 keys (Bk = 16 M W); query tiles of Bq rows
// (32 at D = 128 in every configuration: the accumulators dK, dV take 2 x 64 registers there).
template <int D, int W, int M, int Bq> struct DkvCfg {
  static constexpr int kD = D, kW = W, kM = M, kBk = 16 * M * W, kBq = D <= 64 ? Bq : 32, kLd = D + 8;
  static constexpr unsigned kKBytes = kBk * kLd * 2, kQBytes = kBq * kLd * 2, kStats = kBq * 4;
  // K, V, then two buffers each of Q, dO, lse, Delta.
  static constexpr unsigned kBytes = 2 * kKBytes + 4 * kQBytes + 4 * kStats;
};

template <class T, class C>
__global__ void __launch_bounds__(32 * C::kW) attn_fast_dkdv_kernel(BwdArgs a) {
  constexpr int D = C::kD, M = C::kM, Bk = C::kBk, Bq = C::kBq, LD = C::kLd;
  extern __shared__ __align__(128) unsigned char smem[];
  T* Ks = reinterpret_cast<T*>(smem);
  T* Vs = reinterpret_cast<T*>(smem + C::kKBytes);
  T* Qs = reinterpret_cast<T*>(smem + 2 * C::kKBytes);                  // two buffers of Bq x LD
  T* dOs = reinterpret_cast<T*>(smem + 2 * C::kKBytes + 2 * C::kQBytes);  // two buffers of Bq x LD
  float* lse2s = reinterpret_cast<float*>(smem + 2 * C::kKBytes + 4 * C::kQBytes);  // two of Bq
  float* deltas = lse2s + 2 * Bq;                                                  // two of Bq

  const int hk = blockIdx.y, b = blockIdx.z, k0 = blockIdx.x * Bk;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4;
  const T* kp = static_cast<const T*>(a.k) + b * a.sk.b + hk * a.sk.h + k0 * a.sk.t;
  const T* vp = static_cast<const T*>(a.v) + b * a.sv.b + hk * a.sv.h + k0 * a.sv.t;
  const int krows = min(Bk, a.Tk - k0);
  load_tile<T, D, LD>(Ks, kp, a.sk.t, krows, Bk);
  load_tile<T, D, LD>(Vs, vp, a.sv.t, krows, Bk);

  // The query tiles this key tile meets, per query head: causal, rows below k0 see none of it.
  const int qstart = a.causal ? k0 / Bq * Bq : 0;
  const int ntq = qstart < a.Tq ? (a.Tq - qstart + Bq - 1) / Bq : 0;
  const int ntiles = a.group * ntq;  // (query head of the group, query tile), in this order
  // Issues the loads of step t into buffer `buf`: Q and dO by cp.async, lse and Delta by plain
  // stores (ordered by the __syncthreads before their use).
  auto issue = [&](int t, int buf) {
    const int h = hk * a.group + t / ntq, i0 = qstart + (t % ntq) * Bq;
    const int rows = min(Bq, a.Tq - i0);
    const T* qp = static_cast<const T*>(a.q) + b * a.sq.b + h * a.sq.h + i0 * a.sq.t;
    const T* dop = static_cast<const T*>(a.dout) + b * a.so.b + h * a.so.h + i0 * a.so.t;
    load_tile<T, D, LD>(Qs + buf * Bq * LD, qp, a.sq.t, rows, Bq);
    load_tile<T, D, LD>(dOs + buf * Bq * LD, dop, a.so.t, rows, Bq);
    const int64_t base = (static_cast<int64_t>(b) * a.H + h) * a.Tq + i0;
    for (int i = threadIdx.x; i < Bq; i += blockDim.x) {
      lse2s[buf * Bq + i] = i < rows ? a.lse[base + i] * kLog2e : 0.0f;
      deltas[buf * Bq + i] = i < rows ? a.delta[base + i] : 0.0f;
    }
  };
  if (ntiles > 0) issue(0, 0);
  cp_async_commit();  // K, V (and step 0)

  // The warp owns M m-tiles of 16 keys (keys warp * 16M + 16 mt ..); every array below has the
  // m-tile as its first index, and each Q/dO fragment loaded from shared memory feeds the M
  // m-tiles' MMAs. Per m-tile the arithmetic (and its order) is that of M = 1.
  float dk[M][D / 8][4], dv[M][D / 8][4];  // C fragments: 16 keys x 8 columns of D each
  int key0[M];                             // key of c[0], c[1]; key0 + 8 of c[2], c[3]
#pragma unroll
  for (int mt = 0; mt < M; ++mt) {
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[mt][dt][e] = dv[mt][dt][e] = 0.0f;
    key0[mt] = k0 + (warp * M + mt) * 16 + g;
  }
  const T* Kw = Ks + warp * M * 16 * LD;  // the warp's first key row; m-tile mt at + 16 mt rows
  const T* Vw = Vs + warp * M * 16 * LD;

  for (int t = 0; t < ntiles; ++t) {
    const int buf = t & 1, i0 = qstart + (t % ntq) * Bq;
    if (t + 1 < ntiles) {
      issue(t + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* Qt = Qs + buf * Bq * LD;
    const T* dOt = dOs + buf * Bq * LD;
    const float* lse2 = lse2s + buf * Bq;
    const float* delta = deltas + buf * Bq;

    // S^T = K Q^T and dP^T = V dO^T: 16 keys x Bq queries per m-tile, Bq / 8 C fragments each.
    float st[M][Bq / 8][4], dpt[M][Bq / 8][4];
#pragma unroll
    for (int mt = 0; mt < M; ++mt)
#pragma unroll
      for (int nt = 0; nt < Bq / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[mt][nt][e] = dpt[mt][nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk += 2) {
      uint32_t ka[M][2][4], va[M][2][4];  // A fragments (the m-tile's 16 key rows) of k-steps kk, kk + 1
#pragma unroll
      for (int mt = 0; mt < M; ++mt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          ldmatrix_x4(ka[mt][j], Kw + (mt * 16 + lane % 8 + (lane / 8) % 2 * 8) * LD + (kk + j) * 16 + lane / 16 * 8);
          ldmatrix_x4(va[mt][j], Vw + (mt * 16 + lane % 8 + (lane / 8) % 2 * 8) * LD + (kk + j) * 16 + lane / 16 * 8);
        }
#pragma unroll
      for (int nt = 0; nt < Bq / 8; ++nt) {
        uint32_t qb[4], ob[4];  // B fragments: queries nt*8.. as columns, k-steps kk and kk + 1
        ldmatrix_x4(qb, Qt + (nt * 8 + lane % 8) * LD + kk * 16 + lane / 8 * 8);
        ldmatrix_x4(ob, dOt + (nt * 8 + lane % 8) * LD + kk * 16 + lane / 8 * 8);
#pragma unroll
        for (int mt = 0; mt < M; ++mt) {
          mma16816<T>(st[mt][nt], ka[mt][0], qb[0], qb[1]);
          mma16816<T>(st[mt][nt], ka[mt][1], qb[2], qb[3]);
          mma16816<T>(dpt[mt][nt], va[mt][0], ob[0], ob[1]);
          mma16816<T>(dpt[mt][nt], va[mt][1], ob[2], ob[3]);
        }
      }
    }
    // P^T and dS^T in place (st -> P^T, dpt -> dS^T); masked: keys past Tk, queries past Tq,
    // causal keys after the query.
#pragma unroll
    for (int mt = 0; mt < M; ++mt)
#pragma unroll
      for (int nt = 0; nt < Bq / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0[mt] + (e >= 2 ? 8 : 0), col = nt * 8 + 2 * tg + (e & 1), query = i0 + col;
          const bool vis = key < a.Tk && query < a.Tq && (!a.causal || key <= query);
          const float p = vis ? exp2f(st[mt][nt][e] * a.scale_log2 - lse2[col]) : 0.0f;
          st[mt][nt][e] = p;
          dpt[mt][nt][e] = p * (dpt[mt][nt][e] - delta[col]);
        }
      }
    // dV += P^T dO, dK += dS^T Q: k-steps of 16 queries; B(k = query, n = d) by ldmatrix .trans.
#pragma unroll
    for (int kk = 0; kk < Bq / 16; ++kk) {
      uint32_t pa[M][4], sa[M][4];
#pragma unroll
      for (int mt = 0; mt < M; ++mt) {
        pa[mt][0] = pack2<T>(st[mt][2 * kk][0], st[mt][2 * kk][1]);
        pa[mt][1] = pack2<T>(st[mt][2 * kk][2], st[mt][2 * kk][3]);
        pa[mt][2] = pack2<T>(st[mt][2 * kk + 1][0], st[mt][2 * kk + 1][1]);
        pa[mt][3] = pack2<T>(st[mt][2 * kk + 1][2], st[mt][2 * kk + 1][3]);
        sa[mt][0] = pack2<T>(dpt[mt][2 * kk][0], dpt[mt][2 * kk][1]);
        sa[mt][1] = pack2<T>(dpt[mt][2 * kk][2], dpt[mt][2 * kk][3]);
        sa[mt][2] = pack2<T>(dpt[mt][2 * kk + 1][0], dpt[mt][2 * kk + 1][1]);
        sa[mt][3] = pack2<T>(dpt[mt][2 * kk + 1][2], dpt[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dt = 0; dt < D / 8; dt += 2) {
        uint32_t ob[4], qb[4];
        ldmatrix_x4_trans(ob, dOt + (kk * 16 + lane % 8 + (lane / 8) % 2 * 8) * LD + dt * 8 + lane / 16 * 8);
        ldmatrix_x4_trans(qb, Qt + (kk * 16 + lane % 8 + (lane / 8) % 2 * 8) * LD + dt * 8 + lane / 16 * 8);
#pragma unroll
        for (int mt = 0; mt < M; ++mt) {
          mma16816<T>(dv[mt][dt], pa[mt], ob[0], ob[1]);
          mma16816<T>(dv[mt][dt + 1], pa[mt], ob[2], ob[3]);
          mma16816<T>(dk[mt][dt], sa[mt], qb[0], qb[1]);
          mma16816<T>(dk[mt][dt + 1], sa[mt], qb[2], qb[3]);
        }
      }
    }
    __syncthreads();  // buffer `buf` is refilled by the next step's prefetch
  }
  cp_async_wait<0>();  // no step at all (causal keys past the last query): K/V copies still land

  T* dkp = static_cast<T*>(a.dk) + b * a.sk.b + hk * a.sk.h;
  T* dvp = static_cast<T*>(a.dv) + b * a.sv.b + hk * a.sv.h;
#pragma unroll
  for (int mt = 0; mt < M; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = key0[mt] + 8 * r;
      if (key >= a.Tk) continue;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        const int c = dt * 8 + 2 * tg;
        *reinterpret_cast<uint32_t*>(dkp + key * a.sk.t + c) =
            pack2<T>(dk[mt][dt][2 * r] * a.scale, dk[mt][dt][2 * r + 1] * a.scale);
        *reinterpret_cast<uint32_t*>(dvp + key * a.sv.t + c) = pack2<T>(dv[mt][dt][2 * r], dv[mt][dt][2 * r + 1]);
      }
    }
}

// dQ pass tile shape: W warps x 16 query rows, key tiles of Bc rows.
template <int D, int W, int Bc> struct DqCfg {
  static constexpr int kD = D, kW = W, kBr = 16 * kW, kBc = Bc, kLd = D + 8;
  static constexpr unsigned kQBytes = kBr * kLd * 2, kKBytes = kBc * kLd * 2;
  static constexpr unsigned kBytes = 2 * kQBytes + 4 * kKBytes;  // Q, dO, K[2], V[2]
};

template <class T, class C>
__global__ void __launch_bounds__(32 * C::kW) attn_fast_dq_kernel(BwdArgs a) {
  constexpr int D = C::kD, Br = C::kBr, Bc = C::kBc, LD = C::kLd;
  extern __shared__ __align__(128) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem);
  T* dOs = reinterpret_cast<T*>(smem + C::kQBytes);
  T* Ks = reinterpret_cast<T*>(smem + 2 * C::kQBytes);                  // two buffers of Bc x LD
  T* Vs = reinterpret_cast<T*>(smem + 2 * C::kQBytes + 2 * C::kKBytes);  // two buffers of Bc x LD

  const int qtile = a.causal ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z, hk = h / a.group, i0 = qtile * Br;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4;
  const int rows = min(Br, a.Tq - i0);
  load_tile<T, D, LD>(Qs, static_cast<const T*>(a.q) + b * a.sq.b + h * a.sq.h + i0 * a.sq.t, a.sq.t, rows, Br);
  load_tile<T, D, LD>(dOs, static_cast<const T*>(a.dout) + b * a.so.b + h * a.so.h + i0 * a.so.t, a.so.t, rows, Br);
  const T* k = static_cast<const T*>(a.k) + b * a.sk.b + hk * a.sk.h;
  const T* v = static_cast<const T*>(a.v) + b * a.sv.b + hk * a.sv.h;
  const int kend = a.causal ? min(a.Tk, i0 + Br) : a.Tk;
  const int ntiles = (kend + Bc - 1) / Bc;  // >= 1
  load_tile<T, D, LD>(Ks, k, a.sk.t, min(Bc, a.Tk), Bc);
  load_tile<T, D, LD>(Vs, v, a.sv.t, min(Bc, a.Tk), Bc);
  cp_async_commit();

  const int row0 = i0 + warp * 16 + g;  // query of c[0], c[1]; row0 + 8 of c[2], c[3]
  float lse2[2], delta[2];
  const int64_t bh = static_cast<int64_t>(b) * a.H + h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    lse2[r] = row < a.Tq ? a.lse[bh * a.Tq + row] * kLog2e : 0.0f;
    delta[r] = row < a.Tq ? a.delta[bh * a.Tq + row] : 0.0f;
  }
  float dq[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.0f;
  const T* Qw = Qs + warp * 16 * LD;
  const T* dOw = dOs + warp * 16 * LD;

  for (int t = 0; t < ntiles; ++t) {
    const int j0 = t * Bc, buf = t & 1;
    if (t + 1 < ntiles) {
      const int jn = j0 + Bc;
      load_tile<T, D, LD>(Ks + (buf ^ 1) * Bc * LD, k + jn * a.sk.t, a.sk.t, min(Bc, a.Tk - jn), Bc);
      load_tile<T, D, LD>(Vs + (buf ^ 1) * Bc * LD, v + jn * a.sv.t, a.sv.t, min(Bc, a.Tk - jn), Bc);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* Kt = Ks + buf * Bc * LD;
    const T* Vt = Vs + buf * Bc * LD;

    // S = Q K^T, dP = dO V^T: the warp's 16 rows x Bc keys.
    float s[Bc / 8][4], dp[Bc / 8][4];
#pragma unroll
    for (int nt = 0; nt < Bc / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk += 2) {
      uint32_t qa[2][4], oa[2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        ldmatrix_x4(qa[j], Qw + (lane % 8 + (lane / 8) % 2 * 8) * LD + (kk + j) * 16 + lane / 16 * 8);
        ldmatrix_x4(oa[j], dOw + (lane % 8 + (lane / 8) % 2 * 8) * LD + (kk + j) * 16 + lane / 16 * 8);
      }
#pragma unroll
      for (int nt = 0; nt < Bc / 8; ++nt) {
        uint32_t kb[4], vb[4];  // keys nt*8.. as columns, k-steps kk and kk + 1
        ldmatrix_x4(kb, Kt + (nt * 8 + lane % 8) * LD + kk * 16 + lane / 8 * 8);
        ldmatrix_x4(vb, Vt + (nt * 8 + lane % 8) * LD + kk * 16 + lane / 8 * 8);
        mma16816<T>(s[nt], qa[0], kb[0], kb[1]);
        mma16816<T>(s[nt], qa[1], kb[2], kb[3]);
        mma16816<T>(dp[nt], oa[0], vb[0], vb[1]);
        mma16816<T>(dp[nt], oa[1], vb[2], vb[3]);
      }
    }
    // dS = P (dP - Delta) in place of dp; masked: keys past Tk, causal keys after the row.
#pragma unroll
    for (int nt = 0; nt < Bc / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = row0 + (e >= 2 ? 8 : 0), key = j0 + nt * 8 + 2 * tg + (e & 1);
        const bool vis = key < a.Tk && (!a.causal || key <= row);
        const float p = vis ? exp2f(s[nt][e] * a.scale_log2 - lse2[e >> 1]) : 0.0f;
        dp[nt][e] = p * (dp[nt][e] - delta[e >> 1]);
      }
    }
    // dQ += dS K: k-steps of 16 keys; B(k = key, n = d) = K[key][d] by ldmatrix .trans.
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      uint32_t sa[4];
      sa[0] = pack2<T>(dp[2 * kk][0], dp[2 * kk][1]);
      sa[1] = pack2<T>(dp[2 * kk][2], dp[2 * kk][3]);
      sa[2] = pack2<T>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
      sa[3] = pack2<T>(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
#pragma unroll
      for (int dt = 0; dt < D / 8; dt += 2) {
        uint32_t kb[4];
        ldmatrix_x4_trans(kb, Kt + (kk * 16 + lane % 8 + (lane / 8) % 2 * 8) * LD + dt * 8 + lane / 16 * 8);
        mma16816<T>(dq[dt], sa, kb[0], kb[1]);
        mma16816<T>(dq[dt + 1], sa, kb[2], kb[3]);
      }
    }
    __syncthreads();
  }

  T* dqp = static_cast<T*>(a.dq) + b * a.sq.b + h * a.sq.h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    if (row >= a.Tq) continue;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<uint32_t*>(dqp + row * a.sq.t + dt * 8 + 2 * tg) =
          pack2<T>(dq[dt][2 * r] * a.scale, dq[dt][2 * r + 1] * a.scale);
  }
}

template <class K> void prepare(K kernel, unsigned bytes, const char* name) {
  int dev = 0;
  ATH_CUDA(cudaGetDevice(&dev));
  int optin = 0;
  ATH_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  ATH_CHECK(static_cast<int>(bytes) <= optin, "cuda attention (fast)", name, " needs ", bytes,
            " bytes of shared memory per block, cuda:", dev, " allows ", optin,
            Hint{"set ATHANOR_CUDA_ATTENTION=reference"});
  ATH_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// The backward's passes in configuration (Kv = DkvCfg, Q = DqCfg).
template <class T, class Kv, class Q>
void launch_backward(const BwdArgs& a, const AttentionDims& d, cudaStream_t stream) {
  const int64_t rows = d.B * d.H * d.Tq;
  attn_fast_delta_kernel<T, Kv::kD><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(a, rows);
  ATH_CUDA_LAUNCHED("attn_fast_delta_kernel");
  auto dkdv = attn_fast_dkdv_kernel<T, Kv>;
  prepare(dkdv, Kv::kBytes, "attn_fast_dkdv_kernel");
  const dim3 kv_grid(static_cast<unsigned>((d.Tk + Kv::kBk - 1) / Kv::kBk), static_cast<unsigned>(d.kv_heads()),
                     static_cast<unsigned>(d.B));
  dkdv<<<kv_grid, 32 * Kv::kW, Kv::kBytes, stream>>>(a);
  ATH_CUDA_LAUNCHED("attn_fast_dkdv_kernel");
  auto dqk = attn_fast_dq_kernel<T, Q>;
  prepare(dqk, Q::kBytes, "attn_fast_dq_kernel");
  const dim3 q_grid(static_cast<unsigned>((d.Tq + Q::kBr - 1) / Q::kBr), static_cast<unsigned>(d.H),
                    static_cast<unsigned>(d.B));
  dqk<<<q_grid, 32 * Q::kW, Q::kBytes, stream>>>(a);
  ATH_CUDA_LAUNCHED("attn_fast_dq_kernel");
}

template <class T, class C> void launch(const FastArgs& a, const AttentionDims& d, cudaStream_t stream) {
  auto kernel = attn_fast_fwd_kernel<T, C>;
  prepare(kernel, C::kBytes, "attn_fast_fwd_kernel");
  const dim3 grid(static_cast<unsigned>((d.Tq + C::kBr - 1) / C::kBr), static_cast<unsigned>(d.H),
                  static_cast<unsigned>(d.B));
  kernel<<<grid, 32 * C::kW, C::kBytes, stream>>>(a);
  ATH_CUDA_LAUNCHED("attn_fast_fwd_kernel");
}

// The configurations (attention_fast.h's names). Two m-tiles per warp (f128x64w4, b128x16w4)
// exist at D 64 only: at D 128 the forward's Q fragments and O accumulators alone would take
// 192 registers, the dK/dV pass's dK and dV accumulators 256; f64x128w4 too (at D 128 its
// scores, Q fragments and O would take 160 of them). b128x16w4's 16-query steps keep
// its dK/dV kernel at ~243 registers without spills (32-query steps spill, per ptxas -v).
template <class T, int D> void launch_forward_tiles(FwdTiles tiles, const FastArgs& a, const AttentionDims& d,
                                                    cudaStream_t stream) {
  switch (tiles) {
    case FwdTiles::f128x64w8: return launch<T, FastCfg<D, 8, 1, 64>>(a, d, stream);
    case FwdTiles::f128x64w4:
      if constexpr (D == 64) return launch<T, FastCfg<D, 4, 2, 64>>(a, d, stream);
      else return launch<T, FastCfg<D, 4, 1, 64>>(a, d, stream);
    case FwdTiles::f64x128w4:
      if constexpr (D == 64) return launch<T, FastCfg<D, 4, 1, 128>>(a, d, stream);
      else return launch<T, FastCfg<D, 4, 1, 64>>(a, d, stream);
    default: return launch<T, FastCfg<D, 4, 1, 64>>(a, d, stream);
  }
}

template <class T, int D> void launch_backward_tiles(BwdTiles tiles, const BwdArgs& a, const AttentionDims& d,
                                                     cudaStream_t stream) {
  switch (tiles) {
    case BwdTiles::b128x64w8: return launch_backward<T, DkvCfg<D, 8, 1, 64>, DqCfg<D, 8, 64>>(a, d, stream);
    case BwdTiles::b128x16w4:
      if constexpr (D == 64) return launch_backward<T, DkvCfg<D, 4, 2, 16>, DqCfg<D, 4, 64>>(a, d, stream);
      else return launch_backward<T, DkvCfg<D, 4, 1, 64>, DqCfg<D, 4, 64>>(a, d, stream);
    default: return launch_backward<T, DkvCfg<D, 4, 1, 64>, DqCfg<D, 4, 64>>(a, d, stream);
  }
}

template <class T> void forward_tiles(FwdTiles tiles, const FastArgs& a, const AttentionDims& d, cudaStream_t stream) {
  d.D == 64 ? launch_forward_tiles<T, 64>(tiles, a, d, stream) : launch_forward_tiles<T, 128>(tiles, a, d, stream);
}
template <class T> void backward_tiles(BwdTiles tiles, const BwdArgs& a, const AttentionDims& d, cudaStream_t stream) {
  d.D == 64 ? launch_backward_tiles<T, 64>(tiles, a, d, stream) : launch_backward_tiles<T, 128>(tiles, a, d, stream);
}

}  // namespace

void attention_fast_forward(const void* q, const void* k, const void* v, void* o, float* lse, const AttentionDims& d,
                            const AttentionLayout& L, bool causal, double scale, DType dtype, cudaStream_t stream) {
  ATH_CHECK(attention_fast_supported(q, k, v, o, d, L, dtype), "cuda attention (fast)",
            "this call is not supported by the fast kernel (dtype ", dtype_name(dtype), ", D=", d.D, ", Dv=", d.Dv,
            ")", Hint{"call attention_forward, which falls back to the reference kernels"});
  FastArgs a{};
  a.q = q, a.k = k, a.v = v, a.out = o, a.lse = lse;
  a.sq = L.q, a.sk = L.k, a.sv = L.v, a.so = L.o;
  a.H = static_cast<int>(d.H);
  a.group = static_cast<int>(d.group());
  a.Tq = static_cast<int>(d.Tq), a.Tk = static_cast<int>(d.Tk);
  a.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  a.causal = causal;
  const FwdTiles tiles = attention_tiles().fwd;
  dtype == DType::bf16 ? forward_tiles<__nv_bfloat16>(tiles, a, d, stream) : forward_tiles<__half>(tiles, a, d, stream);
}

void attention_fast_backward(const void* q, const void* k, const void* v, const void* o, const void* dout,
                             const float* lse, void* dq, void* dk, void* dv, const AttentionDims& d,
                             const AttentionLayout& L, bool causal, double scale, DType dtype, void* workspace,
                             cudaStream_t stream) {
  ATH_CHECK(attention_fast_backward_supported(q, k, v, o, dout, dq, dk, dv, d, L, dtype), "cuda attention (fast)",
            "this call is not supported by the fast backward (dtype ", dtype_name(dtype), ", D=", d.D, ", Dv=", d.Dv,
            ")", Hint{"call attention_backward, which falls back to the reference kernels"});
  BwdArgs a{};
  a.q = q, a.k = k, a.v = v, a.o = o, a.dout = dout, a.dq = dq, a.dk = dk, a.dv = dv, a.lse = lse;
  a.delta = static_cast<float*>(workspace);
  a.sq = L.q, a.sk = L.k, a.sv = L.v, a.so = L.o;
  a.H = static_cast<int>(d.H);
  a.group = static_cast<int>(d.group());
  a.Tq = static_cast<int>(d.Tq), a.Tk = static_cast<int>(d.Tk);
  a.scale = static_cast<float>(scale);
  a.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  a.causal = causal;
  const BwdTiles tiles = attention_tiles().bwd;
  dtype == DType::bf16 ? backward_tiles<__nv_bfloat16>(tiles, a, d, stream)
                       : backward_tiles<__half>(tiles, a, d, stream);
}

}  // namespace athanor::cuda
