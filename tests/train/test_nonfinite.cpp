// The non-finite policy and the NaN doctor, on deliberately broken runs trained
// through Trainer(Config, Task): a named layer that multiplies by inf at one step
// (policy stop: an Error naming the module and op, health.jsonl, the saved inputs),
// a NaN in one data sample (the first op and the sample id are named), policy skip
// (the update is skipped and training goes on) and rollback (the last checkpoint is
// reloaded with a lower lr, the factor survives a resume).
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "athanor/ckpt/checkpoint.h"
#include "athanor/ckpt/safetensors.h"
#include "athanor/nn/layers.h"
#include "athanor/nn/mlp.h"
#include "athanor/ops.h"
#include "athanor/train/trainer.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
namespace fs = std::filesystem;

namespace {
std::string tmp_dir(const std::string& name) { return testing::fresh_temp_dir("nonfinite_" + name); }
bool have_fashion() { return fs::exists(data::default_fashion_mnist_dir() + "/train-images-idx3-ubyte.gz"); }

// Multiplies its input by inf while armed: a layer that "blows up".
class Poison : public nn::Module {
 public:
  bool armed = false;
  Tensor forward(const Tensor& x) {
    auto scope = enter();
    return armed ? mul(x, INFINITY) : x;
  }
};
class Body : public nn::Module {
 public:
  Body() {
    fc = register_module("fc", std::make_shared<nn::Linear>(16, 16));
    drop = register_module("drop", std::make_shared<nn::Dropout>(0.2));  // draws from the default generator
    poison = register_module("poison", std::make_shared<Poison>());
  }
  Tensor forward(const Tensor& x) {
    auto scope = enter();
    return poison->forward(drop->forward(tanh(fc->forward(x))));
  }
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<Poison> poison;
};
class ToyLM : public nn::Module {
 public:
  ToyLM() {
    embed = register_module("embed", std::make_shared<nn::Embedding>(256, 16));
    body = register_module("body", std::make_shared<Body>());
    head = register_module("head", std::make_shared<nn::Linear>(16, 256));
  }
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<Body> body;
  std::shared_ptr<nn::Linear> head;
};
class ToyLMTask : public train::Task {
 public:
  ToyLMTask() { manual_seed(7); model = std::make_shared<ToyLM>(); }
  nn::Module& module() override { return *model; }
  Tensor loss(const data::Batch& b) override {
    Tensor logits = model->head->forward(model->body->forward(model->embed->forward(b.input)));
    return cross_entropy(reshape(logits, {-1, 256}), reshape(b.target, {-1}));
  }
  void evaluate(const data::Batch& b, double& loss_sum, int64_t&) override { loss_sum += loss(b).item() * b.num_targets; }
  bool is_classifier() const override { return false; }
  std::shared_ptr<ToyLM> model;
};

// Arms the poison after step `arm_after` and disarms it after the step that was skipped
// (on_step) or rolled back (on_health "rollback").
struct Arming : train::Callback, observe::MetricsSink {
  Arming(ToyLMTask* t, int64_t arm_after) : task(t), arm_after(arm_after) {}
  ToyLMTask* task;
  int64_t arm_after;
  void on_step(const train::StepMetrics& m) override {
    if (m.step == arm_after) task->model->body->poison->armed = true;
    if (m.step == arm_after + 1) task->model->body->poison->armed = false;
  }
  void on_health(const observe::HealthEvent& e) override {
    if (e.kind == "rollback") task->model->body->poison->armed = false;
  }
};

train::Config text_config(const std::string& dir, const std::string& text, std::vector<std::string> overrides) {
  overrides.push_back("out_dir=" + dir);
  overrides.push_back("observe.peak_gflops=100");
  return train::Config::parse(
      "data: {type: text, tokenizer: byte, corpus: " + text + ", cache_dir: " + dir + "/cache, num_workers: 0}\n"
      "model: {block_size: 16}\n"
      "optimizer: {type: adamw, lr: 0.01}\n"
      "trainer: {max_steps: 8, batch_size: 4, eval_every: 0, eval_batches: 1, log_every: 1}\n",
      "toy.yaml", overrides);
}

std::vector<nlohmann::json> jsonl(const fs::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream f(p);
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::vector<std::string> weight_bytes(train::Trainer& t) {
  std::vector<std::string> out;
  for (auto& [n, p] : t.task().module().state_dict()) {
    Tensor c = p.contiguous();
    out.emplace_back(static_cast<const char*>(c.raw_data()), static_cast<size_t>(c.nbytes()));
  }
  return out;
}
}  // namespace

TEST(NonFinite, StopNamesTheModuleAndOpAndSavesTheInputs) {
  const std::string dir = tmp_dir("stop");
  const std::string text = testing::write_tiny_text(dir);
  auto task = std::make_unique<ToyLMTask>();
  ToyLMTask* raw = task.get();
  train::Trainer t(text_config(dir, text, {"name=stop"}), std::move(task));
  std::string log;
  t.set_output([&](const std::string& s) { log += s; });
  t.add_callback(std::make_shared<Arming>(raw, 2));
  const std::string msg = error_message([&] { t.fit(); });
  EXPECT_EQ(t.step(), 2);  // step 3 was not applied
  EXPECT_NE(msg.find("body.poison"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mul"), std::string::npos) << msg;
  const fs::path run = fs::path(dir) / "stop";
  const auto events = jsonl(run / "health.jsonl");
  ASSERT_FALSE(events.empty());
  const auto& e = events[0];
  EXPECT_EQ(e["kind"], "nan_origin");
  EXPECT_EQ(e["step"], 3);
  EXPECT_EQ(e["details"]["module"].get<std::string>().find("body.poison") != std::string::npos, true) << e.dump();
  EXPECT_EQ(e["details"]["op"], "mul");
  EXPECT_EQ(e["details"]["phase"], "forward");
  EXPECT_FALSE(e["suggestions"].empty());
  // The op's inputs and the batch, saved and loadable; the input is finite (the op made the inf).
  const fs::path saved = run / "nonfinite-step-000003.safetensors";
  ASSERT_TRUE(fs::exists(saved)) << e.dump();
  auto file = ckpt::load_safetensors(saved.string());
  ASSERT_NE(file.find("input.0"), nullptr);
  ASSERT_NE(file.find("batch.input"), nullptr);
  for (double v : file.find("input.0")->to_vector()) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(file.metadata["module"], e["details"]["module"].get<std::string>());
  // A checkpoint of the state before the failing step was saved.
  EXPECT_FALSE(ckpt::find_latest_valid(t.checkpoints_dir()).path.empty());
}

TEST(NonFinite, DiagnosisKeepsTheRunDeterministic) {
  // Policy skip with and without the diagnosis replay: identical weights afterwards.
  const std::string dir = tmp_dir("determinism");
  const std::string text = testing::write_tiny_text(dir);
  std::vector<std::string> w[2];
  for (int diag = 0; diag < 2; ++diag) {
    auto task = std::make_unique<ToyLMTask>();
    ToyLMTask* raw = task.get();
    train::Trainer t(text_config(dir, text, {"name=d" + std::to_string(diag), "health.nonfinite_policy=skip",
                                             std::string("health.diagnose_nonfinite=") + (diag ? "true" : "false")}),
                     std::move(task));
    t.set_output([](const std::string&) {});
    t.add_callback(std::make_shared<Arming>(raw, 2));
    t.fit();
    EXPECT_EQ(t.skipped_steps(), 1);
    w[diag] = weight_bytes(t);
  }
  EXPECT_TRUE(w[0] == w[1]);
}

TEST(NonFinite, SkipSkipsTheUpdateAndGoesOn) {
  const std::string dir = tmp_dir("skip");
  const std::string text = testing::write_tiny_text(dir);
  auto task = std::make_unique<ToyLMTask>();
  ToyLMTask* raw = task.get();
  train::Trainer t(text_config(dir, text, {"name=skip", "health.nonfinite_policy=skip"}), std::move(task));
  t.set_output([](const std::string&) {});
  auto arming = std::make_shared<Arming>(raw, 2);
  t.add_callback(arming);
  std::vector<std::string> before;
  struct Snapshot : train::Callback {
    train::Trainer* t;
    std::vector<std::string>* out;
    void on_step(const train::StepMetrics& m) override {
      if (m.step == 2) *out = weight_bytes(*t);
    }
  };
  auto snap = std::make_shared<Snapshot>();
  snap->t = &t;
  snap->out = &before;
  t.add_callback(snap);
  // Stop after step 3 to compare the weights.
  while (t.step() < 3) t.train_step();
  EXPECT_TRUE(t.history().back().skipped);
  EXPECT_TRUE(weight_bytes(t) == before);  // nothing was updated
  t.fit();
  EXPECT_EQ(t.step(), 8);
  EXPECT_EQ(t.skipped_steps(), 1);
  std::vector<std::string> kinds;
  for (const auto& e : t.health_events()) kinds.push_back(e.kind);
  EXPECT_EQ(kinds, (std::vector<std::string>{"nan_origin", "skipped_step"}));
  for (size_t i = 3; i < t.history().size(); ++i) EXPECT_FALSE(t.history()[i].skipped);
}

TEST(NonFinite, RollbackReloadsTheLastCheckpointWithALowerLr) {
  const std::string dir = tmp_dir("rollback");
  const std::string text = testing::write_tiny_text(dir);
  auto task = std::make_unique<ToyLMTask>();
  ToyLMTask* raw = task.get();
  train::Trainer t(text_config(dir, text, {"name=rb", "health.nonfinite_policy=rollback", "health.rollback_lr_factor=0.25",
                                           "checkpoint.every=2", "checkpoint.keep_last=0"}),
                   std::move(task));
  t.set_output([](const std::string&) {});
  auto arming = std::make_shared<Arming>(raw, 4);  // step 5 blows up; the checkpoint of step 4 is there
  t.add_callback(arming);
  t.add_sink(arming);
  t.fit();
  EXPECT_EQ(t.step(), 8);
  EXPECT_DOUBLE_EQ(t.lr_factor(), 0.25);
  bool rolled = false;
  for (const auto& e : t.health_events())
    if (e.kind == "rollback") {
      rolled = true;
      EXPECT_EQ(e.details.at("to_step"), "4");
    }
  EXPECT_TRUE(rolled);
  // After the rollback the lr is a quarter of the (constant) schedule's.
  EXPECT_DOUBLE_EQ(t.history().back().lr, 0.01 * 0.25);
  // The factor is in the checkpoint and survives a resume.
  auto task2 = std::make_unique<ToyLMTask>();
  train::Trainer r(text_config(dir, text, {"name=rb", "trainer.max_steps=10", "health.nonfinite_policy=rollback"}), std::move(task2));
  r.set_output([](const std::string&) {});
  ASSERT_TRUE(r.resume_latest());
  EXPECT_EQ(r.step(), 8);
  EXPECT_DOUBLE_EQ(r.lr_factor(), 0.25);
  EXPECT_DOUBLE_EQ(r.optimizer().param_groups()[0].lr, 0.01 * 0.25);
}

TEST(NonFinite, RollbackWithoutACheckpointStops) {
  const std::string dir = tmp_dir("rollback_none");
  const std::string text = testing::write_tiny_text(dir);
  auto task = std::make_unique<ToyLMTask>();
  ToyLMTask* raw = task.get();
  train::Trainer t(text_config(dir, text, {"name=rb", "health.nonfinite_policy=rollback"}), std::move(task));
  t.set_output([](const std::string&) {});
  t.add_callback(std::make_shared<Arming>(raw, 1));
  const std::string msg = error_message([&] { t.fit(); });
  EXPECT_NE(msg.find("no valid checkpoint"), std::string::npos) << msg;
}

// A NaN in one data sample: the doctor names the first op that saw it and the sample id.
class NanSampleTask : public train::Task {
 public:
  NanSampleTask() { manual_seed(3); model = std::make_shared<nn::MLP>(std::vector<int64_t>{784, 32, 10}, "relu", 0.0); }
  nn::Module& module() override { return *model; }
  Tensor loss(const data::Batch& b) override {
    ++calls;
    if (calls == 3 && bad_id < 0) bad_id = b.sample_ids[1];  // corrupt one sample of step 3's batch
    Tensor x = b.input;
    for (size_t i = 0; i < b.sample_ids.size(); ++i)
      if (b.sample_ids[i] == bad_id) {
        x = b.input.contiguous().clone();
        const int64_t per = x.numel() / x.size(0);
        make_view(x, {per}, {1}, static_cast<int64_t>(i) * per).fill_(NAN);
      }
    return cross_entropy(model->forward(x), b.target);
  }
  void evaluate(const data::Batch&, double&, int64_t&) override {}
  bool is_classifier() const override { return true; }
  std::shared_ptr<nn::MLP> model;
  int calls = 0;
  int64_t bad_id = -1;
};

TEST(NonFinite, NanInASampleNamesTheFirstOpAndTheSampleId) {
  ATHANOR_SKIP_IF_MISSING(!have_fashion(), "dataset-fashion-mnist is not installed");
  const std::string dir = tmp_dir("nan_sample");
  auto task = std::make_unique<NanSampleTask>();
  NanSampleTask* raw = task.get();
  train::Trainer t(train::Config::parse("model: {type: mlp, sizes: [784, 32, 10]}\ndata: {type: fashion_mnist, num_workers: 0}\n"
                                        "optimizer: {type: sgd, lr: 0.1}\ntrainer: {max_steps: 5, batch_size: 16, eval_every: 0}\n",
                                        "nan.yaml", {"out_dir=" + dir, "name=nan", "observe.peak_gflops=100"}),
                   std::move(task));
  t.set_output([](const std::string&) {});
  const std::string msg = error_message([&] { t.fit(); });
  ASSERT_GE(raw->bad_id, 0);
  ASSERT_FALSE(t.health_events().empty()) << msg;
  const auto& e = t.health_events()[0];
  std::printf("nan_origin: %s\n", e.message.c_str());
  EXPECT_EQ(e.kind, "nan_origin");
  EXPECT_EQ(e.details.at("phase"), "forward");
  // The first op of the model saw the NaN in its input: MLP::forward flattens the images
  // first (a view, in the root module, whose path is ''), before layers.0.
  const std::string op = e.details.at("op");
  EXPECT_TRUE(op == "view" || op == "flatten" || op == "reshape") << e.message;
  EXPECT_EQ(e.details.at("module").find("layers"), std::string::npos) << e.details.at("module");
  EXPECT_NE(e.details.at("input_stats").find("nan"), std::string::npos) << e.details.at("input_stats");
  EXPECT_NE(e.details.at("sample_ids").find(std::to_string(raw->bad_id)), std::string::npos);
  bool names_sample = false;
  for (const auto& s : e.suggestions) names_sample |= s.find(std::to_string(raw->bad_id)) != std::string::npos;
  EXPECT_TRUE(names_sample);
  EXPECT_NE(msg.find(std::to_string(raw->bad_id)), std::string::npos) << msg;
}

}  // namespace athanor
