// A GPT block's training step under autocast on CUDA against the CPU: the ops and dtypes
// nn::GPT's forward and loss call (src/nn/gpt.cpp) — embedding, the broadcast add of the
// position embedding, dropout 0.1, layer_norm, linear (qkv, c_proj, c_fc and the tied
// lm_head), causal_self_attention, gelu_linear, the f32 + 16-bit residual adds,
// cross_entropy — written out functionally on leaf parameters made on each device from one
// set of values, so no nn code is involved. Run in f32 (no autocast), bf16 autocast (the
// f32-master rule: dW in f32 from bf16 GEMMs) and f16 autocast; the dropout masks are the
// same on both devices (one seed).
//
// Tolerances, as max |gpu - cpu| / max |cpu| over each tensor (both devices accumulate in
// f32; the 16-bit GEMM outputs and casts round at 2^-8 (bf16) / 2^-11 (f16) of each value,
// and the GEMMs sum in another order):
//   f32:  loss 1e-5 relative, every gradient 1e-4;
//   f16:  loss 2e-3 relative, every gradient 1e-2;
//   bf16: loss 1e-2 relative, every gradient 4e-2.
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "athanor/autograd/engine.h"
#include "athanor/core/rng.h"
#include "athanor/ops/attention.h"
#include "athanor/ops/autocast.h"
#include "athanor/ops/dropout.h"
#include "athanor/ops/elementwise.h"
#include "athanor/ops/embedding.h"
#include "athanor/ops/gelu_linear.h"
#include "athanor/ops/linalg.h"
#include "athanor/ops/loss.h"
#include "athanor/ops/norm.h"
#include "athanor/ops/shape.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;

namespace {

constexpr int64_t B = 2, T = 16, C = 128, H = 2, V = 96;

struct Params {
  std::map<std::string, Tensor> p;
  Tensor& operator[](const std::string& k) { return p.at(k); }
};

Params make_params(Device d) {
  std::mt19937 g(11);
  std::normal_distribution<double> n(0.0, 1.0);
  auto randn = [&](const Shape& s, double scale) {
    int64_t k = 1;
    for (int64_t v : s) k *= v;
    std::vector<double> v(static_cast<std::size_t>(k));
    for (auto& x : v) x = scale * n(g);
    return from_vector(v, s, TensorOptions(DType::f32));
  };
  auto ones_plus = [&](int64_t k) { return add(randn({k}, 0.1), 1.0); };
  Params P;
  P.p = {{"wte", randn({V, C}, 0.1)},          {"wpe", randn({T, C}, 0.1)},
         {"ln_1.w", ones_plus(C)},             {"ln_1.b", randn({C}, 0.1)},
         {"attn.w", randn({3 * C, C}, 0.05)},  {"attn.b", randn({3 * C}, 0.02)},
         {"proj.w", randn({C, C}, 0.05)},      {"proj.b", randn({C}, 0.02)},
         {"ln_2.w", ones_plus(C)},             {"ln_2.b", randn({C}, 0.1)},
         {"fc.w", randn({4 * C, C}, 0.05)},    {"fc.b", randn({4 * C}, 0.02)},
         {"fc_proj.w", randn({C, 4 * C}, 0.03)}, {"fc_proj.b", randn({C}, 0.02)},
         {"ln_f.w", ones_plus(C)},             {"ln_f.b", randn({C}, 0.1)}};
  for (auto& [k, t] : P.p) {
    t = t.to(d).detach();
    t.requires_grad_(true);
  }
  return P;
}

// nn::GPT's forward and loss for one block (src/nn/gpt.cpp), on `d`.
Tensor gpt_loss(Params& P, Device d, Generator& gen) {
  std::vector<int64_t> ids(B * T), targets(B * T), pos(T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = (i * 37 + 5) % V, targets[i] = (i * 11 + 3) % V;
  for (int64_t t = 0; t < T; ++t) pos[t] = t;
  const Tensor idt = from_vector(ids, {B, T}).to(d), tgt = from_vector(targets, {B * T}).to(d), post = from_vector(pos, {T}).to(d);
  const double p = 0.1;
  Tensor x = dropout(add(embedding(P["wte"], idt), embedding(P["wpe"], post)), p, true, gen);  // [B,T,C] + [T,C]
  Tensor qkv = linear(layer_norm(x, {C}, P["ln_1.w"], P["ln_1.b"]), P["attn.w"], P["attn.b"]);
  Tensor a = dropout(linear(causal_self_attention(qkv, H), P["proj.w"], P["proj.b"]), p, true, gen);
  Tensor h = add(x, a);
  Tensor m = linear(layer_norm(h, {C}, P["ln_2.w"], P["ln_2.b"]), P["fc.w"], P["fc.b"]);
  m = dropout(gelu_linear(m, P["fc_proj.w"], P["fc_proj.b"]), p, true, gen);
  h = add(h, m);
  Tensor logits = linear(layer_norm(h, {C}, P["ln_f.w"], P["ln_f.b"]), P["wte"]);
  return cross_entropy(reshape(logits, {-1, V}), tgt);
}

double rel_diff(const Tensor& got, const Tensor& want) {
  const std::vector<double> g = got.cpu().to_vector(), w = want.cpu().to_vector();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    num = std::max(num, std::abs(g[i] - w[i]));
    den = std::max(den, std::abs(w[i]));
    if (!std::isfinite(g[i])) return INFINITY;
  }
  return den > 0 ? num / den : num;
}

void run(std::optional<DType> precision, double loss_tol, double grad_tol) {
  Params pc = make_params(Device::cpu()), pg = make_params(Device::cuda(0));
  Generator gc(5), gg(5);
  Tensor lc, lg;
  {
    std::optional<autocast> ac;
    if (precision) ac.emplace(*precision);
    lc = gpt_loss(pc, Device::cpu(), gc);
    lg = gpt_loss(pg, Device::cuda(0), gg);
  }
  EXPECT_EQ(lg.device(), Device::cuda(0));
  EXPECT_EQ(lg.dtype(), lc.dtype());
  const double vc = lc.item<double>(), vg = lg.item<double>();
  EXPECT_LE(std::abs(vg - vc), loss_tol * std::abs(vc)) << "loss: gpu " << vg << ", cpu " << vc;
  backward({lc});
  backward({lg});
  for (auto& [name, t] : pc.p) {
    const Tensor gcpu = t.grad(), ggpu = pg[name].grad();
    ASSERT_TRUE(gcpu.defined() && ggpu.defined()) << name;
    EXPECT_EQ(ggpu.device(), Device::cuda(0)) << name;
    EXPECT_EQ(ggpu.dtype(), DType::f32) << name << ": the gradient of an f32 parameter";
    EXPECT_LE(rel_diff(ggpu, gcpu), grad_tol) << "gradient of " << name;
  }
}

}  // namespace

TEST(GpuAutocast, GptBlockStepMatchesTheCpuInF32) {
  ATH_REQUIRE_GPU();
  run(std::nullopt, 1e-5, 1e-4);
}
TEST(GpuAutocast, GptBlockStepMatchesTheCpuUnderBf16Autocast) {
  ATH_REQUIRE_GPU();
  run(DType::bf16, 1e-2, 4e-2);
}
TEST(GpuAutocast, GptBlockStepMatchesTheCpuUnderF16Autocast) {
  ATH_REQUIRE_GPU();
  run(DType::f16, 2e-3, 1e-2);
}
