// Column-, row- and vocab-parallel layers (contract in include/athanor/dist/tensor_parallel_layers.h).
#include "athanor/dist/tensor_parallel_layers.h"

#include <cmath>

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/error.h"
#include "athanor/core/rng.h"
#include "athanor/dist/tensor_parallel_dropout.h"
#include "athanor/ops.h"

namespace athanor::dist {

namespace {
int tp_size(const GroupPtr& tp, const char* layer) {
  ATH_CHECK(tp != nullptr, layer, "got no tensor-parallel group", Hint{"pass a DeviceMesh's tp() group"});
  return tp->size();
}

// The logical tensor drawn as the 1-process layer draws it, cut to this rank's shard.
Tensor drawn_shard(const Shape& logical, const ShardSpec& spec, bool normal, double a) {
  NoGradGuard ng;
  Tensor full = empty(logical, TensorOptions());
  if (normal) normal_(full, 0.0, a);
  else uniform_(full, -a, a);
  Tensor shard = shard_of(full, spec);
  shard.storage()->set_tag(MemTag::parameter);
  return shard;
}

ShardSpec split_spec(int dim, int parts, int64_t logical, int64_t padded, const GroupPtr& tp) {
  ShardSpec s;
  s.dim = dim;
  s.parts = parts;
  s.logical = logical;
  s.padded = padded;
  s.index = tp->rank();
  s.count = tp->size();
  return s;
}
}  // namespace

namespace {
// Walks the children directly (not named_modules(): a model collects its specs in its constructor,
// before any shared_ptr owns it).
void collect(nn::Module& m, const std::string& prefix, ShardSpecs& out) {
  if (auto* s = dynamic_cast<ShardedModule*>(&m))
    for (auto& [name, spec] : s->local_shard_specs()) out[prefix + name] = spec;
  for (auto& [name, child] : m.named_children()) collect(*child, prefix + name + ".", out);
}
}  // namespace

ShardSpecs collect_shard_specs(nn::Module& root) {
  ShardSpecs out;
  collect(root, "", out);
  return out;
}

// ---- ColumnParallelLinear

ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out, GroupPtr tp_, Options o)
    : in_features(in), out_features(out), padded_out(out), tp(std::move(tp_)), options(o) {
  const char* layer = "ColumnParallelLinear";
  const int t = tp_size(tp, layer);
  ATH_CHECK(in > 0 && out > 0 && o.parts >= 1 && o.pad_multiple >= 1, layer, "in_features (", in, "), out_features (", out,
            "), parts (", o.parts, ") and pad_multiple (", o.pad_multiple, ") must be > 0");
  ATH_CHECK(o.pad_multiple == 1 || o.parts == 1, layer, "padding (pad_multiple ", o.pad_multiple, ") needs parts 1, got ", o.parts);
  if (o.pad_multiple > 1) padded_out = VocabParallelEmbedding::padded_size(out, t, o.pad_multiple);
  ATH_CHECK(out % o.parts == 0 && (padded_out / o.parts) % t == 0, layer, "out_features ", out, " (", o.parts,
            " part(s) of ", out / o.parts, ") cannot be split evenly across tp = ", t, " ranks",
            Hint{"choose sizes divisible by dist.tp (for GPT: n_head divisible by dist.tp)"});
  // nn::Linear's init: U(±1/sqrt(in)) for the weight, then the bias, from the same generator.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  const ShardSpec ws = split_spec(0, o.parts, out, padded_out, tp);
  weight = register_parameter("weight", drawn_shard({out, in}, ws, false, bound));
  if (o.bias) bias = register_parameter("bias", drawn_shard({out}, ws, false, bound));
}

ShardSpecs ColumnParallelLinear::local_shard_specs() const {
  ShardSpecs s{{"weight", split_spec(0, options.parts, out_features, padded_out, tp)}};
  if (bias.defined()) s["bias"] = s["weight"];
  return s;
}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  auto scope = enter();
  Tensor y = options.sequence_parallel
                 ? sequence_parallel_linear(x, weight, bias, tp, options.sequence_dim, options.regather)
                 : linear(copy_to_tensor_parallel_region(x, tp), weight, bias);
  return options.gather_output ? gather_from_tensor_parallel_region(y, tp, -1) : y;
}

// ---- RowParallelLinear

RowParallelLinear::RowParallelLinear(int64_t in, int64_t out, GroupPtr tp_, Options o)
    : in_features(in), out_features(out), tp(std::move(tp_)), options(o) {
  const char* layer = "RowParallelLinear";
  const int t = tp_size(tp, layer);
  ATH_CHECK(in > 0 && out > 0, layer, "in_features (", in, ") and out_features (", out, ") must be > 0");
  ATH_CHECK(in % t == 0, layer, "in_features ", in, " cannot be split evenly across tp = ", t, " ranks",
            Hint{"choose sizes divisible by dist.tp (for GPT: n_head divisible by dist.tp)"});
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  weight = register_parameter("weight", drawn_shard({out, in}, split_spec(1, 1, in, in, tp), false, bound));
  if (o.bias) bias = register_parameter("bias", drawn_shard({out}, ShardSpec{}, false, bound));
}

ShardSpecs RowParallelLinear::local_shard_specs() const {
  ShardSpecs s{{"weight", split_spec(1, 1, in_features, in_features, tp)}};
  if (bias.defined()) {
    ShardSpec b;
    b.sum_grad_over_tp = options.sequence_parallel;  // added to a slice of the sequence on each rank
    s["bias"] = b;
  }
  return s;
}

Tensor RowParallelLinear::reduce_output(const Tensor& partial) {
  Tensor y = options.sequence_parallel ? reduce_scatter_to_sequence_parallel_region(partial, tp, options.sequence_dim)
                                       : reduce_from_tensor_parallel_region(partial, tp);
  return bias.defined() ? add(y, bias) : y;  // after the sum: the bias is added once, not tp times
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  auto scope = enter();
  const Tensor xin = options.input_is_parallel ? x : scatter_to_tensor_parallel_region(x, tp, -1);
  return reduce_output(linear(xin, weight));
}

// ---- VocabParallelEmbedding

int64_t VocabParallelEmbedding::padded_size(int64_t vocab, int tp, int64_t pad_multiple) {
  const int64_t m = pad_multiple * tp;
  return (vocab + m - 1) / m * m;
}

VocabParallelEmbedding::VocabParallelEmbedding(int64_t V, int64_t d, GroupPtr tp_, int64_t pad_multiple)
    : vocab(V), dim(d), tp(std::move(tp_)) {
  const char* layer = "VocabParallelEmbedding";
  const int t = tp_size(tp, layer);
  ATH_CHECK(V > 0 && d > 0, layer, "vocabulary (", V, ") and embedding dim (", d, ") must be > 0");
  ATH_CHECK(pad_multiple >= 1, layer, "pad_multiple must be >= 1, got ", pad_multiple);
  ATH_CHECK(pad_multiple > 1 || V % t == 0, layer, "the vocabulary of ", V, " tokens is not divisible by tp = ", t,
            " and padding is off (pad multiple 1)",
            Hint{"pad the vocabulary (dist.vocab_pad_multiple: 128 pads it to a multiple of 128 x tp), or choose dist.tp "
                 "dividing " + std::to_string(V)});
  padded = padded_size(V, t, pad_multiple);
  shard_start = static_cast<int64_t>(tp->rank()) * (padded / t);
  // nn::Embedding's init: N(0, 1) over the logical [V, d]; the padding rows are zero.
  weight = register_parameter("weight", drawn_shard({V, d}, split_spec(0, 1, V, padded, tp), true, 1.0));
}

ShardSpecs VocabParallelEmbedding::local_shard_specs() const { return {{"weight", split_spec(0, 1, vocab, padded, tp)}}; }

Tensor VocabParallelEmbedding::forward_partial(const Tensor& ids) {
  auto scope = enter();
  const char* layer = "VocabParallelEmbedding";
  ATH_CHECK(ids.defined() && (ids.dtype() == DType::i64 || ids.dtype() == DType::i32), layer,
            "expected integer token ids, got ", ids.defined() ? ids.describe() : "none");
  const int64_t rows = weight.size(0);
  const Tensor ic = ids.to(DType::i64).contiguous();
  const int64_t* p = ic.data_ptr<int64_t>();
  Tensor local = empty(ids.sizes(), TensorOptions(DType::i64));
  Shape keep_shape = ids.sizes();
  keep_shape.push_back(1);
  Tensor keep = empty(keep_shape, TensorOptions(weight.dtype()));
  int64_t* lp = local.data_ptr<int64_t>();
  std::vector<double> kv(static_cast<size_t>(ids.numel()));
  for (int64_t i = 0; i < ids.numel(); ++i) {
    // Every rank checks the same ids, so a bad one fails everywhere before any collective.
    ATH_CHECK(p[i] >= 0 && p[i] < vocab, layer, "token id ", p[i], " at position ", i, " is outside the vocabulary [0, ",
              vocab, ")", Hint{"check the tokenizer against model.vocab_size"});
    const int64_t r = p[i] - shard_start;
    const bool mine = r >= 0 && r < rows;
    lp[i] = mine ? r : 0;
    kv[static_cast<size_t>(i)] = mine ? 1.0 : 0.0;
  }
  copy_into(keep, from_vector(kv, keep_shape, TensorOptions(DType::f64)));
  // Rows of other shards are looked up as row 0 and zeroed: their gradient is zero too.
  return mul(embedding(weight, local), keep);
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids) { return reduce_from_tensor_parallel_region(forward_partial(ids), tp); }

// ---- TensorParallelDropout

TensorParallelDropout::TensorParallelDropout(double p_, GroupPtr tp_) : p(p_), tp(std::move(tp_)) {
  ATH_CHECK(p >= 0 && p < 1, "TensorParallelDropout", "p must be in [0, 1), got ", p);
  tp_size(tp, "TensorParallelDropout");
}
Tensor TensorParallelDropout::forward(const Tensor& x) {
  auto scope = enter();
  return tensor_parallel_region_dropout(x, p, is_training(), tp->rank());
}

}  // namespace athanor::dist
