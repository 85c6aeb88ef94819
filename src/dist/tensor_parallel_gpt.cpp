// GPT-2 with tensor (and sequence) parallelism: nn::GPT's model and names, layers split over
// the tp group (contract in include/athanor/dist/tensor_parallel_gpt.h).
//   x = g(wte_r[ids]) + wpe[0..T)                      (SP: reduce-scatter, wpe of the slice)
//   per block: x += g(attn_r(f(ln_1(x)))); x += g(mlp_r(f(ln_2(x))))   (SP: all-gather / reduce-scatter)
//   logits_r = f(ln_f(x)) wte_rᵀ;  loss = vocab_parallel_cross_entropy(logits_r)
#include "athanor/dist/tensor_parallel_gpt.h"

#include <algorithm>
#include <cmath>

#include "athanor/autograd/checkpoint.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/core/error.h"
#include "athanor/dist/tensor_parallel_dropout.h"
#include "athanor/dist/vocab_parallel_cross_entropy.h"
#include "athanor/ops.h"
#include "tensor_parallel_block.h"

namespace athanor::dist {

TensorParallelGPT::TensorParallelGPT(nn::GPTConfig c, GroupPtr tp, TensorParallelOptions o)
    : TensorParallelLM("TensorParallelGPT", std::move(tp), o, c.vocab_size, c.block_size), config_(c) {
  const char* op = "TensorParallelGPT";
  const int t = tp_->size();
  ATH_CHECK(c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0 && c.block_size > 0 && c.vocab_size > 0, op,
            "n_layer, n_head, n_embd, block_size and vocab_size must all be > 0");
  ATH_CHECK(c.n_embd % c.n_head == 0, op, "n_embd (", c.n_embd, ") must be divisible by n_head (", c.n_head, ")",
            Hint{"e.g. n_embd 768 with n_head 12 (head size 64)"});
  ATH_CHECK(c.n_head % t == 0, op, "model.n_head (", c.n_head, ") is not divisible by dist.tp (", t,
            "): the attention heads are split across the tensor-parallel ranks",
            Hint{"choose dist.tp dividing n_head (" + std::to_string(c.n_head) + "), or n_head a multiple of " + std::to_string(t)});
  ATH_CHECK(!o.sequence_parallel || c.block_size % t == 0, op, "sequence parallelism splits the sequence across tp: model.block_size (",
            c.block_size, ") must be divisible by dist.tp (", t, ")",
            Hint{"choose block_size a multiple of dist.tp, or turn dist.sequence_parallel off"});
  ATH_CHECK(c.dropout >= 0 && c.dropout < 1, op, "dropout must be in [0, 1), got ", c.dropout);
  sp_ = std::make_shared<bool>(false);  // whether the forward in progress is sequence-parallel (read by the blocks)
  const std::shared_ptr<const bool> sp = sp_;
  // Construction order (and so the generator's draws) is nn::GPT's.
  auto tr = std::make_shared<TPContainer>();
  transformer_ = register_module("transformer", tr);
  wte_ = tr->add("wte", std::make_shared<VocabParallelEmbedding>(c.vocab_size, c.n_embd, tp_, o.vocab_pad_multiple));
  wpe_ = tr->add("wpe", std::make_shared<nn::Embedding>(c.block_size, c.n_embd));
  drop_ = tr->add("drop", std::make_shared<nn::Dropout>(c.dropout));
  auto h = tr->add("h", std::make_shared<TPContainer>());
  for (int64_t i = 0; i < c.n_layer; ++i) blocks_.push_back(h->add(std::to_string(i), std::make_shared<TPBlock>(c, tp_, o, sp)));
  ln_f_ = tr->add("ln_f", std::make_shared<nn::LayerNorm>(Shape{c.n_embd}, 1e-5, true, c.bias));

  specs_ = collect_shard_specs(*this);
  if (o.sequence_parallel)  // replicated parameters that see one slice of the sequence per rank
    for (auto& [name, p] : named_parameters())
      if (!spec_of(specs_, name).sharded() &&
          (name.find(".ln_") != std::string::npos || name == "transformer.wpe.weight" || name.find("c_proj.bias") != std::string::npos))
        specs_[name].sum_grad_over_tp = true;

  // nn::GPT's GPT-2 initialisation, drawn over the logical tensors (tensor_parallel_block.h).
  for (auto& [name, p] : named_parameters()) init_gpt_parameter(name, p, spec_of(specs_, name), c.n_layer);
}

int64_t TensorParallelGPT::padded_vocab() const { return wte_->padded; }

Tensor TensorParallelGPT::hidden(const Tensor& ids, bool sp) {
  auto scope = enter();
  ATH_CHECK(ids.dim() == 2, "GPT", "expected token ids [B, T], got ", ids.describe());
  const int64_t T = ids.size(1);
  ATH_CHECK(T <= config_.block_size, "GPT", "sequence length ", T, " exceeds block_size ", config_.block_size,
            Hint{"crop the input to the last block_size tokens or train with a larger block_size"});
  *sp_ = sp;
  auto t = transformer_->enter();
  Tensor x = tp_embed(*wte_, *wpe_, *drop_, ids, sp, tp_);
  for (auto& b : blocks_) {
    auto hs = ModuleScope("h");
    TPBlock* block = b.get();
    auto run = [block](const Tensor& in) { return block->forward(in); };
    if (b->has_forward_interceptor()) x = b->run_forward(x, run);
    else if (config_.gradient_checkpointing && grad_enabled()) x = checkpoint(run, x);
    else x = b->forward(x);
  }
  return ln_f_->forward(x);
}

const Tensor& TensorParallelGPT::head_weight() const { return wte_->weight; }  // tied

double TensorParallelGPT::flops_per_token(int64_t T) const {
  const double N = static_cast<double>(logical_parameters_count());
  const double L = config_.n_layer, H = config_.n_head, hd = static_cast<double>(config_.n_embd) / config_.n_head;
  return 6.0 * N + 12.0 * L * H * hd * static_cast<double>(T);
}

std::vector<std::string> TensorParallelGPT::shard_units() const {
  std::vector<std::string> out;
  for (int64_t i = 0; i < config_.n_layer; ++i) out.push_back("transformer.h." + std::to_string(i));
  return out;
}

}  // namespace athanor::dist
