#pragma once
// Scaled dot-product attention kernels (flash-attention style) on contiguous buffers:
//   q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv] -> o [B, H, Tq, Dv], lse [B, H, Tq]
//   o_i = sum_j softmax_j(s_ij) v_j,  s_ij = scale * q_i . k_j  (j <= i only when causal, top-left aligned)
//   lse_i = log sum_j exp(s_ij)  (saved for the backward, which recomputes softmax from it)
//
// Invariants:
//  - the Tq x Tk score matrix is never materialized: a thread holds one
//    block_q x block_k score tile (plus its accumulators) at a time, and O(T D) copies of the
//    (b, h) slice it works on (forward: K^T and V; backward: dense Q, K, dO and the dQ, dK, dV
//    accumulators); scratch comes from the tagged allocator (MemTag::workspace), so memory
//    reports see it;
//  - forward is parallel over (batch, head, query tile); backward over (batch, kv head)
//    pairs, each looping over the query heads of its group, so each thread owns the dq/dk/dv
//    slices it writes (no races, no atomics, deterministic whatever the thread count or
//    schedule); with grouped-query attention k and v are read per group (AttentionDims::Hkv)
//    and a group's dk/dv accumulate over its query heads in the thread's f32 (f64) buffers;
//  - f32 tile products run on AVX-512 FMA micro-kernels (4 x 64 register tiles; a transposed
//    A is read through strides, K^T and V^T are packed once per slice / key tile), the oneDNN
//    sgemm at the avx2 level; the score products (S, and dP in the backward) run the softmax,
//    exp or dS of their 4-row block right after it, without a separate pass over the tile;
//  - compute type: f64 for f64, f32 for f32/bf16/f16 (half tiles are converted on load);
//    bf16 inputs with even D and Dv, at the avx512 levels, multiply their tiles with bf16
//    dot products instead (vdpbf16ps with AVX512_BF16, the same sums in f32 FMAs without it;
//    f32 accumulation; P and dS rounded to bf16 as product operands; softmax and all
//    accumulators stay f32);
//    lse has the compute type (f32 except for f64 inputs, where f64 keeps gradcheck exact);
//  - causal key tiles that lie entirely above the diagonal are skipped; in tiles on the
//    diagonal, each 4-row block of a product skips the 16-column vectors of scores no row of
//    it sees and the product terms whose P or dS is masked (exact zeros);
//  - operands may be strided (AttentionLayout): each row of D elements is contiguous, rows,
//    heads and batches are anywhere, so q, k, v can be read straight out of a packed
//    [B, T, 3 H D] projection and O written in [B, T, H D] order, with no transposed copies
//    of the whole tensors (the kernels copy a slice's rows as they need them).
#include <array>
#include <cstdint>
#include <type_traits>

#include "athanor/core/convert.h"
#include "athanor/core/tensor.h"

namespace athanor::cpu {

struct AttentionDims {
  int64_t B = 1, H = 1, Tq = 0, Tk = 0, D = 0, Dv = 0;
  // Heads of k and v (grouped-query attention; PyTorch's enable_gqa): Hkv divides H and query
  // head h reads kv head h / (H / Hkv); k and v are [B, Hkv, Tk, D], never repeated. 0: Hkv = H.
  int64_t Hkv = 0;
  int64_t kv_heads() const { return Hkv > 0 ? Hkv : H; }
  int64_t group() const { return H / kv_heads(); }  // query heads per kv head
  // The kv slice (b Hkv + hkv) that query slice bh = b H + h reads.
  int64_t kv_slice(int64_t bh) const { return bh / H * kv_heads() + bh % H / group(); }
};
struct AttentionTiles {  // rows of q (resp. k) per tile; tests shrink them to cover tile edges
  int64_t q = 64, k = 64;
};
// Element strides of one [B, H, T, D] operand (k, v, dk, dv: [B, Hkv, T, D]) whose last dim is contiguous: element (b, h, t, c)
// is at b * this->b + h * this->h + t * this->t + c.
struct AttentionStrides {
  int64_t b = 0, h = 0, t = 0;
};
// Where the operands live. The backward writes dq, dk, dv in the layouts of q, k, v and reads
// dO in the layout of o.
struct AttentionLayout {
  AttentionStrides q, k, v, o;
  static AttentionLayout contiguous(const AttentionDims& d);  // each operand a dense [B, H, T, D]
  // q, k, v are column blocks of one [B, T, 3 H D] tensor (q in columns [0, H D), head h at
  // [h D, (h+1) D)); o is [B, T, H D]. Needs Tq == Tk and D == Dv.
  static AttentionLayout packed_qkv(const AttentionDims& d);
};
// Accumulation type of the attention kernels for element type T.
template <class T> using attn_acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
void attention_forward(const T* q, const T* k, const T* v, T* o, attn_acc_t<T>* lse, const AttentionDims& d,
                       const AttentionLayout& layout, bool causal, double scale, AttentionTiles tiles = {});
template <class T>
void attention_forward(const T* q, const T* k, const T* v, T* o, attn_acc_t<T>* lse, const AttentionDims& d,
                       bool causal, double scale, AttentionTiles tiles = {}) {
  attention_forward<T>(q, k, v, o, lse, d, AttentionLayout::contiguous(d), causal, scale, tiles);
}
// Gradients of all three inputs from dO, the saved output O and lse (FlashAttention-2 backward).
template <class T>
void attention_backward(const T* q, const T* k, const T* v, const T* o, const T* dout, const attn_acc_t<T>* lse,
                        T* dq, T* dk, T* dv, const AttentionDims& d, const AttentionLayout& layout, bool causal,
                        double scale, AttentionTiles tiles = {});
template <class T>
void attention_backward(const T* q, const T* k, const T* v, const T* o, const T* dout, const attn_acc_t<T>* lse,
                        T* dq, T* dk, T* dv, const AttentionDims& d, bool causal, double scale,
                        AttentionTiles tiles = {}) {
  attention_backward<T>(q, k, v, o, dout, lse, dq, dk, dv, d, AttentionLayout::contiguous(d), causal, scale, tiles);
}

namespace ref {
// Naive: the full [Tq, Tk] score matrix per (b, h) in double, mask, softmax, matmul.
// Inputs of any floating dtype and layout; results are f64 tensors.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale);
// Naive backward through the same materialized P: {dq, dk, dv} as f64 tensors.
std::array<Tensor, 3> attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                                         bool causal, double scale);
}  // namespace ref

}  // namespace athanor::cpu
