// The optimizer's part of a training step on real model shapes, phase by phase:
//   step       optimizer.step() (SGD momentum 0.9 or AdamW, default parameter groups)
//   step+bf16  the same with persistent bf16 copies written in the same pass (--copies)
//   checksum   (--checksum) hash of weights, state and gradients after 5 clipped steps,
//              to compare two builds for bit-exactness; opt also nesterov, dampening, sgd_wd, adam
//   grad_norm  optim::grad_norm over all gradients (the trainer computes it every step)
//   clip       optim::clip_grad_norm with max_norm just under the norm (norm + scale pass)
//   zero_grad  optimizer.zero_grad() and re-attaching the gradients
// Shapes: "mlp" = MLP 784-1024-1024-10 (bench/configs/mlp.yaml, 1.86M parameters),
// "gpt2" = GPT-2 124M (bench/configs/gpt2-124m.yaml, tied lm_head). Gradients are random
// and stay attached, as after a backward. Median / p10 / p90 over REPS, in ms, plus the
// effective bandwidth of the step (bytes it must move / median time).
//   OMP_NUM_THREADS=2 ./build/bench/bench_optimizer_step mlp sgd 200
//   OMP_NUM_THREADS=2 ./build/bench/bench_optimizer_step gpt2 adamw 20 [--copies]
// PyTorch twin: bench/optimizer_step_torch.py (same shapes, torch.optim foreach=True).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "athanor/core/error.h"
#include "athanor/core/rng.h"
#include "athanor/ops/elementwise.h"
#include "athanor/optim/clip.h"
#include "athanor/optim/optimizer.h"

using namespace athanor;

namespace {

optim::NamedTensors model_shapes(const std::string& model) {
  std::vector<std::pair<std::string, Shape>> s;
  if (model == "mlp") {
    s = {{"layers.0.weight", {1024, 784}}, {"layers.0.bias", {1024}}, {"layers.1.weight", {1024, 1024}},
         {"layers.1.bias", {1024}},        {"layers.2.weight", {10, 1024}}, {"layers.2.bias", {10}}};
  } else if (model == "gpt2") {
    const int64_t C = 768;
    s = {{"transformer.wte.weight", {50257, C}}, {"transformer.wpe.weight", {1024, C}}};
    for (int l = 0; l < 12; ++l) {
      const std::string h = "transformer.h." + std::to_string(l) + ".";
      s.push_back({h + "ln_1.weight", {C}}), s.push_back({h + "ln_1.bias", {C}});
      s.push_back({h + "attn.c_attn.weight", {3 * C, C}}), s.push_back({h + "attn.c_attn.bias", {3 * C}});
      s.push_back({h + "attn.c_proj.weight", {C, C}}), s.push_back({h + "attn.c_proj.bias", {C}});
      s.push_back({h + "ln_2.weight", {C}}), s.push_back({h + "ln_2.bias", {C}});
      s.push_back({h + "mlp.c_fc.weight", {4 * C, C}}), s.push_back({h + "mlp.c_fc.bias", {4 * C}});
      s.push_back({h + "mlp.c_proj.weight", {C, 4 * C}}), s.push_back({h + "mlp.c_proj.bias", {C}});
    }
    s.push_back({"transformer.ln_f.weight", {C}}), s.push_back({"transformer.ln_f.bias", {C}});
  } else {
    ATH_FAIL("bench_optimizer_step", "unknown model '", model, "'", Hint{"use mlp or gpt2"});
  }
  Generator gen(1);
  optim::NamedTensors out;
  for (auto& [name, shape] : s) out.emplace_back(name, mul(randn(shape, {}, gen), 0.02).requires_grad_(true));
  return out;
}

struct Stats {
  double median, p10, p90, min;
};
Stats stats(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  auto at = [&](double q) { return t[static_cast<size_t>(q * (t.size() - 1))]; };
  return {at(0.5), at(0.1), at(0.9), t.front()};
}
double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string model = argc > 1 ? argv[1] : "mlp", opt = argc > 2 ? argv[2] : "sgd";
    const int reps = argc > 3 ? std::atoi(argv[3]) : 100;
    const bool copies = argc > 4 && std::strcmp(argv[4], "--copies") == 0;
    const bool checksum = argc > 4 && std::strcmp(argv[4], "--checksum") == 0;
    auto named = model_shapes(model);
    int64_t n = 0;
    for (auto& [name, p] : named) n += p.numel();
    std::vector<Tensor> params, grads;
    Generator gen(2);
    for (auto& [name, p] : named) {
      grads.push_back(mul(randn(p.sizes(), {}, gen), 1e-3));
      p.set_grad(grads.back());
      params.push_back(p);
    }
    const bool adam_like = opt == "adamw" || opt == "adam";
    auto groups = optim::default_param_groups(named, adam_like ? 3e-4 : 0.05, adam_like ? 0.1 : (opt == "sgd" ? 0.0 : 1e-4));
    std::unique_ptr<optim::Optimizer> optimizer;
    if (opt == "adamw") optimizer = optim::make_adamw(groups);
    else if (opt == "adam") optimizer = optim::make_adam(groups);
    else if (opt == "sgd" || opt == "sgd_wd") optimizer = optim::make_sgd(groups, {0.9, 0.0, false});
    else if (opt == "nesterov") optimizer = optim::make_sgd(groups, {0.9, 0.0, true});
    else if (opt == "dampening") optimizer = optim::make_sgd(groups, {0.9, 0.1, false});
    else ATH_FAIL("bench_optimizer_step", "unknown optimizer '", opt, "'", Hint{"sgd, sgd_wd, nesterov, dampening, adam, adamw"});
    if (checksum) {
      // Bits of the weights, the state and the gradient norms after 5 steps of changing
      // gradients: compare builds (old vs new kernels) for bit-exactness.
      uint64_t h = 1469598103934665603ull;
      auto mix = [&](const void* p, size_t nbytes) {
        for (size_t i = 0; i < nbytes; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
      };
      for (int k = 0; k < 5; ++k) {
        for (size_t j = 0; j < params.size(); ++j) params[j].set_grad(mul(grads[j], 1.0 + k));
        const double norm = optim::grad_norm(params);
        const double clipped = optim::clip_grad_norm(params, 0.5 * norm);
        std::printf("step %d grad_norm %.17g\n", k, clipped);
        optimizer->step();
      }
      for (auto& p : params) mix(p.raw_data(), p.nbytes());
      for (auto& [name, t] : optimizer->state_tensors()) mix(t.raw_data(), t.nbytes());
      for (auto& p : params) mix(p.grad().raw_data(), p.grad().nbytes());
      std::printf("%s %s checksum %016llx\n", model.c_str(), opt.c_str(), static_cast<unsigned long long>(h));
      return 0;
    }
    if (copies) optimizer->enable_low_precision_copies(DType::bf16);
    // Bytes the step must move: read p, g, state; write p, state (+ a 2-byte copy).
    const double state_tensors = adam_like ? 2 : 1, bytes = n * (4.0 * (3 + 2 * state_tensors) + (copies ? 2 : 0));
    for (int k = 0; k < 3; ++k) optimizer->step();  // state allocated, pages touched
    std::vector<double> t_step, t_norm, t_clip, t_zero;
    for (int r = 0; r < reps; ++r) {
      double t0 = now_ms();
      optimizer->step();
      double t1 = now_ms();
      t_step.push_back(t1 - t0);
      const double norm = optim::grad_norm(params);
      double t2 = now_ms();
      t_norm.push_back(t2 - t1);
      optim::clip_grad_norm(params, 0.99 * norm);  // shrinks by 1% a rep: no denormals in 1000s of reps
      double t3 = now_ms();
      t_clip.push_back(t3 - t2);
      optimizer->zero_grad();
      for (size_t k = 0; k < params.size(); ++k) params[k].set_grad(grads[k]);
      t_zero.push_back(now_ms() - t3);
    }
    auto print = [&](const char* what, const std::vector<double>& t, double gb) {
      const Stats s = stats(t);
      std::printf("%-10s median %8.3f ms  min %8.3f  p10 %8.3f  p90 %8.3f", what, s.median, s.min, s.p10, s.p90);
      if (gb > 0) std::printf("  %6.1f GB/s at p10", gb / s.p10 * 1e-6);
      std::printf("\n");
    };
    std::printf("%s %s, %lld parameters in %zu tensors, %d reps%s\n", model.c_str(), opt.c_str(),
                static_cast<long long>(n), named.size(), reps, copies ? ", bf16 copies" : "");
    print(copies ? "step+bf16" : "step", t_step, bytes);
    print("grad_norm", t_norm, 4.0 * n);
    print("clip", t_clip, 12.0 * n);
    print("zero_grad", t_zero, 0);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
