#pragma once
// A decoder-only language model split into pipeline stages (and, within a stage, over a
// tensor-parallel group): this rank's model chunks of a dp × tp × pp run, whatever the blocks.
// dist::PipelineGPT (pipeline_gpt.h) and dist::PipelineLlama (pipeline_llama.h) derive from
// PipelineLM; the trainer's pipeline schedule (train/step_pipeline.h) and tasks see this.
//
//   dist::PipelineLayout layout(/*n_layer=*/8, /*pp=*/4);                   // 2 blocks per stage
//   dist::PipelineGPT stage(cfg, layout, mesh.pp_index(), mesh.tp(), {}, make_embedding_group(mesh));
//   Tensor act  = stage.forward_chunk(0, {.ids = ids, .rng = &mb_rng});               // first stage: ids in
//   Tensor loss = stage.forward_chunk(0, {act, ids, targets, &mb_rng});               // last stage: the loss
//
// Layout (PipelineLayout): S = pp · v virtual stages; rank r's chunk c is virtual stage c·pp + r
// (pipeline_schedule.h). Virtual stage 0 holds the embedding; S - 1 the final norm and the
// head; the blocks are split in order, balanced by default (each stage ⌊L/S⌋, the remaining
// L mod S one more, given to the inner stages first, then the first, then the last: the end
// stages also hold the embedding and the head), or as dist.pp_layers gives them. Errors before
// any work: a stage without blocks (L < S, or a count < 1), counts that do not sum to n_layer,
// a count list of another length.
//
// Names, initialisation: every parameter keeps the 1-process model's name (a rank holds a
// subset of them), and gets exactly the value it has in the 1-process model (or its
// tensor-parallel form) built from the same generator state: the modules of the other stages
// are built one at a time and dropped (so the generator advances as in one process), their
// initial draws skipped (note() and init_parameters() below).
//
// A tied embedding (the GPT's always, the Llama's with tie_embeddings): the last virtual stage
// holds a copy of the embedding weight (under its name) for the head. The two copies start
// equal; sum_tied_gradients() adds their gradients between the first and the last stage
// (Megatron's embedding group), so both get the gradient of the 1-process tie and stay equal
// under any optimizer. A norm or a checkpoint counts the last stage's copy not at all
// (duplicate_parameters()).
//
// Dropout: forward_chunk(…, rng) puts the generator where the 1-process forward of that
// micro-batch is when it reaches the chunk's first layer (the embedding's masks draw first, then
// each block its masks, each of B·T·d elements, ⌈n/4⌉ Philox blocks), so the masks are those
// of one process at any pp (and, tensor_parallel_lm.h, any tp).
//
// Activations between chunks are [B, T, d] (sequence parallel: this tp rank's [B, T/tp, d]).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "athanor/core/rng.h"
#include "athanor/dist/device_mesh.h"
#include "athanor/dist/shard_spec.h"
#include "athanor/dist/tensor_parallel_lm.h"
#include "athanor/nn/module.h"
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

class PipelineLM : public nn::Module {
 public:
  struct Chunk {
    int stage = 0;                 // virtual stage
    int64_t first = 0, end = 0;    // blocks [first, end)
    bool embedding = false, head = false;
  };
  ~PipelineLM() override;
  // What the stages need to know of the model (the derived model fills it in).
  struct Dims {
    int64_t n_layer = 0, n_embd = 0, vocab_size = 0, block_size = 0;
    double dropout = 0.0;
    bool gradient_checkpointing = false;
    int embedding_masks = 0;  // dropout masks of B·T·d elements the embedding draws (GPT: 1)
    int layer_masks = 0;      // and each block (GPT, Llama: 2)
    std::string tied;         // the embedding weight the head shares ("" when untied)
  };

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

  const GroupPtr& tp() const { return tp_; }
  const TensorParallelOptions& options() const { return options_; }
  const ShardSpecs& shard_specs() const { return specs_; }
  int64_t vocab_size() const { return dims_.vocab_size; }
  int64_t block_size() const { return dims_.block_size; }
  // Parameters another stage holds too and counts (the tied embedding on the last stage when pp > 1).
  std::vector<std::string> duplicate_parameters() const;
  // After the data-parallel reduction: the tied embedding's gradient summed between the first
  // and the last stage (a collective over the embedding group; nothing when pp = 1 or untied).
  void sum_tied_gradients();
  // The 1-process model's parameter count; this rank's share of its FLOPs per token.
  virtual int64_t logical_parameters_count() const = 0;
  virtual double flops_per_token(int64_t seq_len) const = 0;

 protected:
  // name: the model's, for errors. embedding_group: make_embedding_group's (needed when pp > 1 and tied).
  PipelineLM(const char* name, Dims dims, PipelineLayout layout, int rank, GroupPtr tp, TensorParallelOptions options,
             GroupPtr embedding_group);
  bool holds_layer(int64_t i) const { return held_.at(static_cast<std::size_t>(i)); }

  // Construction, in the 1-process model's order: note() each module built (kept or not) under
  // its name prefix; once every kept module is registered, init_parameters() runs the model's
  // initialisation over every logical parameter in that order: `init` for this rank's, `skip`
  // (the generator advanced by the same draws) for the others'.
  void note(const std::string& prefix, nn::Module& m, bool keep);
  void init_parameters(const std::function<void(const std::string& name, Tensor& p, const ShardSpec& spec)>& init,
                       const std::function<void(const std::string& name, int64_t logical_numel)>& skip);

  // The model's steps: the embedding (x for the first block; a sequence slice when sp), block i,
  // the final norm; the head's weight (this tp rank's vocabulary rows).
  virtual Tensor embed(const Tensor& ids, bool sp) = 0;
  virtual Tensor run_layer(int64_t i, const Tensor& x) = 0;
  virtual Tensor final_norm(const Tensor& x) = 0;
  virtual const Tensor& head_weight() const = 0;

  const char* name_;
  Dims dims_;
  PipelineLayout layout_;
  int rank_;
  GroupPtr tp_, embedding_group_;
  TensorParallelOptions options_;
  std::vector<Chunk> chunks_;
  std::vector<bool> held_;
  ShardSpecs specs_;
  std::shared_ptr<bool> sp_;  // whether the forward in progress is sequence-parallel (the blocks read it)

 private:
  struct Noted {
    std::string name;
    int64_t logical_numel = 0;
    bool held = false;
  };
  std::vector<Noted> order_;
};

}  // namespace athanor::dist
