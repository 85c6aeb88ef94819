// trainer.device's "not yet supported on cuda" list (train/trainer_device.h), checked on the
// CPU: it names exactly what does not run on CUDA for the config. In a CUDA build a GPT
// trained in f32 with adamw has nothing missing (its ops all have CUDA kernels and the trainer
// runs on the device); in a CPU-only build its ops are listed.
#include <gtest/gtest.h>

#include <string>

#include "athanor/core/error.h"
#include "athanor/ops/registry.h"
#include "athanor/train/config.h"
#include "train/trainer_device.h"

using namespace athanor;
using train::Config;

namespace {
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST(TrainerDevice, CudaGapsNameWhatIsMissingForTheConfig) {
  const std::string gpt = cuda_training_gaps(Config::parse("model: {type: gpt}\n", "gpt.yaml"));
  EXPECT_FALSE(has(gpt, "plumbing")) << gpt;  // the trainer moves the model, the batches and the checkpoints
  EXPECT_FALSE(has(gpt, "optimizer")) << gpt;   // adamw, the default, steps on cuda
  EXPECT_FALSE(has(gpt, "precision")) << gpt;   // f32, the default
  const bool cuda_build = find_op("linear")->has_kernel(DeviceType::cuda);
  // The GPT's ops: none missing in a CUDA build (attention, cross_entropy, gelu_linear have
  // their kernels); every one listed in a CPU-only build.
  EXPECT_EQ(has(gpt, "ops without a CUDA kernel"), !cuda_build) << gpt;
  if (!cuda_build) {
    EXPECT_TRUE(has(gpt, "causal_self_attention")) << gpt;
  } else {
    EXPECT_EQ(gpt, "");  // trainer.device=cuda runs examples/gpt-char.yaml
  }

  const std::string other = cuda_training_gaps(
      Config::parse("model: {type: gpt}\n", "gpt.yaml", {"optimizer.type=lamb", "trainer.precision=bf16"}));
  EXPECT_TRUE(has(other, "the lamb optimizer's step")) << other;
  EXPECT_FALSE(has(other, "precision")) << other;  // autocast's ops have CUDA kernels

  const std::string by_value = cuda_training_gaps(Config::parse("model: {type: gpt}\n", "gpt.yaml", {"optimizer.clip_value=1"}));
  EXPECT_TRUE(has(by_value, "optimizer.clip_value")) << by_value;
  const std::string tp = cuda_training_gaps(Config::parse("model: {type: gpt}\n", "gpt.yaml", {"dist.tp=2"}));
  EXPECT_TRUE(has(tp, "tensor and pipeline parallelism")) << tp;
  // Data parallelism and ZeRO are no gap (the launcher's process count is not consulted).
  const std::string zero = cuda_training_gaps(Config::parse("model: {type: gpt}\n", "gpt.yaml", {"dist.zero_stage=3", "dist.backend=nccl"}));
  EXPECT_FALSE(has(zero, "parallelism")) << zero;
  // Each family's own ops: all with CUDA kernels in a CUDA build, each one named otherwise.
  const std::string llama = cuda_training_gaps(Config::parse("model: {type: llama}\n", "llama.yaml"));
  EXPECT_EQ(has(llama, "rope"), !cuda_build) << llama;
  EXPECT_FALSE(has(llama, "conv2d")) << llama;  // the llama's own ops, not the convnet's
  const std::string conv = cuda_training_gaps(Config::parse("model: {type: convnet}\ndata: {type: fashion_mnist}\n", "conv.yaml"));
  EXPECT_EQ(has(conv, "conv2d"), !cuda_build) << conv;
  if (cuda_build) {
    EXPECT_EQ(conv, "") << conv;
  }
}

TEST(TrainerDevice, MalformedDeviceIsAnErrorNamingTheKey) {
  EXPECT_EQ(parse_trainer_device("cpu"), Device::cpu());
  EXPECT_EQ(parse_trainer_device("cuda:3"), Device::cuda(3));
  try {
    (void)parse_trainer_device("gpu");
    FAIL() << "'gpu' was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "trainer.device")) << e.what();
  }
}
