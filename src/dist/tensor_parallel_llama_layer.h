#pragma once
// The decoder layer of dist::TensorParallelLlama (tensor_parallel_llama.h), shared with the
// pipeline's dist::PipelineLlama (pipeline_llama.h): nn::Llama's layer (pre-RMSNorm, RoPE, GQA,
// SwiGLU; Hugging Face names) with Megatron's split over the tp group:
//   self_attn.q_proj          column-parallel by query heads: rank r holds heads [r·H/tp, (r+1)·H/tp)
//   self_attn.k_proj, v_proj  column-parallel by kv heads: rank r holds [r·Hkv/tp, (r+1)·Hkv/tp),
//                             exactly the kv heads its query heads read (query head h reads
//                             kv head h / (H/Hkv)), so attention needs no communication. With
//                             fewer kv heads than ranks (tp a multiple of Hkv; MQA is Hkv = 1)
//                             they are replicated, as Megatron does: rank r reads kv head
//                             r / (tp/Hkv), and the ranks' partial gradients are summed over tp
//                             (ShardSpec::sum_grad_over_tp).
//   self_attn.o_proj          row-parallel (g)
//   mlp.gate_proj, up_proj    column-parallel (the fused SwiGLU is local), mlp.down_proj row-parallel (g)
//   input_layernorm, post_attention_layernorm   replicated (sequence parallel: gradients summed over tp)
// q, k and v read one input: one f per attention (and one per MLP), the traffic of the GPT's fused
// c_attn; under sequence parallelism one all-gather (regathered in backward with options.regather).
// Internal to src/dist.
#include <memory>
#include <string>

#include "athanor/dist/tensor_parallel_layers.h"
#include "athanor/dist/tensor_parallel_lm.h"
#include "athanor/nn/layers.h"
#include "athanor/nn/llama.h"
#include "athanor/ops/rope.h"

namespace athanor::dist {

class TPLlamaAttention;
class TPLlamaMLP;

class TPLlamaLayer : public nn::Module {
 public:
  // sp: whether the forward in progress is sequence-parallel (its owner sets it per forward).
  TPLlamaLayer(const nn::LlamaConfig& c, const GroupPtr& tp, const TensorParallelOptions& o, const std::shared_ptr<const bool>& sp);
  Tensor forward(const Tensor& x, const RopeOptions& rope);
  std::shared_ptr<TPLlamaAttention> self_attn;
  std::shared_ptr<TPLlamaMLP> mlp;
  std::shared_ptr<nn::RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<nn::Dropout> attn_drop, mlp_drop;
};

// The config's problems for a split over tp ranks, checked before any work: nn::Llama's own,
// then n_head, n_kv_head (or replication), intermediate_size and, with sequence parallelism,
// block_size against tp. `op` names the caller in the error.
void check_tensor_parallel_llama(const nn::LlamaConfig& c, int tp, bool sequence_parallel, const char* op);

// Whether the layers replicate the kv heads (tp > n_kv_head).
bool replicates_kv_heads(const nn::LlamaConfig& c, int tp);

// The specs the model adds to its layers' (collect_shard_specs): replicated parameters whose
// gradient each rank computes only part of (the norms under sequence parallelism, replicated
// kv projections).
void mark_llama_partial_gradients(ShardSpecs& specs, const nn::Module& model, const nn::LlamaConfig& c, int tp, bool sequence_parallel);

// x = g(embed_tokens_r[ids]); under sequence parallelism this rank's slice [B, T/tp, d] (a reduce-scatter).
Tensor tp_llama_embed(VocabParallelEmbedding& embed, const Tensor& ids, bool sequence_parallel, const GroupPtr& tp);

// nn::Llama's initialisation of one parameter (HF's _init_weights), drawn over its logical
// tensor (this rank keeps its shard): N(0, initializer_range), norms left at 1.
void init_llama_parameter(const std::string& name, Tensor& p, const ShardSpec& spec, double initializer_range);
// What init_llama_parameter draws for a parameter this rank does not hold: the generator advances alike.
void skip_llama_parameter(const std::string& name, int64_t logical_numel);

}  // namespace athanor::dist
