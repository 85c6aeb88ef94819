#pragma once
// GPT-2 split into pipeline stages (and, within a stage, split over a tensor-parallel group):
// this rank's model chunks of a dp × tp × pp run.
//
//   dist::PipelineLayout layout(/*n_layer=*/8, /*pp=*/4);                   // 2 blocks per stage
//   dist::PipelineGPT stage(cfg, layout, mesh.pp_index(), mesh.tp(), {}, make_embedding_group(mesh));
//   Tensor act  = stage.forward_chunk(0, {.ids = ids, .rng = &mb_rng});               // first stage: ids in
//   Tensor loss = stage.forward_chunk(0, {act, ids, targets, &mb_rng});               // last stage: the loss
//
// Layout (PipelineLayout): S = pp · v virtual stages; rank r's chunk c is virtual stage c·pp + r
// (pipeline_schedule.h). Virtual stage 0 holds transformer.wte, wpe and the embedding dropout;
// S - 1 holds transformer.ln_f and the head; the blocks transformer.h.<i> are split in order,
// balanced by default (each stage ⌊L/S⌋, the remaining L mod S one more, given to the inner
// stages first, then the first, then the last: the end stages also hold the embedding and the
// head), or as dist.pp_layers gives them. Errors before any work: a stage without blocks
// (L < S, or a count < 1), counts that do not sum to n_layer, a count list of another length.
//
// Names, initialisation: every parameter keeps nn::GPT's name (a rank holds a subset of them),
// and gets exactly the value it has in a 1-process nn::GPT (or TensorParallelGPT) built from
// the same generator state: the modules of the other stages are built one at a time and
// dropped (so the generator advances as in one process), their initial draws skipped.
//
// The tied embedding: the last virtual stage holds a copy of transformer.wte.weight (under
// that name) for the lm_head. The two copies start equal; sum_tied_gradients() adds their
// gradients between the first and the last stage (Megatron's embedding group), so both get
// the gradient of the 1-process tie and stay equal under any optimizer. A norm or a checkpoint
// counts the last stage's copy not at all (duplicate_parameters()).
//
// Dropout: forward_chunk(…, rng) puts the generator where the 1-process forward of that
// micro-batch is when it reaches the chunk's first layer (the embedding dropout draws first,
// then each block two masks of B·T·d elements, each ⌈n/4⌉ Philox blocks), so the masks are
// those of one process at any pp (and, tensor_parallel_gpt.h, any tp).
//
// Activations between chunks are [B, T, d] (sequence parallel: this tp rank's [B, T/tp, d]).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "athanor/core/rng.h"
#include "athanor/dist/device_mesh.h"
#include "athanor/dist/shard_spec.h"
#include "athanor/dist/tensor_parallel_gpt.h"
#include "athanor/nn/gpt.h"
#include "athanor/ops/loss.h"

namespace athanor::dist {

class PipelineLayout {
 public:
  // layers: blocks per virtual stage in pipeline order (empty: balanced).
  PipelineLayout(int64_t n_layer, int pp, int virtual_stages = 1, std::vector<int64_t> layers = {});
  int pp() const { return pp_; }
  int virtual_stages() const { return v_; }  // chunks per rank
  int stages() const { return pp_ * v_; }    // S
  int64_t n_layer() const { return n_layer_; }
  int64_t first_layer(int stage) const { return starts_.at(stage); }
  int64_t end_layer(int stage) const { return starts_.at(stage + 1); }
  int stage_of(int rank, int chunk) const { return chunk * pp_ + rank; }
  std::string describe() const;  // "blocks per stage: [0, 3) [3, 6) …"

 private:
  int64_t n_layer_;
  int pp_, v_;
  std::vector<int64_t> starts_;  // S + 1 entries
};

// The group of the first and the last pipeline stage with this rank's dp and tp indices
// (Megatron's embedding group); every other rank gets a group of its own. A collective over
// the mesh's world.
GroupPtr make_embedding_group(const DeviceMesh& mesh);

class TPBlock;
class VocabParallelEmbedding;

class PipelineGPT : public nn::Module {
 public:
  struct Chunk {
    int stage = 0;                 // virtual stage
    int64_t first = 0, end = 0;    // blocks [first, end)
    bool embedding = false, head = false;
  };
  // rank: this rank's pipeline stage (its index in the pp group). tp: a group of any size (1 =
  // no tensor parallelism). embedding_group: make_embedding_group's (needed when pp > 1).
  PipelineGPT(nn::GPTConfig config, PipelineLayout layout, int rank, GroupPtr tp, TensorParallelOptions options = {},
              GroupPtr embedding_group = nullptr);
  ~PipelineGPT() override;

  int chunks() const { return static_cast<int>(chunks_.size()); }
  const Chunk& chunk(int c) const { return chunks_.at(c); }
  const PipelineLayout& layout() const { return layout_; }
  int rank() const { return rank_; }
  bool holds_embedding() const { return chunks_.front().embedding; }
  bool holds_head() const { return chunks_.back().head; }

  // What one chunk's forward reads.
  struct ChunkInput {
    Tensor activation;  // the previous virtual stage's output (not read by the chunk with the embedding)
    Tensor ids;         // token ids [B, T]: read by the chunk with the embedding, the others take its shape
    Tensor targets;     // [B, T] (ignore_index -100): the chunk with the head returns the loss against them;
                        // undefined: it returns this tp rank's logits [B, T, padded vocab / tp]
    const GeneratorState* rng = nullptr;  // the generator at the start of this micro-batch's forward in one process
    Reduction reduction = Reduction::mean;  // the loss: mean over the counted targets, or their sum
  };
  // Chunk c's forward: the activation for the next virtual stage, or (the chunk with the head)
  // the loss or the logits. With rng the dropout masks are one process's (see above).
  Tensor forward_chunk(int c, const ChunkInput& in);
  // Whether micro-batches of T tokens run sequence-parallel (dist.sequence_parallel with tp > 1).
  bool sequence_parallel(int64_t T) const;
  // The activation between chunks for a micro-batch [B, T].
  Shape activation_shape(int64_t B, int64_t T) const;
  // Philox blocks one micro-batch's forward draws for dropout in one process (0 without dropout or in eval mode).
  uint64_t dropout_blocks(int64_t B, int64_t T) const;

  const nn::GPTConfig& config() const { return config_; }
  const GroupPtr& tp() const { return tp_; }
  const TensorParallelOptions& options() const { return options_; }
  const ShardSpecs& shard_specs() const { return specs_; }
  // Parameters another stage holds too and counts ("transformer.wte.weight" on the last stage when pp > 1).
  std::vector<std::string> duplicate_parameters() const;
  // After the data-parallel reduction: the tied embedding's gradient summed between the first
  // and the last stage (a collective over the embedding group; nothing when pp = 1).
  void sum_tied_gradients();
  // The 1-process model's parameter count; this rank's share of its FLOPs per token.
  int64_t logical_parameters_count() const;
  double flops_per_token(int64_t seq_len) const;

 private:
  nn::GPTConfig config_;
  PipelineLayout layout_;
  int rank_;
  GroupPtr tp_, embedding_group_;
  TensorParallelOptions options_;
  std::vector<Chunk> chunks_;
  std::shared_ptr<nn::Module> transformer_;
  std::shared_ptr<VocabParallelEmbedding> wte_;
  std::shared_ptr<nn::Embedding> wpe_;
  std::shared_ptr<nn::Dropout> drop_;
  std::vector<std::shared_ptr<TPBlock>> blocks_;  // by global index (null: another stage's)
  std::shared_ptr<nn::LayerNorm> ln_f_;
  ShardSpecs specs_;
  std::shared_ptr<bool> sp_;
};

}  // namespace athanor::dist
