// nn::Llama against a PyTorch Llama written after HF's modeling_llama with the same weights
// (tools/make_llama_fixture.py): logits, loss and every parameter's gradient in f64, for plain
// RoPE, Llama 3.1's scaled RoPE and tied embeddings; plus names, init, generate() and errors.
#include <cmath>

#include "../ops/fixture_reader.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/nn/llama.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
nn::LlamaConfig fixture_config(const Fixture& f) {
  auto md = f.metadata();
  nn::LlamaConfig c;
  c.n_layer = std::stoll(md.at("n_layer"));
  c.n_head = std::stoll(md.at("n_head"));
  c.n_kv_head = std::stoll(md.at("n_kv_head"));
  c.n_embd = std::stoll(md.at("n_embd"));
  c.intermediate_size = std::stoll(md.at("intermediate_size"));
  c.vocab_size = std::stoll(md.at("vocab_size"));
  c.block_size = std::stoll(md.at("max_position_embeddings"));
  c.rms_norm_eps = std::stod(md.at("rms_norm_eps"));
  c.rope_theta = std::stod(md.at("rope_theta"));
  c.tie_embeddings = md.at("tie_word_embeddings") == "true";
  if (md.count("rope_scaling.factor")) {
    RopeScaling s;
    s.factor = std::stod(md.at("rope_scaling.factor"));
    s.low_freq_factor = std::stod(md.at("rope_scaling.low_freq_factor"));
    s.high_freq_factor = std::stod(md.at("rope_scaling.high_freq_factor"));
    s.original_max_position = std::stoll(md.at("rope_scaling.original_max_position_embeddings"));
    c.rope_scaling = s;
  }
  return c;
}
std::shared_ptr<nn::Llama> load(const Fixture& f, DType dtype) {
  auto model = std::make_shared<nn::Llama>(fixture_config(f));
  model->to(dtype);
  nn::StateDict sd;
  for (auto& [name, p] : model->named_parameters()) sd.emplace_back(name, f.get(name));
  model->load_state_dict(sd);
  return model;
}
void expect_matches_fixture_f64(const std::string& file) {
  SCOPED_TRACE(file);
  const Fixture f = Fixture::load(fixture_path(file));
  auto model = load(f, DType::f64);
  Tensor ids = f.get("ids"), targets = f.get("targets");
  EXPECT_CLOSE(model->forward(ids), f.get("logits"), 1e-10, 1e-10);
  Tensor loss = model->loss(ids, targets);
  EXPECT_NEAR(loss.item(), f.get("loss").to_vector()[0], 1e-10);
  loss.backward();
  size_t n = 0;
  for (auto& [name, p] : model->named_parameters()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(p.grad().defined());
    EXPECT_CLOSE(p.grad(), f.get("grad." + name), 1e-10, 1e-10);
    ++n;
  }
  // Every gradient the fixture holds was compared (no parameter missing on athanor's side).
  size_t in_fixture = 0;
  for (const auto& name : f.names()) in_fixture += name.rfind("grad.", 0) == 0;
  EXPECT_EQ(n, in_fixture);
}
}  // namespace

TEST(Llama, HuggingFaceParameterNames) {
  nn::Llama m({.vocab_size = 11, .n_layer = 2, .n_head = 4, .n_kv_head = 2, .n_embd = 16, .intermediate_size = 24, .block_size = 8});
  std::vector<std::string> names;
  for (auto& [n, p] : m.named_parameters()) names.push_back(n);
  const std::vector<std::string> layer0 = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                                           "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
                                           "model.layers.0.mlp.gate_proj.weight",    "model.layers.0.mlp.up_proj.weight",
                                           "model.layers.0.mlp.down_proj.weight",    "model.layers.0.input_layernorm.weight",
                                           "model.layers.0.post_attention_layernorm.weight"};
  ASSERT_EQ(names.size(), 1u + 2 * 9 + 2);
  EXPECT_EQ(names[0], "model.embed_tokens.weight");
  EXPECT_EQ(std::vector<std::string>(names.begin() + 1, names.begin() + 10), layer0);
  EXPECT_EQ(names[names.size() - 2], "model.norm.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");
  // GQA: k/v project to n_kv_head * head_dim = 2 * 4.
  auto sd = m.state_dict();
  int found = 0;
  for (auto& [n, t] : sd) {
    if (n == "model.layers.1.self_attn.k_proj.weight" || n == "model.layers.1.self_attn.v_proj.weight") {
      EXPECT_EQ(t.sizes(), (Shape{8, 16}));
      ++found;
    }
  }
  EXPECT_EQ(found, 2);
  // 11*16 + 2 * (16*16 + 8*16 + 8*16 + 16*16 + 3 * 24*16 + 2*16) + 16 + 11*16
  EXPECT_EQ(m.parameters_count(), 176 + 2 * (256 + 128 + 128 + 256 + 1152 + 32) + 16 + 176);

  nn::Llama tied({.vocab_size = 11, .n_layer = 1, .n_head = 2, .n_kv_head = 1, .n_embd = 8, .intermediate_size = 8,
                  .block_size = 4, .tie_embeddings = true});
  for (auto& [n, p] : tied.named_parameters()) EXPECT_EQ(n.find("lm_head"), std::string::npos) << n;
}

TEST(Llama, HfInitialisationStatistics) {
  manual_seed(7);
  nn::Llama m({.vocab_size = 512, .n_layer = 2, .n_head = 4, .n_kv_head = 2, .n_embd = 128, .intermediate_size = 344,
               .block_size = 64, .initializer_range = 0.03});
  for (auto& [name, p] : m.named_parameters()) {
    const auto v = p.to_vector();
    double s = 0, s2 = 0;
    for (double x : v) s += x, s2 += x * x;
    const double mean = s / v.size(), sd = std::sqrt(s2 / v.size() - mean * mean);
    if (name.find("norm") != std::string::npos) {
      EXPECT_EQ(mean, 1.0) << name;
      EXPECT_EQ(sd, 0.0) << name;
    } else {
      EXPECT_NEAR(sd, 0.03, 0.001) << name;  // N(0, initializer_range) for every Linear and Embedding
      EXPECT_NEAR(mean, 0.0, 0.002) << name;
    }
  }
}

TEST(Llama, MatchesPyTorchLogitsLossAndEveryGradientInF64) { expect_matches_fixture_f64("llama_tiny.safetensors"); }
TEST(Llama, MatchesPyTorchWithLlama3RopeScalingInF64) { expect_matches_fixture_f64("llama_tiny_rope_llama3.safetensors"); }
TEST(Llama, MatchesPyTorchWithTiedEmbeddingsInF64) { expect_matches_fixture_f64("llama_tiny_tied.safetensors"); }

TEST(Llama, MatchesPyTorchInF32) {
  const Fixture f = Fixture::load(fixture_path("llama_tiny.safetensors"));
  auto model = load(f, DType::f32);
  Tensor loss = model->loss(f.get("ids"), f.get("targets"));
  EXPECT_NEAR(loss.item(), f.get("loss").to_vector()[0], 1e-5);
  loss.backward();
  for (auto& [name, p] : model->named_parameters()) EXPECT_CLOSE(p.grad(), f.get("grad." + name), 1e-5, 1e-3) << name;
}

TEST(Llama, GradientCheckpointingGivesTheSameGradients) {
  const Fixture f = Fixture::load(fixture_path("llama_tiny.safetensors"));
  auto plain = load(f, DType::f64);
  nn::LlamaConfig c = fixture_config(f);
  c.gradient_checkpointing = true;
  auto ck = std::make_shared<nn::Llama>(c);
  ck->to(DType::f64);
  ck->load_state_dict(plain->state_dict());
  plain->loss(f.get("ids"), f.get("targets")).backward();
  ck->loss(f.get("ids"), f.get("targets")).backward();
  auto a = plain->named_parameters(), b = ck->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_CLOSE(b[i].second.grad(), a[i].second.grad(), 1e-13, 1e-12) << a[i].first;
}

TEST(Llama, GenerateIsReproducibleAndRespectsTopK) {
  manual_seed(1);
  nn::Llama m({.vocab_size = 20, .n_layer = 1, .n_head = 2, .n_kv_head = 1, .n_embd = 16, .intermediate_size = 24, .block_size = 8});
  Generator g1(5), g2(5);
  auto a = m.generate({1, 2, 3}, 12, 1.0, 0, g1);
  auto b = m.generate({1, 2, 3}, 12, 1.0, 0, g2);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 15u);  // runs past block_size by cropping the context
  EXPECT_EQ(std::vector<int32_t>(a.begin(), a.begin() + 3), (std::vector<int32_t>{1, 2, 3}));
  for (int32_t t : a) EXPECT_TRUE(t >= 0 && t < 20);
  EXPECT_TRUE(m.is_training());
  // top_k 1 is greedy: the argmax of forward's last position, whatever the generator.
  Generator g3(9);
  auto greedy = m.generate({4, 7}, 1, 1.0, 1, g3);
  NoGradGuard ng;
  m.eval();
  auto logits = m.forward(from_vector(std::vector<int64_t>{4, 7}, {1, 2})).to_vector();
  const auto best = std::max_element(logits.begin() + 20, logits.end()) - (logits.begin() + 20);
  EXPECT_EQ(greedy.back(), best);
}

TEST(Llama, BadConfigAndInputsAreClearErrors) {
  auto msg = [](nn::LlamaConfig c) { return error_message([&] { nn::Llama m(c); }); };
  const nn::LlamaConfig ok{.vocab_size = 10, .n_layer = 1, .n_head = 4, .n_kv_head = 2, .n_embd = 16, .intermediate_size = 8, .block_size = 8};
  auto with = [&](auto f) { nn::LlamaConfig c = ok; f(c); return c; };
  EXPECT_NE(msg(with([](auto& c) { c.n_kv_head = 3; })).find("n_kv_head (3) must divide n_head (4)"), std::string::npos);
  EXPECT_NE(msg(with([](auto& c) { c.n_head = 3; c.n_kv_head = 1; })).find("divisible by n_head"), std::string::npos);
  EXPECT_NE(msg(with([](auto& c) { c.n_embd = 12; c.n_head = 4; })).find("is odd"), std::string::npos);
  EXPECT_NE(msg(with([](auto& c) { c.intermediate_size = 0; })).find("must all be > 0"), std::string::npos);
  EXPECT_NE(msg(with([](auto& c) { c.n_kv_head = 0; })).find("must all be > 0"), std::string::npos);
  EXPECT_NE(msg(with([](auto& c) { c.rope_scaling = RopeScaling{.factor = 0.5}; })).find("factor must be >= 1"), std::string::npos);
  EXPECT_NE(msg(with([](auto& c) { c.rms_norm_eps = 0; })).find("rms_norm_eps"), std::string::npos);
  nn::Llama m(ok);
  EXPECT_NE(error_message([&] { m.forward(zeros({1, 9}, DType::i64)); }).find("exceeds block_size 8"), std::string::npos);
  const std::string e = error_message([&] { m.forward(full({1, 2}, 10, DType::i64)); });
  EXPECT_NE(e.find("model.embed_tokens"), std::string::npos) << e;
}

}  // namespace athanor
