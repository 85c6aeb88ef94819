// nn::MLP runs each Linear followed by a ReLU as one linear_relu op. Checked against the
// unfused composition written out with the model's own parameters (outputs and every
// parameter's gradient, f64/f32 and bf16 autocast), the parameter names, the graph (which
// op made each layer's output), and forward interceptors (ZeRO-3's hook) on the Linear.
#include "athanor/nn/mlp.h"
#include "athanor/ops/autocast.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
// The MLP written out with plain ops: linear, then relu between layers (tanh if asked).
Tensor composition(nn::MLP& m, const Tensor& x, bool tanh_act = false) {
  Tensor h = x.dim() > 2 ? flatten(x, 1) : x;
  for (size_t i = 0; i < m.layers->size(); ++i) {
    if (auto* lin = dynamic_cast<nn::Linear*>((*m.layers)[i].get())) h = linear(h, lin->weight, lin->bias);
    else if (dynamic_cast<nn::Dropout*>((*m.layers)[i].get())) continue;  // compared in eval mode
    else h = tanh_act ? tanh(h) : relu(h);
  }
  return h;
}

// Loss sum(out * w) and the gradients of every parameter, by name.
std::vector<std::pair<std::string, Tensor>> grads_of(nn::MLP& m, const Tensor& out, const Tensor& w) {
  m.zero_grad();
  sum(mul(out, w.to(out.dtype()))).backward();
  std::vector<std::pair<std::string, Tensor>> g;
  for (auto& [name, p] : m.named_parameters()) g.emplace_back(name, p.grad().clone());
  return g;
}

std::string producer(const Tensor& t) { return t.grad_fn() ? t.grad_fn()->name() : "leaf"; }
}  // namespace

TEST(MLP, FusedForwardAndGradientsMatchTheUnfusedComposition) {
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    nn::MLP m({20, 48, 150, 7});
    m.to(dt);
    Generator g(1);
    const Tensor x = randn({33, 4, 5}, {}, g).to(dt), w = randn({33, 7}, {}, g).to(dt);  // [N, 4, 5] flattened to 20
    const Tensor y = m.forward(x);
    const auto gf = grads_of(m, y, w);
    const Tensor yr = composition(m, x);
    const auto gr = grads_of(m, yr, w);
    const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
    EXPECT_CLOSE(y, yr, tol, tol);
    ASSERT_EQ(gf.size(), 6u);
    for (size_t i = 0; i < gf.size(); ++i) {
      SCOPED_TRACE(gf[i].first);
      EXPECT_CLOSE(gf[i].second, gr[i].second, tol, tol);
    }
  }
}

TEST(MLP, Bf16AutocastMatchesTheUnfusedComposition) {
  nn::MLP m({64, 96, 96, 10});
  Generator g(2);
  const Tensor x = randn({128, 64}, {}, g), w = randn({128, 10}, {}, g);
  Tensor y, yr;
  {
    autocast ac(DType::bf16);
    y = m.forward(x);
  }
  const auto gf = grads_of(m, y, w);
  {
    autocast ac(DType::bf16);
    yr = composition(m, x);
  }
  const auto gr = grads_of(m, yr, w);
  ASSERT_EQ(y.dtype(), DType::bf16);
  EXPECT_CLOSE(y.to(DType::f32), yr.to(DType::f32), 2e-2, 1e-2);
  for (size_t i = 0; i < gf.size(); ++i) {
    SCOPED_TRACE(gf[i].first);
    ASSERT_EQ(gf[i].second.dtype(), DType::f32);
    EXPECT_CLOSE(gf[i].second, gr[i].second, 1e-1, 2e-2);
  }
}

TEST(MLP, ParameterNamesAreTheSequentialsAndHiddenLayersRunFused) {
  nn::MLP m({6, 8, 8, 3});
  std::vector<std::string> names;
  for (auto& [name, p] : m.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias",
                                             "layers.4.weight", "layers.4.bias"}));
  const Tensor y = m.forward(random_leaf({5, 6}, 3));
  // The output layer is a plain linear; both hidden layers are linear_relu, with no relu node.
  ASSERT_EQ(producer(y), "linear");
  const auto& hidden2 = y.grad_fn()->next_edges[0].node;
  ASSERT_TRUE(hidden2);
  EXPECT_EQ(hidden2->name(), "linear_relu");
  ASSERT_TRUE(hidden2->next_edges[0].node);
  EXPECT_EQ(hidden2->next_edges[0].node->name(), "linear_relu");
  EXPECT_EQ(hidden2->module_path.find("layers.2") != std::string::npos, true) << hidden2->module_path;
}

TEST(MLP, OtherActivationsAndDropoutKeepTheirOwnOps) {
  Generator g(4);
  const Tensor x = randn({9, 6}, {}, g);
  {  // tanh: not fused
    nn::MLP m({6, 8, 3}, "tanh");
    const Tensor y = m.forward(x);
    ASSERT_TRUE(y.grad_fn()->next_edges[0].node);
    EXPECT_EQ(y.grad_fn()->next_edges[0].node->name(), "tanh");
    EXPECT_CLOSE(y, composition(m, x, /*tanh_act=*/true), 1e-6, 1e-6);
  }
  {  // dropout comes after the ReLU: Linear + ReLU still fuse; in eval mode the result is the composition's
    nn::MLP m({6, 8, 8, 3}, "relu", 0.5);
    m.eval();
    EXPECT_CLOSE(m.forward(x), composition(m, x), 1e-6, 1e-6);
    m.train();
    const Tensor y = m.forward(x);
    ASSERT_TRUE(y.grad_fn()->next_edges[0].node);
    EXPECT_EQ(y.grad_fn()->next_edges[0].node->name(), "dropout");
  }
}

TEST(MLP, ForwardInterceptorOnALinearWrapsTheFusedOp) {
  // ZeRO-3 installs an interceptor on each Linear: it must still see (and may run again)
  // the forward of that Linear, now linear_relu.
  nn::MLP m({6, 8, 8, 3});
  Generator g(5);
  const Tensor x = randn({4, 6}, {}, g);
  const Tensor expected = composition(m, x);
  int calls = 0;
  (*m.layers)[2]->set_forward_interceptor([&calls](const Tensor& in, const nn::Module::ForwardFn& fn) {
    ++calls;
    fn(in);  // a checkpoint-style recompute: running it twice gives the same result
    return fn(in);
  });
  const Tensor y = m.forward(x);
  EXPECT_EQ(calls, 1);
  EXPECT_CLOSE(y, expected, 1e-6, 1e-6);
  EXPECT_EQ(y.grad_fn()->next_edges[0].node->name(), "linear_relu");
  // An interceptor on the ReLU itself keeps that pair unfused, and is called.
  int relu_calls = 0;
  (*m.layers)[1]->set_forward_interceptor([&relu_calls](const Tensor& in, const nn::Module::ForwardFn& fn) {
    ++relu_calls;
    return fn(in);
  });
  const Tensor y2 = m.forward(x);
  EXPECT_EQ(relu_calls, 1);
  EXPECT_CLOSE(y2, expected, 1e-6, 1e-6);
  const auto& second = y2.grad_fn()->next_edges[0].node;  // layers.2 + 3: still fused
  ASSERT_EQ(second->name(), "linear_relu");
  EXPECT_EQ(second->next_edges[0].node->name(), "relu");  // layers.1 ran as its own op
}

}  // namespace athanor
