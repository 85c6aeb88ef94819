// `athanor bench`'s timing loop (train/bench.h): it runs exactly warm-up + timed
// steps, its statistics follow from the recorded step times, the FLOP count
// matches a count made by hand from the model's shapes, the JSON carries the
// same figures, and bad options are clear errors.
#include <nlohmann/json.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "athanor/data/dataset.h"
#include "athanor/train/bench.h"
#include "backend/cpu/cpu_peak.h"
#include "test_util.h"

namespace athanor {
namespace fs = std::filesystem;

namespace {

// GPT: 1 layer, d=16, 2 heads, T=16, byte vocabulary (256), batch 4.
train::Config tiny_gpt(const std::string& dir, std::vector<std::string> overrides = {}) {
  const std::string text = testing::write_tiny_text(dir);
  overrides.push_back("out_dir=" + dir);
  return train::Config::parse(
      "model: {type: gpt, n_layer: 1, n_head: 2, n_embd: 16, block_size: 16}\n"
      "data: {type: text, tokenizer: byte, corpus: " + text + ", cache_dir: " + dir + "/cache, num_workers: 0}\n"
      "optimizer: {type: adamw, lr: 1.0e-3}\n"
      "trainer: {batch_size: 4, max_steps: 5, eval_every: 0}\n",
      "bench_test.yaml", overrides);
}

}  // namespace

TEST(Bench, TimesExactlyTheRequestedStepsAndDerivesItsStatistics) {
  const std::string dir = testing::fresh_temp_dir("bench_stats");
  train::Trainer t(tiny_gpt(dir), /*write_run_files=*/false);
  t.set_output([](const std::string&) {});
  train::BenchOptions opts;
  opts.warmup = 2;
  opts.steps = 3;
  opts.peak_gflops = 100;  // given
  const auto w0 = std::chrono::steady_clock::now();
  const train::BenchResult r = train::run_bench(t, opts);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();

  EXPECT_EQ(t.step(), 5);
  ASSERT_EQ(r.step_seconds.size(), 3u);
  EXPECT_EQ(r.unit, "tokens");
  EXPECT_EQ(r.targets_per_step, 4 * 16);
  EXPECT_EQ(r.parameters, t.task().module().parameters_count());
  // The timed steps are the trainer's last three (its own clock measures them too).
  double summed = 0;
  for (size_t i = 0; i < 3; ++i) {
    const double own = t.history()[2 + i].step_seconds;
    EXPECT_GE(r.step_seconds[i], own * 0.999) << i;
    summed += r.step_seconds[i];
  }
  EXPECT_LE(summed, wall);
  std::vector<double> s = r.step_seconds;
  std::sort(s.begin(), s.end());
  EXPECT_DOUBLE_EQ(r.min_ms, s[0] * 1e3);
  EXPECT_DOUBLE_EQ(r.median_ms, s[1] * 1e3);
  EXPECT_DOUBLE_EQ(r.max_ms, s[2] * 1e3);
  EXPECT_NEAR(r.throughput, 64 / s[1], 1e-9 * r.throughput);
  EXPECT_NEAR(r.throughput_mean, 3 * 64 / summed, 1e-9 * r.throughput_mean);
  EXPECT_DOUBLE_EQ(r.peak_gflops, 100);
  EXPECT_EQ(r.peak_source, "given");
  EXPECT_NEAR(r.mfu, r.flops_per_step / s[1] * 1e-9 / 100, 1e-12);
  EXPECT_GT(r.gemm_gflops, 0);  // GEMM efficiency: against the probe, beside MFU
  EXPECT_NEAR(r.gemm_efficiency, r.achieved_gflops / r.gemm_gflops, 1e-12);
  EXPECT_DOUBLE_EQ(r.final_loss, t.history().back().loss);
  EXPECT_GT(r.memory.peak_of(MemTag::parameter), 0u);
  EXPECT_GT(r.memory.peak_of(MemTag::activation), 0u);
  // The phases are the medians of the trainer's own per-step clocks over the timed steps;
  // "other" is what the step's wall time has beyond them (never negative: it encloses them).
  auto median_of = [&](auto field) {
    std::vector<double> v;
    for (size_t i = 0; i < 3; ++i) v.push_back(field(t.history()[2 + i]) * 1e3);
    std::sort(v.begin(), v.end());
    return v[1];
  };
  EXPECT_DOUBLE_EQ(r.forward_ms, median_of([](const auto& m) { return m.forward_seconds; }));
  EXPECT_DOUBLE_EQ(r.backward_ms, median_of([](const auto& m) { return m.backward_seconds; }));
  EXPECT_DOUBLE_EQ(r.optimizer_ms, median_of([](const auto& m) { return m.optimizer_seconds; }));
  EXPECT_DOUBLE_EQ(r.data_ms, median_of([](const auto& m) { return m.data_seconds; }));
  EXPECT_EQ(r.comm_ms, 0.0);  // one process
  EXPECT_GT(r.forward_ms, 0);
  EXPECT_GT(r.backward_ms, 0);
  EXPECT_GT(r.optimizer_ms, 0);
  EXPECT_GE(r.other_ms, 0);

  // The JSON carries the same figures.
  const auto j = nlohmann::json::parse(r.json());
  EXPECT_EQ(j["engine"], "athanor");
  EXPECT_EQ(j["steps"], 3);
  EXPECT_EQ(j["targets_per_step"], 64);
  EXPECT_NEAR(j["median_ms"].get<double>(), r.median_ms, 1e-6 * r.median_ms);
  EXPECT_NEAR(j["throughput"].get<double>(), r.throughput, 1e-6 * r.throughput);
  EXPECT_EQ(j["step_ms"].size(), 3u);
  EXPECT_EQ(j["peak_bytes"]["parameter"].get<size_t>(), r.memory.peak_of(MemTag::parameter));
  EXPECT_TRUE(j.contains("minor_faults_per_step"));
  EXPECT_TRUE(j.contains("system_allocs_per_step"));
  EXPECT_NEAR(j["phase_ms"]["forward"].get<double>(), r.forward_ms, 1e-6 * r.forward_ms);
  EXPECT_NEAR(j["phase_ms"]["other"].get<double>(), r.other_ms, 1e-6 * r.other_ms + 1e-9);
  EXPECT_TRUE(j["phase_ms"].contains("optimizer") && j["phase_ms"].contains("comm") && j["phase_ms"].contains("data"));
  EXPECT_NE(r.text().find("tok/s"), std::string::npos);
  EXPECT_NE(r.text().find("phases"), std::string::npos);
  // The schema bench/*.py and the report read: these keys, in this order.
  std::vector<std::string> keys;
  const auto ordered = nlohmann::ordered_json::parse(r.json());  // (a temporary would die before the loop)
  for (const auto& [k, v] : ordered.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "engine", "name", "model", "precision", "unit", "targets_per_step", "parameters", "warmup", "steps",
                      "step_ms", "min_ms", "median_ms", "max_ms", "throughput", "throughput_mean", "flops_per_step",
                      "achieved_gflops", "peak_gflops", "peak_source", "gemm_gflops", "mfu", "gemm_efficiency",
                      "minor_faults_per_step", "major_faults_per_step", "thread_minor_faults_per_step",
                      "system_allocs_per_step", "system_frees_per_step", "final_loss", "phase_ms", "peak_bytes",
                      "reserved_bytes", "device"}));
  EXPECT_EQ(ordered["device"], "cpu");  // trainer.device: the memory figures are that device's allocator's
  // Strings are escaped (a name with quotes and a backslash survives the round trip).
  train::BenchResult odd = r;
  odd.name = "a \"quoted\" \\ name\n";
  EXPECT_EQ(nlohmann::json::parse(odd.json())["name"], odd.name);
}

// No peak given: MFU is against the CPU's theoretical peak for the precision (cpu_peak.h), in
// the training log and in the bench, and GEMM efficiency (against the probe) is printed beside it.
TEST(Bench, MfuIsAgainstTheTheoreticalPeakAndTheLogPrintsGemmEfficiencyBesideIt) {
  const std::string dir = testing::fresh_temp_dir("bench_mfu_peak");
  train::Trainer t(tiny_gpt(dir, {"trainer.log_every=1", "trainer.max_steps=4"}), /*write_run_files=*/false);
  std::string log;
  t.set_output([&](const std::string& s) { log += s; });
  const cpu::CpuPeak peak = cpu::cpu_peak(DType::f32, omp_get_max_threads());
  train::BenchOptions opts;
  opts.warmup = 1;
  opts.steps = 2;
  const train::BenchResult r = train::run_bench(t, opts);  // peak_gflops 0: the hardware's
  EXPECT_DOUBLE_EQ(r.peak_gflops, peak.gflops);
  EXPECT_NE(r.peak_source.find(peak.engine), std::string::npos) << r.peak_source;  // describe(): cores x units x ...
  EXPECT_NEAR(r.mfu, r.achieved_gflops / peak.gflops, 1e-12);
  EXPECT_NE(r.text().find("GEMM eff."), std::string::npos) << r.text();

  // The trainer's own measure, one more step: the step line prints both.
  t.fit();
  EXPECT_DOUBLE_EQ(t.peak_flops(), peak.gflops * 1e9);
  ASSERT_GT(t.gemm_flops(), 0);
  const observe::StepMetrics& m = t.history().back();
  EXPECT_NEAR(m.mfu, m.flops / m.step_seconds / (peak.gflops * 1e9), 1e-12);
  EXPECT_NEAR(m.gemm_efficiency, m.flops / m.step_seconds / t.gemm_flops(), 1e-12);
  EXPECT_NE(log.find("MFU against a peak of"), std::string::npos) << log;
  const size_t line = log.rfind("step 4/4");
  ASSERT_NE(line, std::string::npos) << log;
  const std::string last = log.substr(line, log.find('\n', line) - line);
  char mfu_text[32] = {}, eff_text[32] = {};
  const size_t at = last.find("| MFU ");
  ASSERT_NE(at, std::string::npos) << last;
  ASSERT_EQ(std::sscanf(last.c_str() + at, "| MFU %31[0-9.]%% (GEMM eff %31[0-9]%%)", mfu_text, eff_text), 2) << last;
  EXPECT_NEAR(std::stod(mfu_text), 100 * m.mfu, 0.051) << last;
  EXPECT_NEAR(std::stod(eff_text), 100 * m.gemm_efficiency, 0.51) << last;
}

TEST(Bench, GptFlopsMatchAHandCountOfTheShapes) {
  const std::string dir = testing::fresh_temp_dir("bench_flops_gpt");
  train::Trainer t(tiny_gpt(dir), /*write_run_files=*/false);
  // By hand: d=16, V=256, T=16, 1 layer with biases. N excludes the position embedding.
  const double d = 16, V = 256, T = 16, L = 1;
  const double block = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * 4 * d + 4 * d) + (4 * d * d + d);
  const double N = V * d + L * block + 2 * d;  // wte (tied lm_head), blocks, ln_f
  EXPECT_EQ(t.task().module().parameters_count(), static_cast<int64_t>(N + T * d));
  const double tokens = 4 * T;
  EXPECT_DOUBLE_EQ(train::training_flops_per_step(t), 6 * N * tokens + 12 * L * d * T * tokens);
}

TEST(Bench, MlpFlopsMatchAHandCount) {
  ATHANOR_SKIP_IF_MISSING(!fs::exists(data::default_fashion_mnist_dir() + "/train-images-idx3-ubyte.gz"),
                          "dataset-fashion-mnist is not installed");
  const std::string dir = testing::fresh_temp_dir("bench_flops_mlp");
  train::Trainer t(train::Config::parse("model: {type: mlp, sizes: [784, 32, 10]}\n"
                                        "data: {type: fashion_mnist, num_workers: 0}\n"
                                        "optimizer: {type: sgd, lr: 0.1}\n"
                                        "trainer: {batch_size: 16, accum_steps: 2, max_steps: 3, eval_every: 0}\n",
                                        "bench_mlp.yaml", {"out_dir=" + dir}),
                   false);
  const double params = 784 * 32 + 32 + 32 * 10 + 10;
  EXPECT_DOUBLE_EQ(train::training_flops_per_step(t), 6 * params * 32);  // 2 micro-batches of 16
  t.set_output([](const std::string&) {});
  train::BenchOptions opts;
  opts.warmup = 1;
  opts.steps = 2;
  opts.peak_gflops = 50;
  const auto r = train::run_bench(t, opts);
  EXPECT_EQ(r.unit, "samples");
  EXPECT_EQ(r.targets_per_step, 32);
}

TEST(Bench, GemmProbeGivesAPlausibleRate) {
  // Bounds, not a figure: a 2-core machine reaches O(100) GFLOP/s; a broken probe
  // (wrong FLOP count, untimed work) lands outside by orders of magnitude.
  const double f32 = train::measure_gemm_gflops("f32");
  EXPECT_GT(f32, 0.5);
  EXPECT_LT(f32, 20000);
}

TEST(Bench, BadOptionsAreClearErrors) {
  const std::string dir = testing::fresh_temp_dir("bench_errors");
  train::Trainer t(tiny_gpt(dir), /*write_run_files=*/false);
  t.set_output([](const std::string&) {});
  train::BenchOptions opts;
  opts.steps = 0;
  EXPECT_NE(testing::error_message([&] { train::run_bench(t, opts); }).find("--steps"), std::string::npos);
  opts.steps = 1;
  opts.warmup = -1;
  EXPECT_NE(testing::error_message([&] { train::run_bench(t, opts); }).find("--warmup"), std::string::npos);
  opts.warmup = 3;
  opts.steps = 3;  // 6 > max_steps 5
  const std::string msg = testing::error_message([&] { train::run_bench(t, opts); });
  EXPECT_NE(msg.find("trainer.max_steps"), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs 6"), std::string::npos) << msg;
  EXPECT_EQ(t.step(), 0);  // refused before any step ran
}

}  // namespace athanor
