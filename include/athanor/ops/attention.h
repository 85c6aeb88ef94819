#pragma once
#include <optional>

#include "athanor/core/tensor.h"

namespace athanor {

// q: [B, H, Tq, D], k and v: [B, Hkv, Tk, D] -> [B, H, Tq, D].
// softmax(q k^T * scale (+ causal mask)) v, computed by a tiled kernel with an
// online softmax: the Tq x Tk score matrix is never materialized for all heads
// at once. Backward recomputes scores per tile from the saved log-sum-exp.
// scale defaults to 1/sqrt(D). With is_causal, query i attends to keys j <= i
// (top-left aligned, as PyTorch).
// enable_gqa (PyTorch's, grouped-query attention): Hkv divides H and query head h reads kv
// head h / (H / Hkv); k and v are never repeated in memory. Without it Hkv must equal H.
// Operands that are transposed views of contiguous tensors (q_proj(x).view({B, T, H, D})
// .transpose(1, 2)) are read in place, and then the result is laid out as [B, T, H, D] in memory
// (returned as its [B, H, T, D] transpose), so .transpose(1, 2).reshape({B, T, H * D}) is a view.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal = false,
                                    std::optional<double> scale = std::nullopt, bool enable_gqa = false);

// GPT's causal self-attention straight from the packed projection: qkv [B, T, 3 d] holds q, k,
// v side by side along the last dim (as c_attn produces them), d = n_head * head_dim, and
// head h of each is columns [h hd, (h+1) hd) of its block. Returns [B, T, d] with the heads
// side by side again, the layout c_proj reads. Same values as
//   split(qkv, d, 2) -> each .view({B, T, H, hd}).transpose(1, 2) -> sdpa(is_causal = true)
//   -> .transpose(1, 2).reshape({B, T, d})
// but the kernels read q, k, v in place and write O in [B, T, d] order, and the backward writes
// d(qkv) as one [B, T, 3 d] tensor: no head transposes, no copies, no concatenation of dq, dk, dv.
// scale defaults to 1/sqrt(head_dim).
Tensor causal_self_attention(const Tensor& qkv, int64_t n_head, std::optional<double> scale = std::nullopt);

}  // namespace athanor
