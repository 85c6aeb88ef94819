// Module: hierarchical names, registration order, tied weights, train/eval,
// strict state-dict loading that reports every problem at once and changes nothing.
#include "athanor/nn/module.h"
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

}  // namespace athanor
