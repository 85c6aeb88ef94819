// LR schedules against their closed forms, the scheduler counting optimizer
// steps, the linear scaling rule, and gradient clipping.
#include <cmath>

#include "athanor/optim/clip.h"
#include "athanor/optim/lr_schedule.h"
#include "athanor/optim/optimizer.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
using namespace athanor::optim;

TEST(Schedule, WarmupIsLinearFromTheStartFactor) {
  LRSchedule s({.warmup_steps = 10, .warmup_start_factor = 0.1, .decay = "constant"});
  EXPECT_DOUBLE_EQ(s.factor(0), 0.1);
  EXPECT_DOUBLE_EQ(s.factor(5), 0.1 + 0.9 * 0.5);
  EXPECT_DOUBLE_EQ(s.factor(10), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(1000), 1.0);
}

TEST(Schedule, CosineToMinLrMatchesClosedForm) {
  LRSchedule s({.warmup_steps = 100, .decay = "cosine", .total_steps = 1100, .min_lr_ratio = 0.1});
  for (int64_t k : {100, 350, 600, 850, 1099, 1100, 5000}) {
    const double t = std::min(1.0, (k - 100) / 1000.0);
    EXPECT_NEAR(s.factor(k), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * t)), 1e-15) << k;
  }
  EXPECT_NEAR(s.factor(600), 0.55, 1e-15);  // halfway: midpoint between 1 and the floor
}

TEST(Schedule, StepLinearPolynomialClosedForms) {
  LRSchedule st({.warmup_steps = 5, .decay = "step", .step_size = 10, .gamma = 0.5});
  EXPECT_DOUBLE_EQ(st.factor(14), 1.0);
  EXPECT_DOUBLE_EQ(st.factor(15), 0.5);
  EXPECT_DOUBLE_EQ(st.factor(35), 0.125);
  LRSchedule lin({.decay = "linear", .total_steps = 200, .min_lr_ratio = 0.0});
  EXPECT_DOUBLE_EQ(lin.factor(50), 0.75);
  EXPECT_DOUBLE_EQ(lin.factor(200), 0.0);
  LRSchedule poly({.warmup_steps = 0, .decay = "polynomial", .total_steps = 100, .min_lr_ratio = 0.2, .power = 2.0});
  EXPECT_DOUBLE_EQ(poly.factor(50), 0.2 + 0.8 * 0.25);
}

TEST(Schedule, CosineWarmRestartsPeriodsGrow) {
  LRSchedule s({.decay = "cosine_restarts", .min_lr_ratio = 0.0, .t0 = 10, .t_mult = 2.0});
  EXPECT_DOUBLE_EQ(s.factor(0), 1.0);
  EXPECT_NEAR(s.factor(5), 0.5, 1e-15);
  EXPECT_DOUBLE_EQ(s.factor(10), 1.0);   // restart after 10
  EXPECT_NEAR(s.factor(20), 0.5, 1e-15); // second period is 20 long
  EXPECT_DOUBLE_EQ(s.factor(30), 1.0);   // restart after 10 + 20
}

TEST(Schedule, BadConfigsAreClearErrors) {
  EXPECT_NE(error_message([] { LRSchedule({.decay = "cosin"}); }).find("unknown decay 'cosin'"), std::string::npos);
  EXPECT_NE(error_message([] { LRSchedule({.warmup_steps = 10, .decay = "cosine", .total_steps = 5}); }).find("total_steps"),
            std::string::npos);
}

TEST(Scheduler, SetsEveryGroupFromItsBaseLrAndCountsSteps) {
  Tensor a = ones({1}).requires_grad_(true), b = ones({1}).requires_grad_(true);
  auto opt = make_sgd({ParamGroup{"a", {{"a", a}}, 0, 0.1, 0}, ParamGroup{"b", {{"b", b}}, 0, 0.01, 0}});
  Scheduler sch(*opt, LRSchedule({.warmup_steps = 4, .decay = "constant"}));
  EXPECT_DOUBLE_EQ(opt->param_groups()[0].lr, 0.0);
  sch.step();
  sch.step();
  EXPECT_DOUBLE_EQ(opt->param_groups()[0].lr, 0.05);
  EXPECT_DOUBLE_EQ(opt->param_groups()[1].lr, 0.005);
  EXPECT_EQ(sch.current_step(), 2);
  sch.set_step(10);
  EXPECT_DOUBLE_EQ(sch.lr(), 0.1);
}

TEST(Schedule, LinearScalingRule) {
  EXPECT_DOUBLE_EQ(linear_scaled_lr(0.1, 1024, 256), 0.4);
  EXPECT_NE(error_message([] { linear_scaled_lr(0.1, 0, 256); }).find("positive"), std::string::npos);
}

TEST(Clip, NormClipsToMaxAndReturnsThePreClipNorm) {
  Tensor a = zeros({2}).requires_grad_(true), b = zeros({1}).requires_grad_(true);
  a.set_grad(from_vector(std::vector<double>{3, 0}, {2}));
  b.set_grad(from_vector(std::vector<double>{4}, {1}));
  EXPECT_NEAR(clip_grad_norm({a, b}, 1.0), 5.0, 1e-6);
  EXPECT_NEAR(grad_norm({a, b}), 1.0, 1e-6);
  EXPECT_CLOSE(a.grad(), from_vector(std::vector<double>{0.6, 0}, {2}), 1e-6, 0);
  EXPECT_NEAR(clip_grad_norm({a, b}, 10.0), 1.0, 1e-6);  // under the limit: untouched
  EXPECT_CLOSE(b.grad(), from_vector(std::vector<double>{0.8}, {1}), 1e-6, 0);
}

TEST(Clip, NonFiniteNormIsReportedAndGradientsAreLeftAlone) {
  Tensor a = zeros({2}).requires_grad_(true);
  a.set_grad(from_vector(std::vector<double>{1, INFINITY}, {2}));
  EXPECT_TRUE(std::isinf(clip_grad_norm({a}, 1.0)));
  EXPECT_EQ(a.grad().to_vector()[0], 1.0);
  a.set_grad(from_vector(std::vector<double>{NAN, 1}, {2}));
  EXPECT_TRUE(std::isnan(clip_grad_norm({a}, 1.0)));
}

TEST(Clip, ByValue) {
  Tensor a = zeros({3}).requires_grad_(true);
  a.set_grad(from_vector(std::vector<double>{-5, 0.5, 7}, {3}));
  clip_grad_value({a}, 1.0);
  EXPECT_CLOSE(a.grad(), from_vector(std::vector<double>{-1, 0.5, 1}, {3}), 0, 0);
}

}  // namespace athanor
