#pragma once
// GPT-2 (Radford et al. 2019) with Hugging Face's parameter names, so weights
// move both ways: transformer.wte.weight, transformer.wpe.weight,
// transformer.h.{i}.ln_1.{weight,bias}, transformer.h.{i}.attn.c_attn.{weight,bias},
// transformer.h.{i}.attn.c_proj.{weight,bias}, transformer.h.{i}.ln_2.*,
// transformer.h.{i}.mlp.c_fc.*, transformer.h.{i}.mlp.c_proj.*, transformer.ln_f.*.
// (Weights are stored in athanor's Linear layout [out, in]; Hugging Face's Conv1D
// stores [in, out] — the checkpoint layer transposes on import/export.)
// The lm_head is tied to wte (no separate parameter).
#include <cstdint>
#include <string>
#include <functional>
#include <vector>

#include "athanor/core/rng.h"
#include "athanor/nn/layers.h"

namespace athanor::nn {

struct GPTConfig {
  int64_t n_layer = 12, n_head = 12, n_embd = 768, block_size = 1024, vocab_size = 50257;
  double dropout = 0.0;
  bool bias = true;
  // Run each transformer block inside checkpoint() (autograd/checkpoint.h): activation
  // memory drops to ~one block input per layer, at the cost of ~one extra forward.
  bool gradient_checkpointing = false;
};

class GPTBlock;

// The token generate() picks from the last position's logits (one per vocabulary entry):
// divided by the temperature, cut to the top_k largest (0 = all), then one Philox draw from gen.
int32_t sample_token(std::vector<double> logits, double temperature, int64_t top_k, Generator& gen);
// sample_token on the last position of a contiguous [1, T, V] logits tensor.
int32_t sample_last_position(const Tensor& logits, double temperature, int64_t top_k, Generator& gen);

// The generation loop every GPT layout shares: checks the request against the vocabulary,
// puts `model` in eval mode without gradients, and appends max_new_tokens tokens, each the
// one next_token picks after the context (the last block_size tokens), with sample_token.
std::vector<int32_t> generate_tokens(Module& model, const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                                     double temperature, int64_t vocab_size, int64_t block_size,
                                     const std::function<int32_t(const std::vector<int64_t>& context)>& next_token);
// generate_tokens for a model whose forward maps [1, T] token ids to [1, T, V] logits: the
// context is made on the model's device and the next token sampled from the last position.
std::vector<int32_t> generate_from_logits(Module& model, const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                                          double temperature, int64_t top_k, int64_t vocab_size, int64_t block_size,
                                          Generator& gen, const std::function<Tensor(const Tensor& ids)>& forward);

class GPT : public Module {
 public:
  // GPT-2 init: N(0, 0.02) for weights and embeddings, zero biases, unit LN
  // weights; the residual projections (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2*n_layer)).
  explicit GPT(GPTConfig config);
  // ids [B, T] (T <= block_size) -> logits [B, T, vocab_size].
  Tensor forward(const Tensor& ids);
  // Mean cross-entropy of next-token prediction; targets [B, T] (ignore_index -100).
  Tensor loss(const Tensor& ids, const Tensor& targets);
  // Autoregressive sampling (eval mode, no grad): temperature > 0, top_k = 0 for all.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t max_new_tokens, double temperature = 1.0,
                                int64_t top_k = 0, Generator& gen = default_generator());
  // Model FLOPs per token for a training step (6N + attention), for MFU.
  double flops_per_token(int64_t seq_len) const;
  const GPTConfig& config() const { return config_; }
  // The modules that make good ZeRO-3 sharding units (dist::DataParallelOptions::shard_modules):
  // the blocks "transformer.h.<i>". wte stays outside: it is tied to the lm_head.
  std::vector<std::string> shard_units() const;

 private:
  GPTConfig config_;
  std::shared_ptr<Module> transformer_;
  std::shared_ptr<Embedding> wte_, wpe_;
  std::shared_ptr<Dropout> drop_;
  std::vector<std::shared_ptr<GPTBlock>> blocks_;
  std::shared_ptr<LayerNorm> ln_f_;
};

}  // namespace athanor::nn
