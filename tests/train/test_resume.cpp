// Resuming training: N steps straight and N/2 + checkpoint + resume (a new
// Trainer) + N/2 give bitwise-identical weights and identical per-step losses
// (dropout on, two loader workers); resume: auto picks the newest valid
// checkpoint and skips a damaged one; a config that changes the model shape is
// refused naming the key; changing max_steps is allowed; SIGTERM saves and stops.
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "athanor/ckpt/checkpoint.h"
#include "athanor/train/checkpointer.h"
#include "athanor/train/trainer.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
namespace fs = std::filesystem;

namespace {
// Per-file prefix: test files run in parallel under ctest.
std::string tmp_dir(const std::string& name) { return testing::fresh_temp_dir("resume_" + name); }


train::Config gpt_config(const std::string& dir, const std::string& text, std::vector<std::string> overrides) {
  overrides.push_back("out_dir=" + dir);
  return train::Config::parse(
      "model: {type: gpt, n_layer: 1, n_head: 2, n_embd: 16, block_size: 16, dropout: 0.1}\n"
      "data: {type: text, tokenizer: byte, corpus: " + text + ", cache_dir: " + dir + "/cache, num_workers: 2}\n"
      "optimizer: {type: adamw, lr: 0.01, weight_decay: 0.1}\n"
      "schedule: {warmup_steps: 1, decay: cosine}\n"
      "trainer: {max_steps: 8, batch_size: 4, eval_every: 0, eval_batches: 1, sample_tokens: 4, log_every: 1}\n",
      "resume.yaml", overrides);
}

// Raw bytes of every tensor of the state dict: bitwise comparison.
std::vector<std::string> weight_bytes(train::Trainer& t) {
  std::vector<std::string> out;
  for (auto& [n, p] : t.task().module().state_dict()) {
    Tensor c = p.contiguous();
    out.emplace_back(static_cast<const char*>(c.raw_data()), static_cast<size_t>(c.nbytes()));
  }
  return out;
}
std::vector<double> losses(const std::deque<train::StepMetrics>& h) {
  std::vector<double> out;
  for (const auto& m : h) out.push_back(m.loss);
  return out;
}
void quiet(train::Trainer& t) { t.set_output([](const std::string&) {}); }

// Sends this process SIGTERM after optimizer step `at`: fit() finishes the step, saves and returns.
struct RaiseAt : train::Callback {
  explicit RaiseAt(int64_t at) : at(at) {}
  int64_t at;
  void on_step(const train::StepMetrics& m) override {
    if (m.step == at) std::raise(SIGTERM);
  }
};
}  // namespace

// `extra`: overrides of both runs (precision, scaler). Also checks the GradScaler state.
void check_bit_exact_continuation(const std::string& name, const std::vector<std::string>& extra) {
  const std::string dir = tmp_dir(name);
  auto with = [&](std::vector<std::string> o) {
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
  };
  const std::string text = testing::write_tiny_text(dir);
  // Straight: 8 steps.
  std::vector<std::string> straight_w;
  std::vector<double> straight_l;
  double straight_scale = 0;
  int64_t straight_growth = 0;
  {
    train::Trainer t(gpt_config(dir, text, with({"name=straight"})));
    quiet(t);
    t.fit();
    EXPECT_EQ(t.step(), 8);
    straight_w = weight_bytes(t);
    straight_l = losses(t.history());
    straight_scale = t.scaler().get_scale();
    straight_growth = t.scaler().growth_tracker();
  }
  // 4 steps, checkpoint (the end of fit), then a new Trainer resumes and trains to 8.
  std::string ckpt_dir;
  std::vector<double> first_l;
  {
    train::Trainer t(gpt_config(dir, text, with({"name=split", "checkpoint.every=3"})));
    quiet(t);
    t.add_callback(std::make_shared<RaiseAt>(4));
    t.fit();
    EXPECT_TRUE(t.stopped_by_signal());
    EXPECT_EQ(t.step(), 4);
    first_l = losses(t.history());
    ckpt_dir = ckpt::find_latest_valid(t.checkpoints_dir()).path;
    EXPECT_EQ(fs::path(ckpt_dir).filename().string(), "step-000004");
  }
  // Scramble the global RNG in between, as another run in the same process would.
  manual_seed(999);
  // health.jsonl is cut back to the checkpoint like metrics.jsonl: a line of step 6 belongs
  // to the abandoned continuation, one of step 2 stays.
  const fs::path health = fs::path(dir) / "split" / "health.jsonl";
  std::ofstream(health, std::ios::app) << "{\"kind\":\"test\",\"step\":2}\n{\"kind\":\"test\",\"step\":6}\n";
  {
    train::Trainer t(gpt_config(dir, text, with({"name=split", "checkpoint.every=3"})));
    quiet(t);
    t.resume_from(ckpt_dir);
    EXPECT_EQ(t.step(), 4);
    std::stringstream hs;
    hs << std::ifstream(health).rdbuf();
    EXPECT_NE(hs.str().find("\"step\":2}"), std::string::npos) << hs.str();
    EXPECT_EQ(hs.str().find("\"step\":6}"), std::string::npos) << hs.str();
    t.fit();
    EXPECT_EQ(t.step(), 8);
    std::vector<double> all = first_l;
    for (double l : losses(t.history())) all.push_back(l);
    ASSERT_EQ(all.size(), straight_l.size());
    for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], straight_l[i]) << "loss of step " << i + 1;
    const auto w = weight_bytes(t);
    ASSERT_EQ(w.size(), straight_w.size());
    for (size_t i = 0; i < w.size(); ++i) EXPECT_TRUE(w[i] == straight_w[i]) << "tensor " << i << " differs";
    EXPECT_EQ(t.scaler().get_scale(), straight_scale);
    EXPECT_EQ(t.scaler().growth_tracker(), straight_growth);
  }
  // The split run's metrics.jsonl reads as one run: steps 1..8 once each.
  std::ifstream mf(fs::path(dir) / "split" / "metrics.jsonl");
  std::string line;
  int train_lines = 0;
  while (std::getline(mf, line))
    if (line.find("\"loss\"") != std::string::npos) ++train_lines;
  EXPECT_EQ(train_lines, 8);
}

TEST(Resume, BitExactContinuation) { check_bit_exact_continuation("bitexact", {}); }
TEST(Resume, BitExactContinuationBf16) { check_bit_exact_continuation("bitexact_bf16", {"trainer.precision=bf16"}); }
// The next step's batches fetched (and, on cuda, uploaded) during this step: the checkpoints
// at step 3 and at the signal after step 4 are taken with a prefetched batch in hand, and must
// record the position of the batch the next step trains on (train/batch_feed.h).
TEST(Resume, BitExactContinuationWithDevicePrefetch) {
  check_bit_exact_continuation("bitexact_prefetch", {"data.device_prefetch=on"});
}
// f16: scale 2^10 growing ×2 every 3 clean steps, so the split at step 4 falls inside a growth interval.
TEST(Resume, BitExactContinuationF16) {
  check_bit_exact_continuation("bitexact_f16", {"trainer.precision=f16", "scaler.init_scale=1024", "scaler.growth_interval=3"});
}

TEST(Resume, SplitWithoutResumeDiffers) {
  // The test above can fail: without restoring the state the weights differ.
  const std::string dir = tmp_dir("differs");
  const std::string text = testing::write_tiny_text(dir);
  train::Trainer a(gpt_config(dir, text, {"name=a", "trainer.max_steps=2"}));
  quiet(a);
  a.fit();
  train::Trainer b(gpt_config(dir, text, {"name=b", "trainer.max_steps=4"}));
  quiet(b);
  b.load_weights((fs::path(dir) / "a" / "model.safetensors").string());  // weights only: no optimizer, RNG or loader state
  for (int i = 0; i < 2; ++i) b.train_step();
  train::Trainer c(gpt_config(dir, text, {"name=c", "trainer.max_steps=4"}));
  quiet(c);
  for (int i = 0; i < 4; ++i) c.train_step();
  EXPECT_NE(weight_bytes(b), weight_bytes(c));
}

TEST(Resume, AutoUsesNewestValidAndSkipsDamaged) {
  const std::string dir = tmp_dir("auto");
  const std::string text = testing::write_tiny_text(dir);
  {
    train::Trainer t(gpt_config(dir, text, {"name=r", "trainer.max_steps=6", "checkpoint.every=2", "checkpoint.keep_last=0"}));
    quiet(t);
    t.fit();
  }
  const fs::path cdir = fs::path(dir) / "r" / "checkpoints";
  ASSERT_TRUE(fs::exists(cdir / "step-000006"));
  ASSERT_TRUE(fs::exists(cdir / "step-000002"));
  // Damage the newest.
  {
    std::fstream f(cdir / "step-000006" / "optimizer.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x7f');
  }
  std::string log;
  train::Config c = gpt_config(dir, text, {"name=r", "trainer.max_steps=10", "resume=auto"});
  // The constructor resumes (messages go to stdout before set_output): check the outcome.
  train::Trainer t(c);
  EXPECT_EQ(t.step(), 4);
  EXPECT_EQ(t.max_steps(), 10);  // max_steps may change
  t.set_output([&](const std::string& s) { log += s; });
  EXPECT_TRUE(t.resume_latest());
  EXPECT_NE(log.find("step-000006"), std::string::npos) << log;
  EXPECT_NE(log.find("optimizer.safetensors"), std::string::npos) << log;
  EXPECT_NE(log.find("step-000004"), std::string::npos) << log;
}

// A `latest` that names a checkpoint that is not there (deleted by hand): resume still goes on
// from the newest valid one, and says that `latest` was wrong.
TEST(Resume, AStaleLatestIsSaidAndTheNewestValidCheckpointIsUsed) {
  const std::string dir = tmp_dir("stale_latest");
  const std::string text = testing::write_tiny_text(dir);
  {
    train::Trainer t(gpt_config(dir, text, {"name=r", "trainer.max_steps=6", "checkpoint.every=2", "checkpoint.keep_last=0"}));
    quiet(t);
    t.fit();
  }
  const fs::path cdir = fs::path(dir) / "r" / "checkpoints";
  ASSERT_EQ(ckpt::read_latest(cdir.string()), "step-000006");
  EXPECT_EQ(train::stale_latest_note(cdir.string()), "");  // a correct latest: nothing to say
  fs::remove_all(cdir / "step-000006");
  train::Trainer t(gpt_config(dir, text, {"name=r", "trainer.max_steps=10", "resume=auto"}));
  EXPECT_EQ(t.step(), 4);
  std::string log;
  t.set_output([&](const std::string& s) { log += s; });
  EXPECT_TRUE(t.resume_latest());
  EXPECT_EQ(t.step(), 4);
  EXPECT_NE(log.find("warning: " + (cdir / "latest").string() + " names 'step-000006', which is not in " + cdir.string()),
            std::string::npos) << log;
  EXPECT_NE(log.find("resuming from the newest valid checkpoint, step-000004, instead"), std::string::npos) << log;
  // No checkpoint left at all: said too, and nothing is resumed.
  for (const char* d : {"step-000002", "step-000004"}) fs::remove_all(cdir / d);
  log.clear();
  EXPECT_FALSE(t.resume_latest());
  EXPECT_NE(log.find("no valid checkpoint is left"), std::string::npos) << log;
}

TEST(Resume, RefusesAChangedModelShape) {
  const std::string dir = tmp_dir("shape");
  const std::string text = testing::write_tiny_text(dir);
  std::string ck;
  {
    train::Trainer t(gpt_config(dir, text, {"name=s", "trainer.max_steps=2", "checkpoint.every=2"}));
    quiet(t);
    t.fit();
    ck = ckpt::find_latest_valid(t.checkpoints_dir()).path;
  }
  ASSERT_FALSE(ck.empty());
  train::Trainer wider(gpt_config(dir, text, {"name=s", "model.n_embd=32"}));
  quiet(wider);
  const std::string msg = error_message([&] { wider.resume_from(ck); });
  EXPECT_NE(msg.find("model.n_embd"), std::string::npos) << msg;
  EXPECT_NE(msg.find("16"), std::string::npos) << msg;
  EXPECT_NE(msg.find("32"), std::string::npos) << msg;
  // Dropout and max_steps are not shape: allowed.
  train::Trainer ok(gpt_config(dir, text, {"name=s", "model.dropout=0.2", "trainer.max_steps=3"}));
  quiet(ok);
  EXPECT_NO_THROW(ok.resume_from(ck));
  EXPECT_EQ(ok.step(), 2);
  EXPECT_TRUE(ok.train_step());
  EXPECT_FALSE(ok.train_step());
}

TEST(Resume, CheckpointLayoutUsesLogicalNamesAndFullState) {
  const std::string dir = tmp_dir("layout");
  const std::string text = testing::write_tiny_text(dir);
  train::Trainer t(gpt_config(dir, text, {"name=l", "trainer.max_steps=2"}));
  quiet(t);
  for (int i = 0; i < 2; ++i) t.train_step();
  const fs::path ck = t.save_checkpoint();
  EXPECT_EQ(ck.filename().string(), "step-000002");
  const auto optim = ckpt::load_safetensors((ck / "optimizer.safetensors").string());
  EXPECT_NE(optim.find("exp_avg.transformer.h.0.attn.c_attn.weight"), nullptr);
  EXPECT_NE(optim.find("exp_avg_sq.transformer.h.0.attn.c_attn.weight"), nullptr);
  std::ifstream f(ck / "state.json");
  const std::string state((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (const char* key : {"\"step\": 2", "\"loader\"", "\"rng\"", "\"scheduler_step\": 2", "\"scalars\"", "\"config_hash\"",
                          "\"version\"", "\"model.n_embd\": \"16\""})
    EXPECT_NE(state.find(key), std::string::npos) << key << " not in state.json:\n" << state;
  const auto m = ckpt::verify_checkpoint(ck.string());
  EXPECT_EQ(m.files.size(), 3u);
}

TEST(Resume, SigtermFinishesTheStepSavesAndReturns) {
  const std::string dir = tmp_dir("sigterm");
  const std::string text = testing::write_tiny_text(dir);
  train::Trainer t(gpt_config(dir, text, {"name=t"}));  // checkpoint.every = 0: the signal still saves
  quiet(t);
  t.add_callback(std::make_shared<RaiseAt>(3));
  t.fit();
  EXPECT_TRUE(t.stopped_by_signal());
  EXPECT_EQ(t.step(), 3);
  const auto found = ckpt::find_latest_valid(t.checkpoints_dir());
  EXPECT_EQ(found.step, 3);
  EXPECT_EQ(ckpt::read_latest(t.checkpoints_dir()), "step-000003");
  EXPECT_FALSE(t.evals().empty());  // the CLI reports the last evaluation
}

}  // namespace athanor
