// Low-precision copies written in-kernel on CUDA (the lowp_copies candidate,
// backend/cuda/candidates.h; issue 22) and f64 in the layer_norm / rms_norm kernels (issue 30):
//  - a tiny GPT trained bf16 (and f16) on cuda by the Trainer with the candidate off and on:
//    the losses, every parameter and every optimizer state bit for bit the same (the copies are
//    exactly the casts they replace); with it on, the forward "cast" ops per step (the
//    profiler's op table) drop by accum_steps x (the 8 n_layer + 1 weights the linears cast +
//    the 2 n_layer + 1 layer-norm outputs), so the test fails if the copies are silently not
//    used; the "cast" backward nodes stay (the copies join the graph through the same node);
//    after every step each f32 parameter's persistent copy equals cast(parameter) bit for bit;
//  - the counts behind that formula on the CPU, whose optimizer and layer_norm have long done
//    this (a host test that runs without a GPU): the optimizer's copies replace 8 n_layer + 1
//    casts per micro-batch, and there are 2 n_layer + 1 layer norms;
//  - the optimizers on cuda (AdamW, Adam, SGD; bf16 and f16 copies): each weight's published
//    copy equals cast(weight) bit for bit after each of several steps over 30 tensors (two
//    launches of the kernels' 24-tensor table): a clipped step, a step the device guard skips on
//    a NaN gradient, one it skips on GradScaler's found-inf flag (weights and copies untouched),
//    a plain guarded step, an unguarded one; the weights and states equal the candidate-off
//    twin's bit for bit, and the twin has no copies at all; copies first made by a skipped step
//    (enabled with the candidate off, stepped with it on) are the casts too;
//  - the kernels alone: the Adam and SGD kernels' copies equal the CPU pass's (cpu::adam_f32 /
//    sgd_f32, which round as cast() does) bit for bit, a null copy entry and a skipped launch
//    write nothing; layer_norm / rms_norm forward write y rounded as cpu::narrow_f32 rounds it
//    beside an unchanged y;
//  - layer_norm / rms_norm under autocast offer their output's 16-bit copy (the next linear's
//    cast is taken from it: 0 cast ops instead of 1), bit for bit cast(y), with the same y and
//    the same input gradients as without the candidate; no offer when nothing requires grad;
//  - layer_norm / rms_norm forward and backward in f64 on cuda against the CPU's f64 kernels
//    (|gpu - cpu| <= 1e-12 max|cpu| + 1e-12 |cpu|), contiguous and transposed inputs, with and
//    without parameters; f32 against the CPU within the op harness's f32 tolerances; f64 mixed
//    with f32 is an error before any work.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "athanor/autograd/grad_mode.h"
#include "athanor/observe/profiler.h"
#include "athanor/ops.h"
#include "athanor/ops/autocast.h"
#include "athanor/optim/clip.h"
#include "athanor/optim/optimizer.h"
#include "athanor/train/trainer.h"
#include "backend/cpu/optimizer_update.h"
#include "backend/cuda/candidates.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/norm_kernels.h"
#include "gpu_test.h"
#include "optim/device_update.h"
#include "test_util.h"

using namespace athanor;

namespace {

int64_t calls_of(const std::vector<observe::ProfileRow>& rows, const std::string& name, char kind) {
  int64_t n = 0;
  for (const auto& r : rows)
    if (r.name == name && r.kind == kind) n += r.calls;
  return n;
}

// ---- the Trainer, candidate off and on ------------------------------------------------------

constexpr int64_t kLayers = 2, kAccum = 2, kSteps = 4;
// Forward casts per micro-batch that the copies replace (src/nn/gpt.cpp): per block the
// weights and biases of attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj (the linears and
// gelu_linear cast them), plus the tied lm_head's wte; and the layer norms' outputs (ln_1, ln_2
// per block, ln_f), each cast by the linear after it.
constexpr int64_t kWeightCasts = 8 * kLayers + 1, kNormCasts = 2 * kLayers + 1;

train::Config run_config(const std::string& dir, const std::string& text, std::vector<std::string> overrides) {
  overrides.push_back("out_dir=" + dir);
  return train::Config::parse(
      "model: {type: gpt, n_layer: 2, n_head: 2, n_embd: 32, block_size: 32, dropout: 0.0}\n"
      "data: {type: text, tokenizer: byte, corpus: " + text + ", cache_dir: " + dir + "/cache, num_workers: 1}\n"
      "optimizer: {type: adamw, lr: 0.003, weight_decay: 0.1, grad_clip: 1.0}\n"
      "schedule: {warmup_steps: 2, decay: cosine}\n"
      "trainer: {max_steps: 4, batch_size: 4, accum_steps: 2, eval_every: 0, eval_batches: 1, sample_every: 0, "
      "sample_tokens: 4, log_every: 1}\n"
      "observe: {report: false, tensorboard: false}\n",
      "gpu_lowp.yaml", overrides);
}

struct RunResult {
  std::vector<double> losses;
  std::vector<std::string> weights, states;
  std::vector<int64_t> casts, cast_nodes, norms;  // per step: forward "cast" ops, "cast_backward" nodes, layer_norm ops
  int64_t skipped = 0;
};

// `copies`: the trainer's optimizer.low_precision_copies on the CPU; on cuda the candidate (the
// trainer enables the copies in both runs; the candidate decides whether CUDA makes them).
RunResult train_run(const std::string& device, const std::string& precision, bool copies) {
  const std::string dir = athanor::testing::fresh_temp_dir("gpu_lowp_" + device + "_" + precision + (copies ? "_on" : "_off"));
  const std::string text = athanor::testing::write_tiny_text(dir);
  const bool cuda = device == "cuda";
  cuda::CandidateOverride cand(cuda::Candidate::lowp_copies, cuda && copies);
  // The runs compare bit for bit, so every other path they take must be deterministic run to
  // run; under gpu_check.sh's candidates pass (ATHANOR_CUDA_CANDIDATES=all) cuDNN's attention
  // would take this model's heads (D 16), and whether its backward is bit-identical run to run is
  // GpuAttentionCudnn.BackwardIsBitIdenticalRunToRun's question, not this test's.
  cuda::CandidateOverride no_cudnn(cuda::Candidate::attention_cudnn, false);
  train::Trainer t(run_config(dir, text, {"name=run", "trainer.device=" + device, "trainer.precision=" + precision,
                                          std::string("optimizer.low_precision_copies=") + (copies || cuda ? "true" : "false")}));
  t.set_output([](const std::string&) {});
  EXPECT_EQ(t.config().get_int("trainer.accum_steps"), kAccum);
  const DType low = dtype_from_name(precision);
  RunResult r;
  observe::Profiler& prof = observe::Profiler::instance();
  for (int64_t s = 0; s < kSteps; ++s) {
    prof.reset();
    prof.start();
    const bool stepped = t.train_step();
    prof.stop();
    EXPECT_TRUE(stepped) << "step " << s + 1;
    if (!stepped) break;
    const auto rows = prof.rows();
    r.casts.push_back(calls_of(rows, "cast", 'f'));
    r.cast_nodes.push_back(calls_of(rows, "cast_backward", 'b'));
    r.norms.push_back(calls_of(rows, "layer_norm", 'f'));
    if (copies) {  // every f32 parameter's copy is current and is its cast, bit for bit
      NoGradGuard ng;
      for (auto& [n, p] : t.task().module().named_parameters()) {
        const Tensor c = autocast_persistent_cast(p, low);
        EXPECT_TRUE(c.defined()) << device << " " << precision << ": no current copy of " << n << " after step " << s + 1;
        if (c.defined()) {
          EXPECT_EQ(c.device(), p.device()) << n;
          EXPECT_TRUE(athanor::testing::tensor_bytes(c) == athanor::testing::tensor_bytes(cast(p.detach(), low))) << n << "'s copy is not cast(" << n << ") after step " << s + 1;
        }
      }
    }
  }
  for (const auto& m : t.history()) r.losses.push_back(m.loss);
  for (auto& [n, p] : t.task().module().named_parameters()) r.weights.push_back(athanor::testing::tensor_bytes(p));
  for (const auto& [n, s] : t.optimizer().state_tensors()) r.states.push_back(n + ":" + athanor::testing::tensor_bytes(s));
  r.skipped = t.skipped_steps();
  return r;
}

// `saved`: the casts per micro-batch that the copies replace.
void expect_copies_replace_the_casts(const RunResult& off, const RunResult& on, int64_t saved, const std::string& what) {
  ASSERT_EQ(off.casts.size(), static_cast<size_t>(kSteps)) << what;
  ASSERT_EQ(on.casts.size(), static_cast<size_t>(kSteps)) << what;
  for (int64_t s = 0; s < kSteps; ++s) {
    EXPECT_EQ(off.norms[s], kAccum * kNormCasts) << what << ", step " << s + 1 << ": layer norms per step";
    EXPECT_EQ(on.norms[s], off.norms[s]) << what << ", step " << s + 1;
    EXPECT_GE(off.casts[s], kAccum * saved) << what << ", step " << s + 1;
    EXPECT_EQ(off.casts[s] - on.casts[s], kAccum * saved)
        << what << ", step " << s + 1 << ": " << off.casts[s] << " casts without copies, " << on.casts[s] << " with";
    EXPECT_EQ(on.cast_nodes[s], off.cast_nodes[s]) << what << ", step " << s + 1 << ": the copies join through the cast node";
  }
}

}  // namespace

TEST(GpuLowp, CastCountWithCopiesOnTheCpu) {
  // The counts the cuda test below holds the candidate to, on the engine that has had the copies
  // for long (runs without a GPU): the CPU optimizer's copies replace kWeightCasts casts per
  // micro-batch; the CPU layer_norm offers its copy whatever the optimizer does (so its
  // kNormCasts casts are absent from both runs here), and there are kNormCasts of them.
  for (const std::string prec : {"bf16", "f16"}) {
    SCOPED_TRACE(prec);
    const RunResult off = train_run("cpu", prec, false), on = train_run("cpu", prec, true);
    expect_copies_replace_the_casts(off, on, kWeightCasts, "cpu " + prec);
    EXPECT_EQ(on.losses, off.losses);
    EXPECT_TRUE(on.weights == off.weights);
  }
}

TEST(GpuLowp, TrainingWithTheCandidateIsBitIdenticalAndCastsLess) {
  ATH_REQUIRE_GPU();
  for (const std::string prec : {"bf16", "f16"}) {
    SCOPED_TRACE(prec);
    const RunResult off = train_run("cuda", prec, false), on = train_run("cuda", prec, true);
    ASSERT_EQ(off.losses.size(), static_cast<size_t>(kSteps));
    ASSERT_EQ(on.losses.size(), off.losses.size());
    for (size_t i = 0; i < off.losses.size(); ++i) {
      EXPECT_TRUE(std::isfinite(off.losses[i])) << "step " << i + 1;
      EXPECT_EQ(std::memcmp(&on.losses[i], &off.losses[i], sizeof(double)), 0)
          << "loss of step " << i + 1 << ": " << on.losses[i] << " with the candidate, " << off.losses[i] << " without";
    }
    ASSERT_EQ(on.weights.size(), off.weights.size());
    for (size_t i = 0; i < on.weights.size(); ++i) EXPECT_TRUE(on.weights[i] == off.weights[i]) << "parameter " << i << " differs";
    ASSERT_EQ(on.states.size(), off.states.size());
    ASSERT_GT(on.states.size(), 0u);
    for (size_t i = 0; i < on.states.size(); ++i)
      EXPECT_TRUE(on.states[i] == off.states[i]) << "optimizer state " << off.states[i].substr(0, off.states[i].find(':'));
    EXPECT_EQ(on.skipped, off.skipped);
    expect_copies_replace_the_casts(off, on, kWeightCasts + kNormCasts, "cuda " + prec);
  }
}

// ---- the optimizer kernels' copies ----------------------------------------------------------

namespace {

// 30 parameters (two launches of the kernels' 24-tensor table), one of several 4096-element
// chunks with a tail, in one group.
std::vector<Tensor> make_params() {
  std::vector<Tensor> ps;
  for (int i = 0; i < 30; ++i) {
    const int64_t n = i == 7 ? 100003 : 17 + 61 * i;
    ps.push_back(from_vector(gpu_test::random_vector(static_cast<size_t>(n), 40 + static_cast<unsigned>(i), -2, 2), {n}).cuda());
  }
  return ps;
}

struct GuardedOptimizer {
  std::vector<Tensor> params;
  std::unique_ptr<optim::Optimizer> opt;
  Tensor skip, out;
  bool candidate;  // the lowp_copies candidate while this optimizer enables its copies and steps
  GuardedOptimizer(const std::string& kind, DType copy_dtype, bool cand) : params(make_params()), candidate(cand) {
    optim::ParamGroup g;
    g.name = "all", g.lr = 1e-2, g.base_lr = 1e-2, g.weight_decay = 0.1;
    for (size_t i = 0; i < params.size(); ++i) g.params.emplace_back(std::to_string(i) + ".weight", params[i]);
    if (kind == "adamw") opt = optim::make_adamw({g});
    else if (kind == "adam") opt = optim::make_adam({g});
    else opt = optim::make_sgd({g}, {0.9, 0.0, true});
    cuda::CandidateOverride c(cuda::Candidate::lowp_copies, candidate);
    opt->enable_low_precision_copies(copy_dtype);
    skip = zeros({1}, TensorOptions(DType::f32).with_device(Device::cuda(0)));
    out = zeros({3}, TensorOptions(DType::f64).with_device(Device::cuda(0)));
    opt->set_device_guard(skip, make_view(out, {1}, {1}, 0));
  }
  void set_grads(unsigned seed, bool nan) {
    for (size_t i = 0; i < params.size(); ++i) {
      std::vector<float> g = gpu_test::random_vector(static_cast<size_t>(params[i].numel()), seed + 100 * static_cast<unsigned>(i), -3, 3);
      if (nan && i == 3) g[2] = std::numeric_limits<float>::quiet_NaN();
      params[i].set_grad(from_vector(g, params[i].sizes()).cuda());
    }
  }
  // The trainer's guarded step: the guard from Σ g² (and GradScaler's found-inf flag), then step().
  void step(double clip, bool found_inf) {
    const Tensor fi = found_inf ? full({1}, 1.0, TensorOptions(DType::f32).with_device(Device::cuda(0))) : Tensor();
    optim::detail::step_guard_on_device(optim::grad_sum_squares_on_device(params), fi, Tensor(), clip, skip, out);
    cuda::CandidateOverride c(cuda::Candidate::lowp_copies, candidate);
    opt->step();
  }
  void unguarded_step() {
    opt->set_device_guard(Tensor(), Tensor());
    cuda::CandidateOverride c(cuda::Candidate::lowp_copies, candidate);
    opt->step();
  }
};

void expect_copies_track_weights(const std::string& kind, DType dt) {
  SCOPED_TRACE(kind + " " + dtype_name(dt));
  GuardedOptimizer on(kind, dt, true), off(kind, dt, false);
  for (const Tensor& p : off.params) EXPECT_EQ(autocast_persistent_cast_count(p), 0u) << "candidate off: no copy on cuda";
  auto check = [&](const std::string& when) {
    NoGradGuard ng;
    for (size_t i = 0; i < on.params.size(); ++i) {
      const Tensor& p = on.params[i];
      EXPECT_TRUE(athanor::testing::tensor_bytes(p) == athanor::testing::tensor_bytes(off.params[i])) << when << ": weight " << i << " differs from the candidate-off run";
      EXPECT_EQ(autocast_persistent_cast_count(off.params[i]), 0u) << when;
      const Tensor c = autocast_persistent_cast(p, dt);
      ASSERT_TRUE(c.defined()) << when << ": no current copy of weight " << i;
      EXPECT_TRUE(athanor::testing::tensor_bytes(c) == athanor::testing::tensor_bytes(cast(p, dt))) << when << ": the copy of weight " << i << " is not its cast";
    }
    const auto a = on.opt->state_tensors(), b = off.opt->state_tensors();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(athanor::testing::tensor_bytes(a[i].second) == athanor::testing::tensor_bytes(b[i].second)) << when << ", " << a[i].first;
  };
  check("after enabling the copies");
  auto both = [&](auto&& fn) { fn(on), fn(off); };
  const std::string w0 = athanor::testing::tensor_bytes(on.params[7]);
  both([](GuardedOptimizer& o) { o.set_grads(1, false), o.step(0.5, false); });  // clipped
  EXPECT_FALSE(athanor::testing::tensor_bytes(on.params[7]) == w0) << "the first step must change the weights for the check to bite";
  check("after a clipped step");
  const std::string w1 = athanor::testing::tensor_bytes(on.params[7]), c1 = athanor::testing::tensor_bytes(autocast_persistent_cast(on.params[7], dt));
  both([](GuardedOptimizer& o) { o.set_grads(2, true), o.step(0.5, false); });  // NaN gradient: skipped
  EXPECT_EQ(on.skip.cpu().to_vector()[0], 1.0);
  EXPECT_TRUE(athanor::testing::tensor_bytes(on.params[7]) == w1) << "a skipped step must not touch the weights";
  check("after a step skipped on a NaN gradient");
  EXPECT_TRUE(athanor::testing::tensor_bytes(autocast_persistent_cast(on.params[7], dt)) == c1) << "a skipped step must not touch the copies";
  both([](GuardedOptimizer& o) { o.set_grads(3, false), o.step(0.0, true); });  // GradScaler found inf: skipped
  EXPECT_EQ(on.skip.cpu().to_vector()[0], 1.0);
  EXPECT_TRUE(athanor::testing::tensor_bytes(on.params[7]) == w1) << "a step skipped on found_inf must not touch the weights";
  check("after a step skipped on GradScaler's found-inf flag");
  both([](GuardedOptimizer& o) { o.set_grads(4, false), o.step(0.0, false); });
  EXPECT_EQ(on.skip.cpu().to_vector()[0], 0.0);
  check("after a guarded step following the skips");
  both([](GuardedOptimizer& o) { o.set_grads(5, false), o.unguarded_step(); });
  check("after an unguarded step");
  EXPECT_EQ(on.opt->steps(), 3);
  // Copies enabled while the candidate was off are made by the first step with it on; when
  // that step is skipped the new copies must still be the weights' casts.
  GuardedOptimizer late(kind, dt, false);
  late.candidate = true;
  late.set_grads(2, true), late.step(0.5, false);
  EXPECT_EQ(late.skip.cpu().to_vector()[0], 1.0);
  NoGradGuard ng;
  for (size_t i = 0; i < late.params.size(); ++i) {
    const Tensor c = autocast_persistent_cast(late.params[i], dt);
    ASSERT_TRUE(c.defined()) << "no copy of weight " << i << " after the first step with the candidate";
    EXPECT_TRUE(athanor::testing::tensor_bytes(c) == athanor::testing::tensor_bytes(cast(late.params[i], dt))) << "a copy made in a skipped step is not the cast, weight " << i;
  }
}

}  // namespace

TEST(GpuLowp, OptimizerCopiesTrackTheWeightsThroughSkippedSteps) {
  ATH_REQUIRE_GPU();
  for (const DType dt : {DType::bf16, DType::f16}) {
    expect_copies_track_weights("adamw", dt);
    expect_copies_track_weights("adam", dt);
    expect_copies_track_weights("sgd", dt);
  }
}

// ---- the kernels alone, against the CPU's passes ----------------------------------------------

namespace {

constexpr uint16_t kUntouched = 0xFFFF;  // a NaN in bf16 and f16: never a rounded finite weight

// The kernels' copies against the CPU pass's (cpu::adam_f32 / sgd_f32 write theirs as cast()
// rounds), over tensors around the 4096-element chunk; tensor 1 has no copy (a null entry must
// stay untouched). Then the same launch under a step guard that skips: nothing written.
template <class Launch, class CpuPass>
void expect_kernel_copies(DType dt, const Launch& launch, const CpuPass& cpu_pass) {
  using gpu_test::DeviceBuffer;
  const std::vector<int64_t> sizes = {1, 4095, 4097, 30000};
  std::vector<std::vector<float>> w, g, s1, s2;
  std::vector<std::vector<uint16_t>> want(sizes.size());
  std::vector<std::unique_ptr<DeviceBuffer<float>>> dw, dg, ds1, ds2;
  std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>> dc;
  std::vector<float*> pw, ps1, ps2;
  std::vector<const float*> pg;
  std::vector<void*> pc;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto n = static_cast<size_t>(sizes[i]);
    w.push_back(gpu_test::random_vector(n, 20 + i)), g.push_back(gpu_test::random_vector(n, 40 + i, -1e-2f, 1e-2f));
    s1.push_back(gpu_test::random_vector(n, 60 + i, -1e-3f, 1e-3f)), s2.push_back(gpu_test::random_vector(n, 80 + i, 0.0f, 1e-5f));
    dw.emplace_back(new DeviceBuffer<float>(w[i])), dg.emplace_back(new DeviceBuffer<float>(g[i]));
    ds1.emplace_back(new DeviceBuffer<float>(s1[i])), ds2.emplace_back(new DeviceBuffer<float>(s2[i]));
    dc.emplace_back(new DeviceBuffer<uint16_t>(std::vector<uint16_t>(n, kUntouched)));
    pw.push_back(dw[i]->ptr), pg.push_back(dg[i]->ptr), ps1.push_back(ds1[i]->ptr), ps2.push_back(ds2[i]->ptr);
    pc.push_back(i == 1 ? nullptr : dc[i]->ptr);
    want[i].assign(n, kUntouched);
  }
  // The skipped launch first: weights, states and copies as they were.
  DeviceBuffer<float> skip(std::vector<float>{1.0f});
  DeviceBuffer<double> scale(std::vector<double>{1.0});
  std::vector<std::unique_ptr<DeviceBuffer<double>>> steps;
  std::vector<double*> psteps;
  for (size_t i = 0; i < sizes.size(); ++i) steps.emplace_back(new DeviceBuffer<double>(std::vector<double>{0.0})), psteps.push_back(steps[i]->ptr);
  cuda::StepGuard guard;
  guard.skip = skip.ptr, guard.grad_scale = scale.ptr, guard.lr = 1e-3, guard.beta1 = 0.9, guard.beta2 = 0.95;
  launch(pw, pg, ps1, ps2, sizes, cuda::WeightCopies{pc.data(), dt}, guard, psteps.data());
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_TRUE(dw[i]->host() == w[i]) << "a skipped launch wrote weights of tensor " << i;
    EXPECT_TRUE(dc[i]->host() == want[i]) << "a skipped launch wrote the copy of tensor " << i;
  }
  // The update: the CPU pass on the host values, the kernel on the device's.
  launch(pw, pg, ps1, ps2, sizes, cuda::WeightCopies{pc.data(), dt}, cuda::StepGuard{}, nullptr);
  for (size_t i = 0; i < sizes.size(); ++i) {
    cpu_pass(w[i].data(), g[i].data(), s1[i].data(), s2[i].data(), sizes[i], i == 1 ? nullptr : want[i].data());
    const auto gw = dw[i]->host(), gs1 = ds1[i]->host();
    EXPECT_EQ(std::memcmp(gw.data(), w[i].data(), w[i].size() * 4), 0) << "weights of tensor " << i;
    EXPECT_EQ(std::memcmp(gs1.data(), s1[i].data(), s1[i].size() * 4), 0) << "state of tensor " << i;
    EXPECT_TRUE(dc[i]->host() == want[i]) << (i == 1 ? "a null copy entry was written, tensor " : "the copy differs from the CPU's, tensor ") << i;
  }
}

}  // namespace

TEST(GpuLowp, AdamAndSgdKernelsCopiesEqualTheCpuPass) {
  ATH_REQUIRE_GPU();
  for (const DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const cpu::AdamConsts ka{0.9f, 0.95f, 1e-8f, 0.1f, 1e-3f, 1.0f / std::sqrt(1.0f - 0.95f * 0.95f), 1.0f - 1e-4f, false, 1.0};
    const cuda::AdamArgs a{ka.beta1, ka.beta2, ka.eps, ka.wd, ka.step_size, ka.inv_sqrt_bc2, ka.decay, ka.l2, ka.grad_scale};
    expect_kernel_copies(
        dt,
        [&](std::vector<float*>& w, std::vector<const float*>& g, std::vector<float*>& m, std::vector<float*>& v,
            const std::vector<int64_t>& n, const cuda::WeightCopies& c, const cuda::StepGuard& guard, double* const* steps) {
          cuda::adam_multi_tensor(w.data(), g.data(), m.data(), v.data(), n.data(), static_cast<int>(n.size()), a,
                                  gpu_test::stream(), guard, steps, c);
        },
        [&](float* w, const float* g, float* m, float* v, int64_t n, void* copy) { cpu::adam_f32(w, g, m, v, n, ka, copy, dt); });
    const cpu::SgdConsts ks{0.05f, 1e-4f, 0.9f, 1.0f, true, false, 1.0};
    const cuda::SgdArgs sa{ks.lr, ks.wd, ks.momentum, ks.one_minus_dampening, ks.nesterov, ks.first, ks.grad_scale};
    expect_kernel_copies(
        dt,
        [&](std::vector<float*>& w, std::vector<const float*>& g, std::vector<float*>& b, std::vector<float*>&,
            const std::vector<int64_t>& n, const cuda::WeightCopies& c, const cuda::StepGuard& guard, double* const* steps) {
          cuda::sgd_multi_tensor(w.data(), g.data(), b.data(), n.data(), static_cast<int>(n.size()), sa, gpu_test::stream(),
                                 guard, steps, c);
        },
        [&](float* w, const float* g, float* b, float*, int64_t n, void* copy) { cpu::sgd_f32(w, g, b, n, ks, copy, dt); });
  }
}

TEST(GpuLowp, NormKernelsWriteTheRoundedOutputBesideIt) {
  ATH_REQUIRE_GPU();
  using gpu_test::DeviceBuffer;
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{3, 7}, {5, 1031}, {64, 768}})
    for (const DType dt : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + " " + dtype_name(dt));
      const auto n = static_cast<size_t>(rows * cols);
      const auto x = gpu_test::random_vector(n, 1, -2, 3), w = gpu_test::random_vector(cols, 2), b = gpu_test::random_vector(cols, 3);
      DeviceBuffer<float> dX(x), dW(w), dB(b), dY0(n), dY1(n), dM(rows), dR(rows);
      DeviceBuffer<uint16_t> dL(n);
      for (const bool rms : {false, true}) {
        if (rms) {
          cuda::rms_norm_forward(dX.ptr, dW.ptr, dY0.ptr, dR.ptr, rows, cols, 1e-6, gpu_test::stream());
          cuda::rms_norm_forward(dX.ptr, dW.ptr, dY1.ptr, dR.ptr, rows, cols, 1e-6, gpu_test::stream(), dL.ptr, dt);
        } else {
          cuda::layer_norm_forward(dX.ptr, dW.ptr, dB.ptr, dY0.ptr, dM.ptr, dR.ptr, rows, cols, 1e-5, gpu_test::stream());
          cuda::layer_norm_forward(dX.ptr, dW.ptr, dB.ptr, dY1.ptr, dM.ptr, dR.ptr, rows, cols, 1e-5, gpu_test::stream(), dL.ptr, dt);
        }
        const auto y0 = dY0.host(), y1 = dY1.host();
        EXPECT_EQ(std::memcmp(y0.data(), y1.data(), n * 4), 0) << (rms ? "rms_norm" : "layer_norm") << ": y changed by writing the copy";
        std::vector<uint16_t> want(n);
        cpu::narrow_f32(y0.data(), want.data(), static_cast<int64_t>(n), dt);  // cast()'s rounding on the CPU
        EXPECT_TRUE(dL.host() == want) << (rms ? "rms_norm" : "layer_norm") << ": the copy is not y rounded as cast() rounds";
      }
    }
}

// ---- layer_norm / rms_norm: the offered copy -------------------------------------------------

namespace {

Tensor randn_on(const Shape& shape, unsigned seed, DType dt, Device d, double offset = 0.0) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> v(static_cast<size_t>(n));
  const std::vector<float> r = gpu_test::random_vector(v.size(), seed, -2, 2);
  for (size_t i = 0; i < v.size(); ++i) v[i] = r[i] + offset + 1e-3 * std::sin(static_cast<double>(i));  // below f32's grid
  return from_vector(v, shape, TensorOptions(dt)).to(d);
}

struct NormRun {
  std::string y, copy, dx, dw;
  int64_t casts = 0;
};
NormRun norm_under_autocast(const std::string& op, DType low, bool candidate, bool grad) {
  cuda::CandidateOverride c(cuda::Candidate::lowp_copies, candidate);
  const Device d = Device::cuda(0);
  Tensor x = randn_on({6, 50}, 1, DType::f32, d), w = randn_on({50}, 2, DType::f32, d), b = randn_on({50}, 3, DType::f32, d);
  if (grad) x.requires_grad_(), w.requires_grad_(), b.requires_grad_();
  NormRun r;
  Tensor copy, y;
  observe::Profiler& prof = observe::Profiler::instance();
  {
    autocast ac(low);
    y = op == "layer_norm" ? layer_norm(x, {50}, w, b) : rms_norm(x, {50}, w, 1e-5);
    prof.reset();
    prof.start();
    copy = autocast_input(y, "linear");  // the cast the next linear makes (from the offer when there is one)
    prof.stop();
  }
  r.casts = calls_of(prof.rows(), "cast", 'f');
  r.y = athanor::testing::tensor_bytes(y), r.copy = athanor::testing::tensor_bytes(copy);
  EXPECT_EQ(copy.dtype(), low);
  EXPECT_TRUE(athanor::testing::tensor_bytes(cast(y.detach(), low)) == r.copy) << op << ": the copy is not cast(y)";
  if (grad) {
    copy.backward(randn_on({6, 50}, 4, low, d));  // through the cast node back to x and w
    r.dx = athanor::testing::tensor_bytes(x.grad()), r.dw = athanor::testing::tensor_bytes(w.grad());
  }
  return r;
}

}  // namespace

TEST(GpuLowp, NormsOfferTheirOutputsCastUnderAutocast) {
  ATH_REQUIRE_GPU();
  for (const std::string op : {"layer_norm", "rms_norm"})
    for (const DType low : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(op + " " + dtype_name(low));
      const NormRun off = norm_under_autocast(op, low, false, true), on = norm_under_autocast(op, low, true, true);
      EXPECT_EQ(off.casts, 1) << "without the candidate the linear's input is cast";
      EXPECT_EQ(on.casts, 0) << "with it the offered copy is taken instead of a cast";
      EXPECT_TRUE(on.y == off.y) << "y changed with the candidate";
      EXPECT_TRUE(on.copy == off.copy) << "the copy differs from the cast";
      EXPECT_TRUE(on.dx == off.dx) << "x's gradient through the copy differs";
      EXPECT_TRUE(on.dw == off.dw) << "the weight's gradient through the copy differs";
      // The CPU layer_norm's condition: an input that requires grad (an activation being trained).
      EXPECT_EQ(norm_under_autocast(op, low, true, false).casts, 1) << "no offer when nothing requires grad";
    }
}

// ---- layer_norm / rms_norm in f64 (and f32) against the CPU ----------------------------------

namespace {

// |got - want| <= tol (max|want| + |want|) elementwise.
::testing::AssertionResult close_rel(const Tensor& got, const Tensor& want, double tol) {
  const std::vector<double> g = got.cpu().to_vector(), w = want.cpu().to_vector();
  double scale = 0;
  for (double v : w) scale = std::max(scale, std::abs(v));
  return gpu_test::all_close(g, w, tol * scale, tol);
}

struct NormCase {
  int64_t rows, cols;
  bool params, transposed;
};
// A row shorter than a warp, one longer than the block; several chunks of rows for dw; over
// 1024 chunks of 256 rows; x transposed (a strided view: the kernels get a contiguous copy).
const NormCase kCases[] = {{3, 7, true, false}, {5, 1031, true, false}, {600, 300, true, true}, {600, 300, false, false},
                           {270001, 5, true, false}};

// op(x) on `d` with x, w, b (f64 or f32) made from the same numbers, and its gradients for the
// upstream gradient gy: {y, dx, dw, db}.
std::vector<Tensor> norm_run(const std::string& op, const NormCase& c, DType dt, Device d) {
  const bool ln = op == "layer_norm";
  // The leaf; x is a transposed view of it in the strided case (its gradient flows back to the leaf).
  Tensor leaf = randn_on(c.transposed ? Shape{c.cols, c.rows} : Shape{c.rows, c.cols}, 11, dt, d, 10.0);
  leaf.requires_grad_();
  const Tensor x = c.transposed ? transpose(leaf, 0, 1) : leaf;
  Tensor w = c.params ? randn_on({c.cols}, 12, dt, d) : Tensor();
  Tensor b = c.params && ln ? randn_on({c.cols}, 13, dt, d) : Tensor();
  if (w.defined()) w.requires_grad_();
  if (b.defined()) b.requires_grad_();
  const Tensor y = ln ? layer_norm(x, {c.cols}, w, b) : rms_norm(x, {c.cols}, w, 1e-6);
  y.backward(randn_on({c.rows, c.cols}, 14, dt, d));
  return {y, leaf.grad(), w.defined() ? w.grad() : Tensor(), b.defined() ? b.grad() : Tensor()};
}

void expect_norm_matches_cpu(const std::string& op, DType dt) {
  for (const NormCase& c : kCases) {
    SCOPED_TRACE(op + " " + dtype_name(dt) + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols) +
                 (c.params ? "" : " no parameters") + (c.transposed ? " transposed" : ""));
    const auto gpu = norm_run(op, c, dt, Device::cuda(0)), cpu = norm_run(op, c, dt, Device::cpu());
    const char* names[] = {"y", "dx", "dw", "db"};
    for (size_t k = 0; k < 4; ++k) {
      ASSERT_EQ(gpu[k].defined(), cpu[k].defined()) << names[k];
      if (!cpu[k].defined()) continue;
      EXPECT_EQ(gpu[k].device(), Device::cuda(0)) << names[k];
      EXPECT_EQ(gpu[k].dtype(), dt) << names[k];
      if (dt == DType::f64) {
        EXPECT_TRUE(close_rel(gpu[k], cpu[k], 1e-12)) << names[k];
      } else {
        // The op harness's f32 tolerance (test_gpu_ops.cpp); dw, db are f32 sums over the rows whose
        // rounding grows as sqrt(rows) (test_gpu_kernels.cpp's 1e-4 sqrt(rows / 64) against a double
        // reference; twice that here, both sides rounding in f32).
        const double over_rows = std::sqrt(std::max(1.0, static_cast<double>(c.rows) / 64.0));
        const double atol = k >= 2 ? 2e-4 * over_rows : 1e-5;
        EXPECT_TRUE(gpu_test::all_close(gpu[k].cpu().to_vector(), cpu[k].to_vector(), atol, 1e-4)) << names[k];
      }
    }
  }
}

}  // namespace

TEST(GpuLowp, LayerNormAndRmsNormInF64MatchTheCpu) {
  ATH_REQUIRE_GPU();
  expect_norm_matches_cpu("layer_norm", DType::f64);
  expect_norm_matches_cpu("rms_norm", DType::f64);
}

TEST(GpuLowp, LayerNormAndRmsNormInF32StillMatchTheCpu) {
  ATH_REQUIRE_GPU();
  expect_norm_matches_cpu("layer_norm", DType::f32);
  expect_norm_matches_cpu("rms_norm", DType::f32);
}

TEST(GpuLowp, F64MixedWithF32IsAnErrorBeforeAnyWork) {
  ATH_REQUIRE_GPU();
  const Device d = Device::cuda(0);
  const Tensor x = randn_on({4, 8}, 1, DType::f64, d), w32 = randn_on({8}, 2, DType::f32, d), w64 = randn_on({8}, 3, DType::f64, d);
  const Tensor x32 = randn_on({4, 8}, 4, DType::f32, d);
  for (const auto& [what, fn] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"layer_norm f64 x, f32 weight", [&] { layer_norm(x, {8}, w32, Tensor()); }},
           {"layer_norm f32 x, f64 bias", [&] { layer_norm(x32, {8}, Tensor(), w64); }},
           {"rms_norm f64 x, f32 weight", [&] { rms_norm(x, {8}, w32, 1e-6); }}}) {
    try {
      fn();
      ADD_FAILURE() << what << " was accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("f64 mixed with other dtypes on cuda"), std::string::npos) << what << ": " << m;
      EXPECT_NE(m.find("hint:"), std::string::npos) << what << ": " << m;
    }
  }
}
