// GPT-2 (pre-LN transformer) with Hugging Face parameter names.
//   x = wte[ids] + wpe[0..T)            (dropout)
//   for each block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))
//   logits = ln_f(x) @ wte^T            (lm_head tied to the token embedding)
// With gradient_checkpointing each block runs inside checkpoint(): only block
// inputs are kept for backward, and each block's forward is recomputed there.
// Blocks run through Module::run_forward: a forward interceptor installed on
// transformer.h.<i> (ZeRO-3 sharding) wraps the block without renaming anything.
#include "athanor/nn/gpt.h"

#include <algorithm>
#include <cmath>

#include "athanor/autograd/checkpoint.h"
#include "athanor/ops.h"

namespace athanor::nn {
namespace {

// A container whose children are named by the caller ("h", "0", …).
class Container : public Module {
 public:
  template <class M> std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) { return register_module(name, std::move(m)); }
};

void init_normal(Tensor& t, double std) {
  NoGradGuard ng;
  normal_(t, 0.0, std);
}
void init_zero(Tensor& t) {
  if (t.defined()) t.fill_(0.0);
}

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(const GPTConfig& c) : n_head(c.n_head), n_embd(c.n_embd) {
    c_attn = register_module("c_attn", std::make_shared<Linear>(c.n_embd, 3 * c.n_embd, c.bias));
    c_proj = register_module("c_proj", std::make_shared<Linear>(c.n_embd, c.n_embd, c.bias));
    resid_drop = register_module("resid_dropout", std::make_shared<Dropout>(c.dropout));
  }
  Tensor forward(const Tensor& x) {
    auto scope = enter();
    Tensor qkv = c_attn->forward(x);  // [B, T, 3d]: q, k, v side by side
    // Per-head causal attention read straight from the packed qkv, heads written side by side
    // ([B, T, d], c_proj's input); the backward writes d(qkv) in one piece (no split/transposes).
    Tensor y = causal_self_attention(qkv, n_head);
    return resid_drop->forward(c_proj->forward(y));
  }
  int64_t n_head, n_embd;
  std::shared_ptr<Linear> c_attn, c_proj;
  std::shared_ptr<Dropout> resid_drop;
};

class FeedForward : public Module {
 public:
  FeedForward(const GPTConfig& c) {
    c_fc = register_module("c_fc", std::make_shared<Linear>(c.n_embd, 4 * c.n_embd, c.bias));
    c_proj = register_module("c_proj", std::make_shared<Linear>(4 * c.n_embd, c.n_embd, c.bias));
    drop = register_module("dropout", std::make_shared<Dropout>(c.dropout));
  }
  Tensor forward(const Tensor& x) {
    auto scope = enter();
    // c_proj(gelu(c_fc(x))) with the gelu fused into c_proj's GEMM: gelu's output is not
    // kept for backward but recomputed there (saves 4 n_embd activations per token).
    Tensor y = c_fc->forward(x);
    {
      auto proj_scope = c_proj->enter();  // errors and nodes name mlp.c_proj, as Linear::forward would
      y = gelu_linear(y, c_proj->weight, c_proj->bias);
    }
    return drop->forward(y);
  }
  std::shared_ptr<Linear> c_fc, c_proj;
  std::shared_ptr<Dropout> drop;
};

}  // namespace

class GPTBlock : public Module {
 public:
  GPTBlock(const GPTConfig& c) {
    ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(Shape{c.n_embd}, 1e-5, true, c.bias));
    attn = register_module("attn", std::make_shared<CausalSelfAttention>(c));
    ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(Shape{c.n_embd}, 1e-5, true, c.bias));
    mlp = register_module("mlp", std::make_shared<FeedForward>(c));
  }
  Tensor forward(const Tensor& x) {
    auto scope = enter();
    Tensor h = add(x, attn->forward(ln_1->forward(x)));
    return add(h, mlp->forward(ln_2->forward(h)));
  }
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<FeedForward> mlp;
};

GPT::GPT(GPTConfig c) : config_(c) {
  const char* op = "GPT";
  ATH_CHECK(c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0 && c.block_size > 0 && c.vocab_size > 0, op,
            "n_layer, n_head, n_embd, block_size and vocab_size must all be > 0");
  ATH_CHECK(c.n_embd % c.n_head == 0, op, "n_embd (", c.n_embd, ") must be divisible by n_head (", c.n_head, ")",
            Hint{"e.g. n_embd 768 with n_head 12 (head size 64)"});
  ATH_CHECK(c.dropout >= 0 && c.dropout < 1, op, "dropout must be in [0, 1), got ", c.dropout);
  auto tr = std::make_shared<Container>();
  transformer_ = register_module("transformer", tr);
  wte_ = tr->add("wte", std::make_shared<Embedding>(c.vocab_size, c.n_embd));
  wpe_ = tr->add("wpe", std::make_shared<Embedding>(c.block_size, c.n_embd));
  drop_ = tr->add("drop", std::make_shared<Dropout>(c.dropout));
  auto h = tr->add("h", std::make_shared<Container>());
  for (int64_t i = 0; i < c.n_layer; ++i) blocks_.push_back(h->add(std::to_string(i), std::make_shared<GPTBlock>(c)));
  ln_f_ = tr->add("ln_f", std::make_shared<LayerNorm>(Shape{c.n_embd}, 1e-5, true, c.bias));

  // GPT-2 initialisation: N(0, 0.02) everywhere, residual projections scaled by
  // 1/sqrt(2 n_layer) (each block adds two residual branches), zero biases.
  const double std_res = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  for (auto& [name, p] : named_parameters()) {
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (name.find(".ln_") != std::string::npos) continue;  // LayerNorm: weight 1, bias 0 (already)
    if (is_bias) init_zero(p);
    else if (name.find("c_proj.weight") != std::string::npos) init_normal(p, std_res);
    else init_normal(p, 0.02);
  }
}

Tensor GPT::forward(const Tensor& ids) {
  auto scope = enter();
  ATH_CHECK(ids.dim() == 2, "GPT", "expected token ids [B, T], got ", ids.describe());
  const int64_t T = ids.size(1);
  ATH_CHECK(T <= config_.block_size, "GPT", "sequence length ", T, " exceeds block_size ", config_.block_size,
            Hint{"crop the input to the last block_size tokens or train with a larger block_size"});
  Tensor x;
  {
    auto t = transformer_->enter();
    Tensor pos = arange(0, T, TensorOptions(DType::i64).with_device(ids.device()));  // beside the ids (cpu or cuda)
    x = drop_->forward(add(wte_->forward(ids), wpe_->forward(pos)));
    for (auto& b : blocks_) {
      auto hs = ModuleScope("h");
      GPTBlock* block = b.get();
      auto run = [block](const Tensor& in) { return block->forward(in); };
      if (b->has_forward_interceptor()) {
        // The interceptor (e.g. ZeRO-3's, which already runs the block under checkpoint())
        // takes precedence over gradient_checkpointing: a block is never checkpointed twice.
        x = b->run_forward(x, run);
      } else if (config_.gradient_checkpointing && grad_enabled()) {
        // Keep only each block's input; its intermediates are recomputed in backward (one extra block forward).
        x = checkpoint(run, x);
      } else {
        x = b->forward(x);
      }
    }
    x = ln_f_->forward(x);
  }
  return linear(x, wte_->weight);  // tied lm_head
}

Tensor GPT::loss(const Tensor& ids, const Tensor& targets) {
  Tensor logits = forward(ids);
  return cross_entropy(reshape(logits, {-1, config_.vocab_size}), reshape(targets, {-1}));
}

int32_t sample_token(std::vector<double> last, double temperature, int64_t top_k, Generator& gen) {
  const int64_t V = static_cast<int64_t>(last.size());
  for (double& l : last) l /= temperature;
  if (top_k > 0 && top_k < V) {  // keep the k largest logits
    std::vector<double> sorted = last;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<double>());
    const double kth = sorted[top_k - 1];
    for (double& l : last)
      if (l < kth) l = -INFINITY;
  }
  const double mx = *std::max_element(last.begin(), last.end());
  double total = 0;
  for (double& l : last) total += (l = std::exp(l - mx));
  const GeneratorState s = gen.reserve(1);
  const auto r = philox4x32(s.seed, s.offset);
  double u = static_cast<double>(uint_to_unit_float(r[0])) * total, acc = 0;
  int32_t next = static_cast<int32_t>(V - 1);
  for (int64_t i = 0; i < V; ++i) {
    acc += last[i];
    if (u < acc) { next = static_cast<int32_t>(i); break; }
  }
  return next;
}

int32_t sample_last_position(const Tensor& logits, double temperature, int64_t top_k, Generator& gen) {
  const int64_t T = logits.size(1), V = logits.size(2);
  Tensor last = make_view(logits, {V}, {1}, logits.storage_offset() + (T - 1) * V);
  return sample_token(last.to_vector(), temperature, top_k, gen);
}

std::vector<int32_t> generate_tokens(Module& model, const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                                     double temperature, int64_t vocab_size, int64_t block_size,
                                     const std::function<int32_t(const std::vector<int64_t>& context)>& next_token) {
  ATH_CHECK(!prompt.empty(), "generate", "the prompt is empty", Hint{"give at least one token"});
  ATH_CHECK(temperature > 0, "generate", "temperature must be > 0, got ", temperature);
  for (int32_t t : prompt)
    ATH_CHECK(t >= 0 && t < vocab_size, "generate", "prompt token ", t, " is outside the vocabulary [0, ", vocab_size, ")");
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard ng;
  std::vector<int32_t> out = prompt;
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(out.size()) - block_size);
    out.push_back(next_token(std::vector<int64_t>(out.begin() + start, out.end())));
  }
  model.train(was_training);
  return out;
}

std::vector<int32_t> generate_from_logits(Module& model, const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                                          double temperature, int64_t top_k, int64_t vocab_size, int64_t block_size,
                                          Generator& gen, const std::function<Tensor(const Tensor& ids)>& forward) {
  return generate_tokens(model, prompt, max_new_tokens, temperature, vocab_size, block_size, [&](const std::vector<int64_t>& ctx) {
    const int64_t T = static_cast<int64_t>(ctx.size());
    return sample_last_position(forward(from_vector(ctx, {1, T}).to(model.device())), temperature, top_k, gen);
  });
}

std::vector<int32_t> GPT::generate(const std::vector<int32_t>& prompt, int64_t max_new_tokens, double temperature,
                                   int64_t top_k, Generator& gen) {
  return generate_from_logits(*this, prompt, max_new_tokens, temperature, top_k, config_.vocab_size, config_.block_size, gen,
                              [this](const Tensor& ids) { return forward(ids); });
}

std::vector<std::string> GPT::shard_units() const {
  std::vector<std::string> out;
  for (int64_t i = 0; i < config_.n_layer; ++i) out.push_back("transformer.h." + std::to_string(i));
  return out;
}

double GPT::flops_per_token(int64_t T) const {
  // PaLM appendix B: 6N for the matmuls of forward+backward, plus 12 L H hd T for attention.
  const double N = static_cast<double>(parameters_count());
  const double L = config_.n_layer, H = config_.n_head, hd = static_cast<double>(config_.n_embd) / config_.n_head;
  return 6.0 * N + 12.0 * L * H * hd * static_cast<double>(T);
}

}  // namespace athanor::nn
