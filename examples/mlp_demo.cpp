// mlp_demo: fits a 2-layer MLP (1 -> hidden -> 1, tanh) to y = sin(2πx)·x on
// synthetic points in [-1, 1], with autograd and SGD with momentum written by
// hand, to show the tensor API end to end:
//
//   forward   pred = linear(tanh(linear(x, W1, b1)), W2, b2); loss = mse_loss(pred, y)
//   backward  loss.backward() fills p.grad() for every leaf p
//   update    under NoGradGuard: v = momentum·v + grad; p -= lr·v; p.set_grad({})
//
// Prints the loss every 100 steps; exits with 1 unless the final loss is below
// 10% of the initial one. Options (all optional):
//   --steps N (2000)  --lr X (0.1)  --momentum X (0.9)  --hidden N (64)  --points N (256)  --seed N (0)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "athanor/athanor.h"

using namespace athanor;

namespace {

struct Options {
  int steps = 2000;
  double lr = 0.1;  // 0.15+ diverges with this init; 0.07 is too slow for 2000 steps
  double momentum = 0.9;
  int hidden = 64;
  int points = 256;
  uint64_t seed = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      ATH_CHECK(i + 1 < argc, "mlp_demo", "option ", a, " needs a value");
      return argv[++i];
    };
    if (a == "--steps") o.steps = std::atoi(value());
    else if (a == "--lr") o.lr = std::atof(value());
    else if (a == "--momentum") o.momentum = std::atof(value());
    else if (a == "--hidden") o.hidden = std::atoi(value());
    else if (a == "--points") o.points = std::atoi(value());
    else if (a == "--seed") o.seed = std::strtoull(value(), nullptr, 10);
    else ATH_FAIL("mlp_demo", "unknown option ", a, Hint{"options: --steps --lr --momentum --hidden --points --seed"});
  }
  ATH_CHECK(o.steps > 0 && o.hidden > 0 && o.points > 1, "mlp_demo", "steps, hidden and points must be positive");
  return o;
}

// A parameter initialised like PyTorch's nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
Tensor param(const Shape& shape, int64_t fan_in, Generator& gen, const char* name) {
  Tensor p = empty(shape, TensorOptions(DType::f32).with_tag(MemTag::parameter));
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  uniform_(p, -bound, bound, gen);
  p.requires_grad_(true);
  p.set_name(name);
  return p;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse(argc, argv);
  Generator gen(opt.seed);

  // Data: x evenly spaced in [-1, 1], y = sin(2πx)·x. Shapes [N, 1].
  std::vector<float> xs(opt.points), ys(opt.points);
  for (int i = 0; i < opt.points; ++i) {
    xs[i] = -1.0f + 2.0f * static_cast<float>(i) / static_cast<float>(opt.points - 1);
    ys[i] = std::sin(2.0f * static_cast<float>(M_PI) * xs[i]) * xs[i];
  }
  const Tensor x = from_vector(xs, {opt.points, 1});
  const Tensor y = from_vector(ys, {opt.points, 1});

  std::vector<Tensor> params = {param({opt.hidden, 1}, 1, gen, "fc1.weight"), param({opt.hidden}, 1, gen, "fc1.bias"),
                                param({1, opt.hidden}, opt.hidden, gen, "fc2.weight"),
                                param({1}, opt.hidden, gen, "fc2.bias")};
  std::vector<Tensor> velocity;
  for (const Tensor& p : params) velocity.push_back(zeros(p.sizes(), TensorOptions(DType::f32).with_tag(MemTag::optimizer_state)));

  auto forward = [&] {
    const Tensor h = athanor::tanh(linear(x, params[0], params[1]));
    return mse_loss(linear(h, params[2], params[3]), y);
  };

  std::printf("mlp_demo: 1 -> %d -> 1 (tanh), %d points, SGD lr %g momentum %g, %d steps\n", opt.hidden, opt.points,
              opt.lr, opt.momentum, opt.steps);
  double initial = 0.0, last = 0.0;
  for (int step = 0; step < opt.steps; ++step) {
    Tensor loss = forward();
    last = loss.item();
    if (step == 0) initial = last;
    if (!std::isfinite(last)) {
      std::fprintf(stderr, "mlp_demo: loss is %g at step %d (hint: lower --lr)\n", last, step);
      return 1;
    }
    if (step % 100 == 0) std::printf("step %5d  loss %.6f\n", step, last);
    loss.backward();
    NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor& p = params[i];
      Tensor& v = velocity[i];
      v.copy_(v * opt.momentum + p.grad());  // v = momentum·v + g
      p.copy_(p - v * opt.lr);               // p -= lr·v (in place: same storage, version bumped)
      p.set_grad(Tensor());
    }
  }
  {
    NoGradGuard no_grad;
    last = forward().item();
  }
  const double ratio = last / initial;
  std::printf("final loss %.6f (initial %.6f, %.1f%% of it)\n", last, initial, 100.0 * ratio);
  if (!(ratio < 0.1)) {
    std::fprintf(stderr, "mlp_demo: FAILED: the final loss is not below 10%% of the initial loss\n");
    return 1;
  }
  std::printf("mlp_demo: OK\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 2;
}
