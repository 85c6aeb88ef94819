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

struct FastArgs {
  const void *q, *k, *v;
  void* out;
  float* lse;
  AttentionStrides sq, sk, sv, so;
  int H, group, Tq, Tk;
  float scale_log2;  // scale * log2(e): scores are kept in log2 units, exp2 is the hardware's
  bool causal;
};

// Tile shape: W warps of 16 query rows, key/value tiles of kBc rows. Shared rows are D + 8
// elements (16 bytes of padding): the 8 rows one ldmatrix reads at one column then start in 8
// different 16-byte bank groups (row stride 144 or 272 bytes, 16 mod 128), so it has no bank
// conflicts, and every row start stays 16-byte aligned for cp.async.
template <int D> struct FastCfg {
  static constexpr int kW = 4, kBr = 16 * kW, kBc = 64, kLd = D + 8;
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

template <class T, int D>
__global__ void __launch_bounds__(32 * FastCfg<D>::kW) attn_fast_fwd_kernel(FastArgs a) {
  using C = FastCfg<D>;
  constexpr int Br = C::kBr, Bc = C::kBc, LD = C::kLd;
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

  uint32_t qf[D / 16][4];  // the warp's 16 query rows as A fragments, one per 16 columns of D
  float o[D / 8][4];       // O accumulator: C fragments, one per 8 columns of D
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  // Rows g (index 0) and g + 8 (index 1) of the warp: running max of the log2-unit scores
  // (the same in the 4 lanes of a row's quad) and this lane's partial sum of exp2(s - max) over
  // its own columns (summed over the quad at the end).
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int row0 = i0 + warp * 16 + g;  // query index of c[0], c[1]; row0 + 8 of c[2], c[3]

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
      for (int kk = 0; kk < D / 16; ++kk)  // matrices: rows 0-7 | 8-15 at cols 0-7, then at cols 8-15
        ldmatrix_x4(qf[kk], Qs + (warp * 16 + lane % 8 + (lane / 8) % 2 * 8) * LD + kk * 16 + lane / 16 * 8);
    }
    const T* Kt = Ks + buf * Bc * LD;
    const T* Vt = Vs + buf * Bc * LD;

    // S = Q K^T for the warp's 16 rows and the tile's Bc keys: Bc / 8 C fragments.
    float s[Bc / 8][4];
#pragma unroll
    for (int nt = 0; nt < Bc / 8; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; kk += 2) {
        // Keys nt*8..nt*8+7, columns 16kk + 8i for matrix i: b0, b1 of k-step kk, then of kk+1.
        uint32_t kb[4];
        ldmatrix_x4(kb, Kt + (nt * 8 + lane % 8) * LD + kk * 16 + lane / 8 * 8);
        mma16816<T>(s[nt], qf[kk], kb[0], kb[1]);
        mma16816<T>(s[nt], qf[kk + 1], kb[2], kb[3]);
      }
    }

    // Scale to log2 units; mask keys past Tk and (causal) keys after the row. Only tiles that
    // reach past Tk or past the warp's first row need the per-element test.
    const bool need_mask = j0 + Bc > a.Tk || (a.causal && j0 + Bc - 1 > i0 + warp * 16);
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nt = 0; nt < Bc / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * a.scale_log2;
        if (need_mask) {
          const int row = row0 + (e >= 2 ? 8 : 0), col = j0 + nt * 8 + 2 * tg + (e & 1);
          if (col >= a.Tk || (a.causal && col > row)) x = -INFINITY;
        }
        s[nt][e] = x;
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
      corr[r] = exp2f(m[r] - ms);  // exp2(-inf) = 0 on the first tile
      m[r] = mx[r];
      mx[r] = ms;
      l[r] *= corr[r];
    }
#pragma unroll
    for (int nt = 0; nt < Bc / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[nt][e] - mx[e >> 1]);
        s[nt][e] = p;
        l[e >> 1] += p;
      }
    }
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      o[dt][0] *= corr[0], o[dt][1] *= corr[0];
      o[dt][2] *= corr[1], o[dt][3] *= corr[1];
    }

    // O += P V: P's C fragments of keys 16kk..16kk+15 are the A fragment of k-step kk.
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      uint32_t pa[4];
      pa[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);          // row g,     keys 16kk + 2tg, +1
      pa[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);          // row g + 8, keys 16kk + 2tg, +1
      pa[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);  // row g,     keys 16kk + 8 + 2tg, +1
      pa[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);  // row g + 8, keys 16kk + 8 + 2tg, +1
#pragma unroll
      for (int dt = 0; dt < D / 8; dt += 2) {
        // .trans, matrices: keys 0-7 | 8-15 at columns 8dt..8dt+7, then at 8dt+8..8dt+15:
        // b0, b1 of the n-tile dt, then of dt + 1.
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, Vt + (kk * 16 + lane % 8 + (lane / 8) % 2 * 8) * LD + dt * 8 + lane / 16 * 8);
        mma16816<T>(o[dt], pa, vb[0], vb[1]);
        mma16816<T>(o[dt + 1], pa, vb[2], vb[3]);
      }
    }
    __syncthreads();  // every warp is done with buffer `buf` before the next prefetch refills it
  }

  T* out = static_cast<T*>(a.out) + b * a.so.b + h * a.so.h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int row = row0 + 8 * r;
    if (row >= a.Tq) continue;
    const float inv = 1.0f / l[r];  // l >= 1: the row's max contributes exp2(0)
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      const uint32_t packed = pack2<T>(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
      *reinterpret_cast<uint32_t*>(out + row * a.so.t + dt * 8 + 2 * tg) = packed;
    }
    if (tg == 0) a.lse[(static_cast<int64_t>(b) * a.H + h) * a.Tq + row] = (m[r] + log2f(l[r])) * kLn2;
  }
}

template <class T, int D>
void launch(const FastArgs& a, const AttentionDims& d, cudaStream_t stream) {
  using C = FastCfg<D>;
  auto kernel = attn_fast_fwd_kernel<T, D>;
  int dev = 0;
  ATH_CUDA(cudaGetDevice(&dev));
  int optin = 0;
  ATH_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  ATH_CHECK(static_cast<int>(C::kBytes) <= optin, "cuda attention (fast)", "attn_fast_fwd_kernel needs ", C::kBytes,
            " bytes of shared memory per block, cuda:", dev, " allows ", optin,
            Hint{"set ATHANOR_CUDA_ATTENTION=reference"});
  ATH_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(C::kBytes)));
  const dim3 grid(static_cast<unsigned>((d.Tq + C::kBr - 1) / C::kBr), static_cast<unsigned>(d.H),
                  static_cast<unsigned>(d.B));
  kernel<<<grid, 32 * C::kW, C::kBytes, stream>>>(a);
  ATH_CUDA_LAUNCHED("attn_fast_fwd_kernel");
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
  const bool bf16 = dtype == DType::bf16;
  if (d.D == 64)
    bf16 ? launch<__nv_bfloat16, 64>(a, d, stream) : launch<__half, 64>(a, d, stream);
  else
    bf16 ? launch<__nv_bfloat16, 128>(a, d, stream) : launch<__half, 128>(a, d, stream);
}

}  // namespace athanor::cuda
