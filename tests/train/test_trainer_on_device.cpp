// The trainer's device plumbing (trainer.device), checked on the CPU, where the same calls run
// with nothing to move: nn::Module::to(Device) keeps a cpu model's tensors as they are and
// refuses a device that is not there before changing anything; the micro-batch loop leaves
// each loss on the device until the step's read-back (step_pipeline.h); prefetching the next
// step's batches changes nothing in the run; trainer.empty_cache_every is checked and runs.
// The same paths on a GPU: tests/gpu/test_gpu_train.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "athanor/core/device_hooks.h"
#include "athanor/core/error.h"
#include "athanor/nn/gpt.h"
#include "athanor/ops.h"
#include "athanor/train/step_pipeline.h"
#include "athanor/train/trainer.h"
#include "test_util.h"

namespace athanor {
namespace {

std::shared_ptr<nn::GPT> tiny_gpt() {
  nn::GPTConfig c;
  c.vocab_size = 11, c.block_size = 8, c.n_layer = 1, c.n_head = 2, c.n_embd = 8, c.dropout = 0.0;
  return std::make_shared<nn::GPT>(c);
}

std::vector<std::pair<std::string, const Storage*>> storages(nn::Module& m) {
  std::vector<std::pair<std::string, const Storage*>> out;
  for (auto& [n, t] : m.state_dict()) out.emplace_back(n, t.storage().get());
  return out;
}

}  // namespace

TEST(ModuleToDevice, CpuIsANoOpKeepingStoragesNamesAndGrads) {
  auto gpt = tiny_gpt();
  Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, {1, 8});
  gpt->loss(ids, ids).backward();
  const auto before = storages(*gpt);
  std::vector<const TensorImpl*> grads;
  for (auto& [n, p] : gpt->named_parameters()) grads.push_back(p.grad().impl());
  gpt->to(Device::cpu());
  EXPECT_EQ(storages(*gpt), before);  // the very same storages: nothing copied
  size_t i = 0;
  for (auto& [n, p] : gpt->named_parameters()) {
    EXPECT_EQ(p.name(), n.substr(n.rfind('.') + 1));
    ASSERT_TRUE(p.grad().defined()) << n;
    EXPECT_EQ(p.grad().impl(), grads[i++]) << n;
    EXPECT_TRUE(p.requires_grad()) << n;
  }
  EXPECT_EQ(gpt->device(), Device::cpu());
}

TEST(ModuleToDevice, AMissingDeviceIsAnErrorBeforeAnyChange) {
  auto gpt = tiny_gpt();
  const auto before = storages(*gpt);
  // No GPU here (or a build without CUDA): cuda:0 does not exist. On a GPU machine cuda:7 does
  // not either (tests/gpu/test_gpu_train.cpp moves to cuda:0).
  try {
    gpt->to(Device::cuda(7));
    FAIL() << "moving to cuda:7 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:7"), std::string::npos) << e.what();
  }
  EXPECT_EQ(storages(*gpt), before);
  EXPECT_EQ(gpt->device(), Device::cpu());
}

namespace {
// A task whose loss is a fixed value per micro-batch (times a parameter that stays 1).
class FixedLossTask final : public train::Task {
 public:
  FixedLossTask() { module_.w = module_.add(ones({1})); }
  nn::Module& module() override { return module_; }
  Tensor loss(const data::Batch& b) override {
    ++calls;
    return mul(module_.w.sum(), static_cast<double>(b.input.numel()));  // loss_k = numel of batch k
  }
  void evaluate(const data::Batch&, double&, int64_t&) override {}
  bool is_classifier() const override { return false; }
  int calls = 0;

 private:
  struct M : nn::Module {
    Tensor add(Tensor t) { return register_parameter("w", t); }
    Tensor w;
  } module_;
};
data::Batch batch_of(int64_t n, int64_t targets) {
  data::Batch b;
  b.input = zeros({n});
  b.target = zeros({n});
  b.num_targets = targets;
  return b;
}
}  // namespace

TEST(StepPipelineLoss, ReadBackOnceAfterEveryMicroBatchNotInsideTheLoop) {
  FixedLossTask task;
  GradScalerOptions off;
  off.enabled = false;  // f32: no loss scaling
  GradScaler scaler(off);
  auto loop = train::make_micro_batch_loop({task, nullptr, scaler, DType::f32, 1});
  observe::StepMetrics m;
  m.targets = 4;
  // Micro-batch losses 2 and 3 with 1 and 3 of the 4 targets: the step's loss 2/4 + 3*3/4.
  loop->forward_backward({batch_of(2, 1), batch_of(3, 3)}, m);
  EXPECT_EQ(task.calls, 2);
  EXPECT_EQ(m.loss, 0.0) << "the loss was read inside the micro-batch loop (a host sync per micro-batch on a GPU)";
  loop->read_loss(m);
  EXPECT_DOUBLE_EQ(m.loss, 2.0 * 1 / 4 + 3.0 * 3 / 4);
  loop->read_loss(m);  // read once: a second read adds nothing
  EXPECT_DOUBLE_EQ(m.loss, 2.0 * 1 / 4 + 3.0 * 3 / 4);
  // The weighted backward still ran: d(loss)/dw = 2*1/4 + 3*3/4.
  auto p = task.module().parameters();
  EXPECT_DOUBLE_EQ(p[0].grad().item(), 2.0 * 1 / 4 + 3.0 * 3 / 4);
}

namespace {
train::Config run_config(const std::string& dir, const std::string& text, std::vector<std::string> overrides) {
  overrides.push_back("out_dir=" + dir);
  return train::Config::parse(
      "model: {type: gpt, n_layer: 1, n_head: 2, n_embd: 16, block_size: 16, dropout: 0.1}\n"
      "data: {type: text, tokenizer: byte, corpus: " + text + ", cache_dir: " + dir + "/cache, num_workers: 2}\n"
      "optimizer: {type: adamw, lr: 0.01, weight_decay: 0.1, grad_clip: 0.5}\n"
      "trainer: {max_steps: 6, batch_size: 4, accum_steps: 2, eval_every: 3, eval_batches: 1, sample_every: 0, "
      "sample_tokens: 4, log_every: 2}\n"
      "observe: {report: false, tensorboard: false}\n",
      "device.yaml", overrides);
}
std::vector<double> losses_of(const train::Trainer& t) {
  std::vector<double> out;
  for (const auto& m : t.history()) out.push_back(m.loss);
  return out;
}
}  // namespace

TEST(TrainerOnDevice, PrefetchingTheNextBatchesChangesNothingAndEmptyCacheRuns) {
  const std::string dir = testing::fresh_temp_dir("trainer_on_device");
  const std::string text = testing::write_tiny_text(dir);
  train::Trainer plain(run_config(dir, text, {"name=plain", "data.device_prefetch=off"}));
  plain.set_output([](const std::string&) {});
  plain.fit();
  train::Trainer ahead(run_config(dir, text, {"name=ahead", "data.device_prefetch=on", "trainer.empty_cache_every=2"}));
  ahead.set_output([](const std::string&) {});
  ahead.fit();
  EXPECT_EQ(ahead.device(), Device::cpu());
  const auto a = losses_of(plain), b = losses_of(ahead);
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);  // bitwise: the same batches in the same order, the same loss read-back
  for (double l : a) EXPECT_TRUE(std::isfinite(l) && l > 0) << l;
  const auto pa = plain.task().module().state_dict(), pb = ahead.task().module().state_dict();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(pa[i].second.to_vector(), pb[i].second.to_vector()) << pa[i].first;
  // The evaluations (uploaded validation batches) agree too.
  ASSERT_EQ(plain.evals().size(), ahead.evals().size());
  for (size_t i = 0; i < plain.evals().size(); ++i) EXPECT_EQ(plain.evals()[i].loss, ahead.evals()[i].loss);
}

TEST(TrainerOnDevice, NegativeEmptyCacheEveryIsAnError) {
  const std::string dir = testing::fresh_temp_dir("trainer_on_device_bad");
  const std::string text = testing::write_tiny_text(dir);
  try {
    train::Trainer t(run_config(dir, text, {"trainer.empty_cache_every=-1"}));
    FAIL() << "trainer.empty_cache_every=-1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("trainer.empty_cache_every"), std::string::npos) << e.what();
  }
}

}  // namespace athanor
