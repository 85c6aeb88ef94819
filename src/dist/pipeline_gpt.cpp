// GPT-2 split into pipeline stages, each split over a tensor-parallel group (contract in
// include/athanor/dist/pipeline_gpt.h and pipeline_lm.h). The layers are TensorParallelGPT's
// (tensor_parallel_block.h); a one-rank tp group makes them plain.
#include "athanor/dist/pipeline_gpt.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "athanor/autograd/checkpoint.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/core/error.h"
#include "athanor/dist/vocab_parallel_cross_entropy.h"
#include "athanor/ops.h"
#include "tensor_parallel_block.h"

namespace athanor::dist {

namespace {
PipelineLM::Dims gpt_dims(const nn::GPTConfig& c) {
  return {.n_layer = c.n_layer, .n_embd = c.n_embd, .vocab_size = c.vocab_size, .block_size = c.block_size, .dropout = c.dropout,
          .gradient_checkpointing = c.gradient_checkpointing, .embedding_masks = 1, .layer_masks = 2, .tied = "transformer.wte.weight"};
}
}  // namespace

PipelineGPT::PipelineGPT(nn::GPTConfig c, PipelineLayout layout, int rank, GroupPtr tp, TensorParallelOptions o, GroupPtr eg)
    : PipelineLM("PipelineGPT", gpt_dims(c), std::move(layout), rank, std::move(tp), o, std::move(eg)), config_(c) {
  const char* op = "PipelineGPT";
  ATH_CHECK(c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0 && c.block_size > 0 && c.vocab_size > 0, op,
            "n_layer, n_head, n_embd, block_size and vocab_size must all be > 0");
  ATH_CHECK(c.n_embd % c.n_head == 0, op, "n_embd (", c.n_embd, ") must be divisible by n_head (", c.n_head, ")");
  ATH_CHECK(c.n_head % tp_->size() == 0, op, "model.n_head (", c.n_head, ") is not divisible by dist.tp (", tp_->size(), ")",
            Hint{"choose dist.tp dividing n_head"});
  ATH_CHECK(!o.sequence_parallel || c.block_size % tp_->size() == 0, op, "sequence parallelism: model.block_size (", c.block_size,
            ") must be divisible by dist.tp (", tp_->size(), ")");
  const bool embedding = holds_embedding(), head = holds_head();
  const std::shared_ptr<const bool> sp = sp_;

  // nn::GPT's construction order. The modules of other stages are built too, one at a time,
  // and dropped, so that the generator's draws (every layer draws its logical tensor at
  // construction) are those of one process.
  auto tr = std::make_shared<TPContainer>();
  transformer_ = register_module("transformer", tr);
  {
    auto wte = std::make_shared<VocabParallelEmbedding>(c.vocab_size, c.n_embd, tp_, o.vocab_pad_multiple);
    note("transformer.wte.", *wte, embedding || head);
    if (embedding || head) wte_ = tr->add("wte", wte);
    auto wpe = std::make_shared<nn::Embedding>(c.block_size, c.n_embd);
    note("transformer.wpe.", *wpe, embedding);
    if (embedding) wpe_ = tr->add("wpe", wpe);
    drop_ = std::make_shared<nn::Dropout>(c.dropout);
    if (embedding) tr->add("drop", drop_);
  }
  auto h = tr->add("h", std::make_shared<TPContainer>());
  blocks_.resize(static_cast<std::size_t>(c.n_layer));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    auto b = std::make_shared<TPBlock>(c, tp_, o, sp);
    note("transformer.h." + std::to_string(i) + ".", *b, holds_layer(i));
    if (holds_layer(i)) blocks_[i] = h->add(std::to_string(i), b);
  }
  {
    auto ln_f = std::make_shared<nn::LayerNorm>(Shape{c.n_embd}, 1e-5, true, c.bias);
    note("transformer.ln_f.", *ln_f, head);
    if (head) ln_f_ = tr->add("ln_f", ln_f);
  }

  specs_ = collect_shard_specs(*this);
  if (o.sequence_parallel)  // replicated parameters that see one slice of the sequence per rank (as TensorParallelGPT)
    for (auto& [name, p] : named_parameters())
      if (!spec_of(specs_, name).sharded() &&
          (name.find(".ln_") != std::string::npos || name == "transformer.wpe.weight" || name.find("c_proj.bias") != std::string::npos))
        specs_[name].sum_grad_over_tp = true;

  // The GPT-2 initialisation pass over every logical parameter in nn::GPT's order.
  const int64_t L = c.n_layer;
  init_parameters([L](const std::string& n, Tensor& p, const ShardSpec& s) { init_gpt_parameter(n, p, s, L); }, skip_gpt_parameter);
}

PipelineGPT::~PipelineGPT() = default;

Tensor PipelineGPT::embed(const Tensor& ids, bool sp) {
  auto t = transformer_->enter();
  return tp_embed(*wte_, *wpe_, *drop_, ids, sp, tp_);
}

Tensor PipelineGPT::run_layer(int64_t i, const Tensor& x) {
  auto t = transformer_->enter();
  auto hs = ModuleScope("h");
  return blocks_[static_cast<std::size_t>(i)]->forward(x);
}

Tensor PipelineGPT::final_norm(const Tensor& x) {
  auto t = transformer_->enter();
  return ln_f_->forward(x);
}

const Tensor& PipelineGPT::head_weight() const { return wte_->weight; }

int64_t PipelineGPT::logical_parameters_count() const {
  const int64_t d = config_.n_embd, L = config_.n_layer, b = config_.bias ? 1 : 0;
  const int64_t block = 2 * (d + b * d) + (3 * d * d + b * 3 * d) + (d * d + b * d) + (4 * d * d + b * 4 * d) + (4 * d * d + b * d);
  return config_.vocab_size * d + config_.block_size * d + L * block + (d + b * d);
}

double PipelineGPT::flops_per_token(int64_t T) const {
  // This rank's share of nn::GPT's 6N + 12 L d T: its blocks, the head's GEMM (2 V d forward)
  // on the last stage, nothing for the embedding lookup; divided over tp.
  const double d = static_cast<double>(config_.n_embd), b = config_.bias ? 1.0 : 0.0;
  const double block = 2 * (d + b * d) + (3 * d * d + b * 3 * d) + (d * d + b * d) + (4 * d * d + b * 4 * d) + (4 * d * d + b * d);
  double flops = 0;
  for (const Chunk& ch : chunks_) {
    const double layers = static_cast<double>(ch.end - ch.first);
    flops += 6.0 * layers * block + 12.0 * layers * d * static_cast<double>(T);
    if (ch.embedding) flops += 6.0 * static_cast<double>(config_.block_size) * d;
    if (ch.head) flops += 6.0 * (static_cast<double>(config_.vocab_size) * d + d + b * d);
  }
  return flops / static_cast<double>(tp_->size());
}

}  // namespace athanor::dist
