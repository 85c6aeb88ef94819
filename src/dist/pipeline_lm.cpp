// A decoder LM split into pipeline stages, each split over a tensor-parallel group (contract
// in include/athanor/dist/pipeline_lm.h): the layout, the embedding group, and what every
// model's stages share (chunks, the dropout stream, the tied embedding, the loss).
#include "athanor/dist/pipeline_lm.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <sstream>

#include "athanor/autograd/checkpoint.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/core/error.h"
#include "athanor/dist/tensor_parallel_layers.h"
#include "athanor/dist/vocab_parallel_cross_entropy.h"
#include "athanor/ops.h"
#include "tensor_parallel_block.h"

namespace athanor::dist {

// ---- layout

PipelineLayout::PipelineLayout(int64_t n_layer, int pp, int v, std::vector<int64_t> layers) : n_layer_(n_layer), pp_(pp), v_(v) {
  const char* op = "pipeline layout";
  ATH_CHECK(pp >= 1, op, "dist.pp must be >= 1, got ", pp);
  ATH_CHECK(v >= 1, op, "dist.virtual_stages must be >= 1, got ", v);
  const int S = pp * v;
  const std::string stages = std::to_string(S) + (v > 1 ? " virtual stages (dist.pp " + std::to_string(pp) + " x dist.virtual_stages " +
                                                              std::to_string(v) + ")"
                                                        : " stages (dist.pp)");
  if (layers.empty()) {
    ATH_CHECK(n_layer >= S, op, "model.n_layer (", n_layer, ") is smaller than the ", stages,
              ": a stage would hold no transformer block",
              Hint{"use at most " + std::to_string(n_layer) + " stages (dist.pp x dist.virtual_stages), or more layers"});
    // Balanced: ⌊L/S⌋ each; the L mod S extra blocks go to the inner stages first, then the
    // first, then the last (the end stages also compute the embedding and the head).
    std::vector<int64_t> counts(S, n_layer / S);
    std::vector<int> order;
    for (int s = 1; s + 1 < S; ++s) order.push_back(s);
    order.push_back(0);
    if (S > 1) order.push_back(S - 1);
    for (int64_t k = 0; k < n_layer % S; ++k) ++counts[order[k]];
    layers = counts;
  } else {
    ATH_CHECK(static_cast<int>(layers.size()) == S, op, "dist.pp_layers lists ", layers.size(), " stages but the pipeline has ", stages,
              Hint{"give one block count per " + std::string(v > 1 ? "virtual stage, in pipeline order" : "stage") +
                   ", or leave dist.pp_layers empty for a balanced split"});
    for (int s = 0; s < S; ++s)
      ATH_CHECK(layers[s] >= 1, op, "dist.pp_layers gives stage ", s, " ", layers[s], " blocks: every stage needs at least one",
                Hint{"give every stage one block or more"});
    const int64_t total = std::accumulate(layers.begin(), layers.end(), int64_t{0});
    ATH_CHECK(total == n_layer, op, "dist.pp_layers sums to ", total, " blocks but model.n_layer is ", n_layer,
              Hint{"the counts must add up to model.n_layer"});
  }
  starts_.assign(1, 0);
  for (int64_t c : layers) starts_.push_back(starts_.back() + c);
}

std::string PipelineLayout::describe() const {
  std::ostringstream o;
  o << "blocks per stage:";
  for (int s = 0; s < stages(); ++s) o << " [" << first_layer(s) << ", " << end_layer(s) << ")";
  return o.str();
}

GroupPtr make_embedding_group(const DeviceMesh& mesh) {
  const int pp = mesh.pp_size(), i = mesh.pp_index();
  const bool member = pp > 1 && (i == 0 || i == pp - 1);
  // Members: one group per (dp, tp) pair; everyone else a group of their own.
  const int pairs = mesh.dp_size() * mesh.tp_size();
  const int color = member ? mesh.dp_index() * mesh.tp_size() + mesh.tp_index() : pairs + mesh.world()->rank();
  auto g = mesh.world()->split(color, mesh.world()->rank(), "embedding");
  g->set_dimension("pp");  // the ledger counts its traffic with the pipeline's
  g->set_timeout(mesh.pp()->timeout());
  return g;
}

// ---- the stages

PipelineLM::PipelineLM(const char* name, Dims d, PipelineLayout layout, int rank, GroupPtr tp, TensorParallelOptions o, GroupPtr eg)
    : name_(name), dims_(std::move(d)), layout_(std::move(layout)), rank_(rank), tp_(std::move(tp)), embedding_group_(std::move(eg)),
      options_(o) {
  const char* op = name_;
  ATH_CHECK(tp_ != nullptr, op, "got no tensor-parallel group", Hint{"pass a DeviceMesh's tp() group (of size 1 without tensor parallelism)"});
  ATH_CHECK(dims_.dropout >= 0 && dims_.dropout < 1, op, "dropout must be in [0, 1), got ", dims_.dropout);
  ATH_CHECK(layout_.n_layer() == dims_.n_layer, op, "the layout splits ", layout_.n_layer(), " blocks but model.n_layer is ", dims_.n_layer);
  ATH_CHECK(rank >= 0 && rank < layout_.pp(), op, "rank ", rank, " is not a stage of the ", layout_.pp(), "-stage pipeline");
  ATH_CHECK(layout_.pp() == 1 || dims_.tied.empty() || embedding_group_ != nullptr, op, "a pipeline of ", layout_.pp(),
            " stages needs the embedding group (the tied embedding's gradient is summed between the first and the last stage)",
            Hint{"pass dist::make_embedding_group(mesh)"});
  const int S = layout_.stages();
  held_.assign(static_cast<std::size_t>(dims_.n_layer), false);
  for (int k = 0; k < layout_.virtual_stages(); ++k) {
    const int s = layout_.stage_of(rank, k);
    chunks_.push_back({s, layout_.first_layer(s), layout_.end_layer(s), s == 0, s == S - 1});
    for (int64_t i = layout_.first_layer(s); i < layout_.end_layer(s); ++i) held_[static_cast<std::size_t>(i)] = true;
  }
  sp_ = std::make_shared<bool>(false);
}

PipelineLM::~PipelineLM() = default;

void PipelineLM::note(const std::string& prefix, nn::Module& m, bool keep) {
  const ShardSpecs specs = collect_shard_specs(m);
  for (auto& [n, p] : m.named_parameters())
    order_.push_back({prefix + n, shape_numel(logical_shape(p.sizes(), spec_of(specs, n))), keep});
}

void PipelineLM::init_parameters(const std::function<void(const std::string&, Tensor&, const ShardSpec&)>& init,
                                 const std::function<void(const std::string&, int64_t)>& skip) {
  std::map<std::string, Tensor> mine;
  for (auto& [n, p] : named_parameters()) mine[n] = p;
  for (const Noted& e : order_) {
    if (e.held) init(e.name, mine.at(e.name), spec_of(specs_, e.name));
    else skip(e.name, e.logical_numel);
  }
  order_.clear();
}

bool PipelineLM::sequence_parallel(int64_t T) const {
  if (!options_.sequence_parallel || tp_->size() == 1) return false;
  if (T % tp_->size() == 0) return true;
  ATH_CHECK(!grad_enabled(), name_, "sequence parallelism splits the sequence across tp = ", tp_->size(),
            " ranks, but this batch has T = ", T, " tokens",
            Hint{"train on sequences whose length is a multiple of dist.tp (model.block_size)"});
  return false;
}

Shape PipelineLM::activation_shape(int64_t B, int64_t T) const {
  return {B, sequence_parallel(T) ? T / tp_->size() : T, dims_.n_embd};
}

uint64_t PipelineLM::dropout_blocks(int64_t B, int64_t T) const {
  if (dims_.dropout == 0.0 || !is_training()) return 0;
  const uint64_t per_mask = static_cast<uint64_t>((B * T * dims_.n_embd + 3) / 4);  // dropout's ⌈n/4⌉ blocks
  return per_mask * static_cast<uint64_t>(dims_.embedding_masks + dims_.layer_masks * dims_.n_layer);
}

Tensor PipelineLM::forward_chunk(int c, const ChunkInput& in) {
  auto scope = enter();
  const char* op = name_;
  const Chunk& ch = chunks_.at(static_cast<std::size_t>(c));
  ATH_CHECK(in.ids.defined() && in.ids.dim() == 2, op, "stage ", ch.stage, " needs the micro-batch's token ids [B, T] (",
            ch.embedding ? "it starts the model" : "for the shapes", "), got ", in.ids.defined() ? in.ids.describe() : "nothing");
  const int64_t B = in.ids.size(0), T = in.ids.size(1);
  ATH_CHECK(T <= dims_.block_size, op, "sequence length ", T, " exceeds block_size ", dims_.block_size,
            Hint{"crop the input to the last block_size tokens or train with a larger block_size"});
  if (!ch.embedding)
    ATH_CHECK(in.activation.defined() && in.activation.sizes() == activation_shape(B, T), op, "stage ", ch.stage,
              " expected an activation ", shape_str(activation_shape(B, T)), " from stage ", ch.stage - 1, ", got ",
              in.activation.defined() ? in.activation.describe() : "nothing");
  const bool sp = sequence_parallel(T);
  *sp_ = sp;
  if (in.rng) {
    // Where the 1-process forward of this micro-batch is when it reaches this chunk.
    const uint64_t masks = static_cast<uint64_t>(dims_.embedding_masks + dims_.layer_masks * dims_.n_layer);
    const uint64_t per_mask = dropout_blocks(B, T) / masks;
    const uint64_t skip = ch.embedding ? 0 : per_mask * static_cast<uint64_t>(dims_.embedding_masks + dims_.layer_masks * ch.first);
    default_generator().set_state({in.rng->seed, in.rng->offset + skip});
  }
  Tensor x = ch.embedding ? embed(in.ids, sp) : in.activation;
  for (int64_t i = ch.first; i < ch.end; ++i) {
    auto run = [this, i](const Tensor& v) { return run_layer(i, v); };
    if (dims_.gradient_checkpointing && grad_enabled()) x = checkpoint(run, x);
    else x = run(x);
  }
  if (!ch.head) return x;
  Tensor l = tp_logits(final_norm(x), head_weight(), sp, options_.regather, tp_);
  if (!in.targets.defined()) return l;
  ATH_CHECK(in.targets.sizes() == in.ids.sizes(), op, "targets ", in.targets.describe(), " do not match the ids ", in.ids.describe());
  return vocab_parallel_cross_entropy(reshape(l, {-1, l.size(-1)}), reshape(in.targets, {-1}), dims_.vocab_size, tp_, -100,
                                      in.reduction);
}

std::vector<std::string> PipelineLM::duplicate_parameters() const {
  if (!dims_.tied.empty() && layout_.pp() > 1 && holds_head() && !holds_embedding()) return {dims_.tied};
  return {};
}

void PipelineLM::sum_tied_gradients() {
  if (layout_.pp() == 1 || dims_.tied.empty() || !(holds_embedding() || holds_head())) return;
  for (auto& [n, w] : named_parameters()) {
    if (n != dims_.tied) continue;
    ATH_CHECK(w.grad().defined(), name_, "stage ", rank_, ": the tied embedding has no gradient to sum",
              Hint{"call sum_tied_gradients after the step's backward passes"});
    NoGradGuard ng;
    embedding_group_->all_reduce(w.grad());
    return;
  }
}

}  // namespace athanor::dist
