// A training step on one GPU issues no host synchronisation unless it is logged (issue 30;
// DESIGN.md "GPUs"; trainer_step.cpp: guarded_update):
//  - the device step guard: AdamW and SGD over CUDA parameters, with skip / clip coefficient /
//    step counts read on the device, match the CPU optimizer step for step (a finite step
//    with clipping folded in, a NaN step skipped — weights, moments and step counts
//    unchanged — then a step with the bias correction of t = 2);
//  - embedding validates its ids on the device: an out-of-range id costs no host read at the
//    call and is raised (naming the id and its position) at the next read from the device;
//  - the Trainer on cuda with log_every > max_steps: 0 host syncs (cuda::host_sync_count:
//    every device-to-host copy and every synchronize) in each unlogged step, in f32, bf16 and
//    f16 (GradScaler's no-sync forms), and the same final weights, bit for bit, as the run
//    that logs (and so reads back) every step.
#include <cmath>
#include <limits>

#include "athanor/optim/clip.h"
#include "athanor/optim/optimizer.h"
#include "athanor/ops.h"
#include "athanor/train/trainer.h"
#include "gpu_test.h"
#include "optim/device_update.h"
#include "test_util.h"

using namespace athanor;

namespace {

std::vector<double> values(const Tensor& t) { return t.cpu().to_vector(); }

::testing::AssertionResult close(const Tensor& got, const Tensor& want, double rtol) {
  return gpu_test::all_close(values(got), values(want), 1e-7, rtol);
}

// One optimizer kind on the CPU and its guarded twin on cuda:0, over the same two parameters.
struct Twin {
  std::vector<Tensor> cpu_p, gpu_p;
  std::unique_ptr<optim::Optimizer> cpu, gpu;
  Tensor skip, out;
  Twin(const std::string& kind) {
    const std::vector<float> a = gpu_test::random_vector(5000, 1), b = gpu_test::random_vector(37, 2);
    cpu_p = {from_vector(a, {50, 100}), from_vector(b, {37})};
    for (const Tensor& p : cpu_p) gpu_p.push_back(p.cuda());
    auto groups = [&](std::vector<Tensor>& ps) {
      optim::ParamGroup g;
      g.name = "all", g.lr = 1e-2, g.base_lr = 1e-2, g.weight_decay = 0.1;
      g.params = {{"w", ps[0]}, {"b", ps[1]}};
      return std::vector<optim::ParamGroup>{g};
    };
    if (kind == "adamw") {
      cpu = optim::make_adamw(groups(cpu_p));
      gpu = optim::make_adamw(groups(gpu_p));
    } else {
      cpu = optim::make_sgd(groups(cpu_p), {0.9, 0.0, true});
      gpu = optim::make_sgd(groups(gpu_p), {0.9, 0.0, true});
    }
    skip = zeros({1}, TensorOptions(DType::f32).with_device(Device::cuda(0)));
    out = zeros({3}, TensorOptions(DType::f64).with_device(Device::cuda(0)));
    gpu->set_device_guard(skip, make_view(out, {1}, {1}, 0));
  }
  void set_grads(unsigned seed, bool nan) {
    for (size_t i = 0; i < cpu_p.size(); ++i) {
      std::vector<float> g = gpu_test::random_vector(static_cast<size_t>(cpu_p[i].numel()), seed + 10 * i, -3.0f, 3.0f);
      if (nan && i == 1) g[5] = std::numeric_limits<float>::quiet_NaN();
      Tensor gc = from_vector(g, cpu_p[i].sizes());
      cpu_p[i].set_grad(gc);
      gpu_p[i].set_grad(gc.cuda());
    }
  }
  // The trainer's step on both: CPU decides on the host, the GPU on the device.
  void step(double clip) {
    optim::detail::step_guard_on_device(optim::grad_sum_squares_on_device(gpu_p), Tensor(), Tensor(), clip, skip, out);
    gpu->step();
    const double norm = optim::grad_norm(cpu_p);
    if (!std::isfinite(norm)) return;  // the CPU's skipped step: no step() call
    if (const double coef = optim::clip_coefficient(norm, clip); clip > 0 && coef < 1.0) cpu->scale_grads_in_next_step(coef);
    cpu->step();
  }
  void expect_same(const char* when) {
    for (size_t i = 0; i < cpu_p.size(); ++i) EXPECT_TRUE(close(gpu_p[i], cpu_p[i], 1e-6)) << when << ", parameter " << i;
    const auto cs = cpu->state_tensors(), gs = gpu->state_tensors();
    ASSERT_EQ(cs.size(), gs.size());
    for (size_t i = 0; i < cs.size(); ++i) EXPECT_TRUE(close(gs[i].second, cs[i].second, 1e-6)) << when << ", " << cs[i].first;
    EXPECT_EQ(gpu->steps(), cpu->steps()) << when;
    EXPECT_EQ(gpu->state_scalars(), cpu->state_scalars()) << when;
  }
};

void run_guarded(const std::string& kind) {
  Twin t(kind);
  t.set_grads(3, false);
  t.step(/*clip=*/0.5);  // the norm is ~100: clipped, the coefficient folded into the update
  EXPECT_LT(values(t.out)[0], 0.1) << "the clip coefficient";
  EXPECT_NEAR(values(t.out)[1], optim::grad_norm(t.cpu_p), 1e-9 * values(t.out)[1]) << "the norm";
  t.expect_same("after a clipped step");
  const std::vector<double> before = values(t.gpu_p[0]);
  t.set_grads(4, /*nan=*/true);
  t.step(0.5);
  EXPECT_EQ(values(t.skip)[0], 1.0);
  EXPECT_EQ(values(t.out)[2], 1.0) << "the skipped-step count";
  EXPECT_EQ(values(t.gpu_p[0]), before) << "a skipped step must not touch the weights";
  t.expect_same("after a skipped step");
  t.set_grads(5, false);
  t.step(0.0);  // no clipping: coefficient 1
  EXPECT_EQ(values(t.skip)[0], 0.0);
  EXPECT_EQ(values(t.out)[0], 1.0);
  t.expect_same("after the step following the skip (t = 2)");
  t.gpu->set_device_guard(Tensor(), Tensor());  // off: the counts come back to the host
  EXPECT_EQ(t.gpu->steps(), 2);
}

train::Config run_config(const std::string& dir, const std::string& text, std::vector<std::string> overrides) {
  overrides.push_back("out_dir=" + dir);
  return train::Config::parse(
      "model: {type: gpt, n_layer: 2, n_head: 2, n_embd: 32, block_size: 32, dropout: 0.1}\n"
      "data: {type: text, tokenizer: byte, corpus: " + text + ", cache_dir: " + dir + "/cache, num_workers: 2}\n"
      "optimizer: {type: adamw, lr: 0.003, weight_decay: 0.1, grad_clip: 1.0}\n"
      "schedule: {warmup_steps: 2, decay: cosine}\n"
      "trainer: {max_steps: 8, batch_size: 4, accum_steps: 2, eval_every: 0, eval_batches: 1, sample_every: 0, "
      "sample_tokens: 4}\n"
      "observe: {report: false, tensorboard: false}\n",
      "gpu_train_sync.yaml", overrides);
}

std::vector<std::string> weight_bytes(train::Trainer& t) {
  std::vector<std::string> out;
  for (auto& [n, p] : t.task().module().state_dict()) {
    Tensor c = p.cpu().contiguous();
    out.emplace_back(static_cast<const char*>(c.raw_data()), c.nbytes());
  }
  return out;
}

}  // namespace

TEST(GpuTrainSync, GuardedAdamWMatchesTheCpuAndSkipsOnTheDevice) {
  ATH_REQUIRE_GPU();
  run_guarded("adamw");
}

TEST(GpuTrainSync, GuardedSgdMatchesTheCpuAndSkipsOnTheDevice) {
  ATH_REQUIRE_GPU();
  run_guarded("sgd");
}

TEST(GpuTrainSync, UnloggedStepsMakeNoHostSync) {
  ATH_REQUIRE_GPU();
  const std::string dir = athanor::testing::fresh_temp_dir("gpu_train_sync");
  const std::string text = athanor::testing::write_tiny_text(dir);
  for (const std::string prec : {"f32", "bf16", "f16"}) {
    std::vector<std::string> logged_every_step;
    double every_loss = 0, every_norm = 0;
    int64_t every_skipped = 0;
    {
      train::Trainer t(run_config(dir, text, {"name=every_" + prec, "trainer.device=cuda", "trainer.precision=" + prec,
                                              "trainer.log_every=1"}));
      t.set_output([](const std::string&) {});
      while (t.train_step()) {
      }
      logged_every_step = weight_bytes(t);
      every_loss = t.history().back().loss, every_norm = t.history().back().grad_norm;
      every_skipped = t.skipped_steps();
    }
    train::Trainer t(run_config(dir, text, {"name=quiet_" + prec, "trainer.device=cuda", "trainer.precision=" + prec,
                                            "trainer.log_every=100"}));
    t.set_output([](const std::string&) {});
    ASSERT_TRUE(t.train_step());  // step 1 is logged (and warms up everything)
    for (int step = 2; step < 8; ++step) {
      const std::uint64_t before = cuda::host_sync_count(0);
      ASSERT_TRUE(t.train_step());
      EXPECT_EQ(cuda::host_sync_count(0) - before, 0u) << prec << ": host syncs in unlogged step " << step;
    }
    const std::uint64_t before = cuda::host_sync_count(0);
    ASSERT_TRUE(t.train_step());  // the last step is logged: it reads the loss, the norm and the flags
    EXPECT_GT(cuda::host_sync_count(0) - before, 0u) << prec << ": the logged step must read (the counter counts)";
    EXPECT_FALSE(t.train_step());
    // What the logged step reads is what the run that reads every step saw (f16 may skip its
    // first steps while the scale backs off: the count catches up at the logged step).
    EXPECT_TRUE(std::isfinite(t.history().back().loss)) << prec;
    EXPECT_EQ(t.history().back().loss, every_loss) << prec;
    const double norm = t.history().back().grad_norm;
    EXPECT_TRUE(norm == every_norm || (std::isnan(norm) && std::isnan(every_norm))) << prec << ": " << norm << " vs " << every_norm;
    EXPECT_EQ(t.skipped_steps(), every_skipped) << prec;
    if (prec != "f16") {
      EXPECT_EQ(t.skipped_steps(), 0) << prec;
    }
    const auto w = weight_bytes(t);
    ASSERT_EQ(w.size(), logged_every_step.size());
    for (size_t i = 0; i < w.size(); ++i)
      EXPECT_TRUE(w[i] == logged_every_step[i]) << prec << ": tensor " << i << " differs from the run that reads every step";
  }
}

TEST(GpuTrainSync, EmbeddingIdsAreValidatedOnTheDeviceWithoutAHostRead) {
  ATH_REQUIRE_GPU();
  const Tensor table = from_vector(gpu_test::random_vector(10 * 4, 3), {10, 4}).cuda();
  const Tensor good = from_vector(std::vector<int64_t>{1, 9, 0, 3}, {2, 2}).cuda();
  const Tensor bad = from_vector(std::vector<int64_t>{1, 9, 12, 3}, {2, 2}).cuda();
  const Tensor want = embedding(table.cpu(), good.cpu());
  const std::uint64_t before = cuda::host_sync_count(0);
  const Tensor out = embedding(table, good);
  Tensor wrong;
  EXPECT_NO_THROW(wrong = embedding(table, bad)) << "the check must not read the ids at the call";
  EXPECT_EQ(cuda::host_sync_count(0), before) << "embedding read something back";
  try {
    (void)wrong.cpu();
    FAIL() << "the out-of-range id was not reported at the read";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("id 12 at (flat) position 2"), std::string::npos) << m;
    EXPECT_NE(m.find("table of 10 rows"), std::string::npos) << m;
  }
  EXPECT_EQ(out.cpu().to_vector(), want.to_vector()) << "the error is reported once; good ids give the table's rows";
}
