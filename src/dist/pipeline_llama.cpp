// The Llama split into pipeline stages, each split over a tensor-parallel group (contract in
// include/athanor/dist/pipeline_llama.h and pipeline_lm.h). The layers are TensorParallelLlama's
// (tensor_parallel_llama_layer.h); a one-rank tp group makes them plain.
#include "athanor/dist/pipeline_llama.h"

#include "athanor/core/error.h"
#include "athanor/dist/tensor_parallel_layers.h"
#include "athanor/ops.h"
#include "tensor_parallel_block.h"
#include "tensor_parallel_llama_layer.h"

namespace athanor::dist {

namespace {
PipelineLM::Dims llama_dims(const nn::LlamaConfig& c) {
  return {.n_layer = c.n_layer, .n_embd = c.n_embd, .vocab_size = c.vocab_size, .block_size = c.block_size, .dropout = c.dropout,
          .gradient_checkpointing = c.gradient_checkpointing, .embedding_masks = 0, .layer_masks = 2,
          .tied = c.tie_embeddings ? "model.embed_tokens.weight" : ""};
}
}  // namespace

PipelineLlama::PipelineLlama(nn::LlamaConfig c, PipelineLayout layout, int rank, GroupPtr tp, TensorParallelOptions o, GroupPtr eg)
    : PipelineLM("PipelineLlama", llama_dims(c), std::move(layout), rank, std::move(tp), o, std::move(eg)), config_(std::move(c)) {
  const nn::LlamaConfig& k = config_;
  check_tensor_parallel_llama(k, tp_->size(), o.sequence_parallel, "PipelineLlama");
  rope_.theta = k.rope_theta;
  rope_.llama3 = k.rope_scaling;
  const bool embedding = holds_embedding(), head = holds_head();
  const std::shared_ptr<const bool> sp = sp_;

  // nn::Llama's construction order; the other stages' modules are built one at a time and
  // dropped, so that the generator's draws are those of one process.
  auto model = std::make_shared<TPContainer>();
  model_ = register_module("model", model);
  {
    auto e = std::make_shared<VocabParallelEmbedding>(k.vocab_size, k.n_embd, tp_, o.vocab_pad_multiple);
    const bool keep = embedding || (head && k.tie_embeddings);
    note("model.embed_tokens.", *e, keep);
    if (keep) embed_tokens_ = model->add("embed_tokens", e);
  }
  auto layers = model->add("layers", std::make_shared<TPContainer>());
  layers_.resize(static_cast<std::size_t>(k.n_layer));
  for (int64_t i = 0; i < k.n_layer; ++i) {
    auto l = std::make_shared<TPLlamaLayer>(k, tp_, o, sp);
    note("model.layers." + std::to_string(i) + ".", *l, holds_layer(i));
    if (holds_layer(i)) layers_[static_cast<std::size_t>(i)] = layers->add(std::to_string(i), l);
  }
  {
    auto n = std::make_shared<nn::RMSNorm>(Shape{k.n_embd}, k.rms_norm_eps);
    note("model.norm.", *n, head);
    if (head) norm_ = model->add("norm", n);
  }
  if (!k.tie_embeddings) {
    auto h = std::make_shared<ColumnParallelLinear>(k.n_embd, k.vocab_size, tp_,
                                                    ColumnParallelLinear::Options{.bias = false, .pad_multiple = o.vocab_pad_multiple});
    note("lm_head.", *h, head);
    if (head) lm_head_ = register_module("lm_head", h);
  }
  specs_ = collect_shard_specs(*this);
  mark_llama_partial_gradients(specs_, *this, k, tp_->size(), o.sequence_parallel);
  // nn::Llama's re-initialisation over every logical parameter in its order.
  const double range = k.initializer_range;
  init_parameters([range](const std::string& n, Tensor& p, const ShardSpec& s) { init_llama_parameter(n, p, s, range); },
                  skip_llama_parameter);
}

PipelineLlama::~PipelineLlama() = default;

Tensor PipelineLlama::embed(const Tensor& ids, bool sp) {
  auto m = model_->enter();
  return tp_llama_embed(*embed_tokens_, ids, sp, tp_);
}

Tensor PipelineLlama::run_layer(int64_t i, const Tensor& x) {
  auto m = model_->enter();
  auto ls = ModuleScope("layers");
  return layers_[static_cast<std::size_t>(i)]->forward(x, rope_);
}

Tensor PipelineLlama::final_norm(const Tensor& x) {
  auto m = model_->enter();
  return norm_->forward(x);
}

const Tensor& PipelineLlama::head_weight() const { return lm_head_ ? lm_head_->weight : embed_tokens_->weight; }

int64_t PipelineLlama::layer_parameters() const {
  const nn::LlamaConfig& k = config_;
  const int64_t d = k.n_embd, D = k.head_dim();
  return d * k.n_head * D + 2 * d * k.n_kv_head * D + k.n_head * D * d + 3 * d * k.intermediate_size + 2 * d;
}

int64_t PipelineLlama::logical_parameters_count() const {
  const int64_t Vd = config_.vocab_size * config_.n_embd;
  return Vd + config_.n_layer * layer_parameters() + config_.n_embd + (config_.tie_embeddings ? 0 : Vd);
}

double PipelineLlama::flops_per_token(int64_t T) const {
  // This rank's share of nn::Llama::flops_per_token (6 N over the GEMM parameters + 12 L H hd T):
  // its layers, the head's GEMM and the final norm on the last stage, nothing for the embedding
  // lookup; divided over tp.
  const double d = static_cast<double>(config_.n_embd), attn = static_cast<double>(config_.n_head * config_.head_dim());
  double flops = 0;
  for (const Chunk& ch : chunks_) {
    const double layers = static_cast<double>(ch.end - ch.first);
    flops += 6.0 * layers * static_cast<double>(layer_parameters()) + 12.0 * layers * attn * static_cast<double>(T);
    if (ch.head) flops += 6.0 * (static_cast<double>(config_.vocab_size) * d + d);
  }
  return flops / static_cast<double>(tp_->size());
}

}  // namespace athanor::dist
