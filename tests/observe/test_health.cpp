// The health monitor (observe/health.h) on synthetic StepMetrics sequences:
// no false alarms on a realistic noisy, decreasing loss; an injected spike is
// reported once, at its step; a layer 1000x above the others is named;
// repeated f16 scale halvings are a scale_collapse; no event storms.
#include <cmath>
#include <random>

#include "athanor/observe/health.h"
#include "test_util.h"

namespace athanor::observe {
namespace {

// A healthy run: loss decays 4.0 -> ~1.2 with 2% multiplicative noise, grad norm
// ~1 with 20% noise, 6 layers whose grad/param ratios are within 3x of each other.
std::vector<StepMetrics> healthy_run(int64_t steps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01(0, 1);
  std::vector<StepMetrics> run;
  for (int64_t s = 1; s <= steps; ++s) {
    StepMetrics m;
    m.step = s;
    m.loss = (1.2 + 2.8 * std::exp(-s / 200.0)) * (1 + 0.02 * n01(rng));
    m.grad_norm = std::fabs(1.0 + 0.2 * n01(rng));
    m.lr = 3e-4;
    for (int l = 0; l < 6; ++l)
      m.layers.push_back({"h." + std::to_string(l) + ".weight", 0.01 * (1 + l % 3) * std::exp(0.1 * n01(rng)), 10.0});
    run.push_back(m);
  }
  return run;
}

std::vector<HealthEvent> run_all(HealthMonitor& h, const std::vector<StepMetrics>& run) {
  std::vector<HealthEvent> all;
  for (const auto& m : run)
    for (auto& e : h.check(m)) all.push_back(e);
  return all;
}

std::string kinds(const std::vector<HealthEvent>& ev) {
  std::string s;
  for (const auto& e : ev) s += e.kind + "@" + std::to_string(e.step) + ": " + e.message + "\n";
  return s;
}

}  // namespace

TEST(HealthMonitor, NoEventsOnAHealthyNoisyDecreasingRun) {
  for (uint64_t seed : {1, 2, 3}) {
    HealthMonitor h;
    const auto ev = run_all(h, healthy_run(1000, seed));
    EXPECT_TRUE(ev.empty()) << "seed " << seed << "\n" << kinds(ev);
  }
}

TEST(HealthMonitor, AnInjectedLossSpikeIsReportedOnceAtItsStep) {
  auto run = healthy_run(600, 4);
  run[399].loss *= 2.0;  // step 400: loss doubles for one step (e.g. a bad batch)
  HealthMonitor h;
  std::vector<HealthEvent> ev;
  for (const auto& m : run)
    for (auto& e : h.check(m, m.step == 400 ? std::map<std::string, std::string>{{"sample_ids", "17,4242"}}
                                               : std::map<std::string, std::string>{}))
      ev.push_back(e);
  ASSERT_EQ(ev.size(), 1u) << kinds(ev);
  EXPECT_EQ(ev[0].kind, "loss_spike");
  EXPECT_EQ(ev[0].step, 400);
  EXPECT_EQ(ev[0].details.at("sample_ids"), "17,4242");
  bool mentions_lr = false;
  for (const auto& s : ev[0].suggestions) mentions_lr |= s.find("optimizer.lr") != std::string::npos;
  EXPECT_TRUE(mentions_lr);
}

TEST(HealthMonitor, RepeatedSpikesAreRateLimited) {
  auto run = healthy_run(300, 5);
  for (int64_t s = 200; s < 205; ++s) run[s - 1].loss *= 3.0;  // five spiking steps in a row
  HealthMonitor h;
  const auto ev = run_all(h, run);
  int spikes = 0;
  for (const auto& e : ev) {
    spikes += e.kind == "loss_spike";
    // Five of nine losses tripled also lift the level: one loss_rise, no other kind.
    EXPECT_TRUE(e.kind == "loss_spike" || e.kind == "loss_rise") << kinds(ev);
  }
  EXPECT_EQ(spikes, 1) << kinds(ev);
  EXPECT_EQ(ev[0].step, 200);
}

TEST(HealthMonitor, GradientNormOrdersOfMagnitudeAboveIsExploding) {
  auto run = healthy_run(100, 6);
  run[79].grad_norm = 500.0;
  HealthMonitor h;
  const auto ev = run_all(h, run);
  ASSERT_EQ(ev.size(), 1u) << kinds(ev);
  EXPECT_EQ(ev[0].kind, "exploding_gradients");
  EXPECT_EQ(ev[0].severity, "error");
  EXPECT_EQ(ev[0].step, 80);
}

TEST(HealthMonitor, NamesALayerWhoseGradientsAre1000xTheOthers) {
  auto run = healthy_run(30, 7);
  run[19].layers[3].grad_norm *= 1000;  // h.3.weight at step 20
  HealthMonitor h;
  const auto ev = run_all(h, run);
  ASSERT_EQ(ev.size(), 1u) << kinds(ev);
  EXPECT_EQ(ev[0].kind, "exploding_gradients");
  EXPECT_EQ(ev[0].step, 20);
  EXPECT_EQ(ev[0].details.at("layers"), "h.3.weight");
  EXPECT_NE(ev[0].message.find("h.3.weight"), std::string::npos);
}

TEST(HealthMonitor, NamesLayersWithVanishingGradients) {
  auto run = healthy_run(30, 8);
  for (auto& m : run) m.layers[0].grad_norm = 1e-9;  // h.0 gets (almost) no gradient
  HealthMonitor h;
  const auto ev = run_all(h, run);
  ASSERT_GE(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, "vanishing_gradients");
  EXPECT_EQ(ev[0].step, 3);  // on 3 statistics steps in a row: a state, not one noisy step
  EXPECT_EQ(ev[0].details.at("layers"), "h.0.weight");
  // Rate-limited: once per cooldown, not every step.
  EXPECT_EQ(ev.size(), 2u) << kinds(ev);
}

TEST(HealthMonitor, ALayerThatIsAlwaysFarAboveTheOthersIsNotExploding) {
  // The last layers of a deep sigmoid net sit far above a vanishing median from step 1:
  // exploding is a change, so a steady ratio is not reported; a sudden 1000x is.
  auto run = healthy_run(60, 12);
  for (auto& m : run) m.layers[5].grad_norm *= 1000;
  HealthMonitor h;
  for (const auto& e : run_all(h, run)) EXPECT_NE(e.kind, "exploding_gradients") << kinds({e});
}

TEST(HealthMonitor, WarmupStepsAreNotJudgedByZScores) {
  // The lr ramps over 100 steps; the gradient norm doubles and more while it does. The
  // same jump after the warm-up, once the window is full, is a spike.
  auto run = healthy_run(400, 13);
  run[59].grad_norm *= 8;   // step 60, in the warm-up
  run[299].grad_norm *= 8;  // step 300, after it
  HealthMonitor h({}, RunSettings({{"schedule.warmup_steps", "100"}, {"optimizer.lr", "0.001"}}));
  const auto ev = run_all(h, run);
  ASSERT_EQ(ev.size(), 1u) << kinds(ev);
  EXPECT_EQ(ev[0].kind, "grad_spike");
  EXPECT_EQ(ev[0].step, 300);
}

TEST(HealthMonitor, SuggestionsReadTheRunsConfig) {
  auto run = healthy_run(200, 14);
  run[149].loss *= 3;
  // Clipping at 1.0 and a 20-step warm-up are set: neither is suggested as such again.
  HealthMonitor h({}, RunSettings({{"optimizer.grad_clip", "1.0"}, {"schedule.warmup_steps", "20"}, {"optimizer.lr", "0.003"},
                                   {"trainer.max_steps", "200"}}));
  const auto ev = run_all(h, run);
  ASSERT_FALSE(ev.empty());
  std::string all;
  for (const auto& s : ev[0].suggestions) all += s + "\n";
  EXPECT_EQ(all.find("optimizer.grad_clip: 1.0"), std::string::npos) << all;
  EXPECT_EQ(all.find("add a linear"), std::string::npos) << all;
  EXPECT_NE(all.find("lengthen the warm-up: schedule.warmup_steps from 20 to 40"), std::string::npos) << all;
  EXPECT_NE(all.find("optimizer.grad_clip from 1 to 0.25"), std::string::npos) << all;
  EXPECT_EQ(ev[0].fix.count("optimizer.lr"), 1u);
}

TEST(HealthMonitor, AnEarlyLossRiseIsSeenWithoutAWarmWindow) {
  // Steps 1-8: 4.0 -> 2.0; steps 9-30: back up at 3.5 (an early spike); then down to 1.5.
  std::vector<StepMetrics> run;
  for (int64_t s = 1; s <= 80; ++s) {
    StepMetrics m;
    m.step = s;
    m.loss = s <= 8 ? 4.0 - 0.25 * static_cast<double>(s) : s <= 30 ? 3.5 : 1.5;
    m.grad_norm = 1;
    m.lr = 0.01;
    run.push_back(m);
  }
  HealthMonitor h;
  const auto ev = run_all(h, run);
  ASSERT_EQ(ev.size(), 1u) << kinds(ev);
  EXPECT_EQ(ev[0].kind, "loss_rise");
  EXPECT_LE(ev[0].step, 14);
  EXPECT_EQ(ev[0].details.at("initial_level"), "3.75");
}

TEST(HealthMonitor, OneStepAboveTheUntrainedModelsLossIsARise) {
  // A GPT without warm-up: 5.55 (ln 256) -> 3.2 by step 3, then one step at 12.8 (median
  // filters cannot see it), then back.
  const std::vector<double> losses = {5.55, 4.07, 3.19, 3.59, 12.79, 3.69, 3.37, 3.30, 3.32, 3.29, 3.25, 3.2};
  std::vector<StepMetrics> run;
  for (size_t i = 0; i < losses.size(); ++i) {
    StepMetrics m;
    m.step = static_cast<int64_t>(i + 1);
    m.loss = losses[i];
    m.grad_norm = 1;
    m.lr = 0.015;
    run.push_back(m);
  }
  HealthMonitor h;
  const auto ev = run_all(h, run);
  ASSERT_EQ(ev.size(), 1u) << kinds(ev);
  EXPECT_EQ(ev[0].kind, "loss_rise");
  EXPECT_EQ(ev[0].step, 5);
  EXPECT_EQ(ev[0].details.at("min_step"), "3");
  // The same jump before any progress (the loss never came down) is not a rise from a low.
  run[1].loss = run[2].loss = run[3].loss = 5.5;
  HealthMonitor fresh;
  for (const auto& e : run_all(fresh, run)) EXPECT_FALSE(e.kind == "loss_rise" && e.step == 5) << kinds({e});
}

TEST(HealthMonitor, DeadReluLayersAreNamedAfterThreeStatisticsSteps) {
  auto run = healthy_run(6, 15);
  for (auto& m : run) {
    ActivationStats a;
    a.name = "layers.0:linear_relu";
    a.dead_frac = m.step >= 2 ? 0.8 : 0.1;
    a.units = 512;
    m.activations = {a};
    m.lr = 0.5;
  }
  HealthMonitor h({}, RunSettings({{"optimizer.lr", "0.5"}, {"model.activation", "relu"}}));
  const auto ev = run_all(h, run);
  ASSERT_EQ(ev.size(), 1u) << kinds(ev);
  EXPECT_EQ(ev[0].kind, "dead_relus");
  EXPECT_EQ(ev[0].step, 4);  // dead on steps 2, 3, 4
  EXPECT_NE(ev[0].message.find("layers.0:linear_relu 80% of 512 units"), std::string::npos) << ev[0].message;
  EXPECT_EQ(ev[0].fix.at("optimizer.lr"), "0.05");
}

TEST(HealthMonitor, InputChecksNameBadSamplesAndUnnormalizedInputs) {
  StepMetrics m;
  m.step = 7;
  m.input.present = true;
  m.input.mean = 0.1, m.input.std = 1.0, m.input.absmax = 2, m.input.median_absmax = 2, m.input.max_absmax = 2, m.input.max_id = 3;
  m.input.nonfinite_ids = {1234};
  HealthMonitor h({}, RunSettings(std::map<std::string, std::string>{{"data.normalize", "false"}}));
  auto ev = h.check_inputs(m);
  ASSERT_EQ(ev.size(), 1u) << kinds(ev);
  EXPECT_EQ(ev[0].kind, "bad_sample");
  EXPECT_EQ(ev[0].severity, "error");
  EXPECT_EQ(ev[0].details.at("sample_ids"), "1234");
  // An outlier: 1e4 against samples whose largest |x| is ~2.
  m.step = 8;
  m.input.nonfinite_ids.clear();
  m.input.max_absmax = 1e4, m.input.max_id = 99, m.input.absmax = 1e4, m.input.std = 60;
  ev = h.check_inputs(m);
  ASSERT_EQ(ev.size(), 1u) << kinds(ev);  // its one value must not make the batch "unnormalized"
  EXPECT_EQ(ev[0].kind, "bad_sample");
  EXPECT_EQ(ev[0].details.at("sample_ids"), "99");
  // Raw pixels: reported once, with the fix the run's config allows.
  m.step = 9;
  m.input.mean = 73, m.input.std = 90, m.input.absmax = 255, m.input.median_absmax = 255, m.input.max_absmax = 255, m.input.max_id = 5;
  ev = h.check_inputs(m);
  ASSERT_EQ(ev.size(), 1u) << kinds(ev);
  EXPECT_EQ(ev[0].kind, "inputs_not_normalized");
  EXPECT_EQ(ev[0].fix.at("data.normalize"), "true");
  EXPECT_NE(ev[0].message.find("mean 73, std 90"), std::string::npos) << ev[0].message;
  m.step = 10;
  EXPECT_TRUE(h.check_inputs(m).empty());
}

TEST(HealthMonitor, RepeatedScaleHalvingIsAScaleCollapse) {
  auto run = healthy_run(60, 9);
  double scale = 65536;
  for (auto& m : run) {
    if (m.step >= 30 && m.step % 3 == 0) scale /= 2;  // overflow every 3 steps from step 30
    m.loss_scale = scale;
  }
  HealthMonitor h;
  const auto ev = run_all(h, run);
  ASSERT_EQ(ev.size(), 1u) << kinds(ev);
  EXPECT_EQ(ev[0].kind, "scale_collapse");
  EXPECT_EQ(ev[0].step, 39);  // the 4th drop (steps 30, 33, 36, 39)
  EXPECT_NE(ev[0].suggestions[0].find("bf16"), std::string::npos);
}

TEST(HealthMonitor, OccasionalScaleDropsAreNormal) {
  auto run = healthy_run(400, 10);
  double scale = 65536;
  for (auto& m : run) {
    if (m.step % 100 == 0) scale /= 2;  // one overflow per 100 steps: the scaler doing its job
    m.loss_scale = scale;
  }
  HealthMonitor h;
  EXPECT_TRUE(run_all(h, run).empty());
}

TEST(HealthMonitor, SkippedStepNamesTheNonFiniteParameters) {
  auto run = healthy_run(20, 11);
  run[9].skipped = true;
  run[9].skipped_total = 1;
  run[9].grad_norm = std::nan("");
  run[9].nonfinite_params = {"transformer.h.1.mlp.c_fc.weight"};
  HealthMonitor h;
  const auto ev = run_all(h, run);
  ASSERT_EQ(ev.size(), 1u) << kinds(ev);
  EXPECT_EQ(ev[0].kind, "skipped_step");
  EXPECT_EQ(ev[0].step, 10);
  EXPECT_NE(ev[0].message.find("transformer.h.1.mlp.c_fc.weight"), std::string::npos);
}

}  // namespace athanor::observe
