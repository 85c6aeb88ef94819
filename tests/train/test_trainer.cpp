// The Trainer: gradient accumulation is equivalent to one large batch, the
// schedule advances once per optimizer step, non-finite gradients skip the
// update, and the run directory gets its files. Fashion-MNIST tests skip when
// Debian's dataset-fashion-mnist is not installed.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "athanor/data/dataset.h"
#include "athanor/observe/profiler.h"
#include "athanor/train/trainer.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
namespace fs = std::filesystem;

namespace {
// Per-file prefix: test files run in parallel under ctest.
std::string tmp_dir(const std::string& name) { return testing::fresh_temp_dir("trainer_" + name); }
bool have_fashion() { return fs::exists(data::default_fashion_mnist_dir() + "/train-images-idx3-ubyte.gz"); }


train::Config mlp_config(const std::string& out, std::vector<std::string> overrides) {
  overrides.push_back("out_dir=" + out);
  return train::Config::parse(
      "model: {type: mlp, sizes: [784, 32, 10]}\n"
      "data: {type: fashion_mnist, num_workers: 2}\n"
      "optimizer: {type: sgd, lr: 0.1, momentum: 0.9}\n"
      "trainer: {max_steps: 3, eval_every: 0, eval_batches: 2, log_every: 1}\n",
      "test.yaml", overrides);
}

std::vector<double> flat_params(train::Trainer& t) {
  std::vector<double> out;
  for (auto& [n, p] : t.task().module().named_parameters()) {
    auto v = p.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace

TEST(Trainer, AccumulationEqualsOneLargeBatch) {
  ATHANOR_SKIP_IF_MISSING(!have_fashion(), "dataset-fashion-mnist is not installed");
  const std::string out = tmp_dir("accum");
  train::Trainer big(mlp_config(out, {"name=big", "trainer.batch_size=32", "trainer.accum_steps=1"}));
  train::Trainer small(mlp_config(out, {"name=small", "trainer.batch_size=8", "trainer.accum_steps=4"}));
  big.set_output([](const std::string&) {});
  small.set_output([](const std::string&) {});
  ASSERT_EQ(flat_params(big), flat_params(small));  // same seed: same initial weights
  for (int s = 0; s < 3; ++s) {
    ASSERT_TRUE(big.train_step());
    ASSERT_TRUE(small.train_step());
    // f32: the 4 partial sums are added in a different order than one GEMM's, so allow rounding.
    EXPECT_NEAR(big.history().back().loss, small.history().back().loss, 1e-5);
    EXPECT_NEAR(big.history().back().grad_norm, small.history().back().grad_norm, 1e-4 * big.history().back().grad_norm);
    const auto a = flat_params(big), b = flat_params(small);
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
    EXPECT_LT(worst, 2e-6) << "after step " << s + 1;
  }
  // One optimizer step = one schedule step, whatever the number of micro-batches.
  EXPECT_EQ(big.scheduler().current_step(), 3);
  EXPECT_EQ(small.scheduler().current_step(), 3);
  EXPECT_EQ(small.optimizer().steps(), 3);
  EXPECT_FALSE(small.train_step());  // max_steps reached
}

TEST(Trainer, TokenWeightedAccumulationForLanguageModels) {
  const std::string dir = tmp_dir("lm");
  const std::string text = testing::write_tiny_text(dir);
  auto cfg = [&](const std::string& name, int b, int k) {
    return train::Config::parse(
        "model: {type: gpt, n_layer: 1, n_head: 2, n_embd: 16, block_size: 16}\n"
        "data: {type: text, tokenizer: byte, corpus: " + text + ", cache_dir: " + dir + "/cache, num_workers: 0}\n"
        "optimizer: {type: adamw, lr: 0.01}\n"
        "trainer: {max_steps: 2, eval_every: 0, eval_batches: 1}\n",
        "lm.yaml", {"name=" + name, "out_dir=" + dir, "trainer.batch_size=" + std::to_string(b), "trainer.accum_steps=" + std::to_string(k)});
  };
  train::Trainer a(cfg("a", 8, 1)), b(cfg("b", 2, 4));
  a.set_output([](const std::string&) {});
  b.set_output([](const std::string&) {});
  for (int s = 0; s < 2; ++s) {
    a.train_step();
    b.train_step();
    EXPECT_EQ(a.history().back().targets, 8 * 16);
    EXPECT_EQ(b.history().back().targets, 8 * 16);
    EXPECT_NEAR(a.history().back().loss, b.history().back().loss, 1e-5);
  }
  const auto pa = flat_params(a), pb = flat_params(b);
  for (size_t i = 0; i < pa.size(); ++i) ASSERT_NEAR(pa[i], pb[i], 1e-5) << i;
  EXPECT_EQ(a.evaluate().accuracy, -1);  // not a classifier
}

TEST(Trainer, WritesResolvedConfigAndMetrics) {
  ATHANOR_SKIP_IF_MISSING(!have_fashion(), "dataset-fashion-mnist is not installed");
  const std::string out = tmp_dir("files");
  train::Trainer t(mlp_config(out, {"name=files"}));
  std::string log;
  t.set_output([&](const std::string& s) { log += s; });
  t.fit();
  EXPECT_TRUE(fs::exists(out + "/files/config.yaml"));
  auto resolved = train::Config::load(out + "/files/config.yaml");
  EXPECT_EQ(resolved.get_int("trainer.max_steps"), 3);
  std::ifstream m(out + "/files/metrics.jsonl");
  std::string line;
  int steps = 0, evals = 0;
  while (std::getline(m, line)) {
    steps += line.find("\"loss\"") != std::string::npos;
    evals += line.find("\"val_loss\"") != std::string::npos;
  }
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(evals, 1);
  EXPECT_NE(log.find("step 3/3"), std::string::npos) << log;
  EXPECT_NE(log.find("accuracy"), std::string::npos) << log;
}

// profile.enabled: the window's table has the step's phases, and the optimizer span is
// broken into its parts (gradient norm, update, zero_grad), each once per profiled step.
TEST(Trainer, ProfileWindowBreaksTheOptimizerIntoItsParts) {
  ATHANOR_SKIP_IF_MISSING(!have_fashion(), "dataset-fashion-mnist is not installed");
  const std::string out = tmp_dir("profile");
  train::Trainer t(mlp_config(out, {"name=profile", "trainer.max_steps=4", "profile.enabled=true", "profile.start_step=2",
                                    "profile.num_steps=3"}));
  std::string log;
  t.set_output([&](const std::string& s) { log += s; });
  t.fit();
  EXPECT_NE(log.find("profile of steps 2-4"), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(out + "/profile/trace.json"));
  const auto rows = observe::Profiler::instance().rows();
  auto span = [&](const std::string& name) -> const observe::ProfileRow* {
    for (const auto& r : rows)
      if (r.name == name && r.kind == 's') return &r;
    return nullptr;
  };
  for (const char* name : {"forward", "backward", "optimizer", "grad_norm", "optimizer_step", "zero_grad"}) {
    ASSERT_NE(span(name), nullptr) << name << "\n" << log;
    EXPECT_EQ(span(name)->calls, 3) << name;
  }
  // Nested: the optimizer's own time is what its three parts leave.
  const int64_t parts = span("grad_norm")->total_ns + span("optimizer_step")->total_ns + span("zero_grad")->total_ns;
  EXPECT_GT(span("optimizer_step")->total_ns, 0);
  EXPECT_EQ(span("optimizer")->self_ns, span("optimizer")->total_ns - parts);
  EXPECT_NE(log.find("optimizer_step"), std::string::npos) << log;
  observe::Profiler::instance().reset();
}

TEST(Trainer, NonFiniteGradientSkipsTheUpdate) {
  ATHANOR_SKIP_IF_MISSING(!have_fashion(), "dataset-fashion-mnist is not installed");
  const std::string out = tmp_dir("skip");
  // Policy skip (the default without the f16 scaler is stop: tests/train/test_nonfinite.cpp).
  train::Trainer t(mlp_config(out, {"name=skip", "health.nonfinite_policy=skip"}));
  std::string log;
  t.set_output([&](const std::string& s) { log += s; });
  // Poison one weight: the loss and every gradient become NaN.
  Tensor w = t.task().module().named_parameters()[0].second;
  {
    NoGradGuard ng;
    make_view(w, {1}, {1}, 0).fill_(NAN);
  }
  const auto before = flat_params(t);
  t.train_step();
  EXPECT_TRUE(t.history().back().skipped);
  EXPECT_EQ(t.skipped_steps(), 1);
  const auto after = flat_params(t);
  for (size_t i = 1; i < before.size(); ++i) ASSERT_EQ(before[i], after[i]) << i;  // nothing was updated
  EXPECT_NE(log.find("skipped"), std::string::npos) << log;
  EXPECT_NE(log.find("hint:"), std::string::npos) << log;
}

TEST(Trainer, BadInputsAreClearErrors) {
  const std::string out = tmp_dir("bad");
  const std::string msg = error_message([&] {
    train::Trainer t(train::Config::parse("model: {type: mlp}\ndata: {type: fashion_mnist, dir: /nonexistent/fmnist}\n", "x.yaml",
                                          {"out_dir=" + out}));
  });
  EXPECT_NE(msg.find("/nonexistent/fmnist"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dataset-fashion-mnist"), std::string::npos) << msg;
  const std::string mismatch = error_message([&] {
    train::Trainer t(train::Config::parse("model: {type: gpt}\ndata: {type: fashion_mnist}\n", "y.yaml", {"out_dir=" + out}));
  });
  EXPECT_NE(mismatch.find("data.type text"), std::string::npos) << mismatch;
  const std::string missing_text = error_message([&] {
    train::Trainer t(train::Config::parse("data: {type: text, corpus: /nonexistent/book.txt, cache_dir: " + out + "}\n", "z.yaml",
                                          {"out_dir=" + out}));
  });
  EXPECT_NE(missing_text.find("/nonexistent/book.txt"), std::string::npos) << missing_text;
}

}  // namespace athanor
