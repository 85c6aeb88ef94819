// model.type llama through the trainer: its config keys and their errors (file, key, hint),
// tp/pp refused before any work, bf16 and f16 autocast, activation checkpointing, bit-exact
// resume, samples, and the bench's model FLOPs. Tiny models, few steps.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "athanor/ckpt/checkpoint.h"
#include "athanor/train/bench.h"
#include "athanor/train/parallel_context.h"
#include "athanor/train/trainer.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
namespace fs = std::filesystem;

namespace {
std::string tmp_dir(const std::string& name) { return testing::fresh_temp_dir("llama_trainer_" + name); }

const char* kModel = "model: {type: llama, n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 32, intermediate_size: 64, block_size: 16}\n";

train::Config llama_config(const std::string& dir, const std::string& text, std::vector<std::string> overrides,
                           const std::string& model = kModel) {
  overrides.push_back("out_dir=" + dir);
  overrides.push_back("observe.peak_gflops=100");  // no GEMM probe in unit tests
  return train::Config::parse(
      model + "data: {type: text, tokenizer: byte, corpus: " + text + ", cache_dir: " + dir + "/cache, num_workers: 0}\n"
      "optimizer: {type: adamw, lr: 0.01, weight_decay: 0.1}\n"
      "schedule: {warmup_steps: 1, decay: cosine}\n"
      "trainer: {max_steps: 12, batch_size: 4, eval_every: 0, eval_batches: 1, sample_tokens: 4, log_every: 1}\n",
      "llama.yaml", overrides);
}
void quiet(train::Trainer& t) { t.set_output([](const std::string&) {}); }
std::vector<double> losses(const train::Trainer& t) {
  std::vector<double> out;
  for (const auto& m : t.history()) out.push_back(m.loss);
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
double mean(const std::vector<double>& v, size_t a, size_t b) {
  double s = 0;
  for (size_t i = a; i < b; ++i) s += v[i];
  return s / static_cast<double>(b - a);
}
}  // namespace

TEST(LlamaTrainer, ConfigBuildsTheLlamaAndResolvesItsKeys) {
  const std::string dir = tmp_dir("keys");
  const std::string text = write_tiny_text(dir);
  train::Trainer t(llama_config(dir, text, {"name=keys", "model.rope_theta=500000", "model.rope_scaling=llama3",
                                            "model.rope_factor=4", "model.tie_embeddings=true"}));
  quiet(t);
  auto* m = dynamic_cast<nn::Llama*>(&t.task().module());
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->config().n_kv_head, 2);
  EXPECT_EQ(m->config().intermediate_size, 64);
  EXPECT_EQ(m->config().rope_theta, 500000.0);
  ASSERT_TRUE(m->config().rope_scaling.has_value());
  EXPECT_EQ(m->config().rope_scaling->factor, 4.0);
  EXPECT_EQ(m->config().rope_scaling->original_max_position, 8192);
  EXPECT_TRUE(m->config().tie_embeddings);
  EXPECT_EQ(m->config().vocab_size, 256);  // the byte tokenizer's
  std::ifstream cf(fs::path(dir) / "keys" / "config.yaml");
  const std::string yaml((std::istreambuf_iterator<char>(cf)), std::istreambuf_iterator<char>());
  for (const char* k : {"n_kv_head: 2", "intermediate_size: 64", "rope_scaling: llama3", "rms_norm_eps", "tie_embeddings: true"})
    EXPECT_NE(yaml.find(k), std::string::npos) << k << "\n" << yaml;
  EXPECT_EQ(yaml.find("bias:"), std::string::npos) << "model.bias is GPT's";

  // Defaults: n_kv_head 0 = n_head; intermediate_size 0 = 8/3 n_embd rounded up to 64.
  const train::Config d = train::Config::parse(
      "model: {type: llama, n_layer: 1, n_head: 4, n_embd: 96, block_size: 8, vocab_size: 10}\n", "d.yaml");
  const nn::LlamaConfig dc = train::llama_config(d);
  EXPECT_EQ(dc.n_kv_head, 4);
  EXPECT_EQ(dc.intermediate_size, 256);  // 8 * 96 / 3 = 256
  EXPECT_FALSE(dc.rope_scaling.has_value());
}

TEST(LlamaTrainer, BadKeysAreClearErrorsBeforeAnyWork) {
  auto check = [](const std::string& model, std::vector<std::string> o = {}) {
    const train::Config c = train::Config::parse(model + "\n", "bad.yaml", o);
    train::ParallelContext::check_config(c);
    (void)train::llama_config(c);
  };
  auto err = [&](const std::string& model, std::vector<std::string> o = {}) { return error_message([&] { check(model, o); }); };
  const std::string base = "model: {type: llama, n_layer: 1, n_head: 4, n_embd: 32, block_size: 8, vocab_size: 10";
  std::string e = err(base + ", n_kv_head: 3}");
  EXPECT_NE(e.find("bad.yaml"), std::string::npos) << e;
  EXPECT_NE(e.find("n_kv_head (3) must divide n_head (4)"), std::string::npos) << e;
  EXPECT_NE(e.find("hint:"), std::string::npos) << e;
  EXPECT_NO_THROW(check(base + ", n_embd: 24}"));  // head dim 6: fine
  e = err(base + ", n_embd: 20}");  // head dim 5: odd
  EXPECT_NE(e.find("is odd"), std::string::npos) << e;
  e = err(base + ", rope_factor: 4}");
  EXPECT_NE(e.find("'model.rope_factor' does not apply when model.rope_scaling is 'none'"), std::string::npos) << e;
  e = err(base + ", rope_scaling: yarn}");
  EXPECT_NE(e.find("model.rope_scaling"), std::string::npos) << e;
  EXPECT_NE(e.find("llama3"), std::string::npos) << e;  // the allowed choices
  e = err(base + ", bias: false}");  // GPT's key
  EXPECT_NE(e.find("'model.bias' does not apply when model.type is 'llama'"), std::string::npos) << e;
  e = err("model: {type: gpt, n_kv_head: 2}");  // Llama's key on a GPT
  EXPECT_NE(e.find("'model.n_kv_head' does not apply when model.type is 'gpt'"), std::string::npos) << e;
  // Tensor parallelism splits the kv heads and the MLP (dist::TensorParallelLlama): what tp
  // cannot split is refused with the keys named (tests/dist/test_llama_parallel.cpp trains it).
  e = err(base + ", n_head: 6, n_kv_head: 3, n_embd: 48}", {"dist.tp=2"});
  EXPECT_NE(e.find("model.n_kv_head (3) and dist.tp (2) do not divide one another"), std::string::npos) << e;
  EXPECT_NE(e.find("hint:"), std::string::npos) << e;
  e = err(base + ", intermediate_size: 33}", {"dist.tp=2"});
  EXPECT_NE(e.find("model.intermediate_size (33) is not divisible by dist.tp (2)"), std::string::npos) << e;
  EXPECT_NO_THROW(check(base + ", n_kv_head: 1}", {"dist.tp=2"}));  // MQA: the kv head is replicated
}

TEST(LlamaTrainer, Bf16AndF16TrainATinyLlama) {
  const std::string dir = tmp_dir("amp");
  const std::string text = write_tiny_text(dir);
  for (const std::string prec : {"bf16", "f16"}) {
    train::Trainer t(llama_config(dir, text, {"name=" + prec, "trainer.precision=" + prec, "trainer.max_steps=16",
                                              "schedule.decay=constant"}));
    quiet(t);
    while (t.train_step()) {
    }
    const auto l = losses(t);
    ASSERT_EQ(l.size(), 16u);
    const double first = mean(l, 0, 4), last = mean(l, 12, 16);
    std::printf("%s Llama: loss %.6f -> %.6f, skipped %lld\n", prec.c_str(), first, last, static_cast<long long>(t.skipped_steps()));
    EXPECT_LT(last, first - 0.5) << prec;
    for (auto& [n, p] : t.task().module().named_parameters()) EXPECT_EQ(p.dtype(), DType::f32) << n;  // f32 masters
    // A sample: the byte tokenizer decodes sample_tokens tokens after the prompt.
    EXPECT_FALSE(t.sample(4, "The ").empty());
  }
}

TEST(LlamaTrainer, GradientCheckpointingTrainsTheSameSteps) {
  const std::string dir = tmp_dir("ckpt");
  const std::string text = write_tiny_text(dir);
  std::vector<double> a, b;
  {
    train::Trainer t(llama_config(dir, text, {"name=plain", "trainer.max_steps=4"}));
    quiet(t);
    t.fit();
    a = losses(t);
  }
  {
    train::Trainer t(llama_config(dir, text, {"name=recompute", "trainer.max_steps=4", "model.gradient_checkpointing=true"}));
    quiet(t);
    t.fit();
    b = losses(t);
  }
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * std::abs(a[i])) << "step " << i + 1;
}

TEST(LlamaTrainer, ResumeContinuesBitExactly) {
  const std::string dir = tmp_dir("resume");
  const std::string text = write_tiny_text(dir);
  // A constant schedule: the first half runs with max_steps 3, which would reshape a cosine.
  const std::vector<std::string> extra = {"model.dropout=0.1", "trainer.max_steps=6", "schedule.decay=constant"};
  auto with = [&](std::vector<std::string> o) {  // o after extra: o's max_steps wins
    o.insert(o.begin(), extra.begin(), extra.end());
    return o;
  };
  std::vector<std::string> straight_w;
  std::vector<double> straight_l;
  {
    train::Trainer t(llama_config(dir, text, with({"name=straight"})));
    quiet(t);
    t.fit();
    straight_w = weight_bytes(t);
    straight_l = losses(t);
  }
  std::string ckpt_dir;
  std::vector<double> first;
  {
    train::Trainer t(llama_config(dir, text, with({"name=split", "trainer.max_steps=3", "checkpoint.every=3"})));
    quiet(t);
    t.fit();
    first = losses(t);
    ckpt_dir = ckpt::find_latest_valid(t.checkpoints_dir()).path;
    ASSERT_FALSE(ckpt_dir.empty());
  }
  manual_seed(999);  // another run's use of the global RNG in between
  {
    train::Trainer t(llama_config(dir, text, with({"name=split", "checkpoint.every=3"})));
    quiet(t);
    t.resume_from(ckpt_dir);
    EXPECT_EQ(t.step(), 3);
    t.fit();
    std::vector<double> all = first;
    for (const auto& m : t.history())
      if (m.step > 3) all.push_back(m.loss);
    EXPECT_EQ(all, straight_l);
    EXPECT_TRUE(weight_bytes(t) == straight_w) << "the weights differ from the uninterrupted run's";
  }
}

TEST(LlamaTrainer, BenchCountsTheLlamasModelFlops) {
  const std::string dir = tmp_dir("bench");
  const std::string text = write_tiny_text(dir);
  train::Trainer t(llama_config(dir, text, {"name=bench"}));
  quiet(t);
  train::BenchOptions o;
  o.warmup = 1;
  o.steps = 2;
  const train::BenchResult r = train::run_bench(t, o);
  EXPECT_EQ(r.model_type, "llama");
  EXPECT_EQ(r.unit, "tokens");
  // 6 x (GEMM weights: all but embed_tokens) + 12 L d T, per token; B 4 x T 16 tokens a step.
  auto* m = dynamic_cast<nn::Llama*>(&t.task().module());
  ASSERT_NE(m, nullptr);
  const double gemm_params = static_cast<double>(m->parameters_count() - 256 * 32);
  const double want = (6.0 * gemm_params + 12.0 * 2 * 32 * 16) * 4 * 16;
  EXPECT_DOUBLE_EQ(r.flops_per_step, want);
  EXPECT_GT(r.achieved_gflops, 0);
}

// Every shipped example config (examples/*.yaml) parses against the schema and passes the
// checks made before any work; the transformer ones also give a consistent model shape.
TEST(Examples, EveryExampleConfigParsesAndValidates) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(std::string(ATHANOR_SOURCE_DIR) + "/examples")) {
    if (e.path().extension() != ".yaml") continue;
    SCOPED_TRACE(e.path().string());
    const train::Config c = train::Config::load(e.path().string());
    EXPECT_NO_THROW(train::ParallelContext::check_config(c));
    if (c.get_string("model.type") == "llama") {
      const nn::LlamaConfig lc = train::llama_config(train::Config::load(e.path().string(), {"model.vocab_size=256"}));
      EXPECT_EQ(nn::llama_config_problem(lc), "");
    }
    ++n;
  }
  EXPECT_GE(n, 8);  // gpt-char*, gpt2-124m, fashion-*, llama-char
}

}  // namespace athanor
