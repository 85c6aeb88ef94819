// The split backward (engine.h: backward_input + DeferredWeightGrads::run, for zero-bubble
// pipeline schedules): the input pass leaves every weight without a gradient and gives the
// inputs theirs; the weight pass then gives every weight the gradient one backward() gives,
// in f64 to rounding, through linear, layer_norm, an embedding (a node whose only input is
// a weight), a weight used twice (tied), and checkpoint()'s nested backward; each weight's
// post-accumulate hook fires once.
#include "athanor/autograd/checkpoint.h"
#include "athanor/autograd/engine.h"
#include "athanor/autograd/function.h"
#include "athanor/nn/layers.h"
#include "athanor/ops.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {

// ids -> embedding -> LayerNorm -> Linear -> gelu -> Linear(tied to the embedding: logits) -> sum of squares.
struct TinyNet {
  nn::Embedding emb{11, 6};
  nn::LayerNorm ln{Shape{6}};
  nn::Linear fc{6, 6};
  bool ckpt = false;
  TinyNet() {
    emb.to(DType::f64);
    ln.to(DType::f64);
    fc.to(DType::f64);
    // Non-trivial LayerNorm parameters (ones/zeros would hide a wrong gradient).
    Generator g(4);
    NoGradGuard ng;
    normal_(ln.weight, 1.0, 0.3, g);
    normal_(ln.bias, 0.0, 0.3, g);
  }
  std::vector<Tensor> weights() { return {emb.weight, ln.weight, ln.bias, fc.weight, fc.bias}; }
  // x: an extra input that needs a gradient (as a pipeline stage's received activation).
  Tensor operator()(const Tensor& ids, const Tensor& x) {
    Tensor h = add(emb.forward(ids), x);
    auto body = [this](const Tensor& in) { return gelu(fc.forward(ln.forward(in))); };
    h = ckpt ? checkpoint(body, h) : body(h);
    Tensor logits = linear(h, emb.weight);  // the tied head
    return sum(mul(logits, logits));
  }
};

std::vector<Tensor> grads(const std::vector<Tensor>& ts) {
  std::vector<Tensor> g;
  for (const Tensor& t : ts) g.push_back(t.grad().defined() ? t.grad().clone() : Tensor());
  return g;
}

void run_case(bool ckpt) {
  Generator g(9);
  Tensor ids = randint(0, 11, {3, 4}, g);
  TinyNet net;
  net.ckpt = ckpt;
  Tensor x = randn64({3, 4, 6}, 21);
  // Reference: one backward.
  net(ids, x).backward();
  const auto want = grads(net.weights());
  const Tensor want_x = x.grad().clone();
  for (Tensor w : net.weights()) w.set_grad(Tensor());
  x.set_grad(Tensor());

  std::map<const void*, int> fired;
  std::vector<int> hook_ids;
  for (Tensor w : net.weights())
    hook_ids.push_back(w.register_post_accumulate_grad_hook([&fired](const Tensor& t) { ++fired[t.impl()]; }));
  Tensor loss = net(ids, x);
  DeferredWeightGrads w = backward_input({loss}, {}, net.weights());
  // The input pass: the input's gradient is complete, no weight has one yet.
  ASSERT_TRUE(x.grad().defined());
  EXPECT_CLOSE(x.grad(), want_x, 1e-12, 1e-12);
  for (Tensor p : net.weights()) EXPECT_FALSE(p.grad().defined()) << "a weight got its gradient in the input pass";
  EXPECT_FALSE(w.empty());
  EXPECT_EQ(w.size(), 4u);  // one node per op with weights: the embedding, layer_norm, fc, the tied head
  EXPECT_TRUE(fired.empty());
  // The weight pass.
  w.run();
  EXPECT_TRUE(w.empty());
  const auto got = grads(net.weights());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].defined()) << "weight " << i;
    EXPECT_CLOSE(got[i], want[i], 1e-12, 1e-12) << "weight " << i << (ckpt ? " (checkpointed)" : "");
  }
  // Each weight's accumulator ran once, with the sum (the tied embedding included).
  EXPECT_EQ(fired.size(), 5u);
  for (auto& [impl, n] : fired) EXPECT_EQ(n, 1);
  EXPECT_CLOSE(x.grad(), want_x, 1e-12, 1e-12);  // untouched by the weight pass
}

}  // namespace

TEST(SplitBackward, InputPassThenWeightPassEqualsBackward) { run_case(false); }

TEST(SplitBackward, DefersTheWeightsInsideACheckpointsRecompute) { run_case(true); }

TEST(SplitBackward, WeightsNotNamedAreComputedInTheInputPass) {
  TinyNet net;
  Generator g(3);
  Tensor ids = randint(0, 11, {2, 4}, g);
  Tensor x = randn64({2, 4, 6}, 5);
  DeferredWeightGrads w = backward_input({net(ids, x)}, {}, {net.fc.weight});
  EXPECT_FALSE(net.fc.weight.grad().defined());
  EXPECT_TRUE(net.fc.bias.grad().defined());
  EXPECT_TRUE(net.emb.weight.grad().defined());
  w.run();
  EXPECT_TRUE(net.fc.weight.grad().defined());
}

TEST(SplitBackward, EachPassAsksOnlyForItsOwnGradients) {
  // y = x * w with a hand-written backward that records what needs_grad said each time.
  std::vector<std::pair<bool, bool>> asked;
  Tensor x = randn64({4}, 1), w = randn64({4}, 2);
  Tensor y = record("scaled", {x, w}, mul(x.detach(), w.detach()), [&asked, x, w](const Node& n, const Grads& g) {
    asked.emplace_back(needs_grad(n, 0), needs_grad(n, 1));
    return Grads{needs_grad(n, 0) ? mul(g[0], w.detach()) : Tensor(), needs_grad(n, 1) ? mul(g[0], x.detach()) : Tensor()};
  });
  DeferredWeightGrads d = backward_input({sum(y)}, {}, {w});
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0], std::make_pair(true, false));  // the input pass: dx only
  d.run();
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_EQ(asked[1], std::make_pair(false, true));  // the weight pass: dw only
  EXPECT_CLOSE(x.grad(), w, 0, 0);
  EXPECT_CLOSE(w.grad(), x, 0, 0);
}

TEST(SplitBackward, NestingAnInputPassIsAnError) {
  Tensor a = randn64({3}, 1);
  // A checkpointed function that itself starts a split backward would mix the two passes.
  Tensor z = checkpoint(
      [&](const Tensor& in) {
        if (grad_enabled()) {  // the recompute, inside the outer input pass
          Tensor t = mul(in, in);
          (void)backward_input({sum(t)}, {}, {});
        }
        return mul(in, in);
      },
      a);
  const std::string msg = error_message([&] { (void)backward_input({sum(z)}, {}, {}); });
  EXPECT_NE(msg.find("called inside another split backward"), std::string::npos) << msg;
}

}  // namespace athanor
