// Activation checkpointing: gradients through checkpoint() equal those of the
// same computation without it (same ops, so f64 results agree exactly) and
// match central finite differences; dropout masks replay; the RNG stream after
// backward is the non-checkpointed one; nesting; autocast; error paths.
#include <cmath>

#include "athanor/autograd/checkpoint.h"
#include "athanor/core/rng.h"
#include "athanor/ops/autocast.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {

// A two-layer MLP with a residual product: exercises several saved tensors.
struct SmallMlp {
  Tensor w1, b1, w2;
  explicit SmallMlp(uint64_t seed, DType dt = DType::f64) {
    w1 = randn64({6, 5}, seed).to(dt).detach().requires_grad_(true);
    b1 = randn64({6}, seed + 1).to(dt).detach().requires_grad_(true);
    w2 = randn64({5, 6}, seed + 2).to(dt).detach().requires_grad_(true);
  }
  Tensor operator()(const Tensor& x) const {
    Tensor h = tanh(linear(x, w1, b1));
    return mul(linear(h, w2), x);  // y = (W2 tanh(W1 x + b1)) * x
  }
  std::vector<Tensor> params() const { return {w1, b1, w2}; }
};

void clear_grads(const std::vector<Tensor>& ts) {
  for (const Tensor& t : ts) t.set_grad(Tensor());
}

std::vector<Tensor> grads_of(const std::vector<Tensor>& ts) {
  std::vector<Tensor> g;
  for (const Tensor& t : ts) g.push_back(t.grad().defined() ? t.grad().clone().detach() : Tensor());
  return g;
}

void expect_same_grads(const std::vector<Tensor>& actual, const std::vector<Tensor>& expected, double atol, double rtol) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_TRUE(actual[i].defined()) << "gradient " << i << " missing";
    ASSERT_TRUE(expected[i].defined()) << "reference gradient " << i << " missing";
    EXPECT_CLOSE(actual[i], expected[i], atol, rtol) << "gradient " << i;
  }
}

int64_t count_zeros(const Tensor& t) {
  int64_t n = 0;
  for (double v : t.to_vector()) n += v == 0.0;
  return n;
}

}  // namespace

TEST(Checkpoint, CompoundFunctionGradientsEqualPlainRunInF64) {
  SmallMlp mlp(11);
  Tensor x = randn64({4, 5}, 3);
  std::vector<Tensor> all = {x, mlp.w1, mlp.b1, mlp.w2};

  sum(square(mlp(x))).backward();
  const std::vector<Tensor> plain = grads_of(all);
  clear_grads(all);

  Tensor y = checkpoint([&](const Tensor& in) { return mlp(in); }, x);
  ASSERT_TRUE(y.requires_grad());
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "checkpoint");
  sum(square(y)).backward();
  expect_same_grads(grads_of(all), plain, 0, 0);  // the same kernels ran: bit-identical
}

TEST(Checkpoint, GradientsMatchFiniteDifferencesInF64) {
  SmallMlp mlp(21);
  Tensor x = randn64({3, 5}, 4), z = randn64({3, 5}, 5);
  // Two inputs and two outputs; the parameters are used only inside fn (captured),
  // so their gradients come from the nested backward.
  auto fn = [&](const std::vector<Tensor>& in) {
    std::vector<Tensor> ys = checkpoint(
        [&](const std::vector<Tensor>& xs) { return std::vector<Tensor>{mlp(xs[0]), mul(xs[0], exp(xs[1]))}; },
        {in[0], in[1]});
    return add(mul(ys[0], 0.5), tanh(ys[1]));
  };
  EXPECT_TRUE(gradcheck(fn, {x, z, mlp.w1, mlp.b1, mlp.w2}));
}

TEST(Checkpoint, ParametersInsideGetGradientsWhenNoInputRequiresGrad) {
  SmallMlp mlp(31);
  Tensor x = randn64({4, 5}, 6, /*requires_grad=*/false);
  sum(square(mlp(x))).backward();
  const std::vector<Tensor> plain = grads_of(mlp.params());
  clear_grads(mlp.params());

  int hook_calls = 0;
  Tensor w1 = mlp.w1;
  w1.register_post_accumulate_grad_hook([&](const Tensor&) { ++hook_calls; });
  Tensor y = checkpoint([&](const Tensor& in) { return mlp(in); }, x);
  ASSERT_TRUE(y.requires_grad()) << "the output must require grad so the parameters inside get gradients";
  sum(square(y)).backward();
  expect_same_grads(grads_of(mlp.params()), plain, 0, 0);
  EXPECT_EQ(hook_calls, 1);  // post-accumulate hooks fire from the nested backward
  EXPECT_FALSE(x.grad().defined());
}

TEST(Checkpoint, DropoutMasksReplayAndOuterRngStreamIsUnaffected) {
  SmallMlp mlp(41);
  Tensor x = randn64({8, 5}, 7);
  std::vector<Tensor> all = {x, mlp.w1, mlp.b1, mlp.w2};
  auto inner = [&](const Tensor& in) { return dropout(mlp(in), 0.4, /*training=*/true); };
  // A dropout after the checkpoint too: it must draw the same mask in both runs,
  // i.e. the checkpoint's forward consumes the generator exactly like the plain fn.
  auto run = [&](bool use_checkpoint) {
    manual_seed(1234);
    Tensor y = use_checkpoint ? checkpoint(inner, x) : inner(x);
    Tensor out = dropout(tanh(y), 0.3, true);
    EXPECT_GT(count_zeros(y), 0);  // the masks drop something, so a wrong replay would change the gradients
    sum(square(out)).backward();
    // A draw after backward: equal only if backward left the generator where the plain run has it.
    Tensor after = rand({4}, TensorOptions(DType::f64));
    return std::make_pair(default_generator().state(), after);
  };
  const auto [state_plain, after_plain] = run(false);
  const std::vector<Tensor> plain = grads_of(all);
  clear_grads(all);
  const auto [state_ckpt, after_ckpt] = run(true);
  expect_same_grads(grads_of(all), plain, 0, 0);
  EXPECT_EQ(state_ckpt, state_plain);
  EXPECT_CLOSE(after_ckpt, after_plain, 0, 0);
}

TEST(Checkpoint, NestedCheckpointGradientsEqualPlainRunAndFiniteDifferences) {
  SmallMlp a(51), b(61);
  Tensor x = randn64({4, 5}, 8);
  std::vector<Tensor> all = {x, a.w1, a.b1, a.w2, b.w1, b.b1, b.w2};
  auto inner = [&](const Tensor& in) { return dropout(b(in), 0.25, true); };
  auto outer_plain = [&](const Tensor& in) { return a(inner(tanh(in))); };
  auto outer_nested = [&](const Tensor& in) { return a(checkpoint(inner, tanh(in))); };

  manual_seed(99);
  sum(square(outer_plain(x))).backward();
  const GeneratorState state_plain = default_generator().state();
  const std::vector<Tensor> plain = grads_of(all);
  clear_grads(all);

  manual_seed(99);
  Tensor y = checkpoint(outer_nested, x);
  sum(square(y)).backward();
  expect_same_grads(grads_of(all), plain, 0, 0);
  EXPECT_EQ(default_generator().state(), state_plain);

  // And against finite differences (no dropout: gradcheck evaluates fn many times).
  auto fd_fn = [&](const std::vector<Tensor>& in) {
    return checkpoint([&](const Tensor& v) { return a(checkpoint([&](const Tensor& u) { return b(u); }, tanh(v))); },
                      in[0]);
  };
  EXPECT_TRUE(gradcheck(fd_fn, all));
}

TEST(Checkpoint, UnderAutocastBf16EqualsTheNonCheckpointedAutocastRun) {
  SmallMlp mlp(71, DType::f32);
  Tensor x = randn64({8, 5}, 9).to(DType::f32).detach().requires_grad_(true);
  std::vector<Tensor> all = {x, mlp.w1, mlp.b1, mlp.w2};
  auto fn = [&](const Tensor& in) { return linear(gelu(linear(in, mlp.w1, mlp.b1)), mlp.w2); };
  auto run = [&](bool use_checkpoint) {
    Tensor y;
    {
      autocast ac(DType::bf16);
      y = use_checkpoint ? checkpoint(fn, x) : fn(x);
      EXPECT_EQ(y.dtype(), DType::bf16);  // the linears ran in bf16
    }
    sum(square(y.to(DType::f32))).backward();  // backward outside the region, as in PyTorch
  };
  run(false);
  const std::vector<Tensor> plain = grads_of(all);
  clear_grads(all);
  run(true);
  // Same bf16 kernels in both runs; a recompute in f32 would differ at bf16 precision (~1e-2).
  expect_same_grads(grads_of(all), plain, 1e-6, 1e-6);
  for (const Tensor& p : mlp.params()) EXPECT_EQ(p.grad().dtype(), DType::f32);
}

TEST(Checkpoint, InPlaceChangeOfASavedInputRaisesTheVersionError) {
  SmallMlp mlp(81);
  Tensor x = randn64({2, 5}, 10);
  Tensor h = mul(x, 2.0);  // a non-leaf input we can modify in place
  Tensor y = checkpoint([&](const Tensor& in) { return mlp(in); }, h);
  h.fill_(0.0);
  const std::string msg = error_message([&] { sum(y).backward(); });
  EXPECT_NE(msg.find("modified by an in-place operation"), std::string::npos) << msg;
  EXPECT_NE(msg.find("checkpoint input"), std::string::npos) << msg;
}

TEST(Checkpoint, UnderNoGradItJustRunsTheFunction) {
  SmallMlp mlp(91);
  Tensor x = randn64({2, 5}, 12);
  NoGradGuard ng;
  Tensor y = checkpoint([&](const Tensor& in) { return mlp(in); }, x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
}

TEST(Checkpoint, FunctionMayReturnItsInputAndEmptyFunctionIsAnError) {
  Tensor x = randn64({3}, 13);
  Tensor y = checkpoint([](const Tensor& in) { return in; }, x);
  sum(mul(y, 3.0)).backward();
  EXPECT_CLOSE(x.grad(), full({3}, 3.0, TensorOptions(DType::f64)), 0, 0);
  const std::string msg = error_message([&] { checkpoint(CheckpointFn(), {x}); });
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;
}

}  // namespace athanor
