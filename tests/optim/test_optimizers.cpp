// Optimizers against independent references: torch.optim trajectories (fixture
// written by tools/make_optim_fixtures.py) for SGD/RMSprop/Adam/AdamW, and
// scalar re-derivations from the papers for LAMB and LARS. Plus state save/load.
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "athanor/optim/optimizer.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
using namespace athanor::optim;

namespace {
nlohmann::json load_fixture() {
  std::ifstream f(std::string(ATHANOR_FIXTURES_DIR) + "/optim_torch.json");
  EXPECT_TRUE(f.good()) << "missing fixture optim_torch.json";
  return nlohmann::json::parse(f);
}

std::vector<ParamGroup> one_group(Tensor p, double lr, double wd) {
  return {ParamGroup{"all", {{"w", p}}, lr, lr, wd}};
}

std::unique_ptr<Optimizer> make_from(const std::string& name, const nlohmann::json& o, Tensor p) {
  const double lr = o["lr"], wd = o.value("weight_decay", 0.0);
  if (name.rfind("sgd", 0) == 0)
    return make_sgd(one_group(p, lr, wd), {o.value("momentum", 0.0), o.value("dampening", 0.0), o.value("nesterov", false)});
  if (name.rfind("rmsprop", 0) == 0)
    return make_rmsprop(one_group(p, lr, wd), {o.value("alpha", 0.99), o.value("eps", 1e-8), o.value("momentum", 0.0), o.value("centered", false)});
  AdamOptions a{o["betas"][0], o["betas"][1], o["eps"]};
  return name == "adamw" ? make_adamw(one_group(p, lr, wd), a) : make_adam(one_group(p, lr, wd), a);
}
}  // namespace

TEST(Optimizers, MatchTorchOptimTrajectories) {
  const auto fx = load_fixture();
  for (auto& [name, c] : fx["cases"].items()) {
    SCOPED_TRACE(name);
    Tensor p = from_vector(fx["p0"].get<std::vector<double>>(), {4}, TensorOptions(DType::f64)).requires_grad_(true);
    auto opt = make_from(name, c["options"], p);
    for (size_t k = 0; k < fx["grads"].size(); ++k) {
      p.set_grad(from_vector(fx["grads"][k].get<std::vector<double>>(), {4}, TensorOptions(DType::f64)));
      opt->step();
      EXPECT_CLOSE(p, from_vector(c["trajectory"][k].get<std::vector<double>>(), {4}, TensorOptions(DType::f64)), 1e-12, 1e-10)
          << "after step " << k + 1;
    }
  }
}

TEST(Optimizers, LambMatchesThePaperStepByStep) {
  // Scalar re-derivation of LAMB (You et al. 2019, Alg. 2) with bias correction.
  const std::vector<double> p0 = {0.5, -1.0, 2.0};
  const std::vector<std::vector<double>> grads = {{0.1, 0.2, -0.3}, {-0.4, 0.1, 0.0}, {0.2, -0.2, 0.6}};
  const double lr = 0.02, b1 = 0.9, b2 = 0.999, eps = 1e-6, wd = 0.01;
  std::vector<double> w = p0, m(3, 0), v(3, 0);
  Tensor p = from_vector(p0, {3}, TensorOptions(DType::f64)).requires_grad_(true);
  auto opt = make_lamb(one_group(p, lr, wd), {b1, b2, eps});
  for (size_t t = 1; t <= grads.size(); ++t) {
    std::vector<double> r(3);
    double wn = 0, rn = 0;
    for (int i = 0; i < 3; ++i) {
      m[i] = b1 * m[i] + (1 - b1) * grads[t - 1][i];
      v[i] = b2 * v[i] + (1 - b2) * grads[t - 1][i] * grads[t - 1][i];
      const double mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
      r[i] = mh / (std::sqrt(vh) + eps) + wd * w[i];
      wn += w[i] * w[i];
      rn += r[i] * r[i];
    }
    const double trust = std::sqrt(wn) / std::sqrt(rn);
    for (int i = 0; i < 3; ++i) w[i] -= lr * trust * r[i];
    p.set_grad(from_vector(grads[t - 1], {3}, TensorOptions(DType::f64)));
    opt->step();
    EXPECT_CLOSE(p, from_vector(w, {3}, TensorOptions(DType::f64)), 1e-13, 1e-11) << "step " << t;
  }
}

TEST(Optimizers, LarsMatchesThePaperStepByStep) {
  // LARS (You et al. 2017): local_lr = eta ||w|| / (||g|| + wd ||w||); v = m v + lr local_lr (g + wd w); w -= v.
  const std::vector<double> p0 = {1.0, 2.0, -2.0};
  const std::vector<std::vector<double>> grads = {{0.3, 0.0, 0.4}, {0.1, -0.1, 0.2}};
  const double lr = 0.5, mom = 0.9, eta = 0.01, wd = 0.001, eps = 1e-8;
  std::vector<double> w = p0, v(3, 0);
  Tensor p = from_vector(p0, {3}, TensorOptions(DType::f64)).requires_grad_(true);
  auto opt = make_lars(one_group(p, lr, wd), {mom, eta, eps});
  for (size_t t = 0; t < grads.size(); ++t) {
    double wn = 0, gn = 0;
    for (int i = 0; i < 3; ++i) wn += w[i] * w[i], gn += grads[t][i] * grads[t][i];
    wn = std::sqrt(wn), gn = std::sqrt(gn);
    const double local = eta * wn / (gn + wd * wn + eps);
    for (int i = 0; i < 3; ++i) {
      v[i] = mom * v[i] + lr * local * (grads[t][i] + wd * w[i]);
      w[i] -= v[i];
    }
    p.set_grad(from_vector(grads[t], {3}, TensorOptions(DType::f64)));
    opt->step();
    EXPECT_CLOSE(p, from_vector(w, {3}, TensorOptions(DType::f64)), 1e-14, 1e-12) << "step " << t;
  }
}

TEST(Optimizers, F32ParametersKeepF32StateAndFollowTheF64Path) {
  Tensor p64 = from_vector(std::vector<double>{0.5, -0.25}, {2}, TensorOptions(DType::f64)).requires_grad_(true);
  Tensor p32 = from_vector(std::vector<double>{0.5, -0.25}, {2}).requires_grad_(true);
  auto a = make_adamw(one_group(p64, 1e-2, 0.1)), b = make_adamw(one_group(p32, 1e-2, 0.1));
  for (int k = 0; k < 10; ++k) {
    p64.set_grad(from_vector(std::vector<double>{0.1 * k, -0.05}, {2}, TensorOptions(DType::f64)));
    p32.set_grad(from_vector(std::vector<double>{0.1 * k, -0.05}, {2}));
    a->step();
    b->step();
  }
  EXPECT_CLOSE(p32, p64, 1e-6, 1e-5);
  for (auto& [n, t] : b->state_tensors()) {
    EXPECT_EQ(t.dtype(), DType::f32) << n;
    EXPECT_EQ(t.storage()->tag(), MemTag::optimizer_state) << n;
  }
}

TEST(Optimizers, ParametersWithoutGradAreSkipped) {
  Tensor a = ones({2}).requires_grad_(true), b = ones({2}).requires_grad_(true);
  auto opt = make_sgd({ParamGroup{"g", {{"a", a}, {"b", b}}, 0.1, 0.1, 0.0}});
  a.set_grad(ones({2}));
  opt->step();
  EXPECT_CLOSE(a, full({2}, 0.9), 1e-7, 0);
  EXPECT_CLOSE(b, ones({2}), 0, 0);
}

TEST(Optimizers, StateRoundTripContinuesIdentically) {
  auto run = [](Optimizer& opt, Tensor& p, int from, int to) {
    for (int k = from; k < to; ++k) {
      p.set_grad(from_vector(std::vector<double>{std::sin(k), std::cos(k), 0.1 * k}, {3}));
      opt.step();
    }
  };
  Tensor p1 = from_vector(std::vector<double>{1, 2, 3}, {3}).requires_grad_(true);
  auto o1 = make_adam(one_group(p1, 0.01, 0.0));
  run(*o1, p1, 0, 6);
  Tensor p2 = from_vector(std::vector<double>{1, 2, 3}, {3}).requires_grad_(true);
  auto o2 = make_adam(one_group(p2, 0.01, 0.0));
  run(*o2, p2, 0, 3);
  auto tensors = o2->state_tensors();
  auto scalars = o2->state_scalars();
  EXPECT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors[0].first, "exp_avg.w");
  Tensor p3 = p2.detach().clone().requires_grad_(true);
  auto o3 = make_adam(one_group(p3, 0.01, 0.0));
  o3->load_state(tensors, scalars);
  EXPECT_EQ(o3->steps(), 3);
  run(*o3, p3, 3, 6);
  EXPECT_CLOSE(p3, p1, 0, 0);  // bit-identical continuation
}

TEST(Optimizers, LoadStateRejectsUnknownParametersAndShapes) {
  Tensor p = ones({3}).requires_grad_(true);
  auto opt = make_adam(one_group(p, 0.01, 0.0));
  EXPECT_NE(error_message([&] { opt->load_state({{"exp_avg.other", zeros({3})}}, {}); }).find("'other'"), std::string::npos);
  EXPECT_NE(error_message([&] { opt->load_state({{"exp_avg.w", zeros({4})}}, {}); }).find("[4]"), std::string::npos);
}

TEST(Optimizers, DefaultGroupsExcludeBiasesNormsAndEmbeddings) {
  optim::NamedTensors named = {{"transformer.wte.weight", zeros({10, 4})}, {"h.0.attn.c_attn.weight", zeros({12, 4})},
                               {"h.0.attn.c_attn.bias", zeros({12})},      {"h.0.ln_1.weight", zeros({4})}};
  auto groups = default_param_groups(named, 1e-3, 0.1);
  ASSERT_EQ(groups.size(), 2u);
  ASSERT_EQ(groups[0].params.size(), 1u);
  EXPECT_EQ(groups[0].params[0].first, "h.0.attn.c_attn.weight");
  EXPECT_EQ(groups[0].weight_decay, 0.1);
  EXPECT_EQ(groups[1].params.size(), 3u);
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  EXPECT_EQ(default_param_groups(named, 1e-3, 0.1, /*decay_embeddings=*/true)[0].params.size(), 2u);
}

TEST(Optimizers, LowPrecisionParametersAreRejectedWithAHint) {
  Tensor p = ones({2}, TensorOptions(DType::bf16)).requires_grad_(true);
  const std::string msg = error_message([&] { make_sgd(one_group(p, 0.1, 0)); });
  EXPECT_NE(msg.find("bf16"), std::string::npos) << msg;
  EXPECT_NE(msg.find("autocast"), std::string::npos) << msg;
}

}  // namespace athanor
