// GPT against a PyTorch GPT-2 with the same weights (tools/make_gpt_fixture.py):
// logits, loss and every parameter's gradient; plus names, init and generate().
#include <cmath>

#include "../ops/fixture_reader.h"
#include "athanor/nn/gpt.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
nn::GPTConfig tiny_config(const Fixture& f) {
  auto md = f.metadata();
  nn::GPTConfig c;
  c.n_layer = std::stoll(md.at("n_layer"));
  c.n_head = std::stoll(md.at("n_head"));
  c.n_embd = std::stoll(md.at("n_embd"));
  c.block_size = std::stoll(md.at("block_size"));
  c.vocab_size = std::stoll(md.at("vocab_size"));
  return c;
}
std::shared_ptr<nn::GPT> load_tiny(const Fixture& f, DType dtype) {
  auto model = std::make_shared<nn::GPT>(tiny_config(f));
  model->to(dtype);
  nn::StateDict sd;
  for (auto& [name, p] : model->named_parameters()) sd.emplace_back(name, f.get(name));
  model->load_state_dict(sd);
  return model;
}
}  // namespace

TEST(GPT, HuggingFaceParameterNames) {
  nn::GPT m({.n_layer = 2, .n_head = 2, .n_embd = 8, .block_size = 4, .vocab_size = 11});
  std::vector<std::string> names;
  for (auto& [n, p] : m.named_parameters()) names.push_back(n);
  const std::vector<std::string> block0 = {"transformer.h.0.ln_1.weight", "transformer.h.0.ln_1.bias",
                                           "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias",
                                           "transformer.h.0.attn.c_proj.weight", "transformer.h.0.attn.c_proj.bias",
                                           "transformer.h.0.ln_2.weight", "transformer.h.0.ln_2.bias",
                                           "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_fc.bias",
                                           "transformer.h.0.mlp.c_proj.weight", "transformer.h.0.mlp.c_proj.bias"};
  ASSERT_EQ(names.size(), 2u + 2 * 12 + 2);
  EXPECT_EQ(names[0], "transformer.wte.weight");
  EXPECT_EQ(names[1], "transformer.wpe.weight");
  EXPECT_EQ(std::vector<std::string>(names.begin() + 2, names.begin() + 14), block0);
  EXPECT_EQ(names.back(), "transformer.ln_f.bias");
  // 11*8 + 4*8 + 2 * (4*8 + 24*8+24 + 8*8+8 + 32*8+32 + 8*32+8) + 2*8
  EXPECT_EQ(m.parameters_count(), 88 + 32 + 2 * (32 + 216 + 72 + 288 + 264) + 16);
}

TEST(GPT, Gpt2InitialisationStatistics) {
  manual_seed(7);
  nn::GPT m({.n_layer = 4, .n_head = 4, .n_embd = 128, .block_size = 64, .vocab_size = 512});
  for (auto& [name, p] : m.named_parameters()) {
    const auto v = p.to_vector();
    double s = 0, s2 = 0;
    for (double x : v) s += x, s2 += x * x;
    const double mean = s / v.size(), sd = std::sqrt(s2 / v.size() - mean * mean);
    if (name.find("ln_") != std::string::npos) {
      EXPECT_EQ(sd, 0.0) << name;  // constant 1 or 0
    } else if (name.ends_with(".bias")) {
      EXPECT_EQ(s2, 0.0) << name;
    } else if (name.find("c_proj.weight") != std::string::npos) {
      EXPECT_NEAR(sd, 0.02 / std::sqrt(8.0), 0.0007) << name;  // residual scaling 1/sqrt(2 n_layer)
    } else {
      EXPECT_NEAR(sd, 0.02, 0.0007) << name;
    }
  }
}

TEST(GPT, MatchesPyTorchLogitsLossAndGradientsInF64) {
  const Fixture f = Fixture::load(fixture_path("gpt_tiny.safetensors"));
  auto model = load_tiny(f, DType::f64);
  Tensor ids = f.get("ids"), targets = f.get("targets");
  Tensor logits = model->forward(ids);
  EXPECT_CLOSE(logits, f.get("logits"), 1e-12, 1e-10);
  Tensor loss = model->loss(ids, targets);
  EXPECT_NEAR(loss.item(), f.get("loss").to_vector()[0], 1e-12);
  loss.backward();
  for (auto& [name, p] : model->named_parameters()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(p.grad().defined());
    EXPECT_CLOSE(p.grad(), f.get("grad." + name), 1e-12, 1e-8);
  }
}

TEST(GPT, MatchesPyTorchInF32) {
  const Fixture f = Fixture::load(fixture_path("gpt_tiny.safetensors"));
  auto model = load_tiny(f, DType::f32);
  Tensor loss = model->loss(f.get("ids"), f.get("targets"));
  EXPECT_NEAR(loss.item(), f.get("loss").to_vector()[0], 1e-5);
  loss.backward();
  for (auto& [name, p] : model->named_parameters()) EXPECT_CLOSE(p.grad(), f.get("grad." + name), 1e-5, 1e-3) << name;
}

TEST(GPT, GenerateIsReproducibleAndRespectsTopK) {
  manual_seed(1);
  nn::GPT m({.n_layer = 1, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 20});
  Generator g1(5), g2(5);
  auto a = m.generate({1, 2, 3}, 12, 1.0, 0, g1);
  auto b = m.generate({1, 2, 3}, 12, 1.0, 0, g2);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 15u);  // runs past block_size by cropping the context
  EXPECT_EQ(std::vector<int32_t>(a.begin(), a.begin() + 3), (std::vector<int32_t>{1, 2, 3}));
  for (int32_t t : a) EXPECT_TRUE(t >= 0 && t < 20);
  EXPECT_TRUE(m.is_training());  // restored after sampling
  Generator g3(9);
  auto greedy = m.generate({4}, 5, 1.0, /*top_k=*/1, g3);  // top-1 sampling is greedy: deterministic given the model
  Generator g4(123);
  EXPECT_EQ(greedy, m.generate({4}, 5, 1.0, 1, g4));
}

TEST(GPT, BadConfigAndInputsAreClearErrors) {
  EXPECT_NE(error_message([] { nn::GPT({.n_layer = 1, .n_head = 3, .n_embd = 16, .block_size = 8, .vocab_size = 10}); })
                .find("divisible by n_head"),
            std::string::npos);
  nn::GPT m({.n_layer = 1, .n_head = 2, .n_embd = 8, .block_size = 4, .vocab_size = 10});
  EXPECT_NE(error_message([&] { m.forward(zeros({1, 5}, DType::i64)); }).find("exceeds block_size 4"), std::string::npos);
  const std::string msg = error_message([&] { m.forward(full({1, 2}, 10, DType::i64)); });
  EXPECT_NE(msg.find("10"), std::string::npos) << msg;
  EXPECT_NE(msg.find("transformer.wte"), std::string::npos) << msg;  // the module path of the failing embedding
}

}  // namespace athanor
