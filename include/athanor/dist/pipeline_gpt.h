#pragma once
// GPT-2 split into pipeline stages (and, within a stage, split over a tensor-parallel group):
// this rank's model chunks of a dp × tp × pp run (the stages' contract: pipeline_lm.h).
//
// Virtual stage 0 holds transformer.wte, wpe and the embedding dropout; S - 1 holds
// transformer.ln_f and the head (tied to wte: the last stage holds a copy of
// transformer.wte.weight); the blocks transformer.h.<i> (TensorParallelGPT's,
// tensor_parallel_gpt.h) are split in order as the layout says. Dropout draws one mask for the
// embedding, then two per block.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "athanor/dist/pipeline_lm.h"
#include "athanor/dist/tensor_parallel_gpt.h"
#include "athanor/nn/gpt.h"

namespace athanor::dist {

class TPBlock;
class VocabParallelEmbedding;

class PipelineGPT : public PipelineLM {
 public:
  // rank: this rank's pipeline stage (its index in the pp group). tp: a group of any size (1 =
  // no tensor parallelism). embedding_group: make_embedding_group's (needed when pp > 1).
  PipelineGPT(nn::GPTConfig config, PipelineLayout layout, int rank, GroupPtr tp, TensorParallelOptions options = {},
              GroupPtr embedding_group = nullptr);
  ~PipelineGPT() override;

  const nn::GPTConfig& config() const { return config_; }
  int64_t logical_parameters_count() const override;
  double flops_per_token(int64_t seq_len) const override;

 private:
  Tensor embed(const Tensor& ids, bool sp) override;
  Tensor run_layer(int64_t i, const Tensor& x) override;
  Tensor final_norm(const Tensor& x) override;
  const Tensor& head_weight() const override;
  nn::GPTConfig config_;
  std::shared_ptr<nn::Module> transformer_;
  std::shared_ptr<VocabParallelEmbedding> wte_;
  std::shared_ptr<nn::Embedding> wpe_;
  std::shared_ptr<nn::Dropout> drop_;
  std::vector<std::shared_ptr<TPBlock>> blocks_;  // by global index (null: another stage's)
  std::shared_ptr<nn::LayerNorm> ln_f_;
};

}  // namespace athanor::dist
