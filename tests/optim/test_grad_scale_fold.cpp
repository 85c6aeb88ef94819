// Clipping folded into the update (Optimizer::scale_grads_in_next_step): for every
// optimizer, f32 (vector loops with tails, the multi-tensor pass, with and without bf16
// copies) and f64 parameters, grad_norm + scale_grads_in_next_step(clip_coefficient) +
// step() must give the bits of clip_grad_norm + step() — weights, optimizer state and
// the low-precision copies — over steps with and without clipping; the folded path
// leaves the gradients of folding optimizers untouched, and the scale lasts one step.
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>

#include "athanor/ops/autocast.h"
#include "athanor/optim/clip.h"
#include "athanor/optim/optimizer.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
using namespace athanor::optim;

namespace {

using Make = std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup>)>;

NamedTensors make_params(DType dt) {
  NamedTensors out;
  const std::vector<Shape> shapes = {{64, 129}, {7}, {8193}, {20000}};  // tails, a chunk boundary, a large one
  for (size_t k = 0; k < shapes.size(); ++k)
    out.emplace_back("p" + std::to_string(k), randn64(shapes[k], 40 + k, false).to(dt).requires_grad_(true));
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

void check_fold(const char* what, const Make& make, DType dt, bool copies, bool folds) {
  SCOPED_TRACE(std::string(what) + " " + dtype_name(dt) + (copies ? " with bf16 copies" : ""));
  NamedTensors pa = make_params(dt), pb = make_params(dt);
  auto oa = make({ParamGroup{"g", pa, 1e-2, 1e-2, 0.01}}), ob = make({ParamGroup{"g", pb, 1e-2, 1e-2, 0.01}});
  if (copies) oa->enable_low_precision_copies(DType::bf16), ob->enable_low_precision_copies(DType::bf16);
  std::vector<Tensor> a, b;
  for (size_t k = 0; k < pa.size(); ++k) a.push_back(pa[k].second), b.push_back(pb[k].second);
  for (int step = 0; step < 3; ++step) {
    for (size_t k = 0; k < pa.size(); ++k) {
      const Tensor g = randn64(pa[k].second.sizes(), 500 + 10 * step + k, false).to(dt);
      a[k].set_grad(g.clone());
      b[k].set_grad(g.clone());
    }
    const double max_norm = step == 1 ? 1e6 : 0.5;  // step 1 does not clip
    const double na = clip_grad_norm(a, max_norm);
    oa->step();
    const double nb = grad_norm(b);
    ASSERT_EQ(na, nb);
    const double coef = clip_coefficient(nb, max_norm);
    ASSERT_EQ(coef < 1.0, step != 1);
    const std::vector<Tensor> grads_before = [&] {
      std::vector<Tensor> g;
      for (const Tensor& p : b) g.push_back(p.grad().clone());
      return g;
    }();
    if (coef < 1.0) ob->scale_grads_in_next_step(coef);
    ob->step();
    for (size_t k = 0; k < pa.size(); ++k) {
      SCOPED_TRACE("step " + std::to_string(step) + " " + pa[k].first);
      EXPECT_TRUE(same_bits(a[k], b[k])) << "weights differ";
      if (folds && dt == DType::f32) {
        EXPECT_TRUE(same_bits(b[k].grad(), grads_before[k])) << "the folded step wrote the gradient";
      }
      if (copies) {
        EXPECT_TRUE(same_bits(autocast_persistent_cast(a[k], DType::bf16), autocast_persistent_cast(b[k], DType::bf16)));
      }
    }
    const NamedTensors sa = oa->state_tensors(), sb = ob->state_tensors();
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t k = 0; k < sa.size(); ++k) EXPECT_TRUE(same_bits(sa[k].second, sb[k].second)) << sa[k].first;
  }
}

}  // namespace

TEST(GradScaleFold, EveryOptimizerGivesTheBitsOfClippingThenStepping) {
  const std::vector<std::tuple<const char*, Make, bool>> optimizers = {
      {"sgd", [](std::vector<ParamGroup> g) { return make_sgd(std::move(g)); }, true},
      {"sgd momentum", [](std::vector<ParamGroup> g) { return make_sgd(std::move(g), {0.9, 0.1, false}); }, true},
      {"sgd nesterov", [](std::vector<ParamGroup> g) { return make_sgd(std::move(g), {0.9, 0.0, true}); }, true},
      {"adam", [](std::vector<ParamGroup> g) { return make_adam(std::move(g)); }, true},
      {"adamw", [](std::vector<ParamGroup> g) { return make_adamw(std::move(g)); }, true},
      {"rmsprop", [](std::vector<ParamGroup> g) { return make_rmsprop(std::move(g), {0.99, 1e-8, 0.9, true}); }, false},
      {"lamb", [](std::vector<ParamGroup> g) { return make_lamb(std::move(g)); }, false},
      {"lars", [](std::vector<ParamGroup> g) { return make_lars(std::move(g)); }, false},
  };
  for (const auto& [what, make, folds] : optimizers) {
    check_fold(what, make, DType::f32, false, folds);
    check_fold(what, make, DType::f64, false, folds);
  }
  check_fold("sgd momentum", std::get<1>(optimizers[1]), DType::f32, true, true);
  check_fold("adamw", std::get<1>(optimizers[4]), DType::f32, true, true);
}

TEST(GradScaleFold, RejectsANonPositiveOrNonFiniteScale) {
  NamedTensors p = make_params(DType::f32);
  auto o = make_sgd({ParamGroup{"g", p, 0.1, 0.1, 0.0}});
  for (double bad : {0.0, -1.0, std::nan(""), static_cast<double>(INFINITY)})
    EXPECT_NE(error_message([&] { o->scale_grads_in_next_step(bad); }).find("gradient scale must be finite and > 0"),
              std::string::npos);
}

}  // namespace athanor
