// The doctor (observe/doctor.h) on synthetic run directories: a healthy run, an
// LR-too-high divergence, a NaN-origin event recorded by the Trainer, a crashed
// run's truncated last line, and missing or corrupt inputs.
#include <cmath>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "athanor/observe/doctor.h"
#include "test_util.h"

namespace athanor::observe {
using namespace athanor::testing;
using nlohmann::json;

namespace {

// Step lines of a healthy run: noisy, decaying loss, grad norm ~1.
std::vector<json> healthy_steps(int64_t steps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01(0, 1);
  std::vector<json> out;
  for (int64_t s = 1; s <= steps; ++s)
    out.push_back({{"step", s}, {"loss", (1.5 + 2.5 * std::exp(-s / 60.0)) * (1 + 0.02 * n01(rng))}, {"lr", 3e-4},
                   {"grad_norm", std::fabs(1 + 0.2 * n01(rng))}, {"skipped", false}, {"skipped_total", 0}});
  return out;
}

void write_lines(const std::string& path, const std::vector<json>& lines, const std::string& tail = "") {
  std::ofstream f(path);
  for (const auto& j : lines) f << j.dump() << "\n";
  f << tail;
}

void write_config(const std::string& dir, int64_t max_steps) {
  std::ofstream(dir + "/config.yaml") << "trainer:\n  max_steps: " << max_steps << "\noptimizer:\n  lr: 0.0003\n";
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

}  // namespace

TEST(Doctor, HealthyFinishedRun) {
  const std::string dir = fresh_temp_dir("doctor_healthy");
  write_config(dir, 200);
  auto lines = healthy_steps(200, 1);
  lines.push_back({{"step", 200}, {"val_loss", 1.61}});
  write_lines(dir + "/metrics.jsonl", lines);
  const DoctorReport r = diagnose(dir);
  EXPECT_TRUE(r.finished);
  EXPECT_EQ(r.errors, 0);
  EXPECT_TRUE(r.problems.empty()) << r.text;
  EXPECT_TRUE(has(r.text, "status: finished (last step 200 of trainer.max_steps 200)")) << r.text;
  EXPECT_TRUE(has(r.text, "decreasing")) << r.text;
  EXPECT_TRUE(has(r.text, "validation loss: 1.61 at step 200")) << r.text;
  EXPECT_TRUE(has(r.text, "no problems found")) << r.text;
  EXPECT_FALSE(has(r.text, "likely causes")) << r.text;
}

TEST(Doctor, LearningRateTooHighDivergence) {
  const std::string dir = fresh_temp_dir("doctor_lr_high");
  write_config(dir, 1000);
  auto lines = healthy_steps(160, 2);
  // From step 150 on, the loss climbs and the gradient norm explodes: the run diverges and is stopped.
  for (int64_t s = 150; s <= 160; ++s) {
    lines[s - 1]["loss"] = 3.0 * std::pow(1.5, s - 150);
    lines[s - 1]["grad_norm"] = 200.0 * std::pow(2.0, s - 150);
  }
  write_lines(dir + "/metrics.jsonl", lines);
  const DoctorReport r = diagnose(dir);
  EXPECT_FALSE(r.finished);
  EXPECT_TRUE(has(r.text, "stopped early (last step 160 of trainer.max_steps 1000)")) << r.text;
  ASSERT_FALSE(r.problems.empty()) << r.text;
  EXPECT_EQ(r.problems[0].step, 150);
  bool spike = false, exploding = false;
  for (const auto& e : r.problems) {
    spike |= e.kind == "loss_spike" && e.step == 150;
    exploding |= e.kind == "exploding_gradients" && e.step == 150 && e.severity == "error";
  }
  EXPECT_TRUE(spike) << r.text;
  EXPECT_TRUE(exploding) << r.text;
  EXPECT_GE(r.errors, 1);
  // No clipping in the config: the explosion is the diagnosis, and clipping its fix.
  ASSERT_FALSE(r.findings.empty()) << r.text;
  EXPECT_EQ(r.findings[0].kind, "exploding_gradients");
  EXPECT_EQ(r.findings[0].fix.at("optimizer.grad_clip"), "1.0");
  EXPECT_TRUE(has(r.text, "lower optimizer.lr from 0.0003 to 0.0001")) << r.text;
  EXPECT_TRUE(has(r.text, "schedule.warmup_steps")) << r.text;
  EXPECT_TRUE(has(r.text, "INCREASING")) << r.text;
  // Each suggestion once.
  const auto& sg = r.findings[0].suggestions;
  for (size_t i = 0; i < sg.size(); ++i)
    for (size_t j = i + 1; j < sg.size(); ++j) EXPECT_NE(sg[i], sg[j]);
}

TEST(Doctor, ReportsTheRecordedNanOriginAndMergesDuplicates) {
  const std::string dir = fresh_temp_dir("doctor_nan");
  write_config(dir, 100);
  auto lines = healthy_steps(41, 3);
  lines[40]["loss"] = nullptr;  // non-finite loss is written as null
  lines[40]["grad_norm"] = nullptr;
  lines[40]["skipped"] = true;
  lines[40]["skipped_total"] = 1;
  lines[40]["nonfinite_params"] = {"transformer.h.1.attn.c_attn.weight"};
  write_lines(dir + "/metrics.jsonl", lines);
  write_lines(dir + "/health.jsonl",
              {{{"step", 41}, {"kind", "nan_origin"}, {"severity", "error"},
                {"message", "the first non-finite value came from 'log' in transformer.h.1.attn (forward)"},
                {"suggestions", {"check the inputs saved in nan_step41.safetensors"}},
                {"details", {{"op", "log"}, {"module", "transformer.h.1.attn"}, {"file", "nan_step41.safetensors"}}}},
               // The Trainer already reported the skip; the doctor's own check finds it too: listed once.
               {{"step", 41}, {"kind", "skipped_step"}, {"severity", "warning"}, {"message", "step 41 was skipped"},
                {"suggestions", json::array()}, {"details", json::object()}}});
  const DoctorReport r = diagnose(dir);
  EXPECT_EQ(r.errors, 1) << r.text;
  ASSERT_EQ(r.problems.size(), 2u) << r.text;
  EXPECT_TRUE(has(r.text, "nan_origin")) << r.text;
  EXPECT_TRUE(has(r.text, "op: log")) << r.text;
  EXPECT_TRUE(has(r.text, "module: transformer.h.1.attn")) << r.text;
  EXPECT_TRUE(has(r.text, "file: nan_step41.safetensors")) << r.text;
  ASSERT_EQ(r.findings.size(), 1u) << r.text;
  EXPECT_EQ(r.findings[0].kind, "lr_too_high");
  EXPECT_EQ(r.findings[0].details.at("op"), "log");
  EXPECT_EQ(r.findings[0].details.at("module"), "transformer.h.1.attn");
  EXPECT_EQ(r.findings[0].details.at("file"), "nan_step41.safetensors");
  EXPECT_TRUE(has(r.text, "the first non-finite value came from op 'log' in module 'transformer.h.1.attn'")) << r.text;
  EXPECT_TRUE(has(r.text, "non-finite loss on 1 of 41 logged steps")) << r.text;
  EXPECT_TRUE(has(r.text, "stopped early")) << r.text;
}

TEST(Doctor, F16ScaleCollapseSuggestsBf16) {
  const std::string dir = fresh_temp_dir("doctor_scale");
  write_config(dir, 120);
  auto lines = healthy_steps(120, 6);
  double scale = 65536;
  for (auto& j : lines) {
    const int64_t s = j["step"].get<int64_t>();
    if (s >= 60 && s % 2 == 0) scale /= 2;  // overflowing every other step from step 60
    j["loss_scale"] = scale;
  }
  write_lines(dir + "/metrics.jsonl", lines);
  const DoctorReport r = diagnose(dir);
  ASSERT_FALSE(r.problems.empty()) << r.text;
  EXPECT_EQ(r.problems[0].kind, "scale_collapse");
  EXPECT_EQ(r.problems[0].step, 66);  // the 4th drop: steps 60, 62, 64, 66
  EXPECT_TRUE(has(r.text, "use trainer.precision: bf16")) << r.text;
  EXPECT_EQ(r.errors, 0);  // a warning: the run finished
}

TEST(Doctor, ToleratesACrashedRunsTruncatedLastLine) {
  const std::string dir = fresh_temp_dir("doctor_truncated");
  write_lines(dir + "/metrics.jsonl", healthy_steps(80, 4), R"({"step": 81, "loss": 1.7, "lr": 3e-)");
  const DoctorReport r = diagnose(dir);  // no config.yaml: still works
  EXPECT_TRUE(has(r.text, "last step 80")) << r.text;
  EXPECT_TRUE(has(r.text, "cut off")) << r.text;
  EXPECT_TRUE(has(r.text, "no problems found")) << r.text;
  EXPECT_EQ(r.errors, 0);
}

TEST(Doctor, MissingOrCorruptInputsAreClearErrors) {
  const std::string dir = fresh_temp_dir("doctor_bad");
  std::string msg = error_message([&] { diagnose(dir); });
  EXPECT_TRUE(has(msg, "no metrics.jsonl")) << msg;
  EXPECT_TRUE(has(msg, dir)) << msg;
  msg = error_message([&] { diagnose(dir + "/nope"); });
  EXPECT_TRUE(has(msg, "not a directory")) << msg;
  auto lines = healthy_steps(5, 5);
  {
    std::ofstream f(dir + "/metrics.jsonl");
    f << lines[0].dump() << "\n{broken\n" << lines[1].dump() << "\n";
  }
  msg = error_message([&] { diagnose(dir); });
  EXPECT_TRUE(has(msg, "line 2")) << msg;
  EXPECT_TRUE(has(msg, "metrics.jsonl")) << msg;
}

namespace {

// A logged run of `n` steps (every step logged) whose loss follows loss(step); options add
// per-layer update ratios every 10 steps.
std::vector<json> run_lines(int64_t n, const std::function<double(int64_t)>& loss, double update_ratio = -1, double lr = 1e-3) {
  std::vector<json> out;
  for (int64_t s = 1; s <= n; ++s) {
    json j{{"step", s}, {"loss", loss(s)}, {"lr", lr}, {"grad_norm", 1.0}, {"skipped", false}, {"skipped_total", 0}};
    if (update_ratio >= 0 && s % 10 == 0)
      j["layers"] = {{"layers.0.weight", {{"grad", 0.5}, {"param", 10.0}, {"update", update_ratio}, {"dim", 2}}},
                     {"layers.2.weight", {{"grad", 0.5}, {"param", 5.0}, {"update", update_ratio * 1.2}, {"dim", 2}}}};
    out.push_back(j);
  }
  return out;
}

void write_run_json(const std::string& dir, double label_entropy, int64_t global_batch) {
  std::ofstream(dir + "/run.json") << json{{"world_size", 1}, {"global_batch", global_batch}, {"label_entropy", label_entropy},
                                           {"label_classes", 10}}.dump();
}

std::vector<std::string> kinds_of(const DoctorReport& r) {
  std::vector<std::string> k;
  for (const auto& f : r.findings) k.push_back(f.kind);
  return k;
}

}  // namespace

TEST(Doctor, LearningRateTooLowFromTheUpdateToWeightRatio) {
  const std::string dir = fresh_temp_dir("doctor_lr_low");
  std::ofstream(dir + "/config.yaml") << "optimizer:\n  lr: 1.0e-06\ntrainer:\n  max_steps: 300\n";
  write_run_json(dir, 2.3026, 32);
  write_lines(dir + "/metrics.jsonl", run_lines(300, [](int64_t s) { return 2.30 - 0.0002 * static_cast<double>(s); }, 1e-6, 1e-6));
  const DoctorReport r = diagnose(dir);
  ASSERT_FALSE(r.findings.empty()) << r.text;
  EXPECT_EQ(r.findings[0].kind, "lr_too_low") << r.text;
  // The update scales with the lr: aimed at 3e-3 of the weights, 1e-6 x 3e-3 / ~1.1e-6.
  EXPECT_EQ(r.findings[0].fix.at("optimizer.lr"), "0.002") << r.text;
  EXPECT_TRUE(has(r.findings[0].details.at("update_to_weight"), "layers.0.weight 1e-06")) << r.text;
  EXPECT_FALSE(r.healthy());
  // The same flat loss with healthy updates is not an lr that is too low.
  const std::string ok = fresh_temp_dir("doctor_lr_low_not");
  std::ofstream(ok + "/config.yaml") << "optimizer:\n  lr: 1.0e-03\n";
  write_run_json(ok, -1, 32);
  write_lines(ok + "/metrics.jsonl", run_lines(300, [](int64_t s) { return 2.30 - 0.0002 * static_cast<double>(s); }, 2e-3));
  for (const auto& k : kinds_of(diagnose(ok))) EXPECT_NE(k, "lr_too_low");
}

TEST(Doctor, ALossStuckAtTheLabelsEntropyCannotLearnFromTheInputs) {
  const std::string dir = fresh_temp_dir("doctor_chance");
  std::ofstream(dir + "/config.yaml") << "optimizer:\n  lr: 1.0e-03\n";
  write_run_json(dir, 2.3026, 32);
  std::mt19937_64 rng(3);
  std::normal_distribution<double> n01(0, 1);
  write_lines(dir + "/metrics.jsonl", run_lines(400, [&](int64_t) { return 2.31 + 0.02 * n01(rng); }, 2e-3));
  const DoctorReport r = diagnose(dir);
  ASSERT_EQ(kinds_of(r), std::vector<std::string>{"loss_at_chance"}) << r.text;
  EXPECT_TRUE(has(r.findings[0].message, "the model cannot learn from these inputs: check that labels match inputs")) << r.text;
  // A loss that learns past the entropy is not at chance.
  const std::string ok = fresh_temp_dir("doctor_chance_not");
  write_run_json(ok, 2.3026, 32);
  write_lines(ok + "/metrics.jsonl", run_lines(400, [](int64_t s) { return 0.5 + 1.8 * std::exp(-static_cast<double>(s) / 50); }, 2e-3));
  EXPECT_TRUE(diagnose(ok).healthy()) << diagnose(ok).text;
}

TEST(Doctor, OverfittingNamesTheStepWhereValidationWasBest) {
  const std::string dir = fresh_temp_dir("doctor_overfit");
  std::ofstream(dir + "/config.yaml") << "trainer:\n  max_steps: 1000\ndata:\n  train_samples: 512\noptimizer:\n  weight_decay: 0.0\n";
  write_run_json(dir, 2.3026, 32);
  auto lines = run_lines(1000, [](int64_t s) { return 2.0 * std::exp(-static_cast<double>(s) / 150); });
  for (int64_t s = 100; s <= 1000; s += 100)  // best at 300, then rising
    lines.push_back({{"step", s}, {"val_loss", 0.6 + 0.0000015 * static_cast<double>((s - 300) * (s - 300))}});
  write_lines(dir + "/metrics.jsonl", lines);
  const DoctorReport r = diagnose(dir);
  ASSERT_EQ(kinds_of(r), std::vector<std::string>{"overfitting"}) << r.text;
  EXPECT_EQ(r.findings[0].details.at("best_val_step"), "300");
  EXPECT_EQ(r.findings[0].fix.at("trainer.max_steps"), "300");
  EXPECT_TRUE(has(r.text, "data.train_samples is 512")) << r.text;
}

TEST(Doctor, DataStarvationAndStragglersFromTheRunningTotals) {
  const std::string dir = fresh_temp_dir("doctor_data");
  std::ofstream(dir + "/config.yaml") << "data:\n  num_workers: 0\n  prefetch: 4\n";
  write_run_json(dir, -1, 32);
  auto lines = run_lines(100, [](int64_t s) { return 2.0 * std::exp(-static_cast<double>(s) / 30); });
  lines.back()["totals"] = {{"steps", 100}, {"step_s", 10.0}, {"data_s", 6.0}, {"forward_s", 2.0}, {"backward_s", 1.5},
                            {"optimizer_s", 0.5}, {"comm_s", 0.0}};
  lines.back()["ranks"] = {{"compute_s", {2.0, 9.0}}};
  write_lines(dir + "/metrics.jsonl", lines);
  const DoctorReport r = diagnose(dir);
  ASSERT_EQ(kinds_of(r), (std::vector<std::string>{"data_starved", "straggler"})) << r.text;
  EXPECT_TRUE(has(r.findings[0].message, "the step waits for data 60% of the time")) << r.text;
  EXPECT_GE(std::stoi(r.findings[0].fix.at("data.num_workers")), 2);
  EXPECT_EQ(r.findings[1].details.at("rank"), "1");
  EXPECT_EQ(r.findings[1].details.at("rank_share"), "90%");
  // Half the data wait and equal ranks: neither.
  lines.back()["totals"]["data_s"] = 0.5;
  lines.back()["ranks"] = {{"compute_s", {9.0, 9.2}}};
  write_lines(dir + "/metrics.jsonl", lines);
  EXPECT_TRUE(diagnose(dir).healthy()) << diagnose(dir).text;
}

TEST(Doctor, ALargerBatchAtTheSameLrAgainstItsBaselineNeedsLinearScaling) {
  const std::string base = fresh_temp_dir("doctor_batch_base"), big = fresh_temp_dir("doctor_batch_big");
  const std::string model = "model:\n  type: mlp\n  sizes: [784, 512, 10]\noptimizer:\n  type: sgd\n  lr: 0.01\n";
  std::ofstream(base + "/config.yaml") << model;
  std::ofstream(big + "/config.yaml") << model << "  lr_scaling_base_batch: 0\n";
  write_run_json(base, 2.3026, 32);
  write_run_json(big, 2.3026, 256);
  // Progress per sample: the baseline at 32/step, the big run at 256/step but 8x slower per sample.
  write_lines(base + "/metrics.jsonl", run_lines(800, [](int64_t s) { return 0.4 + 1.9 * std::exp(-32.0 * s / 6000); }));
  write_lines(big + "/metrics.jsonl", run_lines(100, [](int64_t s) { return 0.4 + 1.9 * std::exp(-32.0 * s / 6000); }));
  const DoctorReport r = diagnose(big, {base});
  ASSERT_EQ(kinds_of(r), std::vector<std::string>{"batch_lr_not_scaled"}) << r.text;
  EXPECT_EQ(r.findings[0].fix.at("optimizer.lr_scaling_base_batch"), "32");
  EXPECT_TRUE(diagnose(big).healthy());  // without a baseline there is nothing to compare with
  // With the scaling rule on, the lr is not "unchanged".
  std::ofstream(big + "/config.yaml") << model << "  lr_scaling_base_batch: 32\n";
  EXPECT_TRUE(diagnose(big, {base}).healthy()) << diagnose(big, {base}).text;
  // A baseline of another model is no baseline.
  std::ofstream(base + "/config.yaml") << "model:\n  type: mlp\n  sizes: [784, 64, 10]\noptimizer:\n  type: sgd\n  lr: 0.01\n";
  std::ofstream(big + "/config.yaml") << model;
  EXPECT_TRUE(diagnose(big, {base}).healthy());
}

TEST(Doctor, AnEarlySpikeThatRecoversWantsWarmupOneThatStaysUpIsTheLr) {
  const std::string dir = fresh_temp_dir("doctor_early_spike");
  std::ofstream(dir + "/config.yaml") << "optimizer:\n  lr: 0.03\nschedule:\n  warmup_steps: 0\ntrainer:\n  max_steps: 300\n";
  write_run_json(dir, 3.08, 32);
  write_lines(dir + "/health.jsonl",
              {{{"step", 6}, {"kind", "loss_rise"}, {"severity", "warning"}, {"message", "the loss rose"}, {"suggestions", json::array()},
                {"details", {{"min_level", "3.5"}, {"min_step", "2"}, {"level", "5.8"}, {"initial_level", "5.55"}, {"lr_at_min", "0.03"}}}}});
  // Recovers to well below the rise's start: an early spike.
  write_lines(dir + "/metrics.jsonl", run_lines(300, [](int64_t s) { return s < 10 ? 5.0 : 1.8 + 1.5 * std::exp(-static_cast<double>(s) / 60); }));
  DoctorReport r = diagnose(dir);
  ASSERT_EQ(kinds_of(r), std::vector<std::string>{"early_loss_spike"}) << r.text;
  EXPECT_GE(std::stoi(r.findings[0].fix.at("schedule.warmup_steps")), 12);
  // Stays up: the lr diverged, and a tenth of the lr at the onset is suggested.
  write_lines(dir + "/metrics.jsonl", run_lines(300, [](int64_t s) { return s < 3 ? 4.0 : 5.9; }));
  r = diagnose(dir);
  ASSERT_EQ(kinds_of(r), std::vector<std::string>{"lr_too_high"}) << r.text;
  EXPECT_EQ(r.findings[0].fix.at("optimizer.lr"), "0.002");  // 0.03 / 10, to 1-2-5
}

TEST(Doctor, JsonReportsFindingsAndExitsHealthyOnAHealthyRun) {
  const std::string dir = fresh_temp_dir("doctor_json");
  write_config(dir, 200);
  write_lines(dir + "/metrics.jsonl", healthy_steps(200, 9));
  const DoctorReport r = diagnose(dir);
  EXPECT_TRUE(r.healthy()) << r.text;
  const json j = json::parse(r.json());
  EXPECT_TRUE(j.at("healthy").get<bool>());
  EXPECT_TRUE(j.at("findings").empty());
}

}  // namespace athanor::observe
