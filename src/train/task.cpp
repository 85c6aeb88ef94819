// Tasks: how a model turns a batch into a loss. Classifiers (MLP, ConvNet) use
// cross-entropy over classes and count correct predictions; GPT uses next-token
// cross-entropy averaged over the batch's (non-ignored) tokens.
#include "athanor/autograd/grad_mode.h"
#include "athanor/dist/device_mesh.h"
#include "athanor/dist/pipeline_gpt.h"
#include "athanor/dist/pipeline_llama.h"
#include "athanor/dist/tensor_parallel_mappings.h"
#include "athanor/dist/tensor_parallel_gpt.h"
#include "athanor/dist/tensor_parallel_llama.h"
#include "athanor/nn/convnet.h"
#include "athanor/nn/gpt.h"
#include "athanor/nn/llama.h"
#include "athanor/nn/mlp.h"
#include "athanor/ops.h"
#include "athanor/train/trainer.h"

namespace athanor::train {
namespace {

class ClassifierTask : public Task {
 public:
  // gemm_flops_per_sample: multiply-adds ×2 of the model's GEMMs/convolutions for one sample (forward).
  ClassifierTask(std::shared_ptr<nn::UnaryModule> m, double gemm_flops_per_sample)
      : model_(std::move(m)), fwd_flops_(gemm_flops_per_sample) {}
  // Backward costs two GEMMs per forward GEMM (input and weight gradients): ×3.
  double train_flops(const data::Batch& b) const override { return 3.0 * fwd_flops_ * static_cast<double>(b.input.size(0)); }
  nn::Module& module() override { return *model_; }
  Tensor loss(const data::Batch& b) override { return cross_entropy(model_->forward(b.input), b.target); }
  void evaluate(const data::Batch& b, double& loss_sum, int64_t& correct) override {
    Tensor logits = model_->forward(b.input);
    loss_sum += cross_entropy(logits, b.target, -100, 0.0, Reduction::sum).item();
    const auto pred = argmax(logits, 1).to_vector(), tgt = b.target.to_vector();
    for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == tgt[i];
  }
  bool is_classifier() const override { return true; }

 private:
  std::shared_ptr<nn::UnaryModule> model_;
  double fwd_flops_;
};

// Model FLOPs per token of a training step. GPT: 6·N per token for the weight GEMMs (fwd 2N +
// bwd 4N) plus attention scores and values, 12·n_layer·n_embd·T per token (fwd+bwd). Llama:
// nn::Llama::flops_per_token, the same rule (its embedding lookup is not a GEMM unless tied).
// Model FLOPs, as PaLM's MFU counts them: the recompute of activation checkpointing (and of
// ZeRO-3) is work the model does not need, so it is not counted (it shows as a lower MFU).
double lm_flops_per_token(const nn::GPT& m, int64_t T) {
  const auto& g = m.config();
  return 6.0 * static_cast<double>(m.parameters_count()) + 12.0 * static_cast<double>(g.n_layer * g.n_embd * T);
}
double lm_flops_per_token(const nn::Llama& m, int64_t T) { return m.flops_per_token(T); }

// A decoder-only language model on one process (nn::GPT or nn::Llama).
template <class Model>
class LanguageModelTask : public Task {
 public:
  explicit LanguageModelTask(std::shared_ptr<Model> m) : model_(std::move(m)) {}
  double train_flops(const data::Batch& b) const override {
    return lm_flops_per_token(*model_, b.input.size(-1)) * static_cast<double>(b.input.numel());
  }
  nn::Module& module() override { return *model_; }
  Tensor loss(const data::Batch& b) override { return model_->loss(b.input, b.target); }
  void evaluate(const data::Batch& b, double& loss_sum, int64_t& correct) override {
    Tensor logits = model_->forward(b.input);
    const int64_t V = logits.size(-1);
    loss_sum += cross_entropy(reshape(logits, {-1, V}), reshape(b.target, {-1}), -100, 0.0, Reduction::sum).item();
  }
  bool is_classifier() const override { return false; }
  bool is_language_model() const override { return true; }
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t tokens, double temperature, int64_t top_k,
                                Generator& gen) override {
    return model_->generate(prompt, tokens, temperature, top_k, gen);
  }

 private:
  std::shared_ptr<Model> model_;
};

// The GPT or the Llama split across a tensor-parallel group: the loss never gathers the logits.
class TensorParallelLanguageModelTask : public Task {
 public:
  explicit TensorParallelLanguageModelTask(std::shared_ptr<dist::TensorParallelLM> m) : model_(std::move(m)) {}
  // This rank's share of the model FLOPs (MFU is per process): every matmul is split across tp.
  double train_flops(const data::Batch& b) const override {
    const double tokens = static_cast<double>(b.input.numel());
    return model_->flops_per_token(b.input.size(-1)) * tokens / static_cast<double>(model_->tp()->size());
  }
  nn::Module& module() override { return *model_; }
  Tensor loss(const data::Batch& b) override { return model_->loss(b.input, b.target); }
  void evaluate(const data::Batch& b, double& loss_sum, int64_t&) override {
    loss_sum += model_->loss(b.input, b.target, Reduction::sum).item();
  }
  bool is_classifier() const override { return false; }
  bool is_language_model() const override { return true; }
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t tokens, double temperature, int64_t top_k,
                                Generator& gen) override {
    return model_->generate(prompt, tokens, temperature, top_k, gen);
  }

 private:
  std::shared_ptr<dist::TensorParallelLM> model_;
};
// This rank's pipeline stages of the GPT or the Llama. Training runs through the pipeline schedule
// (step_pipeline.h); evaluation and generation run the stages as a chain: each rank runs its
// chunks in pipeline order, receiving each chunk's input from the previous virtual stage and
// sending its output to the next (blocking transfers, with the pp group's timeout); the last
// stage's result is broadcast to every stage.
class PipelineLanguageModelTask : public Task {
 public:
  PipelineLanguageModelTask(std::shared_ptr<dist::PipelineLM> m, dist::GroupPtr pp) : model_(std::move(m)), pp_(std::move(pp)) {}
  // This rank's share of the model FLOPs (MFU is per process).
  double train_flops(const data::Batch& b) const override {
    return model_->flops_per_token(b.input.size(-1)) * static_cast<double>(b.input.numel());
  }
  nn::Module& module() override { return *model_; }
  Tensor loss(const data::Batch&) override {
    ATH_FAIL("trainer", "a pipeline stage has no loss of its own: the last stage computes it inside the pipeline schedule",
             Hint{"train through the Trainer's step (dist.pp_schedule), or evaluate with evaluate()"});
  }
  void evaluate(const data::Batch& b, double& loss_sum, int64_t&) override {
    Tensor out = chain(b.input, b.target, Reduction::sum);
    const double mine = out.defined() ? out.item() : 0.0;
    Tensor t = from_vector(std::vector<double>{mine}, {1}, TensorOptions(DType::f64));
    pp_->broadcast(t, pp_->size() - 1);  // the loss lives on the last stage
    loss_sum += t.item();
  }
  bool is_classifier() const override { return false; }
  bool is_language_model() const override { return true; }
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t tokens, double temperature, int64_t top_k,
                                Generator& gen) override {
    return nn::generate_tokens(*model_, prompt, tokens, temperature, model_->vocab_size(), model_->block_size(),
                               [&](const std::vector<int64_t>& ctx) {
                                 const int64_t T = static_cast<int64_t>(ctx.size());
                                 // Defined on the last stage only: [1, T, V/tp].
                                 Tensor logits = chain(from_vector(ctx, {1, T}), Tensor(), Reduction::mean);
                                 Tensor next = full({1}, 0.0, {DType::i64});
                                 if (logits.defined()) {
                                   const int64_t Vl = logits.size(-1);
                                   Tensor last = make_view(logits, {1, Vl}, {Vl, 1}, logits.storage_offset() + (T - 1) * Vl);
                                   // Every tp rank's vocabulary columns of the last position: V values, not T·V.
                                   Tensor all = dist::all_gather_along(last.contiguous(), *model_->tp(), -1);
                                   std::vector<double> row = all.to_vector();
                                   row.resize(static_cast<size_t>(model_->vocab_size()));  // drop the padding columns
                                   next.data_ptr<int64_t>()[0] = nn::sample_token(std::move(row), temperature, top_k, gen);
                                 } else {
                                   (void)gen.reserve(1);  // the draw sample_token makes: every stage's generator stays alike
                                 }
                                 pp_->broadcast(next, pp_->size() - 1);
                                 return static_cast<int32_t>(next.data_ptr<int64_t>()[0]);
                               });
  }

 private:
  // The stages as a chain (no gradients): the head's output on the last stage, undefined elsewhere.
  Tensor chain(const Tensor& ids, const Tensor& targets, Reduction reduction) {
    NoGradGuard ng;
    const int p = pp_->size(), r = pp_->rank(), S = model_->layout().stages();
    const int64_t B = ids.size(0), T = ids.size(1);
    Tensor result;
    for (int k = 0; k < model_->chunks(); ++k) {
      const auto& ch = model_->chunk(k);
      Tensor act;
      if (ch.stage > 0) {
        act = empty(model_->activation_shape(B, T), TensorOptions(DType::f32));
        auto w = pp_->recv_async(act, (r - 1 + p) % p, kTag + ch.stage);
        w->set_context("stage " + std::to_string(r) + " receiving the activation of an evaluation/generation batch from stage " +
                       std::to_string((r - 1 + p) % p));
        w->wait();
      }
      Tensor out = model_->forward_chunk(k, {act, ids, targets, nullptr, reduction});
      if (ch.stage == S - 1) {
        result = out;
        continue;
      }
      auto w = pp_->send_async(out.to(DType::f32).contiguous(), (r + 1) % p, kTag + ch.stage + 1);
      w->set_context("stage " + std::to_string(r) + " sending the activation of an evaluation/generation batch to stage " +
                     std::to_string((r + 1) % p));
      w->wait();
    }
    return result;
  }
  static constexpr int kTag = 30000;  // apart from the training schedule's tags
  std::shared_ptr<dist::PipelineLM> model_;
  dist::GroupPtr pp_;
};
}  // namespace

std::vector<int32_t> Task::generate(const std::vector<int32_t>&, int64_t, double, int64_t, Generator&) {
  ATH_FAIL("sample", "this task's model does not generate text", Hint{"only language models (model.type gpt, llama) sample text"});
}

nn::GPTConfig gpt_config(const Config& c) {
  nn::GPTConfig g;
  g.n_layer = c.get_int("model.n_layer");
  g.n_head = c.get_int("model.n_head");
  g.n_embd = c.get_int("model.n_embd");
  g.block_size = c.get_int("model.block_size");
  g.vocab_size = c.get_int("model.vocab_size");
  g.dropout = c.get_float("model.dropout");
  g.bias = c.get_bool("model.bias");
  g.gradient_checkpointing = c.get_bool("model.gradient_checkpointing");
  return g;
}

nn::LlamaConfig llama_config(const Config& c) {
  nn::LlamaConfig g;
  g.n_layer = c.get_int("model.n_layer");
  g.n_head = c.get_int("model.n_head");
  g.n_kv_head = c.get_int("model.n_kv_head") == 0 ? g.n_head : c.get_int("model.n_kv_head");
  g.n_embd = c.get_int("model.n_embd");
  // LLaMA's rule (Touvron et al. 2023): 2/3 of GPT's 4 n_embd, rounded up to a multiple of 64.
  g.intermediate_size = c.get_int("model.intermediate_size");
  if (g.intermediate_size == 0) g.intermediate_size = (8 * g.n_embd / 3 + 63) / 64 * 64;
  g.block_size = c.get_int("model.block_size");
  g.vocab_size = c.get_int("model.vocab_size");
  g.rope_theta = c.get_float("model.rope_theta");
  g.rms_norm_eps = c.get_float("model.rms_norm_eps");
  g.tie_embeddings = c.get_bool("model.tie_embeddings");
  g.dropout = c.get_float("model.dropout");
  g.gradient_checkpointing = c.get_bool("model.gradient_checkpointing");
  // The rope_* factors apply only with rope_scaling llama3 (the config refuses them otherwise).
  if (c.get_string("model.rope_scaling") == "llama3") {
    RopeScaling s;
    s.factor = c.get_float("model.rope_factor");
    s.low_freq_factor = c.get_float("model.rope_low_freq_factor");
    s.high_freq_factor = c.get_float("model.rope_high_freq_factor");
    s.original_max_position = c.get_int("model.rope_original_max_position");
    g.rope_scaling = s;
  }
  if (g.vocab_size == 0) return g;  // the tokenizer's: checked when the model is built
  const std::string problem = nn::llama_config_problem(g);
  ATH_CHECK(problem.empty(), "config", c.source(), ": model.type llama: ", problem, " (keys model.<name>)",
            Hint{"e.g. n_embd 768, n_head 12, n_kv_head 4 (a divisor of n_head; 0 = n_head), intermediate_size 2048"});
  return g;
}

std::unique_ptr<Task> make_task(const Config& c, const dist::DeviceMesh* mesh) {
  manual_seed(static_cast<uint64_t>(c.get_int("seed")));  // initialisation is a function of the seed
  const std::string& type = c.get_string("model.type");
  if (type == "mlp") {
    ATH_CHECK(c.get_string("data.type") == "fashion_mnist", "config", "model.type mlp trains on data.type fashion_mnist",
              Hint{"set data.type: fashion_mnist, or use model.type: gpt for text"});
    const auto sizes = c.get_int_list("model.sizes");
    double flops = 0;
    for (size_t i = 0; i + 1 < sizes.size(); ++i) flops += 2.0 * static_cast<double>(sizes[i] * sizes[i + 1]);
    return std::make_unique<ClassifierTask>(
        std::make_shared<nn::MLP>(sizes, c.get_string("model.activation"), c.get_float("model.dropout")), flops);
  }
  if (type == "convnet") {
    ATH_CHECK(c.get_string("data.type") == "fashion_mnist", "config", "model.type convnet trains on data.type fashion_mnist",
              Hint{"set data.type: fashion_mnist"});
    nn::ConvNetConfig cc;
    cc.channels1 = c.get_int("model.channels1");
    cc.channels2 = c.get_int("model.channels2");
    cc.hidden = c.get_int("model.hidden");
    cc.num_classes = c.get_int("model.num_classes");
    cc.dropout = c.get_float("model.dropout");
    // Two 3×3 same-padded convolutions (28×28, then 14×14 after pooling) and two Linear layers.
    const double flops = 2.0 * 9 * (28.0 * 28 * cc.in_channels * cc.channels1 + 14.0 * 14 * cc.channels1 * cc.channels2) +
                         2.0 * (cc.channels2 * 49.0 * cc.hidden + static_cast<double>(cc.hidden * cc.num_classes));
    return std::make_unique<ClassifierTask>(std::make_shared<nn::ConvNet>(cc), flops);
  }
  ATH_CHECK(c.get_string("data.type") == "text", "config", "model.type ", type, " trains on data.type text",
            Hint{"set data.type: text"});
  ATH_CHECK(c.get_int("model.vocab_size") > 0, "config", "model.vocab_size is not known",
            Hint{"it is taken from the tokenizer when the data is loaded; set it explicitly to build the model alone"});
  const bool llama = type == "llama";
  if (mesh && (mesh->pp_size() > 1 || mesh->tp_size() > 1)) {
    dist::TensorParallelOptions o;
    o.sequence_parallel = c.get_bool("dist.sequence_parallel");
    o.regather = c.get_bool("dist.sequence_parallel_regather");
    // Without tensor parallelism the vocabulary needs no padding (it would only add lm_head work).
    o.vocab_pad_multiple = mesh->tp_size() > 1 ? c.get_int("dist.vocab_pad_multiple") : 1;
    if (mesh->pp_size() > 1) {
      dist::PipelineLayout layout(c.get_int("model.n_layer"), mesh->pp_size(), static_cast<int>(c.get_int("dist.virtual_stages")),
                                  c.get_int_list("dist.pp_layers"));
      std::shared_ptr<dist::PipelineLM> model;
      if (llama)
        model = std::make_shared<dist::PipelineLlama>(llama_config(c), layout, mesh->pp_index(), mesh->tp(), o,
                                                      dist::make_embedding_group(*mesh));
      else
        model = std::make_shared<dist::PipelineGPT>(gpt_config(c), layout, mesh->pp_index(), mesh->tp(), o,
                                                    dist::make_embedding_group(*mesh));
      return std::make_unique<PipelineLanguageModelTask>(std::move(model), mesh->pp());
    }
    std::shared_ptr<dist::TensorParallelLM> model;
    if (llama) model = std::make_shared<dist::TensorParallelLlama>(llama_config(c), mesh->tp(), o);
    else model = std::make_shared<dist::TensorParallelGPT>(gpt_config(c), mesh->tp(), o);
    return std::make_unique<TensorParallelLanguageModelTask>(std::move(model));
  }
  if (llama) return std::make_unique<LanguageModelTask<nn::Llama>>(std::make_shared<nn::Llama>(llama_config(c)));
  return std::make_unique<LanguageModelTask<nn::GPT>>(std::make_shared<nn::GPT>(gpt_config(c)));
}

}  // namespace athanor::train
