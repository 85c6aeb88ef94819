#pragma once
// Cross-entropy over logits whose vocabulary is split across the tensor-parallel group
// (Megatron-LM's vocab_parallel_cross_entropy): rank r holds the logits of vocabulary rows
// [r·Vl, (r+1)·Vl) of a vocabulary padded to tp·Vl rows, of which the first `vocab` are real.
// The full [N, V] logits are never gathered. Forward, for each of the N rows:
//   m = max over the real columns          (all-reduce max of N values)
//   s = Σ exp(logit - m)                    (all-reduce sum of N values)
//   z = the target's logit (0 on the ranks that do not hold it)   (all-reduce sum of N values)
//   loss = log s + m - z
// three all-reduces of N floats (f32; f64 for f64 logits). Padding columns count as -inf:
// they take no probability and get a zero gradient, so the loss is that of the unpadded
// vocabulary. Backward needs no communication: d logit_c = (exp(logit_c - m)/s - [c = target])·g,
// from the saved logits and the reduced m and s.
//
// logits: [N, Vl] (any floating dtype: bf16/f16 are read in f32 arithmetic, the loss is then
// f32 and the gradient comes back in the logits' dtype, as ops/cross_entropy does under
// autocast); target: [N] integer ids in [0, vocab) or ignore_index, the same on every rank.
// Reduction as cross_entropy (ops/loss.h): mean over the counted rows, sum, or none.
// An out-of-range target is an Error before any collective (every rank sees the same targets).
#include <cstdint>

#include "athanor/dist/tensor_parallel_mappings.h"
#include "athanor/ops/loss.h"

namespace athanor::dist {

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& target, int64_t vocab, const GroupPtr& tp,
                                    int64_t ignore_index = -100, Reduction reduction = Reduction::mean);

}  // namespace athanor::dist
