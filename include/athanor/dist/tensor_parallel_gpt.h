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
#include "athanor/nn/gpt.h"
#include "athanor/ops/loss.h"

namespace athanor::dist {

struct TensorParallelOptions {
  bool sequence_parallel = false;
  int64_t vocab_pad_multiple = 128;  // vocabulary padded to a multiple of this × tp (1 = no padding)
  bool regather = true;              // sequence parallel: column-parallel inputs kept as slices (see above)
};

class TPBlock;

class TensorParallelGPT : public nn::Module {
 public:
  TensorParallelGPT(nn::GPTConfig config, GroupPtr tp, TensorParallelOptions options = {});
  // This rank's vocabulary columns of the logits, [B, T, padded_vocab / tp]; the padding
  // columns (rows of wte past the vocabulary) are excluded by the loss.
  Tensor logits(const Tensor& ids);
  // Next-token cross-entropy over the unpadded vocabulary (ignore_index -100).
  Tensor loss(const Tensor& ids, const Tensor& targets, Reduction reduction = Reduction::mean);
  // As nn::GPT::generate; every rank of the tp group calls it (collectives) and gets the same tokens.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t max_new_tokens, double temperature = 1.0,
                                int64_t top_k = 0, Generator& gen = default_generator());

  const nn::GPTConfig& config() const { return config_; }
  const TensorParallelOptions& options() const { return options_; }
  const GroupPtr& tp() const { return tp_; }
  // How every parameter maps onto the logical (1-process) one; under the model's parameter names.
  const ShardSpecs& shard_specs() const { return specs_; }
  int64_t padded_vocab() const;
  // The 1-process model's parameter count and FLOPs per token (nn::GPT's formula).
  int64_t logical_parameters_count() const;
  double flops_per_token(int64_t seq_len) const;
  std::vector<std::string> shard_units() const;  // "transformer.h.<i>" (ZeRO-3 units)

  // The logical state dict (1-process names and shapes) from every rank's shards: a collective over tp.
  nn::StateDict logical_state_dict();
  // Loads a logical state dict (any tp layout saved it): each rank copies its shard. Strict.
  void load_logical_state_dict(const nn::StateDict& state);

 private:
  Tensor hidden(const Tensor& ids, bool sequence_parallel);  // ln_f's output (a sequence slice when parallel)
  bool use_sequence_parallel(int64_t T) const;
  nn::GPTConfig config_;
  GroupPtr tp_;
  TensorParallelOptions options_;
  std::shared_ptr<nn::Module> transformer_;
  std::shared_ptr<VocabParallelEmbedding> wte_;
  std::shared_ptr<nn::Embedding> wpe_;
  std::shared_ptr<nn::Dropout> drop_;
  std::vector<std::shared_ptr<TPBlock>> blocks_;
  std::shared_ptr<nn::LayerNorm> ln_f_;
  ShardSpecs specs_;
  std::shared_ptr<bool> sp_;  // whether the forward in progress is sequence-parallel (the blocks read it)
};

// ShardSpecs of nn-style names for an optimizer-state key "<state>.<param>" (the parameter's).
ShardSpec optimizer_state_spec(const ShardSpecs& specs, const std::string& key);

}  // namespace athanor::dist
