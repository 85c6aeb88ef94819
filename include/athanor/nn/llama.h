#pragma once
// Llama (Touvron et al. 2023; Llama 2/3, SmolLM, Mistral without sliding windows) with
// Hugging Face's LlamaForCausalLM parameter names, so weights move both ways unchanged
// (HF's Linear layout [out, in] is athanor's; RoPE uses HF's rotate_half pairing):
//   model.embed_tokens.weight
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight
//   model.layers.{i}.input_layernorm.weight, model.layers.{i}.post_attention_layernorm.weight
//   model.norm.weight
//   lm_head.weight            (absent with tie_embeddings: the head is embed_tokens, as HF)
// No biases anywhere (HF's attention_bias / mlp_bias false, what every released Llama uses).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "athanor/core/rng.h"
#include "athanor/nn/layers.h"
#include "athanor/ops/rope.h"

namespace athanor::nn {

struct LlamaConfig {
  int64_t vocab_size = 32000, n_layer = 2, n_head = 4, n_kv_head = 4, n_embd = 256, intermediate_size = 688;
  int64_t block_size = 2048;  // longest sequence forward accepts (HF's max_position_embeddings)
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling = {};  // Llama 3.1's "rope_type": "llama3"
  double rms_norm_eps = 1e-5;
  bool tie_embeddings = false;
  // Dropout on each block's attention and MLP outputs before the residual add (GPT's
  // resid_dropout). Not HF's attention_dropout, which is 0 in every released Llama.
  double dropout = 0.0;
  double initializer_range = 0.02;
  // Run each decoder layer inside checkpoint() (autograd/checkpoint.h), as GPT does.
  bool gradient_checkpointing = false;

  int64_t head_dim() const { return n_embd / n_head; }
};

class LlamaDecoderLayer;

class Llama : public Module {
 public:
  // HF's _init_weights: N(0, initializer_range) for every Linear and Embedding weight,
  // RMSNorm weights 1. Throws on an inconsistent config (sizes <= 0, n_embd not divisible
  // by n_head, n_kv_head not dividing n_head, an odd head dim, bad RoPE scaling).
  explicit Llama(LlamaConfig config);
  // ids [B, T] (T <= block_size) -> logits [B, T, vocab_size]. Positions start at 0.
  Tensor forward(const Tensor& ids);
  // Mean cross-entropy of next-token prediction; targets [B, T] (ignore_index -100).
  Tensor loss(const Tensor& ids, const Tensor& targets);
  // Autoregressive sampling (eval mode, no grad), as GPT::generate: no KV cache, each new
  // token recomputes the context (its last block_size tokens) from position 0.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t max_new_tokens, double temperature = 1.0,
                                int64_t top_k = 0, Generator& gen = default_generator());
  // Model FLOPs per token of a training step: 6 x the parameters that are GEMM weights
  // (embed_tokens is a lookup unless tied to the head) + 12 L H hd T for attention (PaLM).
  double flops_per_token(int64_t seq_len) const;
  const LlamaConfig& config() const { return config_; }
  RopeOptions rope_options() const;
  // ZeRO-3 sharding units (dist::DataParallelOptions::shard_modules): "model.layers.<i>".
  std::vector<std::string> shard_units() const;

 private:
  LlamaConfig config_;
  std::shared_ptr<Module> model_;
  std::shared_ptr<Embedding> embed_tokens_;
  std::vector<std::shared_ptr<LlamaDecoderLayer>> layers_;
  std::shared_ptr<RMSNorm> norm_;
  std::shared_ptr<Linear> lm_head_;  // null when tied
};

// The config's problems as one message ("" when valid); Llama's constructor throws it.
// Exposed so callers that know the file and keys (the trainer's config, import-hf) can
// report them in their own terms.
std::string llama_config_problem(const LlamaConfig& config);

// Model FLOPs per token of a training step of a Llama of this config, without building it (the
// planner sizes models no machine here holds): Llama::flops_per_token's one definition.
double llama_flops_per_token(const LlamaConfig& config, int64_t seq_len);

}  // namespace athanor::nn
