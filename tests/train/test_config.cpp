// The YAML config: defaults, types, overrides, did-you-mean, keys that do not
// apply to the chosen model, and the resolved config written back.
#include "athanor/train/config.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
using train::Config;

TEST(Config, DefaultsTypesAndOverrides) {
  Config c = Config::parse("model:\n  type: gpt\n  n_layer: 6\ntrainer:\n  batch_size: 16\noptimizer:\n  lr: 3e-4\n", "test.yaml",
                           {"trainer.max_steps=50", "model.dropout=0.1"});
  EXPECT_EQ(c.get_int("model.n_layer"), 6);
  EXPECT_EQ(c.get_int("model.n_head"), 4);  // default
  EXPECT_EQ(c.get_int("trainer.max_steps"), 50);
  EXPECT_DOUBLE_EQ(c.get_float("optimizer.lr"), 3e-4);
  EXPECT_DOUBLE_EQ(c.get_float("model.dropout"), 0.1);
  EXPECT_TRUE(c.is_set("trainer.batch_size"));
  EXPECT_FALSE(c.is_set("trainer.accum_steps"));
  Config l = Config::parse("model: {type: mlp, sizes: [784, 128, 10]}\ndata: {type: fashion_mnist}\n", "t.yaml");
  EXPECT_EQ(l.get_int_list("model.sizes"), (std::vector<int64_t>{784, 128, 10}));
}

TEST(Config, UnknownKeySuggestsTheNearest) {
  const std::string msg = error_message([] { Config::parse("trainer:\n  max_stpes: 10\n", "run.yaml"); });
  EXPECT_NE(msg.find("run.yaml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown key 'trainer.max_stpes'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'trainer.max_steps'?"), std::string::npos) << msg;
  const std::string o = error_message([] { Config::parse("", "x.yaml", {"optimiser.lr=1"}); });
  EXPECT_NE(o.find("did you mean 'optimizer.lr'?"), std::string::npos) << o;
}

TEST(Config, WrongTypeNamesKeyExpectedTypeAndValue) {
  const std::string msg = error_message([] { Config::parse("trainer:\n  batch_size: lots\n", "run.yaml"); });
  EXPECT_NE(msg.find("'trainer.batch_size' must be an integer, got 'lots'"), std::string::npos) << msg;
  EXPECT_NE(error_message([] { Config::parse("model: {bias: maybe}", "r.yaml"); }).find("boolean"), std::string::npos);
  EXPECT_NE(error_message([] { Config::parse("model: {sizes: 7, type: mlp}", "r.yaml"); }).find("list of integers"), std::string::npos);
  const std::string choice = error_message([] { Config::parse("optimizer: {type: adamm}", "r.yaml"); });
  EXPECT_NE(choice.find("did you mean 'adam'?"), std::string::npos) << choice;
}

TEST(Config, KeysOfAnotherModelTypeAreRejected) {
  const std::string msg = error_message([] { Config::parse("model:\n  type: mlp\n  n_layer: 3\n", "r.yaml"); });
  EXPECT_NE(msg.find("'model.n_layer' does not apply when model.type is 'mlp'"), std::string::npos) << msg;
}

TEST(Config, InvalidYamlAndMissingFile) {
  const std::string msg = error_message([] { Config::parse("model:\n  type: [gpt\n", "bad.yaml"); });
  EXPECT_NE(msg.find("bad.yaml: invalid YAML at line"), std::string::npos) << msg;
  const std::string missing = error_message([] { Config::load("/nonexistent/run.yaml"); });
  EXPECT_NE(missing.find("/nonexistent/run.yaml"), std::string::npos) << missing;
  EXPECT_NE(error_message([] { Config::parse("", "x", {"trainer.max_steps"}); }).find("key.path=value"), std::string::npos);
}

TEST(Config, ResolvedYamlRoundTrips) {
  Config c = Config::parse("model: {type: mlp, sizes: [10, 5, 2]}\ndata: {type: fashion_mnist}\n", "a.yaml", {"seed=7"});
  const std::string y = c.resolved_yaml();
  EXPECT_EQ(y.find("n_layer"), std::string::npos) << y;  // gpt-only keys are not written for an mlp
  Config again = Config::parse(y, "resolved.yaml");
  EXPECT_EQ(again.get_int("seed"), 7);
  EXPECT_EQ(again.get_int_list("model.sizes"), (std::vector<int64_t>{10, 5, 2}));
  EXPECT_EQ(again.resolved_yaml(), y);
}

}  // namespace athanor
