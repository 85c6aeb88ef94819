#pragma once
// The Llama (nn::Llama) split into pipeline stages (and, within a stage, split over a
// tensor-parallel group): this rank's model chunks of a dp × tp × pp run (the stages'
// contract: pipeline_lm.h).
//
// Virtual stage 0 holds model.embed_tokens; S - 1 holds model.norm and lm_head (with
// tie_embeddings, a copy of model.embed_tokens.weight whose gradient is summed with the first
// stage's, as the GPT's tie); the decoder layers model.layers.<i> (TensorParallelLlama's,
// tensor_parallel_llama.h: GQA split by kv-head group) are split in order as the layout says.
// Each stage computes RoPE's angles for its own layers from the positions of the micro-batch.
// Dropout draws two masks per layer (attn_dropout, mlp_dropout), none for the embedding.
// Errors before any work: the layout's, and TensorParallelLlama's for the tp split.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "athanor/dist/pipeline_lm.h"
#include "athanor/nn/llama.h"

namespace athanor::dist {

class TPLlamaLayer;
class VocabParallelEmbedding;
class ColumnParallelLinear;

class PipelineLlama : public PipelineLM {
 public:
  // rank: this rank's pipeline stage (its index in the pp group). tp: a group of any size (1 =
  // no tensor parallelism). embedding_group: make_embedding_group's (needed when pp > 1 and tied).
  PipelineLlama(nn::LlamaConfig config, PipelineLayout layout, int rank, GroupPtr tp, TensorParallelOptions options = {},
                GroupPtr embedding_group = nullptr);
  ~PipelineLlama() override;

  const nn::LlamaConfig& config() const { return config_; }
  int64_t logical_parameters_count() const override;
  double flops_per_token(int64_t seq_len) const override;

 private:
  Tensor embed(const Tensor& ids, bool sp) override;
  Tensor run_layer(int64_t i, const Tensor& x) override;
  Tensor final_norm(const Tensor& x) override;
  const Tensor& head_weight() const override;
  int64_t layer_parameters() const;
  nn::LlamaConfig config_;
  RopeOptions rope_;
  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<VocabParallelEmbedding> embed_tokens_;
  std::vector<std::shared_ptr<TPLlamaLayer>> layers_;  // by global index (null: another stage's)
  std::shared_ptr<nn::RMSNorm> norm_;
  std::shared_ptr<ColumnParallelLinear> lm_head_;  // the last stage's, when untied
};

}  // namespace athanor::dist
