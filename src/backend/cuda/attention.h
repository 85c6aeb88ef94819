#pragma once
// Flash attention on the GPU (FlashAttention-2 style), the twin of cpu/attention.h on device
// pointers:
//   q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, D] -> o [B, H, Tq, D], lse [B, H, Tq] (f32)
//   o_i = sum_j softmax_j(s_ij) v_j,  s_ij = scale * q_i . k_j  (j <= i only when causal, top-left
//   aligned), lse_i = log sum_j exp(s_ij), saved for the backward.
// Grouped-query attention: query head h reads kv head h / (H / Hkv) (Hkv divides H; Hkv = H is
// plain multi-head attention, Hkv = 1 multi-query).
//
// Invariants:
//  - the Tq x Tk score matrix is never materialised: a block holds one score tile of its rows
//    in shared memory at a time; causal key tiles entirely above the diagonal are skipped;
//  - forward: one block per (b, h, query tile of 64 rows; 32 for f32), four warps (two), each
//    owning 16 query rows end to end (their scores, softmax statistics and output accumulator,
//    two lanes per row in the softmax), so the softmax needs no block-wide synchronisation;
//    K and V tiles pass through shared memory;
//  - backward, deterministic with no atomics at all: a dK/dV pass with one block per
//    (b, kv head, key tile), each warp owning 16 key rows and adding the contributions of every
//    query tile of every query head of its group in a fixed order; then a separate dQ pass
//    with one block per (b, h, query tile) walking the key tiles in order. P and dP are
//    recomputed from lse (so each pass recomputes the scores: 7 tile products instead of 5,
//    the price of owning every sum); Delta_i = dO_i . O_i comes from a small first pass;
//  - compute type f32 for every dtype: bf16 and f16 tiles multiply on the tensor cores
//    (WMMA 16x16x16, f32 accumulation), with P and dS rounded to the input type as product
//    operands (as the CPU's bf16 path); softmax statistics, lse and accumulators stay f32;
//    f32 inputs take a plain FMA path (no TF32), the reference;
//  - operands may be strided (AttentionLayout, the CPU's semantics): each row of D elements is
//    contiguous, rows, heads and batches anywhere, so q, k, v are read straight out of a packed
//    projection and o written in [B, T, H D] order. The backward writes dq, dk, dv in the
//    layouts of q, k, v and reads dO in the layout of o;
//  - any head dim 1 <= D <= 256 (kAttentionMaxHeadDim): the kernels run at the padded head dim
//    Dp = attention_padded_head_dim(D) (32, 64, 128 or 256) with columns D..Dp-1 zero in shared
//    memory. Zero columns add nothing to q . k, dO . v, P V, dS K or dS^T Q, so the results are
//    those at D exactly (the scale is the caller's, 1/sqrt(D) of the real D); global memory is
//    read and written in columns [0, D) only. Above 256 the tiles of a block outgrow an
//    A100's 163 KiB of shared memory. 16-byte loads where D, the strides and the pointers
//    allow them (D * sizeof(T) a multiple of 16), scalar loads otherwise;
//  - D != Dv, D outside [1, 256] and dtypes other than f32/bf16/f16 are rejected before any
//    work. Nothing here synchronises the stream.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "athanor/core/dtype.h"

namespace athanor::cuda {

// The CPU's AttentionDims (cpu/attention.h, with grouped-query attention's Hkv), field for field.
struct AttentionDims {
  int64_t B = 1, H = 1, Tq = 0, Tk = 0, D = 0, Dv = 0;
  int64_t Hkv = 0;  // kv heads; 0 means H
  int64_t kv_heads() const { return Hkv > 0 ? Hkv : H; }
  int64_t group() const { return H / kv_heads(); }  // query heads per kv head
};
// Element strides of one operand whose rows are contiguous: element (b, h, t, c) is at
// b * this->b + h * this->h + t * this->t + c (h counts kv heads for k and v).
struct AttentionStrides {
  int64_t b = 0, h = 0, t = 0;
};
struct AttentionLayout {
  AttentionStrides q, k, v, o;
  static AttentionLayout contiguous(const AttentionDims& d);  // each operand a dense [B, heads, T, D]
  // q, k, v are column blocks of one [B, T, (H + 2 Hkv) D] tensor: q in columns [0, H D),
  // k in [H D, (H + Hkv) D), v after (with Hkv = H, GPT's [B, T, 3 H D]); o is [B, T, H D].
  // Needs Tq == Tk and D == Dv.
  static AttentionLayout packed_qkv(const AttentionDims& d);
};

// The largest head dim the kernels take (shared memory bounds the tiles; attention.cu).
constexpr int64_t kAttentionMaxHeadDim = 256;
// The head dim the kernels run at for head dim D: the smallest of 32, 64, 128, 256 that is
// >= D; 0 when D is outside [1, kAttentionMaxHeadDim] (not supported).
int64_t attention_padded_head_dim(int64_t D);

// Checks dims, layout, dtype and head dim (op "cuda attention"); throws before any work.
void attention_check(const AttentionDims& d, const AttentionLayout& layout, DType dtype, const char* op);

// q, k, v, o of `dtype` (f32, bf16, f16); lse is f32 [B, H, Tq] contiguous.
void attention_forward(const void* q, const void* k, const void* v, void* o, float* lse, const AttentionDims& d,
                       const AttentionLayout& layout, bool causal, double scale, DType dtype, cudaStream_t stream);

// Bytes of device scratch attention_backward needs (Delta, f32 [B, H, Tq]).
int64_t attention_backward_workspace(const AttentionDims& d);
// Gradients of q, k, v from dO, the saved O and lse. dq, dk, dv are fully overwritten (with
// GQA, dk/dv hold the sums over each kv head's query heads). `workspace` holds
// attention_backward_workspace(d) bytes, 16-byte aligned.
void attention_backward(const void* q, const void* k, const void* v, const void* o, const void* dout,
                        const float* lse, void* dq, void* dk, void* dv, const AttentionDims& d,
                        const AttentionLayout& layout, bool causal, double scale, DType dtype, void* workspace,
                        cudaStream_t stream);

}  // namespace athanor::cuda
