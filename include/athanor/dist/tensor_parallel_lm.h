#pragma once
// A decoder-only language model split over a tensor-parallel group (Megatron's layout): what
// every such model shares, whatever its blocks. dist::TensorParallelGPT (tensor_parallel_gpt.h)
// and dist::TensorParallelLlama (tensor_parallel_llama.h) derive from it; the trainer, the
// checkpointer and the tasks see this interface.
//
// The model's last hidden state x (after its final norm) meets a vocabulary-parallel head:
// logits_r = f(x) W_rᵀ, W_r this rank's rows of the (padded) vocabulary; the loss is
// vocab_parallel_cross_entropy over them (the full logits are never gathered). Under sequence
// parallelism x is this rank's [B, T/tp, d] slice, all-gathered by the head's input
// (sequence_parallel_linear, regathered in backward when options.regather).
//
// Every parameter keeps the 1-process model's name; shard_specs() says how each local tensor
// maps onto its logical one (shard_spec.h), which is what checkpoints, exports and the
// data-parallel wrapper read.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "athanor/core/rng.h"
#include "athanor/dist/shard_spec.h"
#include "athanor/dist/tensor_parallel_mappings.h"
#include "athanor/nn/module.h"
#include "athanor/ops/loss.h"

namespace athanor::dist {

struct TensorParallelOptions {
  bool sequence_parallel = false;
  int64_t vocab_pad_multiple = 128;  // vocabulary padded to a multiple of this × tp (1 = no padding)
  bool regather = true;              // sequence parallel: column-parallel inputs kept as slices (tensor_parallel_mappings.h)
};

class TensorParallelLM : public nn::Module {
 public:
  // This rank's vocabulary columns of the logits, [B, T, padded_vocab / tp]; the padding
  // columns are excluded by the loss.
  Tensor logits(const Tensor& ids);
  // Next-token cross-entropy over the unpadded vocabulary (ignore_index -100).
  Tensor loss(const Tensor& ids, const Tensor& targets, Reduction reduction = Reduction::mean);
  // As the 1-process model's generate; every rank of the tp group calls it (collectives) and
  // gets the same tokens. No KV cache: each new token recomputes the context.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t max_new_tokens, double temperature = 1.0,
                                int64_t top_k = 0, Generator& gen = default_generator());

  const TensorParallelOptions& options() const { return options_; }
  const GroupPtr& tp() const { return tp_; }
  // How every parameter maps onto the logical (1-process) one; under the model's parameter names.
  const ShardSpecs& shard_specs() const { return specs_; }
  int64_t vocab_size() const { return vocab_; }
  int64_t block_size() const { return block_size_; }
  // The 1-process model's parameter count and FLOPs per token (a rank does 1/tp of them).
  int64_t logical_parameters_count() const;
  virtual double flops_per_token(int64_t seq_len) const = 0;
  virtual std::vector<std::string> shard_units() const = 0;  // ZeRO-3 units: the blocks

  // The logical state dict (1-process names and shapes) from every rank's shards: a collective over tp.
  nn::StateDict logical_state_dict();
  // Loads a logical state dict (any tp layout saved it): each rank copies its shard. Strict.
  void load_logical_state_dict(const nn::StateDict& state);

 protected:
  // name: the model's, for errors ("TensorParallelGPT").
  TensorParallelLM(const char* name, GroupPtr tp, TensorParallelOptions options, int64_t vocab, int64_t block_size);
  // The final norm's output for ids [B, T] (this rank's sequence slice when sp).
  virtual Tensor hidden(const Tensor& ids, bool sequence_parallel) = 0;
  // The head's weight: this rank's vocabulary rows [padded / tp, d] (the embedding's when tied).
  virtual const Tensor& head_weight() const = 0;
  // Whether a forward of T tokens runs sequence-parallel (an Error when training on a T that tp does not divide).
  bool use_sequence_parallel(int64_t T) const;

  const char* name_;
  GroupPtr tp_;
  TensorParallelOptions options_;
  int64_t vocab_, block_size_;
  ShardSpecs specs_;
};

// The ShardSpec of an optimizer-state key "<state>.<param>" (the parameter's).
ShardSpec optimizer_state_spec(const ShardSpecs& specs, const std::string& key);

}  // namespace athanor::dist
