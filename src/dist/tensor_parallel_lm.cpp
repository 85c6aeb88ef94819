// What every tensor-parallel decoder LM shares: the vocabulary-parallel head and loss,
// generation, the logical state dict (contract in include/athanor/dist/tensor_parallel_lm.h).
#include "athanor/dist/tensor_parallel_lm.h"

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/error.h"
#include "athanor/dist/vocab_parallel_cross_entropy.h"
#include "athanor/nn/gpt.h"  // generate_tokens, sample_token: the generation loop every LM shares
#include "athanor/ops.h"
#include "tensor_parallel_block.h"

namespace athanor::dist {

TensorParallelLM::TensorParallelLM(const char* name, GroupPtr tp, TensorParallelOptions o, int64_t vocab, int64_t block_size)
    : name_(name), tp_(std::move(tp)), options_(o), vocab_(vocab), block_size_(block_size) {
  ATH_CHECK(tp_ != nullptr, name_, "got no tensor-parallel group", Hint{"pass a DeviceMesh's tp() group"});
}

bool TensorParallelLM::use_sequence_parallel(int64_t T) const {
  if (!options_.sequence_parallel || tp_->size() == 1) return false;
  if (T % tp_->size() == 0) return true;
  // Without gradients the plain tensor-parallel path computes the same function (generation
  // feeds any length); training with a length the sequence cannot be split into is an error.
  ATH_CHECK(!grad_enabled(), name_, "sequence parallelism splits the sequence across tp = ",
            tp_->size(), " ranks, but this batch has T = ", T, " tokens",
            Hint{"train on sequences whose length is a multiple of dist.tp (model.block_size)"});
  return false;
}

Tensor TensorParallelLM::logits(const Tensor& ids) {
  const bool sp = use_sequence_parallel(ids.dim() == 2 ? ids.size(1) : 0);
  Tensor x = hidden(ids, sp);
  return tp_logits(x, head_weight(), sp, options_.regather, tp_);
}

Tensor TensorParallelLM::loss(const Tensor& ids, const Tensor& targets, Reduction reduction) {
  Tensor l = logits(ids);
  return vocab_parallel_cross_entropy(reshape(l, {-1, l.size(-1)}), reshape(targets, {-1}), vocab_, tp_, -100, reduction);
}

std::vector<int32_t> TensorParallelLM::generate(const std::vector<int32_t>& prompt, int64_t max_new_tokens, double temperature,
                                                int64_t top_k, Generator& gen) {
  return nn::generate_tokens(*this, prompt, max_new_tokens, temperature, vocab_, block_size_, [&](const std::vector<int64_t>& ctx) {
    const int64_t T = static_cast<int64_t>(ctx.size());
    Tensor x = hidden(from_vector(ctx, {1, T}), false);
    const int64_t d = x.size(-1);
    Tensor last = make_view(x, {1, d}, {d, 1}, x.storage_offset() + (T - 1) * d);
    // Every rank's vocabulary columns of the last position, gathered: V values, not B·T·V.
    Tensor all = all_gather_along(linear(last, head_weight()), *tp_, -1);
    std::vector<double> row = all.to_vector();
    row.resize(static_cast<size_t>(vocab_));  // drop the padding columns
    return nn::sample_token(std::move(row), temperature, top_k, gen);
  });
}

int64_t TensorParallelLM::logical_parameters_count() const {
  int64_t n = 0;
  for (auto& [name, p] : named_parameters()) n += shape_numel(logical_shape(p.sizes(), spec_of(specs_, name)));
  return n;
}

nn::StateDict TensorParallelLM::logical_state_dict() {
  nn::StateDict out;
  for (auto& [name, t] : state_dict()) out.emplace_back(name, gather_shards(t, spec_of(specs_, name), *tp_));
  return out;
}

void TensorParallelLM::load_logical_state_dict(const nn::StateDict& state) {
  nn::StateDict local;
  for (auto& [name, t] : state) local.emplace_back(name, shard_of(t, spec_of(specs_, name), name));
  load_state_dict(local, /*strict=*/true);
}

ShardSpec optimizer_state_spec(const ShardSpecs& specs, const std::string& key) {
  const auto dot = key.find('.');
  return dot == std::string::npos ? ShardSpec{} : spec_of(specs, key.substr(dot + 1));
}

}  // namespace athanor::dist
