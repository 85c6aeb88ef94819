// The floor of a training step under this GEMM library: only the step's GEMMs (and, for a
// GPT, its attention kernels) run back to back as a step runs them, then the optimizer's
// update of every parameter (athanor's fused multi-tensor pass, the config's optimizer; the
// bf16 copies under bf16) and the rewrite of the packed weight copies, with everything else
// (layer norms, GELU, residual adds, loss, gradient norm, autograd, allocation) free.
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
// Packed weights (ops/packed_weights.h), as a step with optimizer.packed_weights runs them:
// every forward (x W^T + b) and dx (dy W) GEMM that cpu::gemm_prefers_packed_b sends to
// oneDNN's blocked kernels runs cpu::gemm_packed on its own packed copy of W (the plain call
// where gemm_packed declines); the optimizer phase then rewrites every copy in one parallel
// region, each thread its pack_share_begin share of each W's rows (refresh_packed_weights),
// timed inside the optimizer and also shown on its own. Under bf16 only with the optimizer's
// low-precision copies (without them a step's bf16 W is a fresh cast each step, never packed).
// "plain" (or ATHANOR_PACKED_WEIGHTS=0, as for the library) is the floor on plain W, with no
// packing; "both" alternates packed and plain passes in one process (an A/B on a noisy machine).
//
//   ./bench_step_floor bench/configs/tiny-gpt.yaml [f32|bf16] [reps=7] [packed|plain|both]
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "athanor/core/half.h"
#include "athanor/core/rng.h"
#include "athanor/core/tensor.h"
#include "athanor/ops/elementwise.h"
#include "athanor/optim/optimizer.h"
#include "athanor/train/config.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/thread_env.h"
#include "backend/cpu/weight_packing.h"
#include "bench_timing.h"
#include "ops/packed_weights.h"

using namespace athanor;
using train::Config;
using bench::median;

namespace {

double now_s() { return bench::clock_s(); }

enum class Phase { gemm, attention, optimizer, packing };

// One kernel call of the step: what it is, its FLOPs, and how to run it on plain W (run;
// empty: the call only exists on packed W) and on packed W (packed; empty: as on plain W).
struct Call {
  std::string what;
  Phase phase = Phase::gemm;
  double flops = 0;
  std::function<void()> run, packed;
  const std::function<void()>& on(bool packed_w) const { return packed_w && packed ? packed : run; }
};

// Buffers of one dtype, kept alive for the whole run, filled with small values. They are
// tensors from athanor's allocator, as a step's are: large blocks get huge pages there
// (MADV_HUGEPAGE), which the GEMMs measurably profit from (on plain std::vector buffers
// the floor would understate what a real step can reach).
template <class T> struct Pool {
  std::vector<Tensor> bufs;
  T* get(int64_t n) {
    bufs.push_back(empty({n}, TensorOptions(dtype_of<T>)));
    T* p = static_cast<T*>(bufs.back().raw_data());
    for (int64_t i = 0; i < n; ++i) p[i] = T(0.01f * static_cast<float>((i * 7919) % 101 - 50) / 50.0f);
    return p;
  }
};

// The packed copies of the layers' weights (one per weight and use), packed once here and
// rewritten by every optimizer phase (jobs).
struct PackedCopies {
  bool enabled = false;  // whether GEMMs get copies at all (packed mode possible)
  std::vector<Tensor> bufs;
  std::vector<detail::PackJob> jobs;
  int gemms = 0, declined = 0;  // GEMMs given a copy; of them, those gemm_packed turned down
  // A zero-filled copy of W [rows, cols] (row stride cols) as B (w_is_bt: B = W^T) in layout l.
  const void* add(const cpu::PackedLayout& l, bool w_is_bt, const void* w, int64_t rows, int64_t cols) {
    bufs.push_back(zeros({l.elements()}, TensorOptions(l.bf16 ? DType::bf16 : DType::f32).with_tag(MemTag::packed_weights)));
    cpu::pack_weight(l, w_is_bt, w, cols, bufs.back().raw_data());
    jobs.push_back({l, w_is_bt, w, rows, cols, bufs.back().raw_data()});
    return bufs.back().raw_data();
  }
  int64_t bytes() const {
    int64_t n = 0;
    for (const detail::PackJob& j : jobs) n += j.layout.bytes();
    return n;
  }
  // As refresh_packed_weights: one parallel region, thread t packs its share of every W's rows.
  void refresh() const {
    int64_t work = 0;
    for (const detail::PackJob& j : jobs) work += j.layout.elements();
#pragma omp parallel if (work > (1 << 15))
    {
      const int t = omp_get_thread_num(), n = omp_get_num_threads();
      for (const detail::PackJob& j : jobs) j.run(cpu::pack_share_begin(j.rows, t, n), cpu::pack_share_begin(j.rows, t + 1, n));
    }
  }
};

// One linear layer y = x W^T + b (x [M, in], W [out, in]) in T (f32 or bf16): appends its
// forward GEMM to fwd and returns its backward calls (dx = dy W unless !needs_dx, dW = dy^T x).
template <class T>
std::vector<Call> linear(std::vector<Call>& fwd, Pool<T>& p, Pool<float>& pf, PackedCopies& pc, const std::string& name,
                         int64_t M, int64_t in, int64_t out, bool bias, bool needs_dx) {
  constexpr bool bf16 = std::is_same_v<T, bfloat16>;
  T *x = p.get(M * in), *w = p.get(out * in), *b = bias ? p.get(out) : nullptr, *y = p.get(M * out);
  T *dy = p.get(M * out), *dx = p.get(M * in);
  float* dw = pf.get(out * in);  // f32 in both precisions (bf16: from the f32 accumulators)
  const double f = 2.0 * M * in * out;
  const auto fwd_plain = [=] { cpu::gemm_bias<T>(false, true, M, out, in, x, in, w, in, b, y, out); };
  const auto dx_plain = [=] {
    if constexpr (bf16) cpu::gemm_lowp<T>(false, false, M, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
    else cpu::gemm(false, false, M, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
  };
  // gemm_packed on a copy of W where the GEMM runs on oneDNN's blocked kernels; the plain call
  // where it declines (the copy is still rewritten every step then, as the library's is).
  const auto packed_gemm = [&](bool forward, const T* A, const T* bias_, T* C, int64_t N, int64_t K,
                               const std::function<void()>& plain) -> std::function<void()> {
    if (!pc.enabled || !cpu::gemm_prefers_packed_b(bf16, forward, M, N, K)) return {};
    const cpu::PackedLayout l = cpu::packed_layout(bf16, K, N);
    const T* pw = static_cast<const T*>(pc.add(l, forward, w, out, in));
    ++pc.gemms;
    pc.declined += !cpu::gemm_packed<T>(M, A, K, l, pw, bias_, C, N);  // a probe, for the count printed
    return [=] {
      if (!cpu::gemm_packed<T>(M, A, K, l, pw, bias_, C, N)) plain();
    };
  };
  fwd.push_back({name + " fwd", Phase::gemm, f, fwd_plain, packed_gemm(true, x, b, y, out, in, fwd_plain)});
  std::vector<Call> bwd;
  if (needs_dx) bwd.push_back({name + " dx", Phase::gemm, f, dx_plain, packed_gemm(false, dy, nullptr, dx, in, out, dx_plain)});
  bwd.push_back({name + " dW", Phase::gemm, f, [=] {
                   if constexpr (bf16) cpu::gemm_bf16_f32out(true, false, out, in, M, 1.0f, dy, out, x, in, 0.0f, dw, in);
                   else cpu::gemm(true, false, out, in, M, 1.0f, dy, out, x, in, 0.0f, dw, in);
                 }, {}});
  return bwd;
}

template <class T> std::vector<Call> gpt_step(const Config& c, Pool<T>& p, Pool<float>& pf, PackedCopies& pc) {
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
    const std::vector<Call> qkv_b = linear<T>(fwd, p, pf, pc, n + "qkv", M, d, 3 * d, true, true);
    T *qkv = p.get(M * 3 * d), *o = p.get(M * d), *dout = p.get(M * d), *dqkv = p.get(M * 3 * d);
    float* lse = pf.get(B * H * T_);
    fwd.push_back({n + "attention fwd", Phase::attention, attn_fwd_flops,
                   [=] { cpu::attention_forward<T>(qkv, qkv + d, qkv + 2 * d, o, lse, ad, lay, true, scale); }, {}});
    const Call attn_b{n + "attention bwd", Phase::attention, 2 * attn_fwd_flops, [=] {
                        cpu::attention_backward<T>(qkv, qkv + d, qkv + 2 * d, o, dout, lse, dqkv, dqkv + d, dqkv + 2 * d,
                                                   ad, lay, true, scale);
                      }, {}};
    const std::vector<Call> proj_b = linear<T>(fwd, p, pf, pc, n + "proj", M, d, d, true, true);
    const std::vector<Call> fc_b = linear<T>(fwd, p, pf, pc, n + "fc", M, d, 4 * d, true, true);
    const std::vector<Call> fc2_b = linear<T>(fwd, p, pf, pc, n + "fc2", M, 4 * d, d, true, true);
    std::vector<Call> layer = fc2_b;  // the layer's backward: fc2, fc, proj, attention, qkv
    layer.insert(layer.end(), fc_b.begin(), fc_b.end());
    layer.insert(layer.end(), proj_b.begin(), proj_b.end());
    layer.push_back(attn_b);
    layer.insert(layer.end(), qkv_b.begin(), qkv_b.end());
    bwd.insert(bwd.begin(), layer.begin(), layer.end());
  }
  const std::vector<Call> head_b = linear<T>(fwd, p, pf, pc, "lm_head", M, d, V, false, true);
  fwd.insert(fwd.end(), head_b.begin(), head_b.end());
  fwd.insert(fwd.end(), bwd.begin(), bwd.end());
  return fwd;
}

template <class T> std::vector<Call> mlp_step(const Config& c, Pool<T>& p, Pool<float>& pf, PackedCopies& pc) {
  const std::vector<int64_t> sizes = c.get_int_list("model.sizes");
  const int64_t B = c.get_int("trainer.batch_size");
  std::vector<Call> fwd, bwd;
  for (std::size_t l = 0; l + 1 < sizes.size(); ++l) {
    const std::vector<Call> b = linear<T>(fwd, p, pf, pc, "fc" + std::to_string(l + 1), B, sizes[l], sizes[l + 1], true, l > 0);
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

// One pass's times (s) by phase; the optimizer's includes the packing.
struct Pass {
  std::vector<double> total, gemm, attn, opt, pack;
};
void run_pass(const std::vector<Call>& calls, bool packed_w, Pass* keep) {
  double g = 0, a = 0, o = 0, k = 0;
  const double t0 = now_s();
  for (const Call& c : calls) {
    const std::function<void()>& f = c.on(packed_w);
    if (!f) continue;
    const double s = now_s();
    f();
    const double dt = now_s() - s;
    (c.phase == Phase::gemm ? g : c.phase == Phase::attention ? a : o) += dt;
    if (c.phase == Phase::packing) k += dt;
  }
  const double t = now_s() - t0;
  if (keep) keep->total.push_back(t), keep->gemm.push_back(g), keep->attn.push_back(a), keep->opt.push_back(o), keep->pack.push_back(k);
}

enum class Mode { packed, plain, both };

template <class T> int run(const Config& c, const std::string& precision, int reps, Mode mode) {
  constexpr bool bf16 = std::is_same_v<T, bfloat16>;
  Pool<T> p;
  Pool<float> pf;
  PackedCopies pc;
  // As the trainer: copies only where the library would keep them (see the top comment).
  const bool lp_copies = bf16 && c.get_bool("optimizer.low_precision_copies");
  pc.enabled = mode != Mode::plain && c.get_bool("optimizer.packed_weights") && (!bf16 || lp_copies);
  const bool gpt = c.get_string("model.type") == "gpt";
  std::vector<Call> calls = gpt ? gpt_step<T>(c, p, pf, pc) : mlp_step<T>(c, p, pf, pc);
  auto params = std::make_shared<Params>(make_params(c, bf16));
  calls.push_back({"optimizer step", Phase::optimizer, 0, [params] { params->opt->step(); }, {}});
  // The rewrite of the copies right after the update, as Optimizer::step's refresh_packed_weights.
  if (!pc.jobs.empty()) calls.push_back({"packed weights", Phase::packing, 0, {}, [&pc] { pc.refresh(); }});
  const int64_t targets = gpt ? c.get_int("trainer.batch_size") * c.get_int("model.block_size") : c.get_int("trainer.batch_size");
  Pass on_packed, on_plain;
  for (int r = 0; r < reps + 2; ++r) {  // 2 warm-up passes (primitive creation, first touch)
    // both: packed and plain alternate, each going first every other pass.
    const bool packed_first = mode == Mode::packed || (mode == Mode::both && r % 2 == 0);
    for (int i = 0; i < (mode == Mode::both ? 2 : 1); ++i) {
      const bool packed_w = (i == 0) == packed_first;
      run_pass(calls, packed_w, r < 2 ? nullptr : packed_w ? &on_packed : &on_plain);
    }
  }
  double gemm_flops = 0, attn_flops = 0;
  for (const Call& k : calls) (k.phase == Phase::attention ? attn_flops : gemm_flops) += k.flops;
  std::printf("%s (%s): %d threads (OpenMP wait: %s), %d passes after 2 warm-up passes%s\n", c.get_string("name").c_str(),
              precision.c_str(), omp_get_max_threads(), cpu::openmp_wait_policy(), reps,
              mode == Mode::both ? " of each, packed and plain alternating" : "");
  if (mode != Mode::plain && pc.jobs.empty())
    std::printf("  (no packed copies: %s)\n", !c.get_bool("optimizer.packed_weights") ? "optimizer.packed_weights is off"
                                              : !pc.enabled ? "bf16 without optimizer.low_precision_copies"
                                                            : "no forward or dx GEMM runs on oneDNN's blocked kernels");
  for (const bool packed_w : {true, false}) {
    const Pass& ps = packed_w ? on_packed : on_plain;
    if (ps.total.empty()) continue;
    const auto [tm, tmin, tmax] = bench::spread(ps.total);
    const double gm = median(ps.gemm), am = median(ps.attn);
    std::size_t ncalls = 0;
    for (const Call& k : calls) ncalls += static_cast<bool>(k.on(packed_w));
    std::printf(" %s W: %zu kernel calls per step\n", packed_w ? "packed" : "plain", ncalls);
    std::printf("  floor        %.1f ms/step median [%.1f-%.1f]  ->  at most %.0f %s/s\n", tm * 1e3, tmin * 1e3, tmax * 1e3,
                targets / tm, gpt ? "tok" : "samples");
    std::printf("  GEMMs        %.1f ms (%.2f GFLOP, %.0f GFLOP/s)", gm * 1e3, gemm_flops * 1e-9, gemm_flops / gm * 1e-9);
    if (packed_w && pc.gemms > 0) std::printf("; %d fwd/dx GEMMs on packed W (%d of them declined by gemm_packed: plain)", pc.gemms, pc.declined);
    std::printf("\n");
    if (gpt) std::printf("  attention    %.1f ms (%.2f GFLOP causal, %.0f GFLOP/s)\n", am * 1e3, attn_flops * 1e-9, attn_flops / am * 1e-9);
    std::printf("  optimizer    %.2f ms (%s step over %zu tensors", median(ps.opt) * 1e3, c.get_string("optimizer.type").c_str(),
                params->named.size());
    if (packed_w && !pc.jobs.empty()) std::printf("; packing %.2f ms: %zu copies, %.1f MB", median(ps.pack) * 1e3, pc.jobs.size(), pc.bytes() / 1e6);
    std::printf(")\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // As the athanor program: idle OpenMP workers wait passively (thread_env.h); with libgomp's
  // default spinning on a loaded machine the floor measures the spinners, not the kernels.
  cpu::ensure_passive_openmp_wait(argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CONFIG.yaml [f32|bf16] [reps=7] [packed|plain|both]\n", argv[0]);
    return 2;
  }
  try {
    const Config c = Config::load(argv[1]);
    const std::string precision = argc > 2 ? argv[2] : "f32";
    const int reps = argc > 3 ? std::max(1, std::atoi(argv[3])) : 7;
    const std::string m = argc > 4 ? argv[4] : "packed";
    if (m != "packed" && m != "plain" && m != "both") {
      std::fprintf(stderr, "the 4th argument must be packed, plain or both, got '%s'\n", m.c_str());
      return 2;
    }
    // ATHANOR_PACKED_WEIGHTS=0 means what it means to the library: no packed weights at all.
    const char* env = std::getenv("ATHANOR_PACKED_WEIGHTS");
    const Mode mode = (env && std::strcmp(env, "0") == 0) || m == "plain" ? Mode::plain : m == "both" ? Mode::both : Mode::packed;
    if (precision == "f32") return run<float>(c, precision, reps, mode);
    if (precision == "bf16") return run<bfloat16>(c, precision, reps, mode);
    std::fprintf(stderr, "precision must be f32 or bf16, got '%s'\n", precision.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
