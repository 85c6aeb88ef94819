// The tensor-parallel Llama decoder layer and the embedding / init steps shared by
// TensorParallelLlama and PipelineLlama (contract in tensor_parallel_llama_layer.h).
#include "tensor_parallel_llama_layer.h"

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/error.h"
#include "athanor/core/rng.h"
#include "athanor/ops.h"
#include "athanor/ops/swiglu.h"
#include "tensor_parallel_block.h"

namespace athanor::dist {

bool replicates_kv_heads(const nn::LlamaConfig& c, int tp) { return tp > 1 && c.n_kv_head < tp; }

void check_tensor_parallel_llama(const nn::LlamaConfig& c, int tp, bool sp, const char* op) {
  const std::string problem = nn::llama_config_problem(c);
  ATH_CHECK(problem.empty(), op, problem,
            Hint{"e.g. n_embd 768, n_head 12 (head dim 64), n_kv_head 4 (groups of 3 query heads), intermediate_size 2048"});
  const std::string t = std::to_string(tp);
  ATH_CHECK(c.n_head % tp == 0, op, "model.n_head (", c.n_head, ") is not divisible by dist.tp (", tp,
            "): the query heads are split across the tensor-parallel ranks",
            Hint{"choose dist.tp dividing n_head (" + std::to_string(c.n_head) + "), or n_head a multiple of " + t});
  ATH_CHECK(c.n_kv_head % tp == 0 || tp % c.n_kv_head == 0, op, "model.n_kv_head (", c.n_kv_head, ") and dist.tp (", tp,
            ") do not divide one another: each tensor-parallel rank holds n_kv_head / tp key/value heads and the query heads "
            "of their groups; with fewer kv heads than ranks (multi-query attention: n_kv_head 1) each rank holds a replica of "
            "the one kv head its query heads read, which needs dist.tp a multiple of n_kv_head",
            Hint{"choose dist.tp dividing n_kv_head (" + std::to_string(c.n_kv_head) + ") or a multiple of it that divides n_head (" +
                 std::to_string(c.n_head) + ")"});
  ATH_CHECK(c.intermediate_size % tp == 0, op, "model.intermediate_size (", c.intermediate_size, ") is not divisible by dist.tp (",
            tp, "): the MLP's gate_proj / up_proj rows and down_proj columns are split across the tensor-parallel ranks",
            Hint{"choose intermediate_size a multiple of dist.tp (e.g. a multiple of 64), or another dist.tp"});
  ATH_CHECK(!sp || c.block_size % tp == 0, op, "sequence parallelism splits the sequence across tp: model.block_size (",
            c.block_size, ") must be divisible by dist.tp (", tp, ")",
            Hint{"choose block_size a multiple of dist.tp, or turn dist.sequence_parallel off"});
}

class TPLlamaAttention : public nn::Module {
 public:
  TPLlamaAttention(const nn::LlamaConfig& c, const GroupPtr& tp, const TensorParallelOptions& o, std::shared_ptr<const bool> sp)
      : D(c.head_dim()), tp_(tp), regather_(o.regather), sp_(std::move(sp)) {
    const int t = tp->size();
    H_local = c.n_head / t;
    const ColumnParallelLinear::Options col{.bias = false, .regather = o.regather};
    q_proj = register_module("q_proj", std::make_shared<ColumnParallelLinear>(c.n_embd, c.n_head * D, tp, col));
    if (replicates_kv_heads(c, t)) {
      // Megatron's replication: every rank holds all kv heads and reads the one of its query heads' group.
      Hkv_local = 1;
      kv_start = tp->rank() / (t / c.n_kv_head);
      k_rep = register_module("k_proj", std::make_shared<nn::Linear>(c.n_embd, c.n_kv_head * D, false));
      v_rep = register_module("v_proj", std::make_shared<nn::Linear>(c.n_embd, c.n_kv_head * D, false));
    } else {
      Hkv_local = c.n_kv_head / t;
      k_proj = register_module("k_proj", std::make_shared<ColumnParallelLinear>(c.n_embd, c.n_kv_head * D, tp, col));
      v_proj = register_module("v_proj", std::make_shared<ColumnParallelLinear>(c.n_embd, c.n_kv_head * D, tp, col));
    }
    o_proj = register_module("o_proj", std::make_shared<RowParallelLinear>(c.n_head * D, c.n_embd, tp, RowParallelLinear::Options{.bias = false}));
  }
  Tensor forward(const Tensor& x, const RopeOptions& rope_opt) {
    auto scope = enter();
    const bool sp = *sp_;
    o_proj->options.sequence_parallel = sp;
    const Tensor kw = k_rep ? narrow(k_rep->weight, 0, kv_start * D, D) : k_proj->weight;
    const Tensor vw = v_rep ? narrow(v_rep->weight, 0, kv_start * D, D) : v_proj->weight;
    Tensor q, k, v;
    auto project = [&](const Tensor& h) {  // h: the whole sequence, [B, T, d]
      q = linear(h, q_proj->weight);
      k = linear(h, kw);
      v = linear(h, vw);
      return q;
    };
    if (sp) sequence_parallel_apply(x, tp_, 1, regather_, "linear", project);
    else project(copy_to_tensor_parallel_region(x, tp_));
    const int64_t B = q.size(0), T = q.size(1);
    // This rank's heads only: RoPE and grouped-query attention are local.
    Tensor qh = rope(view(q, {B, T, H_local, D}), rope_opt);
    Tensor kh = rope(view(k, {B, T, Hkv_local, D}), rope_opt);
    Tensor vh = view(v, {B, T, Hkv_local, D});
    Tensor y = scaled_dot_product_attention(transpose(qh, 1, 2), transpose(kh, 1, 2), transpose(vh, 1, 2),
                                            /*is_causal=*/true, std::nullopt, /*enable_gqa=*/Hkv_local != H_local);
    return o_proj->forward(reshape(transpose(y, 1, 2), {B, T, H_local * D}));
  }
  int64_t D, H_local = 0, Hkv_local = 0, kv_start = 0;
  GroupPtr tp_;
  bool regather_;
  std::shared_ptr<const bool> sp_;
  std::shared_ptr<ColumnParallelLinear> q_proj, k_proj, v_proj;  // k_proj, v_proj null when replicated
  std::shared_ptr<nn::Linear> k_rep, v_rep;                        // the replicated kv projections
  std::shared_ptr<RowParallelLinear> o_proj;
};

class TPLlamaMLP : public nn::Module {
 public:
  TPLlamaMLP(const nn::LlamaConfig& c, const GroupPtr& tp, const TensorParallelOptions& o, std::shared_ptr<const bool> sp)
      : tp_(tp), regather_(o.regather), sp_(std::move(sp)) {
    const ColumnParallelLinear::Options col{.bias = false, .regather = o.regather};
    gate_proj = register_module("gate_proj", std::make_shared<ColumnParallelLinear>(c.n_embd, c.intermediate_size, tp, col));
    up_proj = register_module("up_proj", std::make_shared<ColumnParallelLinear>(c.n_embd, c.intermediate_size, tp, col));
    down_proj = register_module("down_proj", std::make_shared<RowParallelLinear>(c.intermediate_size, c.n_embd, tp,
                                                                                 RowParallelLinear::Options{.bias = false}));
  }
  Tensor forward(const Tensor& x) {
    auto scope = enter();
    const bool sp = *sp_;
    down_proj->options.sequence_parallel = sp;
    Tensor h;
    {
      auto gate_scope = gate_proj->enter();  // errors and nodes name mlp.gate_proj, as nn::Llama's
      // silu(x W_gate_rᵀ) * (x W_up_rᵀ): this rank's intermediate columns, one fused op.
      auto op = [&](const Tensor& full) { return swiglu(full, gate_proj->weight, up_proj->weight); };
      h = sp ? sequence_parallel_apply(x, tp_, 1, regather_, "swiglu", op) : op(copy_to_tensor_parallel_region(x, tp_));
    }
    return down_proj->forward(h);
  }
  GroupPtr tp_;
  bool regather_;
  std::shared_ptr<const bool> sp_;
  std::shared_ptr<ColumnParallelLinear> gate_proj, up_proj;
  std::shared_ptr<RowParallelLinear> down_proj;
};

TPLlamaLayer::TPLlamaLayer(const nn::LlamaConfig& c, const GroupPtr& tp, const TensorParallelOptions& o,
                           const std::shared_ptr<const bool>& sp) {
  // nn::Llama's registration order (HF's state_dict order).
  self_attn = register_module("self_attn", std::make_shared<TPLlamaAttention>(c, tp, o, sp));
  mlp = register_module("mlp", std::make_shared<TPLlamaMLP>(c, tp, o, sp));
  input_layernorm = register_module("input_layernorm", std::make_shared<nn::RMSNorm>(Shape{c.n_embd}, c.rms_norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", std::make_shared<nn::RMSNorm>(Shape{c.n_embd}, c.rms_norm_eps));
  attn_drop = register_module("attn_dropout", std::make_shared<nn::Dropout>(c.dropout));
  mlp_drop = register_module("mlp_dropout", std::make_shared<nn::Dropout>(c.dropout));
}

Tensor TPLlamaLayer::forward(const Tensor& x, const RopeOptions& rope_opt) {
  auto scope = enter();
  const bool sp = *self_attn->sp_;
  const GroupPtr& tp = self_attn->tp_;
  Tensor h = add(x, replicated_dropout(*attn_drop, self_attn->forward(input_layernorm->forward(x), rope_opt), sp, tp));
  return add(h, replicated_dropout(*mlp_drop, mlp->forward(post_attention_layernorm->forward(h)), sp, tp));
}

namespace {
bool is_norm(const std::string& name) { return name.find("layernorm") != std::string::npos || name == "model.norm.weight"; }
}  // namespace

void mark_llama_partial_gradients(ShardSpecs& specs, const nn::Module& model, const nn::LlamaConfig& c, int tp, bool sp) {
  const bool rep = replicates_kv_heads(c, tp);
  for (auto& [name, p] : model.named_parameters()) {
    if (spec_of(specs, name).sharded()) continue;
    const bool kv = name.find("self_attn.k_proj.") != std::string::npos || name.find("self_attn.v_proj.") != std::string::npos;
    if ((sp && is_norm(name)) || (rep && kv)) specs[name].sum_grad_over_tp = true;
  }
}

Tensor tp_llama_embed(VocabParallelEmbedding& embed, const Tensor& ids, bool sp, const GroupPtr& tp) {
  if (!sp) return embed.forward(ids);
  return reduce_scatter_to_sequence_parallel_region(embed.forward_partial(ids), tp, 1);  // [B, T/tp, d]
}

void init_llama_parameter(const std::string& name, Tensor& p, const ShardSpec& s, double initializer_range) {
  if (is_norm(name)) return;
  NoGradGuard ng;
  Tensor full = empty(logical_shape(p.sizes(), s), TensorOptions(p.dtype()));
  normal_(full, 0.0, initializer_range);
  copy_into(p, shard_of(full, s, name));
  p.bump_version();
}

void skip_llama_parameter(const std::string& name, int64_t logical_numel) {
  if (is_norm(name)) return;
  default_generator().reserve(static_cast<uint64_t>((logical_numel + 1) / 2));  // normal_'s blocks
}

}  // namespace athanor::dist
