#pragma once
// Dropout under tensor and sequence parallelism, deterministic given (seed, rank layout).
//
// athanor's dropout (ops/dropout.h) keeps element i of a tensor of n elements iff
//   philox4x32(seed, offset + i/4)[i % 4] >> 8 >= ceil(p · 2^24)
// after one gen.reserve(ceil(n/4)); every rank's default generator holds the same state,
// so dropout on a replicated tensor (outside tensor-parallel regions) draws the same mask
// on every tp rank, as one process does. Two more cases:
//
//  - inside a tensor-parallel region (between a column- and a row-parallel layer) each rank
//    holds a different part of the activations and must draw its own mask:
//    tensor_parallel_region_dropout draws from Philox stream 1 + tp_index at the generator's
//    (seed, offset) — what Megatron's model-parallel RNG tracker gives, without a second
//    generator: the default generator advances by the same ceil(n/4) blocks on every rank
//    (the shapes are equal), so the replicated stream stays in step, and activation
//    checkpointing (which restores the default generator) redraws the same masks;
//  - on a sequence-parallel slice (rank r holding rows [start, start + n) of dimension
//    `dim` of a logical tensor whose size there is `full`): sequence_parallel_dropout keeps
//    exactly the elements that dropout() of the logical tensor keeps (it reserves the
//    logical tensor's blocks and indexes the mask by logical position), so a run with
//    sequence parallelism draws the masks of the run without it, and of one process.
//
// Both scale kept elements by 1/(1-p) in the arithmetic of ops/dropout (f32 for f32/bf16/
// f16, f64 for f64), recompute the mask in backward from the saved (seed, offset) and return
// x itself when !training or p == 0.
#include "athanor/core/rng.h"
#include "athanor/core/tensor.h"

namespace athanor::dist {

Tensor tensor_parallel_region_dropout(const Tensor& x, double p, bool training, int tp_index,
                                      Generator& gen = default_generator());
Tensor sequence_parallel_dropout(const Tensor& x, double p, bool training, int64_t dim, int64_t start, int64_t full,
                                 Generator& gen = default_generator());

}  // namespace athanor::dist
