#pragma once
// The transformer block of dist::TensorParallelGPT (tensor_parallel_gpt.h), shared with the
// pipeline's dist::PipelineGPT (pipeline_gpt.h), which holds a range of these blocks: nn::GPT's
// block (pre-LayerNorm attention and MLP, Hugging Face names) with Megatron's split:
//   x += g(attn_r(f(ln_1(x)))); x += g(mlp_r(f(ln_2(x))))   (sequence parallel: all-gather / reduce-scatter)
// Internal to src/dist.
#include <memory>

#include "athanor/dist/tensor_parallel_gpt.h"
#include "athanor/dist/tensor_parallel_layers.h"
#include "athanor/nn/gpt.h"
#include "athanor/nn/layers.h"

namespace athanor::dist {

// A module whose children the caller names ("h", "0", …).
class TPContainer : public nn::Module {
 public:
  template <class M> std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) { return register_module(name, std::move(m)); }
};

// Dropout on a replicated tensor, or on this rank's sequence slice of one ([B, T/tp, d], dim 1):
// the mask is the logical one either way (the generator advances as in one process).
Tensor replicated_dropout(const nn::Dropout& d, const Tensor& x, bool sequence_parallel, const GroupPtr& tp);

class TPAttention;
class TPFeedForward;

class TPBlock : public nn::Module {
 public:
  // sp: whether the forward in progress is sequence-parallel (its owner sets it per forward).
  TPBlock(const nn::GPTConfig& c, const GroupPtr& tp, const TensorParallelOptions& o, const std::shared_ptr<const bool>& sp);
  Tensor forward(const Tensor& x);
  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<TPAttention> attn;
  std::shared_ptr<TPFeedForward> mlp;
};

// x = g(wte_r[ids]) + wpe[0..T), then dropout; under sequence parallelism this rank's slice
// of the sequence ([B, T/tp, d]).
Tensor tp_embed(VocabParallelEmbedding& wte, nn::Embedding& wpe, const nn::Dropout& drop, const Tensor& ids, bool sequence_parallel,
                const GroupPtr& tp);
// The tied lm_head's logits over this rank's vocabulary rows, from ln_f's output x.
Tensor tp_logits(const Tensor& x, const Tensor& wte_weight, bool sequence_parallel, bool regather, const GroupPtr& tp);

// nn::GPT's GPT-2 initialisation of one parameter, drawn over its logical tensor (this rank
// keeps its shard): N(0, 0.02), residual projections N(0, 0.02/sqrt(2 n_layer)), zero
// biases, LayerNorms left as constructed. The generator advances by the logical tensor's draws.
void init_gpt_parameter(const std::string& name, Tensor& p, const ShardSpec& spec, int64_t n_layer);
// What init_gpt_parameter draws for a parameter of `logical_numel` elements this rank does
// not hold: the generator advances by the same number of blocks.
void skip_gpt_parameter(const std::string& name, int64_t logical_numel);

}  // namespace athanor::dist
