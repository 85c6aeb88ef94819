// The doctor (observe/doctor.h) on synthetic run directories: a healthy run, an
// LR-too-high divergence, a NaN-origin event recorded by the Trainer, a crashed
// run's truncated last line, and missing or corrupt inputs.
#include <cmath>
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
  EXPECT_TRUE(has(r.text, "lower optimizer.lr")) << r.text;
  EXPECT_TRUE(has(r.text, "schedule.warmup_steps")) << r.text;
  EXPECT_TRUE(has(r.text, "optimizer.grad_clip: 1.0")) << r.text;
  EXPECT_TRUE(has(r.text, "lower optimizer.lr (now 0.0003)")) << r.text;
  EXPECT_TRUE(has(r.text, "INCREASING")) << r.text;
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
  EXPECT_TRUE(has(r.text, "first appeared at step 41 in op 'log' of module transformer.h.1.attn; its inputs are saved in "
                          "nan_step41.safetensors")) << r.text;
  EXPECT_TRUE(has(r.text, "non-finite loss on 1 of 41 steps")) << r.text;
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

}  // namespace athanor::observe
