#pragma once
#include <optional>

#include "athanor/core/tensor.h"

namespace athanor {

// q: [B, H, Tq, D], k and v: [B, H, Tk, D] -> [B, H, Tq, D].
// softmax(q k^T * scale (+ causal mask)) v, computed by a tiled kernel with an
// online softmax: the Tq x Tk score matrix is never materialized for all heads
// at once. Backward recomputes scores per tile from the saved log-sum-exp.
// scale defaults to 1/sqrt(D). With is_causal, query i attends to keys j <= i
// (top-left aligned, as PyTorch).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal = false,
                                    std::optional<double> scale = std::nullopt);

}  // namespace athanor
