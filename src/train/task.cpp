// Tasks: how a model turns a batch into a loss. Classifiers (MLP, ConvNet) use
// cross-entropy over classes and count correct predictions; GPT uses next-token
// cross-entropy averaged over the batch's (non-ignored) tokens.
#include "athanor/dist/device_mesh.h"
#include "athanor/dist/tensor_parallel_gpt.h"
#include "athanor/nn/convnet.h"
#include "athanor/nn/gpt.h"
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

class LanguageModelTask : public Task {
 public:
  explicit LanguageModelTask(std::shared_ptr<nn::GPT> m) : model_(std::move(m)) {}
  // 6·N per token for the weight GEMMs (fwd 2N + bwd 4N) plus attention scores and values,
  // 12·n_layer·n_embd·T per token (fwd+bwd). Model FLOPs, as PaLM's MFU counts them: the
  // recompute of activation checkpointing (and of ZeRO-3) is work the model does not need,
  // so it is not counted (it shows as a lower MFU, not as more useful work).
  double train_flops(const data::Batch& b) const override {
    const auto& g = model_->config();
    const double tokens = static_cast<double>(b.input.numel());
    const double per_token = 6.0 * static_cast<double>(model_->parameters_count()) +
                             12.0 * static_cast<double>(g.n_layer * g.n_embd * b.input.size(-1));
    return per_token * tokens;
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
  nn::GPT& gpt() { return *model_; }

 private:
  std::shared_ptr<nn::GPT> model_;
};

// The GPT split across a tensor-parallel group: the loss never gathers the logits.
class TensorParallelLanguageModelTask : public Task {
 public:
  explicit TensorParallelLanguageModelTask(std::shared_ptr<dist::TensorParallelGPT> m) : model_(std::move(m)) {}
  // This rank's share of the model FLOPs (MFU is per process): every matmul is split across tp.
  double train_flops(const data::Batch& b) const override {
    const auto& g = model_->config();
    const double tokens = static_cast<double>(b.input.numel());
    const double per_token = 6.0 * static_cast<double>(model_->logical_parameters_count()) +
                             12.0 * static_cast<double>(g.n_layer * g.n_embd * b.input.size(-1));
    return per_token * tokens / static_cast<double>(model_->tp()->size());
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
  std::shared_ptr<dist::TensorParallelGPT> model_;
};
}  // namespace

std::vector<int32_t> Task::generate(const std::vector<int32_t>&, int64_t, double, int64_t, Generator&) {
  ATH_FAIL("sample", "this task's model does not generate text", Hint{"only GPT models (model.type gpt) sample text"});
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
  ATH_CHECK(c.get_string("data.type") == "text", "config", "model.type gpt trains on data.type text",
            Hint{"set data.type: text"});
  ATH_CHECK(c.get_int("model.vocab_size") > 0, "config", "model.vocab_size is not known",
            Hint{"it is taken from the tokenizer when the data is loaded; set it explicitly to build the model alone"});
  if (mesh && mesh->tp_size() > 1) {
    dist::TensorParallelOptions o;
    o.sequence_parallel = c.get_bool("dist.sequence_parallel");
    o.regather = c.get_bool("dist.sequence_parallel_regather");
    o.vocab_pad_multiple = c.get_int("dist.vocab_pad_multiple");
    return std::make_unique<TensorParallelLanguageModelTask>(std::make_shared<dist::TensorParallelGPT>(gpt_config(c), mesh->tp(), o));
  }
  return std::make_unique<LanguageModelTask>(std::make_shared<nn::GPT>(gpt_config(c)));
}

}  // namespace athanor::train
