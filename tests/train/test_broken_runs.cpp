// Deliberately broken runs, end to end through the Trainer (issue 6, check (a)):
// an lr 100x too high must be reported while the run goes on — a loss or
// gradient-norm spike, or exploding gradients, in health.jsonl with the advice a
// person needs (lower the lr, add warmup or clipping) — and the same run at a
// sane lr must report nothing (no false alarms). Checks (b)-(d) live in
// test_nonfinite.cpp and test_mixed_precision.cpp.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "athanor/train/trainer.h"
#include "test_util.h"

namespace athanor {
namespace fs = std::filesystem;

namespace {

std::vector<nlohmann::json> health_events(const std::string& run_dir) {
  std::vector<nlohmann::json> events;
  std::ifstream in(fs::path(run_dir) / "health.jsonl");
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) events.push_back(nlohmann::json::parse(line));
  return events;
}

// A tiny GPT whose lr warms up linearly over the first steps: the window of the
// health monitor fills while the lr is still small, then the lr reaches `lr`.
std::unique_ptr<train::Trainer> make_run(const std::string& dir, double lr) {
  const std::string text = testing::write_tiny_text(dir);
  auto cfg = train::Config::parse(
      "model: {type: gpt, n_layer: 1, n_head: 2, n_embd: 32, block_size: 16}\n"
      "data: {type: text, tokenizer: byte, corpus: " + text + ", cache_dir: " + dir + "/cache, num_workers: 0}\n"
      "optimizer: {type: sgd}\n"
      "schedule: {warmup_steps: 20}\n"
      "trainer: {max_steps: 80, batch_size: 8, eval_every: 0, eval_batches: 1, sample_tokens: 4, log_every: 1}\n"
      "health: {nonfinite_policy: skip, spike_window: 20}\n"
      "observe: {tensorboard: false, report: false, peak_gflops: 100}\n",
      "broken.yaml", {"out_dir=" + dir, "name=run", "optimizer.lr=" + std::to_string(lr)});
  return std::make_unique<train::Trainer>(cfg);
}

void train_quietly(train::Trainer& t) {
  t.set_output([](const std::string&) {});
  while (t.train_step()) {
  }
}

}  // namespace

TEST(BrokenRuns, LrHundredTimesTooHighIsReportedWithAdvice) {
  const std::string dir = testing::fresh_temp_dir("broken_lr_high");
  auto t = make_run(dir, 0.1 * 100);  // a sane SGD lr for this model is ~0.1
  train_quietly(*t);
  const auto events = health_events(t->run_dir());
  ASSERT_FALSE(events.empty()) << "no health event for an lr 100x too high";
  bool found = false;
  for (const auto& e : events) {
    const std::string kind = e.at("kind");
    if (kind != "loss_spike" && kind != "grad_spike" && kind != "exploding_gradients") continue;
    std::string advice;
    for (const auto& s : e.at("suggestions")) advice += s.get<std::string>() + "\n";
    EXPECT_NE(advice.find("lr"), std::string::npos) << advice;
    EXPECT_TRUE(advice.find("warmup") != std::string::npos || advice.find("clip") != std::string::npos) << advice;
    // The step's batch: 8 sample ids, comma-separated.
    const std::string ids = e.at("details").at("sample_ids");
    EXPECT_EQ(std::count(ids.begin(), ids.end(), ','), 7) << ids;
    found = true;
  }
  EXPECT_TRUE(found) << "events: " << nlohmann::json(events).dump();
}

TEST(BrokenRuns, SaneLrReportsNothing) {
  const std::string dir = testing::fresh_temp_dir("broken_lr_sane");
  auto t = make_run(dir, 0.1);
  train_quietly(*t);
  const auto events = health_events(t->run_dir());
  EXPECT_TRUE(events.empty()) << nlohmann::json(events).dump();
  EXPECT_LT(t->history().back().loss, t->history().front().loss);  // and it learned
}

}  // namespace athanor
