#pragma once
// The Llama (nn::Llama: RoPE, SwiGLU, RMSNorm, grouped-query attention) with Megatron-style
// tensor parallelism (and optional sequence parallelism) over a tp group: nn::Llama's model,
// Hugging Face parameter names and initialisation, each layer split across the group's ranks.
//
//   model.embed_tokens        VocabParallelEmbedding (vocabulary padded to a multiple of
//                             vocab_pad_multiple·tp, split in row blocks)
//   model.layers.<i>          TPLlamaLayer (src/dist/tensor_parallel_llama_layer.h): q_proj split
//                             by query heads, k_proj / v_proj by kv heads so that a rank holds
//                             n_kv_head/tp kv heads and exactly the n_head/tp query heads of their
//                             groups (GQA is local); o_proj row-parallel; gate_proj / up_proj
//                             column-parallel, down_proj row-parallel (SwiGLU local); the RMSNorms
//                             replicated. tp > n_kv_head (MQA) replicates the kv heads (Megatron).
//   model.norm                replicated
//   lm_head                   ColumnParallelLinear over the padded vocabulary (this rank's rows);
//                             tied: embed_tokens' shard is the head, as nn::Llama's tie
//   loss                      vocab_parallel_cross_entropy: the full logits are never gathered
//
// Per layer and micro-batch this communicates what TensorParallelGPT does (tensor_parallel_gpt.h):
// 4 all-reduces of B·T·d (f before q|k|v and before gate|up in backward, g after o_proj and
// down_proj in forward), or with sequence parallelism their reduce-scatter / all-gather halves.
//
// Initialisation equals nn::Llama's for the same generator state: every layer draws its logical
// tensors at construction as nn::Llama's do, then HF's N(0, initializer_range) re-init is drawn
// over each logical tensor in nn::Llama's order and cut to the shard. Errors before any work
// (check_tensor_parallel_llama): n_head not divisible by tp; n_kv_head and tp not dividing one
// another; intermediate_size not divisible by tp; sequence parallelism with block_size not
// divisible by tp; a vocabulary not divisible by tp with padding off.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "athanor/dist/tensor_parallel_layers.h"
#include "athanor/dist/tensor_parallel_lm.h"
#include "athanor/nn/llama.h"

namespace athanor::dist {

class TPLlamaLayer;

class TensorParallelLlama : public TensorParallelLM {
 public:
  TensorParallelLlama(nn::LlamaConfig config, GroupPtr tp, TensorParallelOptions options = {});
  // logits, loss, generate, shard_specs, logical_state_dict …: TensorParallelLM's.
  ~TensorParallelLlama() override;

  const nn::LlamaConfig& config() const { return config_; }
  // nn::Llama::flops_per_token's rule over the logical parameters.
  double flops_per_token(int64_t seq_len) const override;
  std::vector<std::string> shard_units() const override;  // "model.layers.<i>" (ZeRO-3 units)

 private:
  Tensor hidden(const Tensor& ids, bool sequence_parallel) override;  // model.norm's output
  const Tensor& head_weight() const override;
  nn::LlamaConfig config_;
  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<VocabParallelEmbedding> embed_tokens_;
  std::vector<std::shared_ptr<TPLlamaLayer>> layers_;
  std::shared_ptr<nn::RMSNorm> norm_;
  std::shared_ptr<ColumnParallelLinear> lm_head_;  // null when tied
  std::shared_ptr<bool> sp_;
};

}  // namespace athanor::dist
