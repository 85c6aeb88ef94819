// The floor of a training step under this GEMM library: only the step's GEMMs (and, for a
// GPT, its attention kernels) run back to back as a step runs them, then the optimizer's
// update of every parameter (athanor's fused multi-tensor pass, the config's optimizer; the
// bf16 copies under bf16), with everything else (layer norms, GELU, residual adds, loss,
// gradient norm, autograd, allocation) free.
// No implementation built on these kernels can take less per step; comparing the floor with
// a throughput target says whether the target is reachable with them at all.
//
// GPT: per layer, forward qkv = x Wqkv^T + b, attention (causal, packed qkv), proj, fc, fc2
// (bias in the epilogue), then the tied lm_head x Wte^T; backward in reverse, dx = dy W and
// dW = dy^T x for every linear, attention's backward. MLP: forward x W^T + b per layer,
// backward dW for every layer and dx for all but the first. Shapes, transposes and dtypes are
// those of athanor's linear / gelu_linear / causal_self_attention (f32; bf16 autocast: bf16
// operands, dW in f32 from the accumulators). Each layer has its own buffers, as in a step.
//
//   ./bench_step_floor bench/configs/tiny-gpt.yaml [f32|bf16] [reps=7]
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "athanor/core/half.h"
#include "athanor/core/rng.h"
#include "athanor/core/tensor.h"
#include "athanor/ops/elementwise.h"
#include "athanor/optim/optimizer.h"
#include "athanor/train/config.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/gemm.h"
#include "bench_timing.h"

using namespace athanor;
using train::Config;
using bench::median;

namespace {

double now_s() { return bench::clock_s(); }

// One kernel call of the step: what it is, its FLOPs, and how to run it.
struct Call {
  std::string what;
  bool attention = false;
  double flops = 0;
  std::function<void()> run;
};

// Buffers of one dtype, kept alive for the whole run, filled with small values. They are
// tensors from athanor's allocator, as a step's are: large blocks get huge pages there
// (MADV_HUGEPAGE), which the GEMMs measurably profit from (gpt2-124M f32: 290 GFLOP/s on
// plain std::vector buffers, more than the whole real step achieves).
template <class T> struct Pool {
  std::vector<Tensor> bufs;
  T* get(int64_t n) {
    bufs.push_back(empty({n}, TensorOptions(dtype_of<T>)));
    T* p = static_cast<T*>(bufs.back().raw_data());
    for (int64_t i = 0; i < n; ++i) p[i] = T(0.01f * static_cast<float>((i * 7919) % 101 - 50) / 50.0f);
    return p;
  }
};

// One linear layer y = x W^T + b (x [M, in], W [out, in]) in T (f32 or bf16): appends its
// forward GEMM to fwd and returns its backward calls (dx = dy W unless !needs_dx, dW = dy^T x).
template <class T>
std::vector<Call> linear(std::vector<Call>& fwd, Pool<T>& p, Pool<float>& pf, const std::string& name, int64_t M,
                         int64_t in, int64_t out, bool bias, bool needs_dx) {
  T *x = p.get(M * in), *w = p.get(out * in), *b = bias ? p.get(out) : nullptr, *y = p.get(M * out);
  T *dy = p.get(M * out), *dx = p.get(M * in);
  float* dw = pf.get(out * in);  // f32 in both precisions (bf16: from the f32 accumulators)
  const double f = 2.0 * M * in * out;
  fwd.push_back({name + " fwd", false, f, [=] { cpu::gemm_bias<T>(false, true, M, out, in, x, in, w, in, b, y, out); }});
  std::vector<Call> bwd;
  if (needs_dx)
    bwd.push_back({name + " dx", false, f, [=] {
                     if constexpr (std::is_same_v<T, float>) cpu::gemm(false, false, M, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
                     else cpu::gemm_lowp<T>(false, false, M, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
                   }});
  bwd.push_back({name + " dW", false, f, [=] {
                   if constexpr (std::is_same_v<T, float>) cpu::gemm(true, false, out, in, M, 1.0f, dy, out, x, in, 0.0f, dw, in);
                   else cpu::gemm_bf16_f32out(true, false, out, in, M, 1.0f, dy, out, x, in, 0.0f, dw, in);
                 }});
  return bwd;
}

template <class T> std::vector<Call> gpt_step(const Config& c, Pool<T>& p, Pool<float>& pf) {
  const int64_t L = c.get_int("model.n_layer"), d = c.get_int("model.n_embd"), H = c.get_int("model.n_head");
  const int64_t T_ = c.get_int("model.block_size"), V = c.get_int("model.vocab_size");
  const int64_t B = c.get_int("trainer.batch_size"), M = B * T_;
  const cpu::AttentionDims ad{B, H, T_, T_, d / H, d / H};
  const cpu::AttentionLayout lay = cpu::AttentionLayout::packed_qkv(ad);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d / H));
  const double attn_fwd_flops = 4.0 * B * H * static_cast<double>(T_) * T_ * (d / H) / 2;  // causal half
  std::vector<Call> fwd, bwd;  // bwd is built back to front: each layer's calls go before the previous layer's
  for (int64_t l = 0; l < L; ++l) {
    const std::string n = "layer" + std::to_string(l) + ".";
    const std::vector<Call> qkv_b = linear<T>(fwd, p, pf, n + "qkv", M, d, 3 * d, true, true);
    T *qkv = p.get(M * 3 * d), *o = p.get(M * d), *dout = p.get(M * d), *dqkv = p.get(M * 3 * d);
    float* lse = pf.get(B * H * T_);
    fwd.push_back({n + "attention fwd", true, attn_fwd_flops,
                   [=] { cpu::attention_forward<T>(qkv, qkv + d, qkv + 2 * d, o, lse, ad, lay, true, scale); }});
    const Call attn_b{n + "attention bwd", true, 2 * attn_fwd_flops, [=] {
                        cpu::attention_backward<T>(qkv, qkv + d, qkv + 2 * d, o, dout, lse, dqkv, dqkv + d, dqkv + 2 * d,
                                                   ad, lay, true, scale);
                      }};
    const std::vector<Call> proj_b = linear<T>(fwd, p, pf, n + "proj", M, d, d, true, true);
    const std::vector<Call> fc_b = linear<T>(fwd, p, pf, n + "fc", M, d, 4 * d, true, true);
    const std::vector<Call> fc2_b = linear<T>(fwd, p, pf, n + "fc2", M, 4 * d, d, true, true);
    std::vector<Call> layer = fc2_b;  // the layer's backward: fc2, fc, proj, attention, qkv
    layer.insert(layer.end(), fc_b.begin(), fc_b.end());
    layer.insert(layer.end(), proj_b.begin(), proj_b.end());
    layer.push_back(attn_b);
    layer.insert(layer.end(), qkv_b.begin(), qkv_b.end());
    bwd.insert(bwd.begin(), layer.begin(), layer.end());
  }
  const std::vector<Call> head_b = linear<T>(fwd, p, pf, "lm_head", M, d, V, false, true);
  fwd.insert(fwd.end(), head_b.begin(), head_b.end());
  fwd.insert(fwd.end(), bwd.begin(), bwd.end());
  return fwd;
}

template <class T> std::vector<Call> mlp_step(const Config& c, Pool<T>& p, Pool<float>& pf) {
  const std::vector<int64_t> sizes = c.get_int_list("model.sizes");
  const int64_t B = c.get_int("trainer.batch_size");
  std::vector<Call> fwd, bwd;
  for (std::size_t l = 0; l + 1 < sizes.size(); ++l) {
    const std::vector<Call> b = linear<T>(fwd, p, pf, "fc" + std::to_string(l + 1), B, sizes[l], sizes[l + 1], true, l > 0);
    bwd.insert(bwd.begin(), b.begin(), b.end());
  }
  fwd.insert(fwd.end(), bwd.begin(), bwd.end());
  return fwd;
}

// The model's parameters (shapes as in nn::GPT / nn::MLP; values do not matter) with
// gradients attached, and the config's optimizer over them.
struct Params {
  optim::NamedTensors named;
  std::unique_ptr<optim::Optimizer> opt;
};
Params make_params(const Config& c, bool bf16) {
  std::vector<std::pair<std::string, Shape>> s;
  if (c.get_string("model.type") == "gpt") {
    const int64_t L = c.get_int("model.n_layer"), d = c.get_int("model.n_embd");
    s = {{"wte.weight", {c.get_int("model.vocab_size"), d}}, {"wpe.weight", {c.get_int("model.block_size"), d}}};
    for (int64_t l = 0; l < L; ++l) {
      const std::string h = "h." + std::to_string(l) + ".";
      for (const char* ln : {"ln_1", "ln_2"}) s.push_back({h + ln + ".weight", {d}}), s.push_back({h + ln + ".bias", {d}});
      for (auto [name, out, in] : {std::tuple{"attn.c_attn", 3 * d, d}, {"attn.c_proj", d, d}, {"mlp.c_fc", 4 * d, d},
                                   {"mlp.c_proj", d, 4 * d}})
        s.push_back({h + name + ".weight", {out, in}}), s.push_back({h + name + ".bias", {out}});
    }
    s.push_back({"ln_f.weight", {d}}), s.push_back({"ln_f.bias", {d}});
  } else {
    const std::vector<int64_t> sizes = c.get_int_list("model.sizes");
    for (std::size_t l = 0; l + 1 < sizes.size(); ++l) {
      const std::string n = "layers." + std::to_string(l);
      s.push_back({n + ".weight", {sizes[l + 1], sizes[l]}}), s.push_back({n + ".bias", {sizes[l + 1]}});
    }
  }
  Generator gen(1);
  Params p;
  for (auto& [name, shape] : s) {
    Tensor t = mul(randn(shape, {}, gen), 0.02).requires_grad_(true);
    t.set_grad(mul(randn(shape, {}, gen), 1e-3));
    p.named.emplace_back(name, t);
  }
  const std::string type = c.get_string("optimizer.type");
  auto groups = optim::default_param_groups(p.named, c.get_float("optimizer.lr"), c.get_float("optimizer.weight_decay"));
  if (type == "sgd") p.opt = optim::make_sgd(groups, {c.get_float("optimizer.momentum"), 0.0, false});
  else if (type == "adamw") p.opt = optim::make_adamw(groups, {c.get_float("optimizer.beta1"), c.get_float("optimizer.beta2"), c.get_float("optimizer.eps")});
  else throw std::runtime_error("bench_step_floor: optimizer '" + type + "' is not mirrored; use sgd or adamw");
  if (bf16 && c.get_bool("optimizer.low_precision_copies")) p.opt->enable_low_precision_copies(DType::bf16);
  return p;
}

template <class T> int run(const Config& c, const std::string& precision, int reps) {
  Pool<T> p;
  Pool<float> pf;
  const bool gpt = c.get_string("model.type") == "gpt";
  std::vector<Call> calls = gpt ? gpt_step<T>(c, p, pf) : mlp_step<T>(c, p, pf);
  auto params = std::make_shared<Params>(make_params(c, std::is_same_v<T, bfloat16>));
  calls.push_back({"optimizer step", false, 0, [params] { params->opt->step(); }});
  const int64_t targets = gpt ? c.get_int("trainer.batch_size") * c.get_int("model.block_size") : c.get_int("trainer.batch_size");
  std::vector<double> total, gemm, attn, opt;
  for (int r = 0; r < reps + 2; ++r) {  // 2 warm-up passes (primitive creation, first touch)
    double g = 0, a = 0, o = 0;
    const double t0 = now_s();
    for (const Call& k : calls) {
      const double s = now_s();
      k.run();
      (k.attention ? a : k.flops > 0 ? g : o) += now_s() - s;
    }
    const double t = now_s() - t0;
    if (r >= 2) total.push_back(t), gemm.push_back(g), attn.push_back(a), opt.push_back(o);
  }
  double gemm_flops = 0, attn_flops = 0;
  for (const Call& k : calls) (k.attention ? attn_flops : gemm_flops) += k.flops;
  const double tm = median(total), gm = median(gemm), am = median(attn);
  std::printf("%s (%s): %zu kernel calls per step, %d threads, %d passes after 2 warm-up passes\n",
              c.get_string("name").c_str(), precision.c_str(), calls.size(), omp_get_max_threads(), reps);
  std::printf("  floor        %.1f ms/step median [%.1f-%.1f]  ->  at most %.0f %s/s\n", tm * 1e3,
              *std::min_element(total.begin(), total.end()) * 1e3, *std::max_element(total.begin(), total.end()) * 1e3,
              targets / tm, gpt ? "tok" : "samples");
  std::printf("  GEMMs        %.1f ms (%.2f GFLOP, %.0f GFLOP/s)\n", gm * 1e3, gemm_flops * 1e-9, gemm_flops / gm * 1e-9);
  if (gpt) std::printf("  attention    %.1f ms (%.2f GFLOP causal, %.0f GFLOP/s)\n", am * 1e3, attn_flops * 1e-9, attn_flops / am * 1e-9);
  std::printf("  optimizer    %.2f ms (%s step over %zu tensors)\n", median(opt) * 1e3, c.get_string("optimizer.type").c_str(),
              params->named.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CONFIG.yaml [f32|bf16] [reps=7]\n", argv[0]);
    return 2;
  }
  try {
    const Config c = Config::load(argv[1]);
    const std::string precision = argc > 2 ? argv[2] : "f32";
    const int reps = argc > 3 ? std::max(1, std::atoi(argv[3])) : 7;
    if (precision == "f32") return run<float>(c, precision, reps);
    if (precision == "bf16") return run<bfloat16>(c, precision, reps);
    std::fprintf(stderr, "precision must be f32 or bf16, got '%s'\n", precision.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
