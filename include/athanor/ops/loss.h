#pragma once
#include "athanor/core/tensor.h"

namespace athanor {

enum class Reduction { mean, sum, none };

// logits: [N, C] (or [C]); target: [N] integer class ids. Fused log-softmax + NLL:
// never materializes probabilities for backward beyond one row block.
// ignore_index targets contribute nothing and are not counted in the mean.
// label_smoothing eps mixes the target with the uniform distribution (PyTorch semantics).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     double label_smoothing = 0.0, Reduction reduction = Reduction::mean);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);

}  // namespace athanor
