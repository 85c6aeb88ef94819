#pragma once
// GPT-2 with Megatron-style tensor parallelism (and optional sequence parallelism) over a
// tp group: nn::GPT's model, parameter names and initialisation, each layer split across
// the group's ranks.
//
//   transformer.wte          VocabParallelEmbedding (vocabulary padded to a multiple of
//                            vocab_pad_multiple·tp, split in row blocks); the tied lm_head
//                            uses the same shard: logits_r = x W_rᵀ are this rank's columns
//   attn.c_attn              ColumnParallelLinear, 3 parts (rank r: heads r·H/tp .. of q, k, v)
//   attn.c_proj, mlp.c_proj  RowParallelLinear (bias added after the reduction)
//   mlp.c_fc                 ColumnParallelLinear
//   wpe, ln_1, ln_2, ln_f    replicated
//   loss                     vocab_parallel_cross_entropy: the full logits are never gathered
//
// Per layer and micro-batch this communicates, with TP alone, 4 all-reduces of B·T·d
// elements (f before c_attn and c_fc in backward, g after the two c_projs in forward); the
// embedding adds one in forward (g) and the lm_head one in backward (f), the loss three of
// B·T values. With sequence parallelism (options.sequence_parallel) the activations between
// the tensor-parallel regions (LayerNorms, dropout, residuals) are [B, T/tp, d] slices of
// the sequence: g becomes a reduce-scatter, f an all-gather (each B·T·d elements), and with
// regather (default) the column-parallel layers keep only their input slice and all-gather
// it again in backward (one more all-gather per column-parallel layer, the lm_head included).
// The replicated parameters that then see only a slice (wpe, LayerNorms, c_proj biases) have
// their gradients summed over tp by the data-parallel wrapper (ShardSpec::sum_grad_over_tp).
//
// Dropout: outside the tp regions every rank draws the replicated stream; with sequence
// parallelism each rank draws its slice of the logical mask (tensor_parallel_dropout.h), so
// the masks are those of one process in both cases.
//
// Initialisation equals nn::GPT's for the same generator state (each layer draws the
// logical tensor and keeps its shard; the generator advances as in one process), so a run
// at any tp starts from the 1-process weights. Errors before any work: n_head not
// divisible by tp; sequence parallelism with block_size not divisible by tp; a vocabulary
// not divisible by tp with padding off.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "athanor/core/rng.h"
#include "athanor/dist/shard_spec.h"
#include "athanor/dist/tensor_parallel_layers.h"
#include "athanor/dist/tensor_parallel_lm.h"
#include "athanor/nn/gpt.h"
#include "athanor/ops/loss.h"

namespace athanor::dist {

class TPBlock;

class TensorParallelGPT : public TensorParallelLM {
 public:
  TensorParallelGPT(nn::GPTConfig config, GroupPtr tp, TensorParallelOptions options = {});
  // logits, loss, generate, shard_specs, logical_state_dict …: TensorParallelLM's.

  const nn::GPTConfig& config() const { return config_; }
  int64_t padded_vocab() const;
  // nn::GPT's FLOPs per token (6 N + 12 L d T) over the logical parameters.
  double flops_per_token(int64_t seq_len) const override;
  std::vector<std::string> shard_units() const override;  // "transformer.h.<i>" (ZeRO-3 units)

 private:
  Tensor hidden(const Tensor& ids, bool sequence_parallel) override;  // ln_f's output (a sequence slice when parallel)
  const Tensor& head_weight() const override;
  nn::GPTConfig config_;
  std::shared_ptr<nn::Module> transformer_;
  std::shared_ptr<VocabParallelEmbedding> wte_;
  std::shared_ptr<nn::Embedding> wpe_;
  std::shared_ptr<nn::Dropout> drop_;
  std::vector<std::shared_ptr<TPBlock>> blocks_;
  std::shared_ptr<nn::LayerNorm> ln_f_;
  std::shared_ptr<bool> sp_;  // whether the forward in progress is sequence-parallel (the blocks read it)
};

}  // namespace athanor::dist
