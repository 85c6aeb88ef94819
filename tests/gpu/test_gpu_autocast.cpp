// Training steps under autocast on CUDA against the CPU, for the op sequences the models call,
// written out functionally on leaf parameters made on each device from one set of values (no
// nn code involved):
//  - a GPT block (src/nn/gpt.cpp): embedding, the broadcast add of the position embedding,
//    dropout 0.1, layer_norm, linear (qkv, c_proj, c_fc, the tied lm_head),
//    causal_self_attention, gelu_linear, the f32 + 16-bit residual adds, cross_entropy;
//  - a Llama block (src/nn/llama.cpp): rms_norm, q/k/v projections, rope (theta 500000, an
//    offset), grouped-query sdpa (4 query heads, 2 kv heads), swiglu, the residual adds;
//  - a ConvNet + MLP step (src/nn/convnet.cpp, mlp.cpp): conv2d, batch_norm (training),
//    relu, max_pool2d, flatten, linear_relu, linear, cross_entropy.
// Each in f32 (no autocast), bf16 autocast (the f32-master rule: dW in f32 from bf16 GEMMs)
// and f16 autocast; the dropout masks are the same on both devices (one seed).
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
#include "athanor/ops/activation.h"
#include "athanor/ops/attention.h"
#include "athanor/ops/conv.h"
#include "athanor/ops/autocast.h"
#include "athanor/ops/dropout.h"
#include "athanor/ops/elementwise.h"
#include "athanor/ops/embedding.h"
#include "athanor/ops/gelu_linear.h"
#include "athanor/ops/linalg.h"
#include "athanor/ops/loss.h"
#include "athanor/ops/linear_relu.h"
#include "athanor/ops/norm.h"
#include "athanor/ops/rope.h"
#include "athanor/ops/shape.h"
#include "athanor/ops/swiglu.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;

namespace {

constexpr int64_t B = 2, T = 16, C = 128, H = 2, V = 96;

struct Params {
  std::map<std::string, Tensor> p;
  Tensor& operator[](const std::string& k) { return p.at(k); }
};

using Spec = std::vector<std::pair<std::string, std::pair<Shape, double>>>;  // name, shape, scale (0: 1 + N(0, 0.1))

Params make_params(Device d, const Spec& spec) {
  std::mt19937 g(11);
  std::normal_distribution<double> n(0.0, 1.0);
  Params P;
  for (const auto& [name, sv] : spec) {
    const auto& [shape, scale] = sv;
    int64_t k = 1;
    for (int64_t v : shape) k *= v;
    std::vector<double> v(static_cast<std::size_t>(k));
    for (auto& x : v) x = scale == 0 ? 1.0 + 0.1 * n(g) : scale * n(g);
    Tensor t = from_vector(v, shape, TensorOptions(DType::f32)).to(d).detach();
    t.requires_grad_(true);
    P.p.emplace(name, t);
  }
  return P;
}

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

// A Llama block (src/nn/llama.cpp's order) and its loss.
constexpr int64_t LH = 4, LKV = 2, LD = 64, LC = LH * LD, LI = 192;
const Spec kLlama = {{"wte", {{V, LC}, 0.1}},         {"in_norm", {{LC}, 0.0}},        {"q", {{LH * LD, LC}, 0.05}},
                     {"k", {{LKV * LD, LC}, 0.05}},   {"v", {{LKV * LD, LC}, 0.05}},   {"o", {{LC, LH * LD}, 0.05}},
                     {"post_norm", {{LC}, 0.0}},      {"gate", {{LI, LC}, 0.05}},      {"up", {{LI, LC}, 0.05}},
                     {"down", {{LC, LI}, 0.05}},      {"norm", {{LC}, 0.0}},           {"lm_head", {{V, LC}, 0.05}}};
Tensor llama_loss(Params& P, Device d, Generator&) {
  std::vector<int64_t> ids(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = (i * 37 + 5) % V, targets[i] = (i * 11 + 3) % V;
  const Tensor idt = from_vector(ids, {B, T}).to(d), tgt = from_vector(targets, {B * T}).to(d);
  const RopeOptions ro{.theta = 500000.0, .llama3 = std::nullopt, .position_offset = 3};
  Tensor x = embedding(P["wte"], idt);
  Tensor h = rms_norm(x, {LC}, P["in_norm"], 1e-5);
  Tensor q = rope(view(linear(h, P["q"]), {B, T, LH, LD}), ro);
  Tensor k = rope(view(linear(h, P["k"]), {B, T, LKV, LD}), ro);
  Tensor v = view(linear(h, P["v"]), {B, T, LKV, LD});
  Tensor y = scaled_dot_product_attention(transpose(q, 1, 2), transpose(k, 1, 2), transpose(v, 1, 2), true, std::nullopt, true);
  x = add(x, linear(reshape(transpose(y, 1, 2), {B, T, LH * LD}), P["o"]));
  x = add(x, linear(swiglu(rms_norm(x, {LC}, P["post_norm"], 1e-5), P["gate"], P["up"]), P["down"]));
  Tensor logits = linear(rms_norm(x, {LC}, P["norm"], 1e-5), P["lm_head"]);
  return cross_entropy(reshape(logits, {-1, V}), tgt);
}

// ConvNet's features and an MLP head (src/nn/convnet.cpp, mlp.cpp): conv, batch_norm, relu,
// max_pool twice, then linear_relu and linear, on [4, 1, 12, 12] images.
constexpr int64_t CN = 4, CH = 12, C1 = 8, C2 = 16, HID = 32, CLS = 10;
const Spec kConv = {{"conv1.w", {{C1, 1, 3, 3}, 0.3}},  {"conv1.b", {{C1}, 0.1}},  {"bn1.w", {{C1}, 0.0}},
                    {"bn1.b", {{C1}, 0.1}},             {"conv2.w", {{C2, C1, 3, 3}, 0.1}}, {"conv2.b", {{C2}, 0.1}},
                    {"bn2.w", {{C2}, 0.0}},             {"bn2.b", {{C2}, 0.1}},    {"fc1.w", {{HID, C2 * 3 * 3}, 0.05}},
                    {"fc1.b", {{HID}, 0.1}},            {"fc2.w", {{CLS, HID}, 0.1}}, {"fc2.b", {{CLS}, 0.1}}};
Tensor convnet_loss(Params& P, Device d, Generator&) {
  std::mt19937 g(4);
  std::normal_distribution<double> n(0.0, 1.0);
  std::vector<double> img(static_cast<std::size_t>(CN * CH * CH));
  for (auto& v : img) v = n(g);
  std::vector<int64_t> labels(CN);
  for (int64_t i = 0; i < CN; ++i) labels[i] = (i * 3 + 1) % CLS;
  const Tensor x0 = from_vector(img, {CN, 1, CH, CH}, TensorOptions(DType::f32)).to(d), tgt = from_vector(labels, {CN}).to(d);
  auto stats = [&](int64_t c) {
    return std::pair{zeros({c}, TensorOptions(DType::f32).with_device(d)), ones({c}, TensorOptions(DType::f32).with_device(d))};
  };
  auto [m1, v1] = stats(C1);
  auto [m2, v2] = stats(C2);
  Tensor x = conv2d(x0, P["conv1.w"], P["conv1.b"], {1, 1}, {1, 1});
  x = max_pool2d(relu(batch_norm(x, m1, v1, P["bn1.w"], P["bn1.b"], true)), {2, 2});
  x = conv2d(x, P["conv2.w"], P["conv2.b"], {1, 1}, {1, 1});
  x = max_pool2d(relu(batch_norm(x, m2, v2, P["bn2.w"], P["bn2.b"], true)), {2, 2});
  x = linear_relu(flatten(x, 1), P["fc1.w"], P["fc1.b"]);
  return cross_entropy(linear(x, P["fc2.w"], P["fc2.b"]), tgt);
}

using LossFn = Tensor (*)(Params&, Device, Generator&);

void run(std::optional<DType> precision, double loss_tol, double grad_tol, LossFn loss_fn = gpt_loss,
         const Spec* spec = nullptr) {
  Params pc = spec ? make_params(Device::cpu(), *spec) : make_params(Device::cpu());
  Params pg = spec ? make_params(Device::cuda(0), *spec) : make_params(Device::cuda(0));
  Generator gc(5), gg(5);
  Tensor lc, lg;
  {
    std::optional<autocast> ac;
    if (precision) ac.emplace(*precision);
    lc = loss_fn(pc, Device::cpu(), gc);
    lg = loss_fn(pg, Device::cuda(0), gg);
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

TEST(GpuAutocast, LlamaBlockStepMatchesTheCpu) {
  ATH_REQUIRE_GPU();
  {
    SCOPED_TRACE("f32");
    run(std::nullopt, 1e-5, 1e-4, llama_loss, &kLlama);
  }
  {
    SCOPED_TRACE("bf16 autocast");
    run(DType::bf16, 1e-2, 4e-2, llama_loss, &kLlama);
  }
  {
    SCOPED_TRACE("f16 autocast");
    run(DType::f16, 2e-3, 1e-2, llama_loss, &kLlama);
  }
}

TEST(GpuAutocast, ConvNetAndMlpStepMatchesTheCpu) {
  ATH_REQUIRE_GPU();
  {
    SCOPED_TRACE("f32");
    run(std::nullopt, 1e-5, 1e-4, convnet_loss, &kConv);
  }
  {
    SCOPED_TRACE("bf16 autocast");
    run(DType::bf16, 1e-2, 4e-2, convnet_loss, &kConv);
  }
  {
    SCOPED_TRACE("f16 autocast");
    run(DType::f16, 2e-3, 1e-2, convnet_loss, &kConv);
  }
}

// The CPU halves of the comparisons above, run without a GPU: each step runs at every
// precision and gives a finite loss and a finite f32 gradient for every parameter, so a GPU
// session spends its minutes on the device, not on a broken reference.
TEST(GpuAutocast, TheCpuReferenceStepsRunWithoutAGpu) {
  const std::vector<std::pair<LossFn, const Spec*>> steps = {{gpt_loss, nullptr}, {llama_loss, &kLlama}, {convnet_loss, &kConv}};
  for (std::size_t i = 0; i < steps.size(); ++i)
    for (std::optional<DType> precision : {std::optional<DType>(), std::optional<DType>(DType::bf16), std::optional<DType>(DType::f16)}) {
      SCOPED_TRACE("step " + std::to_string(i) + (precision ? std::string(" ") + dtype_name(*precision) : " f32"));
      Params p = steps[i].second ? make_params(Device::cpu(), *steps[i].second) : make_params(Device::cpu());
      Generator g(5);
      Tensor loss;
      {
        std::optional<autocast> ac;
        if (precision) ac.emplace(*precision);
        loss = steps[i].first(p, Device::cpu(), g);
      }
      ASSERT_TRUE(std::isfinite(loss.item<double>()));
      backward({loss});
      for (auto& [name, t] : p.p) {
        ASSERT_TRUE(t.grad().defined()) << name;
        EXPECT_EQ(t.grad().dtype(), DType::f32) << name;
        for (double v : t.grad().to_vector()) ASSERT_TRUE(std::isfinite(v)) << name;
      }
    }
}
