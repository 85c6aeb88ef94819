// Module: hierarchical names, registration order, tied weights, train/eval,
// strict state-dict loading that reports every problem at once and changes nothing.
#include <cmath>
#include <map>

#include "athanor/autograd/checkpoint.h"
#include "athanor/nn/gpt.h"
#include "athanor/nn/mlp.h"
#include "athanor/nn/module.h"
#include "athanor/ops.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
struct Leaf : nn::Module {
  Leaf(int64_t n) {
    weight = register_parameter("weight", ones({n, n}));
    bias = register_parameter("bias", zeros({n}));
    running = register_buffer("running", zeros({n}));
  }
  Tensor forward(const Tensor& x) {
    auto scope = enter();
    return matmul(x, weight) + bias;
  }
  Tensor weight, bias, running;
};
struct Tree : nn::Module {
  Tree() {
    a = register_module("a", std::make_shared<Leaf>(2));
    b = register_module("b", std::make_shared<Leaf>(3));
  }
  std::shared_ptr<Leaf> a, b;
};
}  // namespace

TEST(Module, HierarchicalNamesInRegistrationOrder) {
  auto t = std::make_shared<Tree>();
  std::vector<std::string> names;
  for (auto& [n, p] : t->named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"a.weight", "a.bias", "b.weight", "b.bias"}));
  EXPECT_EQ(t->parameters_count(), 4 + 2 + 9 + 3);
  EXPECT_EQ(t->named_buffers().size(), 2u);
  EXPECT_TRUE(t->a->weight.requires_grad());
  EXPECT_EQ(t->a->weight.storage()->tag(), MemTag::parameter);
  auto mods = t->named_modules();
  ASSERT_EQ(mods.size(), 3u);
  EXPECT_EQ(mods[1].first, "a");
}

TEST(Module, TrainEvalPropagates) {
  auto t = std::make_shared<Tree>();
  t->eval();
  EXPECT_FALSE(t->b->is_training());
  t->train();
  EXPECT_TRUE(t->a->is_training());
}

TEST(Module, StateDictRoundTrip) {
  auto src = std::make_shared<Tree>(), dst = std::make_shared<Tree>();
  src->a->weight.fill_(7.0);
  src->b->running.fill_(3.0);
  dst->load_state_dict(src->state_dict());
  EXPECT_EQ(dst->a->weight.to_vector(), std::vector<double>(4, 7.0));
  EXPECT_EQ(dst->b->running.to_vector(), std::vector<double>(3, 3.0));
}

TEST(Module, StrictLoadListsEveryProblemAndChangesNothing) {
  auto t = std::make_shared<Tree>();
  nn::StateDict sd = t->state_dict();
  sd.erase(sd.begin());                               // a.weight missing
  sd.emplace_back("c.weight", zeros({1}));             // unexpected
  for (auto& [k, v] : sd)
    if (k == "b.bias") v = full({4}, 9.0);            // shape mismatch
    else if (k == "a.bias") v = full({2}, 5.0);       // would be a valid change
  const std::string msg = error_message([&] { t->load_state_dict(sd); });
  EXPECT_NE(msg.find("missing keys (1):\n    a.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unexpected keys (1):\n    c.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("b.bias: checkpoint [4] vs model [3]"), std::string::npos) << msg;
  EXPECT_EQ(t->a->bias.to_vector(), std::vector<double>(2, 0.0));  // nothing was loaded
}

TEST(Module, ErrorsInsideForwardNameTheModulePath) {
  auto t = std::make_shared<Tree>();
  try {
    nn::Module& root = *t;
    (void)root;
    ModuleScope top("model");
    t->b->forward(zeros({2, 2}));  // b expects 3 features
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.module_path(), "model.b");
    EXPECT_NE(std::string(e.what()).find("(module model.b)"), std::string::npos) << e.what();
  }
}

TEST(Module, DuplicateOrDottedNamesAreRejected) {
  struct Bad : nn::Module {
    void dup() { register_parameter("w", zeros({1})); register_parameter("w", zeros({1})); }
    void dotted() { register_parameter("a.b", zeros({1})); }
  };
  Bad b;
  EXPECT_NE(error_message([&] { b.dup(); }).find("already registered"), std::string::npos);
  EXPECT_NE(error_message([&] { b.dotted(); }).find("no '.'"), std::string::npos);
}

// ---- forward interceptors (Module::run_forward): what ZeRO-3 uses to wrap a block in place

namespace {
struct Counts {
  int intercepted = 0, forwards = 0;
};
// An interceptor that counts, then runs the forward as it is (optionally scaling its output,
// to prove its result is the one used).
nn::Module::ForwardInterceptor counting(Counts& c, double scale = 1.0) {
  return [&c, scale](const Tensor& x, const nn::Module::ForwardFn& fwd) {
    ++c.intercepted;
    Tensor y = fwd(x);
    ++c.forwards;
    return scale == 1.0 ? y : mul(y, scale);
  };
}
nn::GPTConfig tiny_gpt(bool checkpointing) {
  return nn::GPTConfig{.n_layer = 2, .n_head = 2, .n_embd = 8, .block_size = 4, .vocab_size = 11,
                       .gradient_checkpointing = checkpointing};
}
}  // namespace

TEST(ModuleInterceptor, GptBlocksRunThroughItAndNamesDoNotChange) {
  manual_seed(3);
  auto gpt = std::make_shared<nn::GPT>(tiny_gpt(false));
  Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  const Tensor plain = gpt->forward(ids);
  std::vector<std::string> names_before;
  for (auto& [n, p] : gpt->named_parameters()) names_before.push_back(n);
  EXPECT_EQ(gpt->shard_units(), (std::vector<std::string>{"transformer.h.0", "transformer.h.1"}));
  std::map<std::string, std::shared_ptr<nn::Module>> mods;
  for (auto& [n, m] : gpt->named_modules()) mods[n] = m;
  Counts c0, c1;
  mods.at("transformer.h.0")->set_forward_interceptor(counting(c0));
  mods.at("transformer.h.1")->set_forward_interceptor(counting(c1));
  EXPECT_CLOSE(gpt->forward(ids), plain, 0, 0);  // a pass-through interceptor changes nothing
  EXPECT_EQ(c0.intercepted, 1);
  EXPECT_EQ(c1.intercepted, 1);
  std::vector<std::string> names_after;
  for (auto& [n, p] : gpt->named_parameters()) names_after.push_back(n);
  EXPECT_EQ(names_after, names_before);
  // its result is the one the model uses: scaling block 1's output changes the logits
  mods.at("transformer.h.1")->set_forward_interceptor(counting(c1, 2.0));
  {
    const auto a = gpt->forward(ids).to_vector(), b = plain.to_vector();
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
    EXPECT_GT(d, 1e-3);
  }
  // removed: the model runs as before
  for (const char* p : {"transformer.h.0", "transformer.h.1"}) mods.at(p)->set_forward_interceptor(nullptr);
  EXPECT_FALSE(mods.at("transformer.h.0")->has_forward_interceptor());
  EXPECT_CLOSE(gpt->forward(ids), plain, 0, 0);
}

// With gradient_checkpointing, an interceptor takes the checkpoint's place: the block's forward
// runs once (the interceptor's call) and is not recomputed in backward by GPT itself.
TEST(ModuleInterceptor, TakesPrecedenceOverGradientCheckpointing) {
  manual_seed(4);
  auto gpt = std::make_shared<nn::GPT>(tiny_gpt(true));
  Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  std::map<std::string, std::shared_ptr<nn::Module>> mods;
  for (auto& [n, m] : gpt->named_modules()) mods[n] = m;
  int runs = 0;  // calls of block 0's forward function, whoever makes them
  mods.at("transformer.h.0")->set_forward_interceptor([&runs](const Tensor& x, const nn::Module::ForwardFn& fwd) {
    ++runs;
    return fwd(x);
  });
  gpt->loss(ids, ids).backward();
  EXPECT_EQ(runs, 1) << "GPT must not checkpoint an intercepted block (it would run its forward again in backward)";
  // the control: an interceptor that checkpoints itself sees the recompute (the forward runs twice)
  gpt->zero_grad();
  int calls = 0;
  mods.at("transformer.h.0")->set_forward_interceptor([&calls](const Tensor& x, const nn::Module::ForwardFn& fwd) {
    return checkpoint([&calls, fwd](const Tensor& in) { ++calls; return fwd(in); }, x);
  });
  gpt->loss(ids, ids).backward();
  EXPECT_EQ(calls, 2);
}

TEST(ModuleInterceptor, MlpLayersRunThroughIt) {
  manual_seed(5);
  auto mlp = std::make_shared<nn::MLP>(std::vector<int64_t>{3, 4, 2}, "tanh");
  EXPECT_EQ(mlp->shard_units(), (std::vector<std::string>{"layers.0", "layers.2"}));
  Tensor x = randn({5, 3});
  const Tensor plain = mlp->forward(x);
  Counts c;
  (*mlp->layers)[2]->set_forward_interceptor(counting(c, 3.0));
  const Tensor y = mlp->forward(x);
  EXPECT_EQ(c.intercepted, 1);
  EXPECT_CLOSE(y, mul(plain, 3.0), 1e-6, 1e-6);  // the last layer's output is the MLP's
}

}  // namespace athanor
