// trainer.stop_at_val_loss: fit() ends at the first periodic evaluation whose validation loss is
// at or below the target, says so in the log and in run.json's "end", and bad values are refused
// before any training. The reference is the same run without a target (same seed: the same
// trajectory), so the step it must stop at is known from that run's evaluations.
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

#include "athanor/data/dataset.h"
#include "athanor/train/trainer.h"
#include "test_util.h"

namespace athanor {
namespace fs = std::filesystem;

namespace {
bool have_fashion() { return fs::exists(data::default_fashion_mnist_dir() + "/train-images-idx3-ubyte.gz"); }

train::Config config(const std::string& out, std::vector<std::string> overrides) {
  overrides.push_back("out_dir=" + out);
  return train::Config::parse(
      "model: {type: mlp, sizes: [784, 32, 10]}\n"
      "data: {type: fashion_mnist, num_workers: 0}\n"
      "optimizer: {type: sgd, lr: 0.05}\n"
      "trainer: {max_steps: 40, batch_size: 32, eval_every: 5, eval_batches: 4, log_every: 5}\n"
      "observe: {tensorboard: false, report: false}\n",
      "stop.yaml", overrides);
}

nlohmann::json run_json(const std::string& dir) {
  std::ifstream f(fs::path(dir) / "run.json");
  return nlohmann::json::parse(f);
}
}  // namespace

TEST(StopAtValLoss, EndsAtTheFirstEvaluationAtOrBelowTheTarget) {
  ATHANOR_SKIP_IF_MISSING(!have_fashion(), "dataset-fashion-mnist is not installed (scripts/setup.sh installs it)");
  const std::string out = testing::fresh_temp_dir("stop_at_val_loss");
  // The reference: no target, every evaluation at steps 5, 10, ..., 35 and the final one at 40.
  train::Trainer ref(config(out, {"name=ref"}));
  ref.set_output([](const std::string&) {});
  ref.fit();
  ASSERT_EQ(ref.evals().size(), 8u);
  EXPECT_EQ(ref.end_reason(), "max_steps");
  EXPECT_EQ(run_json(out + "/ref")["end"]["reason"], "max_steps");
  EXPECT_EQ(run_json(out + "/ref")["end"]["step"], 40);
  // The target: the loss of the periodic evaluation at step 20; the run must stop at the first
  // evaluation at or below it (step 20, or earlier if the curve went below it before).
  const double target = ref.evals()[3].loss;
  size_t first = 0;
  while (ref.evals()[first].loss > target) ++first;
  ASSERT_LE(first, 3u);
  ASSERT_GT(ref.evals()[0].loss, ref.evals()[3].loss) << "the reference did not learn: the test would prove nothing";

  std::string log;
  std::ostringstream target_text;
  target_text << std::setprecision(17) << target;
  train::Trainer t(config(out, {"name=stop", "trainer.stop_at_val_loss=" + target_text.str()}));
  t.set_output([&](const std::string& s) { log += s; });
  t.fit();
  const int64_t expect_step = 5 * static_cast<int64_t>(first + 1);
  EXPECT_EQ(t.step(), expect_step);
  EXPECT_EQ(t.end_reason(), "stop_at_val_loss");
  // No second evaluation of the same weights at the end.
  ASSERT_EQ(t.evals().size(), first + 1);
  EXPECT_EQ(t.evals().back().step, expect_step);
  EXPECT_LE(t.evals().back().loss, target);
  EXPECT_EQ(t.evals().back().loss, ref.evals()[first].loss);  // the same trajectory as the reference
  EXPECT_NE(log.find("stopping at step " + std::to_string(expect_step) + ": val loss "), std::string::npos) << log;
  EXPECT_NE(log.find("<= trainer.stop_at_val_loss"), std::string::npos) << log;
  const auto end = run_json(out + "/stop")["end"];
  EXPECT_EQ(end["reason"], "stop_at_val_loss");
  EXPECT_EQ(end["step"], expect_step);
  EXPECT_NE(end["detail"].get<std::string>().find("<= trainer.stop_at_val_loss"), std::string::npos);
  EXPECT_TRUE(fs::exists(fs::path(out) / "stop" / "model.safetensors"));

  // A target never reached: the run goes to max_steps.
  train::Trainer low(config(out, {"name=low", "trainer.stop_at_val_loss=1e-9"}));
  low.set_output([](const std::string&) {});
  low.fit();
  EXPECT_EQ(low.step(), 40);
  EXPECT_EQ(low.end_reason(), "max_steps");
}

TEST(StopAtValLoss, BadValuesAreRefusedBeforeTraining) {
  const std::string out = testing::fresh_temp_dir("stop_at_val_loss_bad");
  const std::string bad = testing::error_message([&] { train::Trainer t(config(out, {"trainer.stop_at_val_loss=-1"})); });
  EXPECT_NE(bad.find("trainer.stop_at_val_loss must be a finite number >= 0, got -1"), std::string::npos) << bad;
  EXPECT_NE(bad.find("hint:"), std::string::npos) << bad;
  ATHANOR_SKIP_IF_MISSING(!have_fashion(), "dataset-fashion-mnist is not installed (scripts/setup.sh installs it)");
  train::Trainer t(config(out, {"trainer.stop_at_val_loss=0.5", "trainer.eval_every=0"}));
  t.set_output([](const std::string&) {});
  const std::string msg = testing::error_message([&] { t.fit(); });
  EXPECT_NE(msg.find("trainer.stop_at_val_loss (0.5) is checked at the periodic evaluations, but trainer.eval_every is 0"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("hint: set trainer.eval_every"), std::string::npos) << msg;
  EXPECT_EQ(t.step(), 0);  // refused before the first step
}

}  // namespace athanor
