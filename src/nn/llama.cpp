// Llama (pre-RMSNorm decoder) with Hugging Face's LlamaForCausalLM parameter names.
//   x = embed_tokens[ids]
//   for each layer: x = x + o_proj(attn(rope(q), rope(k), v))    on input_layernorm(x)
//                   x = x + down_proj(silu(gate_proj(h)) * up_proj(h)), h = post_attention_layernorm(x)
//   logits = lm_head(norm(x))                                     (or embed_tokens^T when tied)
// Attention is causal and grouped-query: n_head query heads share n_kv_head key/value heads
// (query head h reads kv head h / (n_head / n_kv_head), HF's repeat_kv), read per group by
// scaled_dot_product_attention's enable_gqa, never repeated in memory.
// With gradient_checkpointing each layer runs inside checkpoint(); layers run through
// Module::run_forward, so a forward interceptor on model.layers.<i> (ZeRO-3) wraps them.
#include "athanor/nn/llama.h"

#include <cmath>
#include <sstream>

#include "athanor/autograd/checkpoint.h"
#include "athanor/nn/gpt.h"  // generate_from_logits: the generation loop every LM shares
#include "athanor/ops.h"
#include "athanor/ops/rope.h"
#include "athanor/ops/swiglu.h"

namespace athanor::nn {
namespace {

// A container whose children are named by the caller ("layers", "0", …).
class Container : public Module {
 public:
  template <class M> std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) { return register_module(name, std::move(m)); }
};

class LlamaAttention : public Module {
 public:
  explicit LlamaAttention(const LlamaConfig& c) : H(c.n_head), Hkv(c.n_kv_head), D(c.head_dim()) {
    q_proj = register_module("q_proj", std::make_shared<Linear>(c.n_embd, H * D, false));
    k_proj = register_module("k_proj", std::make_shared<Linear>(c.n_embd, Hkv * D, false));
    v_proj = register_module("v_proj", std::make_shared<Linear>(c.n_embd, Hkv * D, false));
    o_proj = register_module("o_proj", std::make_shared<Linear>(H * D, c.n_embd, false));
  }
  Tensor forward(const Tensor& x, const RopeOptions& rope_opt) {
    auto scope = enter();
    const int64_t B = x.size(0), T = x.size(1);
    // [B, T, heads, D]: RoPE rotates each head's pairs (i, i + D/2) by position * inv_freq_i.
    Tensor q = rope(view(q_proj->forward(x), {B, T, H, D}), rope_opt);
    Tensor k = rope(view(k_proj->forward(x), {B, T, Hkv, D}), rope_opt);
    Tensor v = view(v_proj->forward(x), {B, T, Hkv, D});
    Tensor y = scaled_dot_product_attention(transpose(q, 1, 2), transpose(k, 1, 2), transpose(v, 1, 2),
                                            /*is_causal=*/true, std::nullopt, /*enable_gqa=*/Hkv != H);
    return o_proj->forward(reshape(transpose(y, 1, 2), {B, T, H * D}));
  }
  int64_t H, Hkv, D;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
};

class LlamaMLP : public Module {
 public:
  explicit LlamaMLP(const LlamaConfig& c) {
    gate_proj = register_module("gate_proj", std::make_shared<Linear>(c.n_embd, c.intermediate_size, false));
    up_proj = register_module("up_proj", std::make_shared<Linear>(c.n_embd, c.intermediate_size, false));
    down_proj = register_module("down_proj", std::make_shared<Linear>(c.intermediate_size, c.n_embd, false));
  }
  Tensor forward(const Tensor& x) {
    auto scope = enter();
    // silu(x W_gate^T) * (x W_up^T) as one op: the two GEMMs' outputs are not both kept.
    Tensor h;
    {
      auto gate_scope = gate_proj->enter();  // errors and nodes name mlp.gate_proj
      h = swiglu(x, gate_proj->weight, up_proj->weight);
    }
    return down_proj->forward(h);
  }
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
};

}  // namespace

class LlamaDecoderLayer : public Module {
 public:
  explicit LlamaDecoderLayer(const LlamaConfig& c) {
    // HF's registration order (its state_dict order): self_attn, mlp, input_layernorm, post_attention_layernorm.
    self_attn = register_module("self_attn", std::make_shared<LlamaAttention>(c));
    mlp = register_module("mlp", std::make_shared<LlamaMLP>(c));
    input_layernorm = register_module("input_layernorm", std::make_shared<RMSNorm>(Shape{c.n_embd}, c.rms_norm_eps));
    post_attention_layernorm =
        register_module("post_attention_layernorm", std::make_shared<RMSNorm>(Shape{c.n_embd}, c.rms_norm_eps));
    attn_drop = register_module("attn_dropout", std::make_shared<Dropout>(c.dropout));
    mlp_drop = register_module("mlp_dropout", std::make_shared<Dropout>(c.dropout));
  }
  Tensor forward(const Tensor& x, const RopeOptions& rope_opt) {
    auto scope = enter();
    Tensor h = add(x, attn_drop->forward(self_attn->forward(input_layernorm->forward(x), rope_opt)));
    return add(h, mlp_drop->forward(mlp->forward(post_attention_layernorm->forward(h))));
  }
  std::shared_ptr<LlamaAttention> self_attn;
  std::shared_ptr<LlamaMLP> mlp;
  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<Dropout> attn_drop, mlp_drop;
};

std::string llama_config_problem(const LlamaConfig& c) {
  std::ostringstream o;
  if (c.vocab_size <= 0 || c.n_layer <= 0 || c.n_head <= 0 || c.n_kv_head <= 0 || c.n_embd <= 0 || c.intermediate_size <= 0 ||
      c.block_size <= 0) {
    o << "vocab_size (" << c.vocab_size << "), n_layer (" << c.n_layer << "), n_head (" << c.n_head << "), n_kv_head ("
      << c.n_kv_head << "), n_embd (" << c.n_embd << "), intermediate_size (" << c.intermediate_size << ") and block_size ("
      << c.block_size << ") must all be > 0";
  } else if (c.n_embd % c.n_head != 0) {
    o << "n_embd (" << c.n_embd << ") must be divisible by n_head (" << c.n_head << ")";
  } else if (c.n_head % c.n_kv_head != 0) {
    o << "n_kv_head (" << c.n_kv_head << ") must divide n_head (" << c.n_head
      << "): each key/value head serves a group of n_head / n_kv_head query heads";
  } else if (c.head_dim() % 2 != 0) {
    o << "the head dim n_embd / n_head = " << c.head_dim() << " is odd; RoPE rotates pairs of dims, so it must be even";
  } else if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) {
    o << "rope_theta must be a finite number > 0, got " << c.rope_theta;
  } else if (!(c.rms_norm_eps > 0)) {
    o << "rms_norm_eps must be > 0, got " << c.rms_norm_eps;
  } else if (!(c.dropout >= 0 && c.dropout < 1)) {
    o << "dropout must be in [0, 1), got " << c.dropout;
  } else if (!(c.initializer_range >= 0)) {
    o << "initializer_range must be >= 0, got " << c.initializer_range;
  } else if (c.rope_scaling) {
    const RopeScaling& s = *c.rope_scaling;
    // transformers' _validate_llama3_parameters
    if (!(s.factor >= 1)) o << "rope_scaling factor must be >= 1, got " << s.factor;
    else if (!(s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor))
      o << "rope_scaling needs 0 < low_freq_factor < high_freq_factor, got " << s.low_freq_factor << " and " << s.high_freq_factor;
    else if (s.original_max_position <= 0)
      o << "rope_scaling original_max_position_embeddings must be > 0, got " << s.original_max_position;
  }
  return o.str();
}

Llama::Llama(LlamaConfig c) : config_(std::move(c)) {
  const std::string problem = llama_config_problem(config_);
  ATH_CHECK(problem.empty(), "Llama", problem,
            Hint{"e.g. n_embd 768, n_head 12 (head dim 64), n_kv_head 4 (groups of 3 query heads), intermediate_size 2048"});
  const LlamaConfig& k = config_;
  auto model = std::make_shared<Container>();
  model_ = register_module("model", model);
  embed_tokens_ = model->add("embed_tokens", std::make_shared<Embedding>(k.vocab_size, k.n_embd));
  auto layers = model->add("layers", std::make_shared<Container>());
  for (int64_t i = 0; i < k.n_layer; ++i) layers_.push_back(layers->add(std::to_string(i), std::make_shared<LlamaDecoderLayer>(k)));
  norm_ = model->add("norm", std::make_shared<RMSNorm>(Shape{k.n_embd}, k.rms_norm_eps));
  if (!k.tie_embeddings) lm_head_ = register_module("lm_head", std::make_shared<Linear>(k.n_embd, k.vocab_size, false));

  // HF's LlamaPreTrainedModel._init_weights: every Linear and Embedding weight N(0, initializer_range);
  // RMSNorm weights stay 1 (no residual-branch scaling, unlike GPT-2).
  NoGradGuard ng;
  for (auto& [name, p] : named_parameters()) {
    if (name.find("layernorm") != std::string::npos || name == "model.norm.weight") continue;
    normal_(p, 0.0, k.initializer_range);
  }
}

RopeOptions Llama::rope_options() const {
  RopeOptions o;
  o.theta = config_.rope_theta;
  o.llama3 = config_.rope_scaling;
  return o;
}

Tensor Llama::forward(const Tensor& ids) {
  auto scope = enter();
  ATH_CHECK(ids.dim() == 2, "Llama", "expected token ids [B, T], got ", ids.describe());
  const int64_t T = ids.size(1);
  ATH_CHECK(T <= config_.block_size, "Llama", "sequence length ", T, " exceeds block_size ", config_.block_size,
            Hint{"crop the input to the last block_size tokens or build the model with a larger block_size"});
  const RopeOptions rope_opt = rope_options();
  Tensor x;
  {
    auto m = model_->enter();
    x = embed_tokens_->forward(ids);
    for (auto& l : layers_) {
      auto ls = ModuleScope("layers");
      LlamaDecoderLayer* layer = l.get();
      // By value: checkpoint() reruns this in backward, after forward has returned.
      auto run = [layer, rope_opt](const Tensor& in) { return layer->forward(in, rope_opt); };
      if (l->has_forward_interceptor()) {
        x = l->run_forward(x, run);  // ZeRO-3's interceptor already checkpoints: never twice
      } else if (config_.gradient_checkpointing && grad_enabled()) {
        x = checkpoint(run, x);
      } else {
        x = run(x);
      }
    }
    x = norm_->forward(x);
  }
  if (lm_head_) return lm_head_->forward(x);
  return linear(x, embed_tokens_->weight);  // tied lm_head
}

Tensor Llama::loss(const Tensor& ids, const Tensor& targets) {
  Tensor logits = forward(ids);
  return cross_entropy(reshape(logits, {-1, config_.vocab_size}), reshape(targets, {-1}));
}

std::vector<int32_t> Llama::generate(const std::vector<int32_t>& prompt, int64_t max_new_tokens, double temperature,
                                     int64_t top_k, Generator& gen) {
  return generate_from_logits(*this, prompt, max_new_tokens, temperature, top_k, config_.vocab_size, config_.block_size, gen,
                              [this](const Tensor& ids) { return forward(ids); });
}

std::vector<std::string> Llama::shard_units() const {
  std::vector<std::string> out;
  for (int64_t i = 0; i < config_.n_layer; ++i) out.push_back("model.layers." + std::to_string(i));
  return out;
}

double Llama::flops_per_token(int64_t T) const { return llama_flops_per_token(config_, T); }

double llama_flops_per_token(const LlamaConfig& c, int64_t T) {
  // 6 x the parameters that are GEMM weights, counted from the config: per layer q and o (d x d),
  // k and v (d x n_kv_head hd), gate, up and down (d x intermediate) and the two RMSNorm weights,
  // then the final norm and the head (lm_head, or embed_tokens when tied; embed_tokens is a
  // lookup otherwise). tests/plan checks it against a built Llama's parameters.
  const double d = static_cast<double>(c.n_embd), kv = static_cast<double>(c.n_kv_head * c.head_dim()),
               I = static_cast<double>(c.intermediate_size), L = static_cast<double>(c.n_layer);
  const double n = L * (2 * d * d + 2 * d * kv + 3 * d * I + 2 * d) + d + static_cast<double>(c.vocab_size) * d;
  const double H = static_cast<double>(c.n_head), hd = static_cast<double>(c.head_dim());
  return 6.0 * n + 12.0 * L * H * hd * static_cast<double>(T);
}

}  // namespace athanor::nn
