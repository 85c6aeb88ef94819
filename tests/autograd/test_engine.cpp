// The tape and the engine: chain rule, fan-in, accumulation, retain_graph,
// explicit root gradients, detach/no-grad, hooks, the saved-tensor version
// check, anomaly mode, and gradients a backward takes from the sum waiting at its input.
#include <cmath>
#include <limits>

#include "athanor/autograd/engine.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
Tensor vec(std::vector<double> v) { return from_vector(v, {static_cast<int64_t>(v.size())}, TensorOptions(DType::f64)); }
Tensor leaf(std::vector<double> v) { return vec(v).requires_grad_(true); }
}  // namespace

TEST(Engine, ChainRuleAndFanIn) {
  Tensor a = leaf({1, 2, 3}), b = leaf({4, 5, 6});
  // loss = sum(a*b + a*a): d/da = b + 2a, d/db = a (a is used three times)
  Tensor loss = sum(add(mul(a, b), mul(a, a)));
  loss.backward();
  EXPECT_CLOSE(a.grad(), vec({6, 9, 12}), 0, 0);
  EXPECT_CLOSE(b.grad(), vec({1, 2, 3}), 0, 0);
  EXPECT_TRUE(loss.grad_fn() != nullptr);
  EXPECT_EQ(loss.grad_fn()->name(), "sum");
}

TEST(Engine, GradientsAccumulateAcrossBackwardCalls) {
  Tensor a = leaf({1, 2});
  sum(mul(a, 3.0)).backward();
  sum(mul(a, 3.0)).backward();
  EXPECT_CLOSE(a.grad(), vec({6, 6}), 0, 0);
  EXPECT_EQ(a.grad().storage()->tag(), MemTag::gradient);
}

TEST(Engine, RetainGraphAllowsASecondBackward) {
  Tensor a = leaf({1, 2});
  Tensor y = sum(mul(a, a));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  EXPECT_CLOSE(a.grad(), vec({4, 8}), 0, 0);
}

TEST(Engine, SecondBackwardThroughFreedGraphIsAClearError) {
  Tensor a = leaf({1, 2});
  Tensor y = sum(mul(a, a));
  y.backward();
  const std::string msg = error_message([&] { y.backward(); });
  EXPECT_NE(msg.find("second time"), std::string::npos) << msg;
  EXPECT_NE(msg.find("retain_graph"), std::string::npos) << msg;
}

TEST(Engine, NonScalarRootNeedsAnExplicitGradient) {
  Tensor a = leaf({1, 2, 3});
  Tensor y = mul(a, 2.0);
  const std::string msg = error_message([&] { y.backward(); });
  EXPECT_NE(msg.find("scalar"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3]"), std::string::npos) << msg;
  y.backward(vec({1, 10, 100}));
  EXPECT_CLOSE(a.grad(), vec({2, 20, 200}), 0, 0);
  const std::string wrong = error_message([&] { mul(a, 2.0).backward(vec({1, 2})); });
  EXPECT_NE(wrong.find("[2]"), std::string::npos) << wrong;
}

TEST(Engine, DetachAndNoGradStopHistory) {
  Tensor a = leaf({1, 2});
  Tensor d = mul(a, 2.0).detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  {
    NoGradGuard ng;
    Tensor y = mul(a, a);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(y.grad_fn() == nullptr);
  }
  Tensor y = mul(a, d);  // d is a constant here
  sum(y).backward();
  EXPECT_CLOSE(a.grad(), vec({2, 4}), 0, 0);
  const std::string msg = error_message([&] { sum(d).backward(); });
  EXPECT_NE(msg.find("does not require grad"), std::string::npos) << msg;
}

TEST(Engine, RequiresGradOnlyOnFloatingLeaves) {
  Tensor a = leaf({1});
  Tensor y = mul(a, 2.0);
  EXPECT_NE(error_message([&] { y.requires_grad_(false); }).find("leaf"), std::string::npos);
  Tensor i = from_vector(std::vector<int64_t>{1, 2}, {2});
  EXPECT_NE(error_message([&] { i.requires_grad_(true); }).find("floating"), std::string::npos);
}

TEST(Hooks, TensorHooksSeeAndReplaceGradients) {
  Tensor a = leaf({1, 2});
  Tensor mid = mul(a, 3.0);
  std::vector<double> seen;
  mid.register_hook([&](const Tensor& g) {
    seen = g.to_vector();
    return mul(g, 10.0);  // replaces the gradient flowing on
  });
  a.register_hook([](const Tensor& g) { return add(g, 1.0); });
  sum(mid).backward();
  EXPECT_EQ(seen, (std::vector<double>{1, 1}));
  EXPECT_CLOSE(a.grad(), vec({31, 31}), 0, 0);  // (1*10)*3 + 1
}

TEST(Hooks, PostAccumulateHookFiresOncePerBackwardWithTheGradInPlace) {
  // The distributed layer starts gradient reduction from this hook, so it must
  // fire after .grad holds the full gradient of the step, once per leaf, in
  // reverse order of use.
  Tensor w1 = leaf({1, 1}), w2 = leaf({2, 2});
  std::vector<std::string> order;
  std::vector<double> g1;
  w1.register_post_accumulate_grad_hook([&](Tensor& p) { order.push_back("w1"); g1 = p.grad().to_vector(); });
  w2.register_post_accumulate_grad_hook([&](Tensor& p) { order.push_back("w2"); });
  Tensor h = mul(w1, 2.0);
  Tensor y = add(mul(h, w2), h);  // w1 reaches the loss by two paths
  sum(y).backward();
  EXPECT_EQ(order, (std::vector<std::string>{"w2", "w1"}));
  EXPECT_EQ(g1, (std::vector<double>{6, 6}));  // 2*w2 + 2, both paths summed before the hook
}

TEST(Hooks, RetainGradKeepsNonLeafGradient) {
  Tensor a = leaf({1, 2});
  Tensor mid = mul(a, a);
  mid.retain_grad();
  sum(mul(mid, 5.0)).backward();
  EXPECT_CLOSE(mid.grad(), vec({5, 5}), 0, 0);
}

TEST(Hooks, RemovedHookDoesNotRun) {
  Tensor a = leaf({1});
  int calls = 0;
  const int id = a.register_hook([&](const Tensor&) { ++calls; return Tensor(); });
  a.remove_hook(id);
  sum(mul(a, 2.0)).backward();
  EXPECT_EQ(calls, 0);
}

TEST(VersionCheck, InPlaceChangeOfASavedTensorIsAnErrorNamingOpAndVersions) {
  Tensor a = leaf({1, 2}), b = vec({3, 4});
  b.set_name("b");
  Tensor y = mul(a, b);  // saves b for a's gradient
  b.fill_(0.0);          // modifies it in place
  const std::string msg = error_message([&] { sum(y).backward(); });
  EXPECT_NE(msg.find("mul"), std::string::npos) << msg;
  EXPECT_NE(msg.find("in-place"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'b'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("version 1; expected version 0"), std::string::npos) << msg;
}

TEST(VersionCheck, ModifyingAViewOfASavedTensorIsCaughtToo) {
  Tensor a = leaf({1, 2, 3, 4});
  Tensor b = vec({1, 1, 1, 1});
  Tensor y = mul(a, b);
  Tensor bv = reshape(b, {2, 2});  // shares storage (and the version counter)
  bv.fill_(2.0);
  EXPECT_NE(error_message([&] { sum(y).backward(); }).find("modified by an in-place operation"), std::string::npos);
}

TEST(VersionCheck, UnrelatedInPlaceChangeIsFine) {
  Tensor a = leaf({1, 2}), b = vec({3, 4}), c = vec({0, 0});
  Tensor y = mul(a, b);
  c.fill_(5.0);
  sum(y).backward();
  EXPECT_CLOSE(a.grad(), vec({3, 4}), 0, 0);
}

namespace {
// An op with a hand-written backward, for testing the engine itself.
Tensor custom_op(const char* name, const Tensor& x, double backward_factor) {
  Tensor out = clone(x.detach());
  return record(name, {x}, out, [backward_factor](const Node&, const Grads& g) { return Grads{mul(g[0], backward_factor)}; });
}
}  // namespace

TEST(Anomaly, ForwardNamesTheFirstOpThatProducedNonFinite) {
  Tensor a = leaf({1, 0});
  Tensor zero = vec({0, 0});
  {
    Tensor y = div(a, zero);  // inf and nan, but anomaly mode is off: no error
    EXPECT_FALSE(all_finite(y));
  }
  AnomalyModeGuard guard;
  Tensor ok = mul(a, 2.0);
  const std::string msg = error_message([&] { div(ok, zero); });
  EXPECT_NE(msg.find("forward of 'div'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("input 1: [2] f64: min 0 max 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nan 1 inf 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
}

TEST(Anomaly, BackwardNamesTheFirstNodeInBackwardOrderAndItsModule) {
  Tensor a = leaf({1, 2});
  Tensor h;
  {
    ModuleScope outer("transformer");
    ModuleScope inner("h.7");
    h = custom_op("bad_op", a, std::numeric_limits<double>::infinity());  // backward multiplies by inf
  }
  Tensor y = custom_op("good_op", h, 1.0);
  AnomalyModeGuard guard;
  try {
    sum(y).backward();
    FAIL() << "expected an anomaly error";
  } catch (const Error& e) {
    EXPECT_EQ(e.op(), "bad_op");
    EXPECT_EQ(e.module_path(), "transformer.h.7");
    EXPECT_NE(std::string(e.what()).find("backward of 'bad_op'"), std::string::npos) << e.what();
  }
}

TEST(Gradcheck, DetectsAWrongBackward) {
  // The harness must be able to fail: a backward off by 10% is caught.
  Tensor a = randn64({5}, 1);
  EXPECT_FALSE(gradcheck([](const std::vector<Tensor>& x) { return custom_op("wrong", x[0], 1.1); }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& x) { return custom_op("right", x[0], 1.0); }, {a}));
}

TEST(Engine, DeepChainRunsInCreationOrderReversed) {
  // 200 nodes in a chain plus a skip connection: the dependency counting must
  // wait for both paths before running the node they meet at.
  Tensor a = leaf({1.0});
  Tensor x = a;
  for (int i = 0; i < 200; ++i) x = mul(x, 1.01);
  Tensor y = add(x, a);
  y.sum().backward();
  EXPECT_NEAR(a.grad().item(), std::pow(1.01, 200) + 1.0, 1e-9);
}

// The engine sums meeting gradients in place and lets a leaf adopt its gradient instead of
// copying it, but only when nothing else holds that memory: a backward that returns a tensor
// it keeps (here a captured constant) must see it unchanged, and a hook that keeps the
// gradient it was shown must not find it turned into .grad.
TEST(Engine, InPlaceSummationNeverWritesIntoATensorSomeoneElseHolds) {
  const Tensor kept = vec({1, 2, 3});  // returned as the gradient by both uses of x below
  auto const_grad_op = [&](const Tensor& x) {
    Tensor out = empty(x.sizes(), TensorOptions(x.dtype()));
    copy_into(out, x);
    return record("const_grad", {x}, out, [kept](const Node&, const Grads&) { return Grads{kept}; });
  };
  Tensor x = leaf({0, 0, 0});
  Tensor loss = sum(add(const_grad_op(x), const_grad_op(x)));  // two gradients meet at x's accumulator
  loss.backward();
  EXPECT_CLOSE(x.grad(), vec({2, 4, 6}), 0, 0);
  EXPECT_EQ(kept.to_vector(), (std::vector<double>{1, 2, 3}));
  EXPECT_NE(x.grad().storage(), kept.storage());

  // One use only: the leaf must copy `kept`, not adopt it (then accumulating would change it).
  Tensor y = leaf({0, 0, 0});
  sum(const_grad_op(y)).backward();
  sum(const_grad_op(y)).backward();
  EXPECT_CLOSE(y.grad(), vec({2, 4, 6}), 0, 0);
  EXPECT_EQ(kept.to_vector(), (std::vector<double>{1, 2, 3}));
}

TEST(Engine, LeafAdoptsOnlyAGradientNobodyElseHolds) {
  // Adopted: the engine's own gradient becomes .grad, accounted as a gradient.
  Tensor a = leaf({1, 2});
  sum(mul(a, 3.0)).backward();
  EXPECT_CLOSE(a.grad(), vec({3, 3}), 0, 0);
  EXPECT_EQ(a.grad().storage()->tag(), MemTag::gradient);
  // A hook that keeps the gradient it saw: .grad must be a copy, so that the kept tensor does
  // not change when later backward calls accumulate.
  Tensor b = leaf({1, 2});
  Tensor seen;
  b.register_hook([&](const Tensor& g) { seen = g; return Tensor(); });
  sum(mul(b, 3.0)).backward();
  EXPECT_NE(b.grad().storage(), seen.storage());
  sum(mul(b, 5.0)).backward();
  EXPECT_CLOSE(b.grad(), vec({8, 8}), 0, 0);
  EXPECT_CLOSE(seen, vec({5, 5}), 0, 0);
  // A view of a larger gradient (no exclusive storage) is copied too.
  Tensor c = leaf({1, 2});
  Tensor big = leaf({1, 2, 3, 4});
  Tensor loss = add(sum(mul(slice(big, 0, 0, 2), c)), sum(big));
  loss.backward();
  EXPECT_CLOSE(c.grad(), vec({1, 2}), 0, 0);
  EXPECT_CLOSE(big.grad(), vec({2, 3, 1, 1}), 0, 0);
}


namespace {
// An identity op whose backward adds its gradient (factor * g) into the sum already waiting
// at its input when the engine offers it (Node::take_pending_grad), noting what it was given.
Tensor pending_summing_op(const Tensor& x, double factor, std::vector<double>* taken) {
  Tensor out = clone(x.detach());
  return record("pending_summing_op", {x}, out, [factor, taken](const Node& n, const Grads& g) {
    Tensor own = mul(g[0], factor);
    Tensor pending = n.take_pending_grad(0);
    if (!pending.defined()) return Grads{own};
    *taken = pending.to_vector();
    return Grads{add(pending, own)};
  });
}
}  // namespace

TEST(Engine, ABackwardMayAddItsGradientIntoTheSumWaitingAtItsInput) {
  for (bool input_is_leaf : {false, true}) {
    SCOPED_TRACE(input_is_leaf ? "leaf input" : "non-leaf input");
    Tensor a = leaf({1, 2, 3});
    Tensor x = input_is_leaf ? a : mul(a, 2.0);
    std::vector<double> taken;
    Tensor s = pending_summing_op(x, 10.0, &taken);  // created first, so its backward runs last
    Tensor u = mul(x, vec({1, 2, 3}));               // leaves [1, 2, 3] waiting at x
    const uint64_t before = pending_grads_taken();
    sum(add(s, u)).backward();
    EXPECT_EQ(pending_grads_taken() - before, 1u);
    EXPECT_EQ(taken, (std::vector<double>{1, 2, 3}));
    EXPECT_CLOSE(a.grad(), input_is_leaf ? vec({11, 12, 13}) : vec({22, 24, 26}), 0, 0);
  }
}

TEST(Engine, APendingGradientSomeoneElseHoldsIsNotOffered) {
  const Tensor kept = vec({1, 2, 3});  // the other use's backward returns a tensor it keeps
  Tensor a = leaf({0, 0, 0});
  std::vector<double> taken;
  Tensor s = pending_summing_op(a, 10.0, &taken);
  Tensor u = record("const_grad", {a}, clone(a.detach()), [kept](const Node&, const Grads&) { return Grads{kept}; });
  const uint64_t before = pending_grads_taken();
  sum(add(s, u)).backward();
  EXPECT_EQ(pending_grads_taken(), before);
  EXPECT_TRUE(taken.empty());
  EXPECT_CLOSE(a.grad(), vec({11, 12, 13}), 0, 0);  // the engine summed them instead
  EXPECT_EQ(kept.to_vector(), (std::vector<double>{1, 2, 3}));
}

}  // namespace athanor
