#pragma once
// Tensor-parallel layers, as Megatron-LM's tensor_parallel/layers.py. Each rank of the tp
// group (DeviceMesh::tp()) holds one shard of each weight; the layers communicate through
// the functions of tensor_parallel_mappings.h.
//
//   ColumnParallelLinear   W [out, in] split by output rows: rank r holds W_r [out/tp, in]
//                          (and b_r). y_r = x W_rᵀ + b_r is this rank's slice of the output
//                          columns. No forward communication; backward all-reduces dx (f).
//                          With sequence parallelism x is the rank's slice of the sequence
//                          and is all-gathered first (sequence_parallel_linear).
//   RowParallelLinear      W [out, in] split by input columns: rank r holds W_r [out, in/tp]
//                          and reads its slice of the input features. The partial outputs are
//                          summed by an all-reduce (g) — or reduce-scattered over the sequence
//                          with sequence parallelism — and the bias (replicated) is added after.
//   VocabParallelEmbedding the vocabulary V is padded to a multiple of pad_multiple·tp and split
//                          into equal row blocks; ids outside this rank's block contribute zero,
//                          then the partial embeddings are summed (g, or a reduce-scatter over
//                          the sequence). Its weight shard doubles as a tied lm_head's.
//   TensorParallelDropout  dropout inside a tp region: a per-rank stream (tensor_parallel_dropout.h).
//
// Initialisation: each layer draws the logical weight exactly as its 1-process counterpart
// (nn::Linear, nn::Embedding) does, from the same generator, and keeps its shard; padding rows
// are zero. So a model built the same way on every tp layout starts from the same weights,
// and the generator advances as in one process. (The logical weight exists transiently, one
// layer at a time.)
//
// Shapes that do not divide are an Error at construction, naming the layer, the sizes and tp.
// ShardedModule::local_shard_specs() says how each parameter maps onto its logical tensor
// (shard_spec.h); collect_shard_specs gathers them over a model under its parameter names.
#include <cstdint>
#include <memory>

#include "athanor/dist/shard_spec.h"
#include "athanor/dist/tensor_parallel_mappings.h"
#include "athanor/nn/layers.h"

namespace athanor::dist {

class ShardedModule {
 public:
  virtual ~ShardedModule() = default;
  // Keys: this module's own parameter names ("weight", "bias"); absent ones are replicated.
  virtual ShardSpecs local_shard_specs() const = 0;
};
// Every ShardedModule's specs in the tree of `root`, under the full parameter names.
ShardSpecs collect_shard_specs(nn::Module& root);

class ColumnParallelLinear : public nn::UnaryModule, public ShardedModule {
 public:
  struct Options {
    bool bias = true;
    int parts = 1;                   // the output rows are `parts` blocks split separately (fused q|k|v: 3)
    bool sequence_parallel = false;  // x is a slice of the sequence (dim sequence_dim): all-gather it first
    int64_t sequence_dim = 1;
    bool regather = true;            // sequence parallel: keep only the slice for backward (sequence_parallel_linear)
    bool gather_output = false;      // all-gather the output columns (y is then the full [.., out])
    // out_features padded to a multiple of pad_multiple·tp (a vocabulary-parallel lm_head, as
    // VocabParallelEmbedding pads its rows); the padding rows are zero. 1 = no padding. parts 1 only.
    int64_t pad_multiple = 1;
  };
  ColumnParallelLinear(int64_t in_features, int64_t out_features, GroupPtr tp, Options options);
  Tensor forward(const Tensor& x) override;
  ShardSpecs local_shard_specs() const override;
  Tensor weight, bias;  // [padded_out/tp, in], [padded_out/tp]
  int64_t in_features, out_features, padded_out;
  GroupPtr tp;
  Options options;
};

class RowParallelLinear : public nn::UnaryModule, public ShardedModule {
 public:
  struct Options {
    bool bias = true;
    bool sequence_parallel = false;  // reduce-scatter the output over the sequence instead of all-reducing it
    int64_t sequence_dim = 1;
    bool input_is_parallel = true;   // x is already this rank's slice of the features (else it is split here)
  };
  RowParallelLinear(int64_t in_features, int64_t out_features, GroupPtr tp, Options options);
  Tensor forward(const Tensor& x) override;
  // The second half of forward, for callers that compute the partial product themselves
  // (GPT's fused gelu_linear): sums the ranks' partial outputs (g or reduce-scatter), adds the bias.
  Tensor reduce_output(const Tensor& partial);
  ShardSpecs local_shard_specs() const override;
  Tensor weight, bias;  // [out, in/tp], [out] (replicated)
  int64_t in_features, out_features;
  GroupPtr tp;
  Options options;
};

class VocabParallelEmbedding : public nn::UnaryModule, public ShardedModule {
 public:
  // pad_multiple: V is padded to a multiple of pad_multiple·tp (Megatron's
  // make-vocab-size-divisible-by, 128); 1 = no padding, then V must be divisible by tp.
  VocabParallelEmbedding(int64_t vocab, int64_t dim, GroupPtr tp, int64_t pad_multiple = 128);
  Tensor forward(const Tensor& ids) override;   // reduce_from_tensor_parallel_region(forward_partial(ids))
  Tensor forward_partial(const Tensor& ids);    // this shard's rows only (zero elsewhere), not yet summed
  ShardSpecs local_shard_specs() const override;
  static int64_t padded_size(int64_t vocab, int tp, int64_t pad_multiple);
  Tensor weight;  // [padded / tp, dim]
  int64_t vocab, padded, dim, shard_start;
  GroupPtr tp;
};

class TensorParallelDropout : public nn::UnaryModule {
 public:
  TensorParallelDropout(double p, GroupPtr tp);
  Tensor forward(const Tensor& x) override;
  double p;
  GroupPtr tp;
};

}  // namespace athanor::dist
