// The trainer's step calls GradScaler's no-sync forms (unscale_async, update(found_inf
// tensor)) and never the bool forms that read the flag on the host: on a GPU those would be a
// host synchronisation in every step (tests/gpu/test_gpu_train_sync.cpp counts them); on the
// CPU the same calls give the same steps as before. A skipped f16 step (an overflow forced by
// a huge initial scale) still backs the scale off through the tensor form.
#include <gtest/gtest.h>

#include "athanor/train/trainer.h"
#include "test_util.h"

using namespace athanor;

namespace {
train::Config f16_config(const std::string& dir, const std::string& text, std::vector<std::string> overrides) {
  overrides.push_back("out_dir=" + dir);
  overrides.push_back("observe.peak_gflops=100");  // no GEMM probe in unit tests
  return train::Config::parse(
      "model: {type: gpt, n_layer: 1, n_head: 2, n_embd: 32, block_size: 16}\n"
      "data: {type: text, tokenizer: byte, corpus: " + text + ", cache_dir: " + dir + "/cache, num_workers: 0}\n"
      "optimizer: {type: adamw, lr: 0.01, grad_clip: 1.0}\n"
      "trainer: {max_steps: 4, batch_size: 4, eval_every: 0, eval_batches: 1, sample_every: 0, sample_tokens: 4, "
      "log_every: 1, precision: f16}\n"
      "observe: {report: false, tensorboard: false}\n",
      "scaler_forms.yaml", overrides);
}
}  // namespace

TEST(StepScalerForms, TheStepUsesTheNoSyncForms) {
  const std::string dir = athanor::testing::fresh_temp_dir("scaler_forms");
  const std::string text = athanor::testing::write_tiny_text(dir);
  // 2^40 overflows f16 in the first backward: a skipped step, then finite ones.
  train::Trainer t(f16_config(dir, text, {"name=forms", "scaler.init_scale=1099511627776"}));
  t.set_output([](const std::string&) {});
  t.fit();
  ASSERT_TRUE(t.scaler().enabled());
  const GradScalerCalls& c = t.scaler().calls();
  EXPECT_EQ(c.unscale_async, 4);
  EXPECT_EQ(c.update_tensor, 4);
  EXPECT_EQ(c.unscale, 0) << "the bool unscale reads found_inf on the host";
  EXPECT_EQ(c.update_bool, 0) << "the bool update needs found_inf on the host";
  EXPECT_GE(t.skipped_steps(), 1) << "the overflowing step is skipped";
  EXPECT_LT(t.scaler().get_scale(), 1099511627776.0) << "and the scale backed off";
}
