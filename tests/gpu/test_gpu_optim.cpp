// The optimizer step on CUDA parameters (src/optim, optim/device_update.h): a few steps of
// AdamW, Adam and SGD (momentum, nesterov) with gradient clipping on cuda:0 against the same
// steps on the CPU, from the same parameters and gradients, in f32:
//   |gpu - cpu| <= 1e-6 |cpu| + 1e-7 (the kernels follow the CPU's rounding; the clip's
//   scaling multiplies in f32 on the device and in f64-then-f32 on the CPU).
// Also: grad_norm on the device equals the CPU's (f64 sums, 1e-12 relative), and an optimizer
// without a device step (rmsprop) refuses CUDA parameters with "not yet supported on cuda".
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "athanor/core/error.h"
#include "athanor/core/tensor.h"
#include "athanor/optim/clip.h"
#include "athanor/optim/optimizer.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;

namespace {

// Parameters of several sizes (one not a multiple of any chunk), in two groups with different
// lr and weight decay (two kernel launches per step).
struct Model {
  std::vector<Tensor> params;
  std::vector<optim::ParamGroup> groups;
};
Model make_model(Device d) {
  const std::vector<Shape> shapes{{37, 64}, {64}, {129, 3}, {100003}};
  Model m;
  optim::ParamGroup decay{.name = "decay", .params = {}, .lr = 3e-3, .base_lr = 3e-3, .weight_decay = 0.1};
  optim::ParamGroup no_decay{.name = "no_decay", .params = {}, .lr = 1e-3, .base_lr = 1e-3, .weight_decay = 0.0};
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    int64_t n = 1;
    for (int64_t s : shapes[i]) n *= s;
    const Tensor p = from_vector(random_vector(static_cast<std::size_t>(n), 11 + static_cast<unsigned>(i)), shapes[i]).to(d);
    m.params.push_back(p);
    (i % 2 == 0 ? decay : no_decay).params.emplace_back("p" + std::to_string(i), p);
  }
  m.groups = {decay, no_decay};
  return m;
}
void set_grads(Model& m, int step) {
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    Tensor& p = m.params[i];
    const Tensor g = from_vector(random_vector(static_cast<std::size_t>(p.numel()), 1000 * step + static_cast<unsigned>(i), -3, 3),
                                 p.sizes())
                         .to(p.device());
    p.set_grad(g);
  }
}

using Factory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;
void expect_same_steps(const Factory& make, const char* what) {
  SCOPED_TRACE(what);
  Model c = make_model(Device::cpu()), g = make_model(Device::cuda(0));
  auto oc = make(c.groups), og = make(g.groups);
  for (int step = 0; step < 4; ++step) {
    set_grads(c, step), set_grads(g, step);
    const double nc = optim::clip_grad_norm(c.params, 20.0), ng = optim::clip_grad_norm(g.params, 20.0);
    EXPECT_NEAR(ng, nc, 1e-12 * nc) << "step " << step;
    ASSERT_LT(20.0, nc) << "the clip must act for the test to cover it";
    oc->step(), og->step();
    for (std::size_t i = 0; i < c.params.size(); ++i) {
      EXPECT_EQ(g.params[i].device(), Device::cuda(0));
      EXPECT_TRUE(all_close(g.params[i].cpu().to_vector(), c.params[i].to_vector(), 1e-7, 1e-6))
          << "parameter " << i << " after step " << step;
    }
  }
  // The state lives on the device too.
  for (const auto& [name, t] : og->state_tensors()) EXPECT_EQ(t.device(), Device::cuda(0)) << name;
}

}  // namespace

TEST(GpuOptim, AdamWAdamAndSgdStepsOnCudaMatchTheCpu) {
  ATH_REQUIRE_GPU();
  expect_same_steps([](auto gr) { return optim::make_adamw(std::move(gr), {}); }, "adamw");
  expect_same_steps([](auto gr) { return optim::make_adam(std::move(gr), {.beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6}); }, "adam");
  expect_same_steps([](auto gr) { return optim::make_sgd(std::move(gr), {.momentum = 0.9, .dampening = 0, .nesterov = true}); },
                    "sgd nesterov");
  expect_same_steps([](auto gr) { return optim::make_sgd(std::move(gr), {}); }, "sgd plain");
}

TEST(GpuOptim, GradNormOnTheDeviceEqualsTheCpus) {
  ATH_REQUIRE_GPU();
  Model c = make_model(Device::cpu()), g = make_model(Device::cuda(0));
  set_grads(c, 7), set_grads(g, 7);
  const double nc = optim::grad_norm(c.params), ng = optim::grad_norm(g.params);
  EXPECT_NEAR(ng, nc, 1e-12 * nc);
  EXPECT_GT(nc, 0.0);
}

TEST(GpuOptim, OptimizersWithoutADeviceStepRefuseCudaParameters) {
  ATH_REQUIRE_GPU();
  Model g = make_model(Device::cuda(0));
  set_grads(g, 0);
  auto o = optim::make_rmsprop(g.groups, {});
  const std::vector<double> before = g.params[0].cpu().to_vector();
  try {
    o->step();
    FAIL() << "rmsprop stepped CUDA parameters";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not yet supported on cuda"), std::string::npos) << e.what();
  }
  EXPECT_EQ(g.params[0].cpu().to_vector(), before) << "nothing may have changed before the error";
}
