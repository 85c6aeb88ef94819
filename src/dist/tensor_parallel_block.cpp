// The tensor-parallel GPT block and the embedding / head steps shared by TensorParallelGPT
// and PipelineGPT (contract in tensor_parallel_block.h).
#include "tensor_parallel_block.h"

#include <cmath>

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/rng.h"
#include "athanor/dist/tensor_parallel_dropout.h"
#include "athanor/dist/tensor_parallel_mappings.h"
#include "athanor/ops.h"

namespace athanor::dist {

Tensor replicated_dropout(const nn::Dropout& d, const Tensor& x, bool sequence_parallel, const GroupPtr& tp) {
  if (!sequence_parallel) return dropout(x, d.p, d.is_training());
  const int64_t Tl = x.size(1);
  return sequence_parallel_dropout(x, d.p, d.is_training(), 1, tp->rank() * Tl, Tl * tp->size());
}

class TPAttention : public nn::Module {
 public:
  TPAttention(const nn::GPTConfig& c, const GroupPtr& tp, const TensorParallelOptions& o, std::shared_ptr<const bool> sp)
      : n_head_local(c.n_head / tp->size()), tp_(tp), sp_(sp) {
    c_attn = register_module("c_attn", std::make_shared<ColumnParallelLinear>(
                                           c.n_embd, 3 * c.n_embd, tp,
                                           ColumnParallelLinear::Options{.bias = c.bias, .parts = 3, .regather = o.regather}));
    c_proj = register_module("c_proj", std::make_shared<RowParallelLinear>(c.n_embd, c.n_embd, tp,
                                                                           RowParallelLinear::Options{.bias = c.bias}));
    resid_drop = register_module("resid_dropout", std::make_shared<nn::Dropout>(c.dropout));
  }
  Tensor forward(const Tensor& x) {
    auto scope = enter();
    c_attn->options.sequence_parallel = c_proj->options.sequence_parallel = *sp_;
    Tensor qkv = c_attn->forward(x);                          // [B, T, 3d/tp]: this rank's heads of q, k, v
    Tensor y = causal_self_attention(qkv, n_head_local);      // [B, T, d/tp]
    return replicated_dropout(*resid_drop, c_proj->forward(y), *sp_, tp_);
  }
  int64_t n_head_local;
  GroupPtr tp_;
  std::shared_ptr<const bool> sp_;
  std::shared_ptr<ColumnParallelLinear> c_attn;
  std::shared_ptr<RowParallelLinear> c_proj;
  std::shared_ptr<nn::Dropout> resid_drop;
};

class TPFeedForward : public nn::Module {
 public:
  TPFeedForward(const nn::GPTConfig& c, const GroupPtr& tp, const TensorParallelOptions& o, std::shared_ptr<const bool> sp) : tp_(tp), sp_(sp) {
    c_fc = register_module("c_fc", std::make_shared<ColumnParallelLinear>(
                                       c.n_embd, 4 * c.n_embd, tp, ColumnParallelLinear::Options{.bias = c.bias, .regather = o.regather}));
    c_proj = register_module("c_proj", std::make_shared<RowParallelLinear>(4 * c.n_embd, c.n_embd, tp,
                                                                           RowParallelLinear::Options{.bias = c.bias}));
    drop = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout));
  }
  Tensor forward(const Tensor& x) {
    auto scope = enter();
    c_fc->options.sequence_parallel = c_proj->options.sequence_parallel = *sp_;
    Tensor h = c_fc->forward(x);  // [B, T, 4d/tp]
    Tensor partial;
    {
      auto proj_scope = c_proj->enter();
      partial = gelu_linear(h, c_proj->weight);  // as nn::GPT: gelu fused into c_proj's GEMM; no bias yet
    }
    return replicated_dropout(*drop, c_proj->reduce_output(partial), *sp_, tp_);
  }
  GroupPtr tp_;
  std::shared_ptr<const bool> sp_;
  std::shared_ptr<ColumnParallelLinear> c_fc;
  std::shared_ptr<RowParallelLinear> c_proj;
  std::shared_ptr<nn::Dropout> drop;
};
TPBlock::TPBlock(const nn::GPTConfig& c, const GroupPtr& tp, const TensorParallelOptions& o, const std::shared_ptr<const bool>& sp) {
    ln_1 = register_module("ln_1", std::make_shared<nn::LayerNorm>(Shape{c.n_embd}, 1e-5, true, c.bias));
    attn = register_module("attn", std::make_shared<TPAttention>(c, tp, o, sp));
    ln_2 = register_module("ln_2", std::make_shared<nn::LayerNorm>(Shape{c.n_embd}, 1e-5, true, c.bias));
    mlp = register_module("mlp", std::make_shared<TPFeedForward>(c, tp, o, sp));
}

Tensor TPBlock::forward(const Tensor& x) {
  auto scope = enter();
  Tensor h = add(x, attn->forward(ln_1->forward(x)));
  return add(h, mlp->forward(ln_2->forward(h)));
}


Tensor tp_embed(VocabParallelEmbedding& wte, nn::Embedding& wpe, const nn::Dropout& drop, const Tensor& ids, bool sp,
                const GroupPtr& tp) {
  const int64_t T = ids.size(1);
  Tensor x;
  if (sp) {
    const int64_t Tl = T / tp->size(), start = tp->rank() * Tl;
    x = reduce_scatter_to_sequence_parallel_region(wte.forward_partial(ids), tp, 1);  // [B, T/tp, d]
    x = add(x, wpe.forward(arange(start, start + Tl, TensorOptions(DType::i64))));
  } else {
    x = add(wte.forward(ids), wpe.forward(arange(0, T, TensorOptions(DType::i64))));
  }
  return replicated_dropout(drop, x, sp, tp);
}

Tensor tp_logits(const Tensor& x, const Tensor& w, bool sp, bool regather, const GroupPtr& tp) {
  // The tied lm_head: this rank's vocabulary rows of wte, a column-parallel layer without bias.
  return sp ? sequence_parallel_linear(x, w, Tensor(), tp, 1, regather) : linear(copy_to_tensor_parallel_region(x, tp), w);
}

namespace {
bool is_bias(const std::string& name) { return name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0; }
}  // namespace

void init_gpt_parameter(const std::string& name, Tensor& p, const ShardSpec& s, int64_t n_layer) {
  if (name.find(".ln_") != std::string::npos) return;
  NoGradGuard ng;
  if (is_bias(name)) {
    p.fill_(0.0);
    return;
  }
  const double std_res = 0.02 / std::sqrt(2.0 * static_cast<double>(n_layer));
  Tensor full = empty(logical_shape(p.sizes(), s), TensorOptions(p.dtype()));
  normal_(full, 0.0, name.find("c_proj.weight") != std::string::npos ? std_res : 0.02);
  copy_into(p, shard_of(full, s, name));
  p.bump_version();
}

void skip_gpt_parameter(const std::string& name, int64_t logical_numel) {
  if (name.find(".ln_") != std::string::npos || is_bias(name)) return;
  default_generator().reserve(static_cast<uint64_t>((logical_numel + 1) / 2));  // normal_'s blocks
}

}  // namespace athanor::dist
