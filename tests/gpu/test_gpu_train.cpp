// The trainer on cuda:0 (trainer.device; issue 30), each against the same on the CPU:
//  - nn::Module::to(cuda): every parameter, buffer and gradient on the device with its name,
//    tag and values (bitwise back on the cpu), storages shared before shared after;
//  - a GPT's loss on cuda within 1e-5 relative of the cpu's (f32, exact GEMMs);
//  - the Trainer on cuda: parameters, gradients and AdamW state on the device, the loss within
//    1e-3 relative of the cpu run's at every step (f32, dropout 0.1: the same Philox masks);
//    the allocator's parameter and optimizer-state tags hold exactly the model's bytes (and 2x);
//  - bit-exact resume on the device: 6 steps straight and 3 + checkpoint + resume + 3 give the
//    same bits in every parameter and the same losses;
//  - safetensors of a device tensor larger than the 16 MiB piece: the file is byte-for-byte
//    the cpu tensor's, and load_safetensors_into a device tensor gives its bits back;
//  - empty_device_cache gives cached blocks back (the allocator's reserved bytes drop);
//  - athanor bench on cuda: the device's allocator's peaks, the GPU's datasheet peak (H100/H200
//    SXM: 66.9 TFLOP/s in f32), no CPU GEMM probe.
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "athanor/ckpt/checkpoint.h"
#include "athanor/ckpt/safetensors.h"
#include "athanor/nn/gpt.h"
#include "athanor/ops.h"
#include "athanor/train/bench.h"
#include "athanor/train/trainer.h"
#include "gpu_test.h"
#include "test_util.h"
#include "train/device_runtime.h"

using namespace athanor;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<nn::GPT> tiny_gpt() {
  nn::GPTConfig c;
  c.vocab_size = 37, c.block_size = 16, c.n_layer = 2, c.n_head = 2, c.n_embd = 32, c.dropout = 0.0;
  return std::make_shared<nn::GPT>(c);
}

std::vector<std::string> weight_bytes(train::Trainer& t) {
  std::vector<std::string> out;
  for (auto& [n, p] : t.task().module().state_dict()) out.push_back(athanor::testing::tensor_bytes(p));
  return out;
}
std::vector<double> losses(const train::Trainer& t) {
  std::vector<double> out;
  for (const auto& m : t.history()) out.push_back(m.loss);
  return out;
}

train::Config run_config(const std::string& dir, const std::string& text, std::vector<std::string> overrides) {
  overrides.push_back("out_dir=" + dir);
  return train::Config::parse(
      "model: {type: gpt, n_layer: 2, n_head: 2, n_embd: 32, block_size: 32, dropout: 0.1}\n"
      "data: {type: text, tokenizer: byte, corpus: " + text + ", cache_dir: " + dir + "/cache, num_workers: 2}\n"
      "optimizer: {type: adamw, lr: 0.003, weight_decay: 0.1, grad_clip: 1.0}\n"
      "schedule: {warmup_steps: 2, decay: cosine}\n"
      "trainer: {max_steps: 6, batch_size: 4, accum_steps: 2, eval_every: 0, eval_batches: 1, sample_every: 0, sample_tokens: 4, "
      "log_every: 1}\n"
      "observe: {report: false, tensorboard: false}\n",
      "gpu_train.yaml", overrides);
}

struct RaiseAt : train::Callback {
  explicit RaiseAt(int64_t at) : at(at) {}
  int64_t at;
  void on_step(const train::StepMetrics& m) override {
    if (m.step == at) std::raise(SIGTERM);
  }
};

}  // namespace

TEST(GpuTrain, ModuleToCudaMovesEveryTensorAndBack) {
  ATH_REQUIRE_GPU();
  auto gpt = tiny_gpt();
  Tensor ids = from_vector(std::vector<int64_t>{1, 5, 9, 2, 33, 0, 7, 7}, {1, 8});
  gpt->loss(ids, ids).backward();
  std::vector<std::pair<std::string, std::string>> values, grads;
  std::map<const Storage*, std::vector<std::string>> shared_before;
  for (auto& [n, t] : gpt->state_dict()) {
    values.emplace_back(n, athanor::testing::tensor_bytes(t));
    shared_before[t.storage().get()].push_back(n);
  }
  for (auto& [n, p] : gpt->named_parameters()) grads.emplace_back(n, athanor::testing::tensor_bytes(p.grad()));
  gpt->to(Device::cuda(0));
  EXPECT_EQ(gpt->device(), Device::cuda(0));
  std::map<const Storage*, std::vector<std::string>> shared_after;
  size_t i = 0;
  for (auto& [n, t] : gpt->state_dict()) {
    EXPECT_EQ(t.device(), Device::cuda(0)) << n;
    EXPECT_EQ(t.storage()->tag(), MemTag::parameter) << n;
    EXPECT_TRUE(athanor::testing::tensor_bytes(t) == values[i++].second) << n << " changed in the move";
    shared_after[t.storage().get()].push_back(n);
  }
  EXPECT_EQ(shared_after.size(), shared_before.size());  // no storage split or merged
  i = 0;
  for (auto& [n, p] : gpt->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << n;
    EXPECT_EQ(p.grad().device(), Device::cuda(0)) << n;
    EXPECT_TRUE(athanor::testing::tensor_bytes(p.grad()) == grads[i++].second) << n << "'s gradient changed in the move";
  }
  gpt->to(Device::cpu());
  i = 0;
  for (auto& [n, t] : gpt->state_dict()) {
    EXPECT_TRUE(t.device().is_cpu()) << n;
    EXPECT_TRUE(athanor::testing::tensor_bytes(t) == values[i++].second) << n << " changed in the round trip";
  }
}

TEST(GpuTrain, GptLossOnCudaMatchesTheCpu) {
  ATH_REQUIRE_GPU();
  auto cpu = tiny_gpt(), gpu = tiny_gpt();
  gpu->load_state_dict(cpu->state_dict());
  gpu->to(Device::cuda(0));
  Tensor ids = from_vector(std::vector<int64_t>{1, 5, 9, 2, 33, 0, 7, 7, 3, 3, 4, 36, 12, 8, 8, 1}, {2, 8});
  const double want = cpu->loss(ids, ids).item(), got = gpu->loss(ids.cuda(), ids.cuda()).item();
  EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << "cpu " << want << ", cuda " << got;
}

TEST(GpuTrain, TrainerOnCudaMatchesTheCpuRunAndAccountsItsMemory) {
  ATH_REQUIRE_GPU();
  const std::string dir = athanor::testing::fresh_temp_dir("gpu_train_parity");
  const std::string text = athanor::testing::write_tiny_text(dir);
  train::Trainer cpu(run_config(dir, text, {"name=cpu"}));
  cpu.set_output([](const std::string&) {});
  cpu.fit();
  train::Trainer gpu(run_config(dir, text, {"name=gpu", "trainer.device=cuda"}));
  gpu.set_output([](const std::string&) {});
  EXPECT_EQ(gpu.device(), Device::cuda(0));
  gpu.fit();
  for (auto& [n, p] : gpu.task().module().named_parameters()) EXPECT_EQ(p.device(), Device::cuda(0)) << n;
  for (auto& [n, t] : gpu.optimizer().state_tensors()) EXPECT_EQ(t.device(), Device::cuda(0)) << n;
  const auto a = losses(cpu), b = losses(gpu);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(b[k], a[k], 1e-3 * std::abs(a[k])) << "loss of step " << k + 1;
  // The allocator's tags: the parameters' bytes exactly, AdamW's two moments twice that.
  std::size_t param_bytes = 0;
  for (auto& [n, p] : gpu.task().module().named_parameters()) param_bytes += p.storage()->nbytes();
  const MemoryStats mem = train::device_memory_stats(Device::cuda(0));
  EXPECT_EQ(mem.of(MemTag::parameter), param_bytes);
  EXPECT_EQ(mem.of(MemTag::optimizer_state), 2 * param_bytes);
  EXPECT_GE(mem.peak_of(MemTag::activation), 1u);  // the forward's activations were counted on the device
  // empty_cache: reserved bytes do not grow, and the cached free blocks go back.
  const std::size_t reserved = mem.reserved;
  train::empty_device_cache(Device::cuda(0));
  EXPECT_LE(train::device_memory_stats(Device::cuda(0)).reserved, reserved);
}

TEST(GpuTrain, ResumeOnCudaIsBitExact) {
  ATH_REQUIRE_GPU();
  const std::string dir = athanor::testing::fresh_temp_dir("gpu_train_resume");
  const std::string text = athanor::testing::write_tiny_text(dir);
  std::vector<std::string> straight_w;
  std::vector<double> straight_l;
  {
    train::Trainer t(run_config(dir, text, {"name=straight", "trainer.device=cuda"}));
    t.set_output([](const std::string&) {});
    t.fit();
    straight_w = weight_bytes(t);
    straight_l = losses(t);
  }
  std::string ckpt_dir;
  std::vector<double> all;
  {
    train::Trainer t(run_config(dir, text, {"name=split", "trainer.device=cuda", "checkpoint.every=2"}));
    t.set_output([](const std::string&) {});
    t.add_callback(std::make_shared<RaiseAt>(3));
    t.fit();
    ASSERT_EQ(t.step(), 3);
    all = losses(t);
    ckpt_dir = ckpt::find_latest_valid(t.checkpoints_dir()).path;
    ASSERT_EQ(fs::path(ckpt_dir).filename().string(), "step-000003");
  }
  manual_seed(999);  // another run's draws in between
  {
    train::Trainer t(run_config(dir, text, {"name=split", "trainer.device=cuda", "checkpoint.every=2"}));
    t.set_output([](const std::string&) {});
    t.resume_from(ckpt_dir);
    for (auto& [n, p] : t.task().module().named_parameters()) EXPECT_EQ(p.device(), Device::cuda(0)) << n;
    t.fit();
    ASSERT_EQ(t.step(), 6);
    for (double l : losses(t)) all.push_back(l);
    ASSERT_EQ(all.size(), straight_l.size());
    for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], straight_l[i]) << "loss of step " << i + 1;
    const auto w = weight_bytes(t);
    ASSERT_EQ(w.size(), straight_w.size());
    for (size_t i = 0; i < w.size(); ++i) EXPECT_TRUE(w[i] == straight_w[i]) << "tensor " << i << " differs after the resume";
  }
}

TEST(GpuTrain, SafetensorsStreamADeviceTensorPieceByPiece) {
  ATH_REQUIRE_GPU();
  const std::string dir = athanor::testing::fresh_temp_dir("gpu_train_safetensors");
  // 5.5 M floats = 22 MB: two 16 MiB pieces, the second partial.
  const int64_t n = 5'500'001;
  Tensor host = empty({n});
  float* h = host.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) h[i] = static_cast<float>((i * 2654435761u) % 100003) * 1e-3f - 7.0f;
  Tensor dev = host.cuda();
  const std::string on_cpu = dir + "/cpu.safetensors", on_gpu = dir + "/gpu.safetensors";
  ckpt::save_safetensors(on_cpu, {{"w", host}, {"b", ones({3})}});
  ckpt::save_safetensors(on_gpu, {{"w", dev}, {"b", ones({3}).cuda()}});
  auto read = [](const std::string& p) {
    std::stringstream s;
    s << std::ifstream(p, std::ios::binary).rdbuf();
    return s.str();
  };
  EXPECT_TRUE(read(on_cpu) == read(on_gpu)) << "the device tensor's file differs from the cpu tensor's";
  Tensor back = zeros({n}).cuda(), b = zeros({3}).cuda();
  ckpt::load_safetensors_into(on_gpu, {{"w", back}, {"b", b}});
  EXPECT_TRUE(athanor::testing::tensor_bytes(back) == athanor::testing::tensor_bytes(host)) << "the uploaded tensor differs from the saved one";
  EXPECT_EQ(b.to_vector(), (std::vector<double>{1, 1, 1}));
}

TEST(GpuTrain, BenchOnCudaReportsTheDevicesMemoryAndPeak) {
  ATH_REQUIRE_GPU();
  const std::string dir = athanor::testing::fresh_temp_dir("gpu_train_bench");
  const std::string text = athanor::testing::write_tiny_text(dir);
  train::Trainer t(run_config(dir, text, {"name=bench", "trainer.device=cuda", "trainer.max_steps=3"}), /*write_run_files=*/false);
  t.set_output([](const std::string&) {});
  train::BenchOptions o;
  o.warmup = 1;
  o.steps = 2;
  const train::BenchResult r = train::run_bench(t, o);
  EXPECT_EQ(r.device, "cuda:0");
  std::size_t param_bytes = 0;
  for (auto& [n, p] : t.task().module().named_parameters()) param_bytes += p.storage()->nbytes();
  EXPECT_EQ(r.memory.peak_of(MemTag::parameter), param_bytes);  // the device allocator's, not the CPU's
  EXPECT_GT(r.memory.peak_of(MemTag::activation), 0u);
  EXPECT_EQ(r.gemm_gflops, 0.0);
  EXPECT_GT(r.throughput, 0.0);
  const std::string gpu = cuda::device_info(0).name;
  if (gpu.find("H100") != std::string::npos && gpu.find("PCIe") == std::string::npos && gpu.find("NVL") == std::string::npos) {
    EXPECT_DOUBLE_EQ(r.peak_gflops, 66900.0) << r.peak_source;
    EXPECT_GT(r.mfu, 0.0);
  }
}
