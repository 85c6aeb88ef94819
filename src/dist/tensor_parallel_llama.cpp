// The Llama with tensor (and sequence) parallelism: nn::Llama's model and names, layers split
// over the tp group (contract in include/athanor/dist/tensor_parallel_llama.h).
//   x = g(embed_tokens_r[ids])                                   (SP: reduce-scatter)
//   per layer: x += g(attn_r(f(input_layernorm(x)))); x += g(swiglu_r(f(post_attention_layernorm(x))))
//   logits_r = f(norm(x)) lm_head_rᵀ;  loss = vocab_parallel_cross_entropy(logits_r)
#include "athanor/dist/tensor_parallel_llama.h"

#include "athanor/autograd/checkpoint.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/core/error.h"
#include "athanor/ops.h"
#include "tensor_parallel_block.h"
#include "tensor_parallel_llama_layer.h"

namespace athanor::dist {

TensorParallelLlama::TensorParallelLlama(nn::LlamaConfig c, GroupPtr tp, TensorParallelOptions o)
    : TensorParallelLM("TensorParallelLlama", std::move(tp), o, c.vocab_size, c.block_size), config_(std::move(c)) {
  const nn::LlamaConfig& k = config_;
  check_tensor_parallel_llama(k, tp_->size(), o.sequence_parallel, "TensorParallelLlama");
  sp_ = std::make_shared<bool>(false);
  const std::shared_ptr<const bool> sp = sp_;
  // nn::Llama's construction order (and so the generator's draws).
  auto model = std::make_shared<TPContainer>();
  model_ = register_module("model", model);
  embed_tokens_ = model->add("embed_tokens", std::make_shared<VocabParallelEmbedding>(k.vocab_size, k.n_embd, tp_, o.vocab_pad_multiple));
  auto layers = model->add("layers", std::make_shared<TPContainer>());
  for (int64_t i = 0; i < k.n_layer; ++i) layers_.push_back(layers->add(std::to_string(i), std::make_shared<TPLlamaLayer>(k, tp_, o, sp)));
  norm_ = model->add("norm", std::make_shared<nn::RMSNorm>(Shape{k.n_embd}, k.rms_norm_eps));
  if (!k.tie_embeddings)
    lm_head_ = register_module("lm_head", std::make_shared<ColumnParallelLinear>(
                                              k.n_embd, k.vocab_size, tp_,
                                              ColumnParallelLinear::Options{.bias = false, .pad_multiple = o.vocab_pad_multiple}));
  specs_ = collect_shard_specs(*this);
  mark_llama_partial_gradients(specs_, *this, k, tp_->size(), o.sequence_parallel);
  // nn::Llama's re-initialisation, drawn over the logical tensors.
  for (auto& [name, p] : named_parameters()) init_llama_parameter(name, p, spec_of(specs_, name), k.initializer_range);
}

TensorParallelLlama::~TensorParallelLlama() = default;

Tensor TensorParallelLlama::hidden(const Tensor& ids, bool sp) {
  auto scope = enter();
  ATH_CHECK(ids.dim() == 2, "Llama", "expected token ids [B, T], got ", ids.describe());
  const int64_t T = ids.size(1);
  ATH_CHECK(T <= config_.block_size, "Llama", "sequence length ", T, " exceeds block_size ", config_.block_size,
            Hint{"crop the input to the last block_size tokens or build the model with a larger block_size"});
  *sp_ = sp;
  RopeOptions rope_opt;
  rope_opt.theta = config_.rope_theta;
  rope_opt.llama3 = config_.rope_scaling;
  auto m = model_->enter();
  Tensor x = tp_llama_embed(*embed_tokens_, ids, sp, tp_);
  for (auto& l : layers_) {
    auto ls = ModuleScope("layers");
    TPLlamaLayer* layer = l.get();
    // By value: checkpoint() reruns this in backward, after forward has returned.
    auto run = [layer, rope_opt](const Tensor& in) { return layer->forward(in, rope_opt); };
    if (l->has_forward_interceptor()) x = l->run_forward(x, run);  // ZeRO-3's interceptor already checkpoints
    else if (config_.gradient_checkpointing && grad_enabled()) x = checkpoint(run, x);
    else x = run(x);
  }
  return norm_->forward(x);
}

const Tensor& TensorParallelLlama::head_weight() const { return lm_head_ ? lm_head_->weight : embed_tokens_->weight; }

double TensorParallelLlama::flops_per_token(int64_t T) const {
  // nn::Llama::flops_per_token: 6 x the GEMM parameters (embed_tokens is a lookup unless tied) + 12 L H hd T.
  double n = static_cast<double>(logical_parameters_count());
  if (!config_.tie_embeddings) n -= static_cast<double>(config_.vocab_size * config_.n_embd);
  const double L = static_cast<double>(config_.n_layer), H = static_cast<double>(config_.n_head),
               hd = static_cast<double>(config_.head_dim());
  return 6.0 * n + 12.0 * L * H * hd * static_cast<double>(T);
}

std::vector<std::string> TensorParallelLlama::shard_units() const {
  std::vector<std::string> out;
  for (int64_t i = 0; i < config_.n_layer; ++i) out.push_back("model.layers." + std::to_string(i));
  return out;
}

}  // namespace athanor::dist
