// GPT-2 split into pipeline stages, each split over a tensor-parallel group (contract in
// include/athanor/dist/pipeline_gpt.h). The layers are TensorParallelGPT's
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

// ---- the model

PipelineGPT::PipelineGPT(nn::GPTConfig c, PipelineLayout layout, int rank, GroupPtr tp, TensorParallelOptions o, GroupPtr eg)
    : config_(c), layout_(std::move(layout)), rank_(rank), tp_(std::move(tp)), embedding_group_(std::move(eg)), options_(o) {
  const char* op = "PipelineGPT";
  ATH_CHECK(tp_ != nullptr, op, "got no tensor-parallel group", Hint{"pass a DeviceMesh's tp() group (of size 1 without tensor parallelism)"});
  ATH_CHECK(c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0 && c.block_size > 0 && c.vocab_size > 0, op,
            "n_layer, n_head, n_embd, block_size and vocab_size must all be > 0");
  ATH_CHECK(c.n_embd % c.n_head == 0, op, "n_embd (", c.n_embd, ") must be divisible by n_head (", c.n_head, ")");
  ATH_CHECK(c.n_head % tp_->size() == 0, op, "model.n_head (", c.n_head, ") is not divisible by dist.tp (", tp_->size(), ")",
            Hint{"choose dist.tp dividing n_head"});
  ATH_CHECK(!o.sequence_parallel || c.block_size % tp_->size() == 0, op, "sequence parallelism: model.block_size (", c.block_size,
            ") must be divisible by dist.tp (", tp_->size(), ")");
  ATH_CHECK(c.dropout >= 0 && c.dropout < 1, op, "dropout must be in [0, 1), got ", c.dropout);
  ATH_CHECK(layout_.n_layer() == c.n_layer, op, "the layout splits ", layout_.n_layer(), " blocks but model.n_layer is ", c.n_layer);
  ATH_CHECK(rank >= 0 && rank < layout_.pp(), op, "rank ", rank, " is not a stage of the ", layout_.pp(), "-stage pipeline");
  ATH_CHECK(layout_.pp() == 1 || embedding_group_ != nullptr, op, "a pipeline of ", layout_.pp(),
            " stages needs the embedding group (the tied embedding's gradient is summed between the first and the last stage)",
            Hint{"pass dist::make_embedding_group(mesh)"});
  const int S = layout_.stages();
  std::vector<bool> held(static_cast<std::size_t>(c.n_layer), false);
  for (int k = 0; k < layout_.virtual_stages(); ++k) {
    const int s = layout_.stage_of(rank, k);
    chunks_.push_back({s, layout_.first_layer(s), layout_.end_layer(s), s == 0, s == S - 1});
    for (int64_t i = layout_.first_layer(s); i < layout_.end_layer(s); ++i) held[i] = true;
  }
  const bool embedding = holds_embedding(), head = holds_head();
  sp_ = std::make_shared<bool>(false);
  const std::shared_ptr<const bool> sp = sp_;

  // nn::GPT's construction order. The modules of other stages are built too, one at a time,
  // and dropped, so that the generator's draws (every layer draws its logical tensor at
  // construction) are those of one process; their names and sizes are kept for the init pass.
  struct Entry {
    std::string name;
    int64_t logical_numel = 0;
    bool held = false;
  };
  std::vector<Entry> order;
  auto note = [&](const std::string& prefix, nn::Module& m, bool keep) {
    const ShardSpecs specs = collect_shard_specs(m);
    for (auto& [n, p] : m.named_parameters())
      order.push_back({prefix + n, shape_numel(logical_shape(p.sizes(), spec_of(specs, n))), keep});
  };
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
    note("transformer.h." + std::to_string(i) + ".", *b, held[i]);
    if (held[i]) blocks_[i] = h->add(std::to_string(i), b);
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

  // The GPT-2 initialisation pass over every logical parameter in nn::GPT's order: this
  // rank's are drawn, the others' draws skipped.
  std::map<std::string, Tensor> mine;
  for (auto& [n, p] : named_parameters()) mine[n] = p;
  for (const Entry& e : order) {
    if (e.held) init_gpt_parameter(e.name, mine.at(e.name), spec_of(specs_, e.name), c.n_layer);
    else skip_gpt_parameter(e.name, e.logical_numel);
  }
}

PipelineGPT::~PipelineGPT() = default;

bool PipelineGPT::sequence_parallel(int64_t T) const {
  if (!options_.sequence_parallel || tp_->size() == 1) return false;
  if (T % tp_->size() == 0) return true;
  ATH_CHECK(!grad_enabled(), "PipelineGPT", "sequence parallelism splits the sequence across tp = ", tp_->size(),
            " ranks, but this batch has T = ", T, " tokens",
            Hint{"train on sequences whose length is a multiple of dist.tp (model.block_size)"});
  return false;
}

Shape PipelineGPT::activation_shape(int64_t B, int64_t T) const {
  return {B, sequence_parallel(T) ? T / tp_->size() : T, config_.n_embd};
}

uint64_t PipelineGPT::dropout_blocks(int64_t B, int64_t T) const {
  if (config_.dropout == 0.0 || !is_training()) return 0;
  const uint64_t per_mask = static_cast<uint64_t>((B * T * config_.n_embd + 3) / 4);  // dropout's ⌈n/4⌉ blocks
  return per_mask * static_cast<uint64_t>(1 + 2 * config_.n_layer);
}

Tensor PipelineGPT::forward_chunk(int c, const ChunkInput& in) {
  auto scope = enter();
  const char* op = "PipelineGPT";
  const Chunk& ch = chunks_.at(static_cast<std::size_t>(c));
  ATH_CHECK(in.ids.defined() && in.ids.dim() == 2, op, "stage ", ch.stage, " needs the micro-batch's token ids [B, T] (",
            ch.embedding ? "it starts the model" : "for the shapes", "), got ", in.ids.defined() ? in.ids.describe() : "nothing");
  const int64_t B = in.ids.size(0), T = in.ids.size(1);
  ATH_CHECK(T <= config_.block_size, op, "sequence length ", T, " exceeds block_size ", config_.block_size,
            Hint{"crop the input to the last block_size tokens or train with a larger block_size"});
  if (!ch.embedding)
    ATH_CHECK(in.activation.defined() && in.activation.sizes() == activation_shape(B, T), op, "stage ", ch.stage,
              " expected an activation ", shape_str(activation_shape(B, T)), " from stage ", ch.stage - 1, ", got ",
              in.activation.defined() ? in.activation.describe() : "nothing");
  const bool sp = sequence_parallel(T);
  *sp_ = sp;
  if (in.rng) {
    // Where the 1-process forward of this micro-batch is when it reaches this chunk.
    const uint64_t per_mask = dropout_blocks(B, T) / static_cast<uint64_t>(1 + 2 * config_.n_layer);
    const uint64_t skip = ch.embedding ? 0 : per_mask * static_cast<uint64_t>(1 + 2 * ch.first);
    default_generator().set_state({in.rng->seed, in.rng->offset + skip});
  }
  auto t = transformer_->enter();
  Tensor x = ch.embedding ? tp_embed(*wte_, *wpe_, *drop_, in.ids, sp, tp_) : in.activation;
  for (int64_t i = ch.first; i < ch.end; ++i) {
    auto hs = ModuleScope("h");
    TPBlock* block = blocks_[static_cast<std::size_t>(i)].get();
    auto run = [block](const Tensor& v) { return block->forward(v); };
    if (config_.gradient_checkpointing && grad_enabled()) x = checkpoint(run, x);
    else x = block->forward(x);
  }
  if (!ch.head) return x;
  x = ln_f_->forward(x);
  Tensor l = tp_logits(x, wte_->weight, sp, options_.regather, tp_);
  if (!in.targets.defined()) return l;
  ATH_CHECK(in.targets.sizes() == in.ids.sizes(), op, "targets ", in.targets.describe(), " do not match the ids ", in.ids.describe());
  return vocab_parallel_cross_entropy(reshape(l, {-1, l.size(-1)}), reshape(in.targets, {-1}), config_.vocab_size, tp_, -100,
                                      in.reduction);
}

std::vector<std::string> PipelineGPT::duplicate_parameters() const {
  if (layout_.pp() > 1 && holds_head() && !holds_embedding()) return {"transformer.wte.weight"};
  return {};
}

void PipelineGPT::sum_tied_gradients() {
  if (layout_.pp() == 1 || !wte_) return;
  Tensor& w = wte_->weight;
  ATH_CHECK(w.grad().defined(), "PipelineGPT", "stage ", rank_, ": the tied embedding has no gradient to sum",
            Hint{"call sum_tied_gradients after the step's backward passes"});
  NoGradGuard ng;
  embedding_group_->all_reduce(w.grad());
}

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
