// ZeRO tests: run under `mpirun --oversubscribe -np 2|4` (see tests/CMakeLists.txt).
//
//   test_zero                         gtest: stages 1/2 == DDP == 1 process; memory per tag
//   test_zero --reshard=DIR,save      (4 ranks, stage 2) trains 6 steps, saves a sharded checkpoint
//                                     after step 3 (each rank its part, logical names), writes the
//                                     final weights as the reference
//   test_zero --reshard=DIR,resume,S  (any ranks, stage S) resumes from the checkpoint, trains
//                                     steps 3..5 and compares with the reference (exit 1 if not equal)
//   test_zero --reshard=DIR,resume_weights_only,S   the same without the optimizer state
//                                     (negative control: must exit 1)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>

#include "athanor/autograd/grad_mode.h"
#include "athanor/ckpt/safetensors.h"
#include "athanor/ckpt/sharded_checkpoint.h"
#include "athanor/core/allocator.h"
#include "athanor/core/rng.h"
#include "athanor/dist/zero.h"
#include "athanor/nn/gpt.h"
#include "athanor/nn/mlp.h"
#include "athanor/ops/activation.h"
#include "athanor/ops/linalg.h"
#include "athanor/ops/loss.h"
#include "athanor/ops/shape.h"
#include "athanor/optim/clip.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {

std::shared_ptr<dist::ProcessGroup> W() { return dist::world(); }

// A model and its deterministic data: loss of rows [row0, row0 + rows) of step's global batch.
struct Workload {
  std::function<std::shared_ptr<nn::Module>(uint64_t seed)> make;
  std::function<Tensor(nn::Module&, int step, int64_t row0, int64_t rows, int64_t global)> loss;
  // Stage 3: the shard_modules to name (none: the model's FullyShardedBlocks are the units).
  std::function<std::vector<std::string>(nn::Module&)> units;
};

// MSE against random targets: step `step`'s global batch of `global` rows (the same
// on every rank), of which this rank takes rows [row0, row0 + rows).
template <class Net>
std::function<Tensor(nn::Module&, int, int64_t, int64_t, int64_t)> regression_loss(int64_t in, int64_t out) {
  return [in, out](nn::Module& m, int step, int64_t row0, int64_t rows, int64_t global) {
    std::mt19937 rng(1000 + step);
    std::normal_distribution<float> nd;
    std::vector<float> x(global * in), y(global * out);
    for (auto& v : x) v = nd(rng);
    for (auto& v : y) v = nd(rng);
    std::vector<float> xs(x.begin() + row0 * in, x.begin() + (row0 + rows) * in);
    std::vector<float> ys(y.begin() + row0 * out, y.begin() + (row0 + rows) * out);
    return mse_loss(static_cast<Net&>(m).forward(from_vector(xs, {rows, in})), from_vector(ys, {rows, out}));
  };
}

Workload mlp_workload(std::vector<int64_t> sizes = {5, 16, 16, 3}) {
  Workload w;
  w.make = [sizes](uint64_t seed) -> std::shared_ptr<nn::Module> {
    manual_seed(seed);
    return std::make_shared<nn::MLP>(sizes, "tanh");
  };
  const int64_t in = sizes.front(), out = sizes.back();
  w.loss = regression_loss<nn::MLP>(in, out);
  w.units = [](nn::Module& m) { return static_cast<nn::MLP&>(m).shard_units(); };
  return w;
}

// A stack of FullyShardedBlocks (each 4 tanh-Linear layers: 4 equal weights shard evenly
// over 2 or 4 ranks) between an input and a head Linear that are not in any block.
struct TanhStack : nn::UnaryModule {
  explicit TanhStack(int64_t d) {
    for (int k = 0; k < 4; ++k) layers.push_back(register_module(std::to_string(k), std::make_shared<nn::Linear>(d, d)));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (auto& l : layers) h = tanh(l->forward(h));
    return h;
  }
  std::vector<std::shared_ptr<nn::Linear>> layers;
};
struct BlockNet : nn::UnaryModule {
  BlockNet(int64_t in, int64_t d, int nblocks, int64_t out) {
    inp = register_module("inp", std::make_shared<nn::Linear>(in, d));
    std::vector<std::shared_ptr<nn::UnaryModule>> bs;
    for (int i = 0; i < nblocks; ++i) bs.push_back(std::make_shared<dist::FullyShardedBlock>(std::make_shared<TanhStack>(d)));
    blocks = register_module("blocks", std::make_shared<nn::Sequential>(bs));
    head = register_module("head", std::make_shared<nn::Linear>(d, out));
  }
  Tensor forward(const Tensor& x) override { return head->forward(blocks->forward(tanh(inp->forward(x)))); }
  std::shared_ptr<nn::Linear> inp, head;
  std::shared_ptr<nn::Sequential> blocks;
};

constexpr int64_t kBlockIn = 5, kBlockOut = 3;
Workload block_workload(int64_t d = 8, int nblocks = 3) {
  const int64_t in = kBlockIn, out = kBlockOut;
  Workload w;
  w.make = [d, nblocks](uint64_t seed) -> std::shared_ptr<nn::Module> {
    manual_seed(seed);
    return std::make_shared<BlockNet>(kBlockIn, d, nblocks, kBlockOut);
  };
  w.loss = regression_loss<BlockNet>(in, out);
  return w;
}

Workload gpt_workload(int64_t n_layer = 2, bool gradient_checkpointing = false) {
  const nn::GPTConfig c{.n_layer = n_layer, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 23,
                        .gradient_checkpointing = gradient_checkpointing};
  Workload w;
  w.make = [c](uint64_t seed) -> std::shared_ptr<nn::Module> {
    manual_seed(seed);
    return std::make_shared<nn::GPT>(c);
  };
  w.units = [](nn::Module& m) { return static_cast<nn::GPT&>(m).shard_units(); };
  w.loss = [c](nn::Module& m, int step, int64_t row0, int64_t rows, int64_t global) {
    Generator g(500 + step);
    Tensor ids = randint(0, c.vocab_size, {global, c.block_size}, g);
    Tensor tgt = randint(0, c.vocab_size, {global, c.block_size}, g);
    return static_cast<nn::GPT&>(m).loss(narrow(ids, 0, row0, rows).contiguous(), narrow(tgt, 0, row0, rows).contiguous());
  };
  return w;
}

enum class Opt { sgd_momentum, adamw };
std::unique_ptr<optim::Optimizer> make_opt(Opt o, const optim::NamedTensors& params) {
  if (o == Opt::sgd_momentum) {
    optim::ParamGroup pg;
    pg.name = "all";
    pg.params = params;
    pg.lr = pg.base_lr = 0.05;
    return optim::make_sgd({pg}, optim::SgdOptions{.momentum = 0.9});
  }
  return optim::make_adamw(optim::default_param_groups(params, 1e-2, 0.1));
}

struct RunSpec {
  int stage = 0;          // -1: one process with the global batch (no DataParallel)
  int micro_batches = 1;
  double clip = 0;        // 0: no clipping
  double bucket_mb = 25;
  int steps = 5;
};

struct RunResult {
  nn::StateDict weights;
  std::vector<double> norms;  // pre-clip gradient norm per step
};

RunResult train(const Workload& w, Opt o, const RunSpec& s) {
  auto g = W();
  const int n = g->size(), r = g->rank();
  const int64_t b = 2;  // rows per micro-batch per rank
  const int64_t global = int64_t(n) * s.micro_batches * b;
  RunResult res;
  if (s.stage < 0) {
    auto model = w.make(42);
    auto opt = make_opt(o, model->named_parameters());
    for (int step = 0; step < s.steps; ++step) {
      w.loss(*model, step, 0, global, global).backward();
      res.norms.push_back(s.clip > 0 ? optim::clip_grad_norm(model->parameters(), s.clip)
                                     : optim::grad_norm(model->parameters()));
      opt->step();
      opt->zero_grad();
    }
    res.weights = model->state_dict();
    return res;
  }
  auto model = w.make(r == 0 ? 42 : 7 + r);  // other ranks start elsewhere: rank 0's weights are broadcast
  dist::DataParallel dp(model, g, [o](const optim::NamedTensors& owned) { return make_opt(o, owned); },
                        {.zero_stage = s.stage, .bucket_mb = s.bucket_mb,
                         .shard_modules = s.stage == 3 && w.units ? w.units(*model) : std::vector<std::string>{}});
  for (int step = 0; step < s.steps; ++step) {
    for (int mb = 0; mb < s.micro_batches; ++mb) {
      Tensor loss = mul(w.loss(*model, step, (int64_t(mb) * n + r) * b, b, global), 1.0 / s.micro_batches);
      if (mb + 1 < s.micro_batches) {
        auto ns = dp.no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    dp.finish_backward();
    EXPECT_FALSE(dp.found_nonfinite());
    res.norms.push_back(s.clip > 0 ? dp.clip_grad_norm(s.clip) : dp.grad_norm());
    dp.step();
    dp.zero_grad();
  }
  res.weights = dp.full_state_dict();
  return res;
}

double max_abs_diff(const nn::StateDict& a, const nn::StateDict& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = a[i].second.to_vector(), y = b[i].second.to_vector();
    for (std::size_t j = 0; j < x.size(); ++j) m = std::max(m, std::abs(x[j] - y[j]));
  }
  return m;
}

// f32 throughout: the runs differ only in reduction order (per-rank means averaged by
// all-reduce or reduce-scatter vs one mean), so after 5 steps weights agree to 1e-5.
constexpr double kTol = 1e-5;

void expect_stages_equal(const Workload& w, Opt o, RunSpec s, std::vector<int> stages = {1, 2}) {
  RunSpec one = s;
  one.stage = -1;
  const RunResult ref = train(w, o, one);
  s.stage = 0;
  const RunResult ddp = train(w, o, s);
  ASSERT_EQ(ddp.weights.size(), ref.weights.size());
  EXPECT_LE(max_abs_diff(ddp.weights, ref.weights), kTol) << "DDP vs 1 process";
  if (s.clip > 0) {
    EXPECT_GT(ref.norms[0], s.clip) << "clipping must really act in this test";
  }
  for (int stage : stages) {
    s.stage = stage;
    const RunResult z = train(w, o, s);
    const double d_ddp = max_abs_diff(z.weights, ddp.weights), d_ref = max_abs_diff(z.weights, ref.weights);
    EXPECT_LE(d_ddp, kTol) << "stage " << stage << " vs DDP";
    EXPECT_LE(d_ref, kTol) << "stage " << stage << " vs 1 process";
    for (int i = 0; i < s.steps; ++i) EXPECT_NEAR(z.norms[i], ref.norms[i], 1e-5 * ref.norms[i]) << "stage " << stage;
    if (W()->rank() == 0)
      std::printf("[zero] np %d stage %d: max|w - w_ddp| = %.3g, max|w - w_1proc| = %.3g\n", W()->size(), stage, d_ddp,
                  d_ref);
  }
}

}  // namespace

TEST(ZeRO, MlpSgdMomentumStages1And2EqualDDPAndOneProcess) {
  expect_stages_equal(mlp_workload(), Opt::sgd_momentum, {.micro_batches = 1, .bucket_mb = 1e-3});
}
TEST(ZeRO, MlpSgdMomentumWithAccumulationAndClipping) {
  expect_stages_equal(mlp_workload(), Opt::sgd_momentum, {.micro_batches = 3, .clip = 0.05, .bucket_mb = 1e-3});
}
TEST(ZeRO, MlpAdamWWithAccumulationAndClipping) {
  expect_stages_equal(mlp_workload(), Opt::adamw, {.micro_batches = 2, .clip = 0.05, .bucket_mb = 25});
}
TEST(ZeRO, TinyGptAdamWWithAccumulationAndClipping) {
  expect_stages_equal(gpt_workload(), Opt::adamw, {.micro_batches = 2, .clip = 0.5, .bucket_mb = 4e-3});
}

TEST(ZeRO, Stage3BlocksSgdMomentumWithAccumulationAndClippingEqualDDP) {
  expect_stages_equal(block_workload(), Opt::sgd_momentum, {.micro_batches = 2, .clip = 0.05, .bucket_mb = 1e-3},
                      {1, 2, 3});
}
TEST(ZeRO, Stage3BlocksAdamWEqualDDP) {
  expect_stages_equal(block_workload(), Opt::adamw, {.micro_batches = 1, .clip = 0.05, .bucket_mb = 25}, {3});
}

// Stage 3 through shard_modules: the model's own blocks named by path (no wrapper, names unchanged).
TEST(ZeRO, Stage3GptShardModulesAdamWWithAccumulationAndClippingEqualDDP) {
  expect_stages_equal(gpt_workload(), Opt::adamw, {.micro_batches = 2, .clip = 0.5, .bucket_mb = 4e-3}, {3});
}
// GPT's own gradient_checkpointing gives way to the stage-3 interceptor (one checkpoint per block).
TEST(ZeRO, Stage3GptWithGradientCheckpointingEqualDDP) {
  expect_stages_equal(gpt_workload(2, true), Opt::sgd_momentum, {.micro_batches = 1, .clip = 0.5, .bucket_mb = 25}, {3});
}
TEST(ZeRO, Stage3MlpLinearLayersEqualDDP) {
  expect_stages_equal(mlp_workload(), Opt::sgd_momentum, {.micro_batches = 2, .clip = 0.05, .bucket_mb = 1e-3}, {3});
}

TEST(ZeRO, ParametersAreOwnedOnceAndBalanced) {
  auto g = W();
  auto w = mlp_workload({64, 64, 64, 64, 64, 64, 64, 64, 64});
  auto model = w.make(1);
  dist::DataParallel dp(model, g, [](const optim::NamedTensors& p) { return make_opt(Opt::adamw, p); },
                        {.zero_stage = 1, .bucket_mb = 1e-3});
  std::vector<double> owned(g->size(), 0);
  for (auto& [name, p] : model->named_parameters()) owned[dp.owner_of(name)] += static_cast<double>(p.numel());
  const double total = static_cast<double>(model->parameters_count());
  for (double o : owned) EXPECT_LE(o, total / g->size() + 64 * 64) << "greedy bound: 1/N + one largest parameter";
  // the optimizer holds exactly the owned parameters
  int64_t in_opt = 0;
  for (auto& grp : dp.optimizer().param_groups()) in_opt += static_cast<int64_t>(grp.params.size());
  EXPECT_EQ(in_opt, static_cast<int64_t>(dp.owned_parameters().size()));
  // stage 3 needs FullyShardedBlocks to shard; a plain MLP has none
  const std::string msg = error_message([&] {
    dist::DataParallel(model, g, [](const optim::NamedTensors& p) { return make_opt(Opt::adamw, p); }, {.zero_stage = 3});
  });
  EXPECT_NE(msg.find("FullyShardedBlock"), std::string::npos) << msg;
}

// Per-rank bytes by allocator tag, after one step, relative to before DataParallel existed.
struct StageBytes {
  double optimizer_state = 0, gradient = 0;
  double gradient_peak = 0;  // during backward + finish_backward
};
// 16 equal layers of 64x64 + 64: ownership balances exactly for N = 2 and 4, and
// buckets of ~4 layers are balanced too (the padded reduce-scatter input is one bucket).
constexpr int kLayers = 16;
constexpr double kLayerBytes = (64 * 64 + 64) * 4.0;
constexpr double kBucketMb = 4.2 * kLayerBytes / (1024.0 * 1024.0);

StageBytes measure(int stage, const Workload& w) {
  auto g = W();
  auto model = w.make(3);
  Allocator& a = Allocator::cpu();
  const auto before = a.stats();
  StageBytes out;
  {
    dist::DataParallel dp(model, g, [](const optim::NamedTensors& p) { return make_opt(Opt::adamw, p); },
                          {.zero_stage = stage, .bucket_mb = kBucketMb});
    a.reset_peak();
    w.loss(*model, 0, g->rank() * 4, 4, 4 * g->size()).backward();
    dp.finish_backward();
    const auto after_bwd = a.stats();
    out.gradient_peak = double(after_bwd.peak_of(MemTag::gradient)) - double(before.of(MemTag::gradient));
    out.gradient = double(after_bwd.of(MemTag::gradient)) - double(before.of(MemTag::gradient));
    dp.step();
    out.optimizer_state = double(a.stats().of(MemTag::optimizer_state)) - double(before.of(MemTag::optimizer_state));
    dp.zero_grad();
  }
  return out;
}

TEST(ZeRO, OptimizerStateAndGradientBytesShrinkToOneNth) {
  auto g = W();
  const double n = g->size();
  auto w = mlp_workload(std::vector<int64_t>(kLayers + 1, 64));
  const double param_bytes = kLayers * kLayerBytes, bucket_bytes = kBucketMb * 1024 * 1024;
  const StageBytes s0 = measure(0, w), s1 = measure(1, w), s2 = measure(2, w);
  // DDP: AdamW keeps 2 f32 tensors per parameter; gradients are .grad plus DDP's flat buckets
  EXPECT_NEAR(s0.optimizer_state, 2 * param_bytes, 1);
  EXPECT_NEAR(s0.gradient, 2 * param_bytes, 1);
  // slack: 1/N * 1.25 of DDP's
  EXPECT_LE(s1.optimizer_state, s0.optimizer_state / n * 1.25);
  EXPECT_LE(s2.optimizer_state, s0.optimizer_state / n * 1.25);
  EXPECT_GT(s1.optimizer_state, 0);
  // stage 2: the persistent gradient shard is ~1/N of the full gradient (no full .grad is kept)
  EXPECT_LE(s2.gradient, param_bytes / n * 1.25);
  EXPECT_GT(s2.gradient, 0);
  // ... and during backward: the shard, two buckets in flight (packed input + received
  // segment), and the .grads of the bucket being filled — at most 4 buckets beyond the shard
  EXPECT_LE(s2.gradient_peak, param_bytes / n * 1.25 + 4 * bucket_bytes);
  EXPECT_LT(s2.gradient_peak, s0.gradient_peak);
  if (g->rank() == 0)
    std::printf("[zero] np %d bytes per rank: optimizer_state ddp %.0f s1 %.0f s2 %.0f; gradient ddp %.0f s1 %.0f s2 %.0f; "
                "gradient peak ddp %.0f s1 %.0f s2 %.0f\n",
                g->size(), s0.optimizer_state, s1.optimizer_state, s2.optimizer_state, s0.gradient, s1.gradient,
                s2.gradient, s0.gradient_peak, s1.gradient_peak, s2.gradient_peak);
}

TEST(ZeRO, BadInputIsAnErrorSayingWhatAndWhere) {
  auto g = W();
  auto model = mlp_workload().make(1);
  auto factory = [](const optim::NamedTensors& p) { return make_opt(Opt::adamw, p); };
  std::string msg = error_message([&] { dist::DataParallel(model, g, factory, {.zero_stage = 4}); });
  EXPECT_NE(msg.find("zero_stage 4"), std::string::npos) << msg;
  msg = error_message([&] { dist::DataParallel(model, g, factory, {.zero_stage = 1, .bucket_mb = 0}); });
  EXPECT_NE(msg.find("bucket_mb"), std::string::npos) << msg;
  dist::DataParallel dp(model, g, factory, {.zero_stage = 2});
  msg = error_message([&] { dp.load_full_optimizer_state({{"exp_avg.no.such.weight", zeros({2})}}, {}); });
  EXPECT_NE(msg.find("no.such.weight"), std::string::npos) << msg;
  msg = error_message([&] { dp.owner_of("nope"); });
  EXPECT_NE(msg.find("'nope'"), std::string::npos) << msg;
}

// Stage 3: parameter bytes per rank at rest ≈ 1/N of the blocks (+ the unsharded input
// and head layers), and during forward/backward at most two gathered blocks more.
TEST(ZeRO, Stage3ParameterBytesShrinkToOneNthPlusABlock) {
  auto g = W();
  const double n = g->size();
  constexpr int64_t d = 32;
  constexpr int nblocks = 8;
  auto w = block_workload(d, nblocks);
  const double block_bytes = 4 * (d * d + d) * 4.0, outside_bytes = ((5 * d + d) + (d * 3 + 3)) * 4.0;
  Allocator& a = Allocator::cpu();
  const double base = double(a.stats().of(MemTag::parameter));
  auto model = w.make(3);
  const double full = double(a.stats().of(MemTag::parameter)) - base;
  EXPECT_NEAR(full, nblocks * block_bytes + outside_bytes, 1);
  {
    dist::DataParallel dp(model, g, [](const optim::NamedTensors& p) { return make_opt(Opt::adamw, p); },
                          {.zero_stage = 3, .bucket_mb = 25});
    const double rest = double(a.stats().of(MemTag::parameter)) - base;
    a.reset_peak();
    w.loss(*model, 0, g->rank() * 4, 4, 4 * g->size()).backward();
    dp.finish_backward();
    dp.step();
    dp.zero_grad();
    const double peak = double(a.stats().peak_of(MemTag::parameter)) - base;
    const double after = double(a.stats().of(MemTag::parameter)) - base;
    const double sharded = nblocks * block_bytes / n * 1.25 + outside_bytes + 64;  // + the placeholder
    EXPECT_LE(rest, sharded);
    EXPECT_LE(after, sharded);
    EXPECT_LE(peak, sharded + 2 * block_bytes * 1.25);
    EXPECT_LT(peak, full);
    if (g->rank() == 0)
      std::printf("[zero] np %d stage 3 parameter bytes per rank: full %.0f, at rest %.0f, after a step %.0f, peak %.0f "
                  "(one block %.0f)\n", g->size(), full, rest, after, peak, block_bytes);
  }
  // destroying the DataParallel re-gathered every block
  EXPECT_NEAR(double(a.stats().of(MemTag::parameter)) - base, full, block_bytes * 0.5 + 64);
}

// Stage 3 of a GPT through shard_modules (its blocks transformer.h.<i>): per rank, after a step,
// the parameter bytes are the unsharded rest (embeddings, ln_f) + the owned block parameters,
// which is at most 1/N of the blocks + one block; names stay the 1-process ones.
TEST(ZeRO, Stage3GptParameterBytesAreOneNthPlusABlockAndNamesStay) {
  auto g = W();
  const int n = g->size(), me = g->rank();
  constexpr int kGptLayers = 8;
  auto w = gpt_workload(kGptLayers);
  Allocator& a = Allocator::cpu();
  const double base = double(a.stats().of(MemTag::parameter));
  auto model = w.make(3);
  const double full = double(a.stats().of(MemTag::parameter)) - base;
  std::vector<std::string> names;
  double block_bytes = 0, outside = 0;
  for (auto& [name, p] : model->named_parameters()) {
    names.push_back(name);
    if (name.rfind("transformer.h.0.", 0) == 0) block_bytes += double(p.nbytes());
    if (name.rfind("transformer.h.", 0) != 0) outside += double(p.nbytes());
  }
  const double blocks = full - outside;
  ASSERT_NEAR(blocks, kGptLayers * block_bytes, 1) << "the blocks are all alike";
  std::vector<std::string> state_names;
  for (auto& [name, t] : model->state_dict()) state_names.push_back(name);
  {
    dist::DataParallel dp(model, g, [](const optim::NamedTensors& p) { return make_opt(Opt::adamw, p); },
                          {.zero_stage = 3, .bucket_mb = 25, .shard_modules = w.units(*model)});
    EXPECT_EQ(dp.shard_units(), w.units(*model));
    a.reset_peak();
    w.loss(*model, 0, me * 2, 2, 2 * n).backward();
    dp.finish_backward();
    dp.step();
    dp.zero_grad();
    const double after = double(a.stats().of(MemTag::parameter)) - base;
    const double peak = double(a.stats().peak_of(MemTag::parameter)) - base;
    double owned = 0;  // this rank's block parameters, counted from the ownership map
    for (auto& [name, p] : model->named_parameters())
      if (name.rfind("transformer.h.", 0) == 0 && dp.owner_of(name) == me) owned += double(p.nbytes());
    EXPECT_NEAR(after, outside + owned, 256) << "the rest + the owned block parameters (+ the 4-byte placeholder)";
    EXPECT_LE(after, outside + blocks / n + block_bytes) << "1/N of the blocks + one block";
    EXPECT_LE(peak, outside + blocks / n + block_bytes + 2 * block_bytes * 1.25) << "+ at most two gathered blocks";
    if (n > 1) {
      EXPECT_LT(after, outside + blocks * 0.75);
    }
    // names: the model's and the gathered state dict's are the 1-process ones
    std::vector<std::string> now, gathered;
    for (auto& [name, p] : model->named_parameters()) now.push_back(name);
    for (auto& [name, t] : dp.full_state_dict()) gathered.push_back(name);
    EXPECT_EQ(now, names);
    EXPECT_EQ(gathered, state_names);
    if (me == 0)
      std::printf("[zero] np %d GPT stage 3 (shard_modules) parameter bytes per rank: full %.0f, after a step %.0f "
                  "(rest %.0f + owned %.0f), peak %.0f, one block %.0f\n", n, full, after, outside, owned, peak, block_bytes);
  }
  EXPECT_NEAR(double(a.stats().of(MemTag::parameter)) - base, full, block_bytes * 0.5 + 64);
}

namespace {
// A weight registered in two modules (tied, as a lm_head tied to an embedding).
struct SharedLinear : nn::UnaryModule {
  explicit SharedLinear(Tensor w) { weight = register_parameter("weight", w); }
  Tensor forward(const Tensor& x) override { return linear(x, weight); }
  Tensor weight;
};
struct TiedNet : nn::UnaryModule {
  TiedNet() {
    first = register_module("first", std::make_shared<nn::Linear>(4, 4));
    tied = register_module("tied", std::make_shared<SharedLinear>(first->weight));
  }
  Tensor forward(const Tensor& x) override { return tied->forward(first->run_forward(x, [this](const Tensor& in) { return first->forward(in); })); }
  std::shared_ptr<nn::Linear> first;
  std::shared_ptr<SharedLinear> tied;
};
}  // namespace

TEST(ZeRO, Stage3ShardModulesBadInputIsAnErrorSayingWhatAndWhere) {
  auto g = W();
  auto factory = [](const optim::NamedTensors& p) { return make_opt(Opt::adamw, p); };
  auto gpt = gpt_workload().make(1);
  auto with = [&](std::shared_ptr<nn::Module> m, std::vector<std::string> units, int stage = 3) {
    return error_message([&] { dist::DataParallel(m, g, factory, {.zero_stage = stage, .shard_modules = units}); });
  };
  std::string msg = with(gpt, {"transformer.h.9"});
  EXPECT_NE(msg.find("'transformer.h.9', which is not a module"), std::string::npos) << msg;
  EXPECT_NE(msg.find("transformer.h.0"), std::string::npos) << "the hint lists real paths: " << msg;
  msg = with(gpt, {"transformer.h", "transformer.h.1"});
  EXPECT_NE(msg.find("'transformer.h.1' is nested in unit 'transformer.h'"), std::string::npos) << msg;
  msg = with(gpt, {"transformer.h.0"}, 2);
  EXPECT_NE(msg.find("zero_stage is 2"), std::string::npos) << msg;
  msg = with(gpt, {"transformer.drop"});
  EXPECT_NE(msg.find("'transformer.drop' has no trainable parameter"), std::string::npos) << msg;
  msg = with(std::make_shared<TiedNet>(), {"first"});
  EXPECT_NE(msg.find("also used outside it, as 'tied.weight'"), std::string::npos) << msg;
  // a unit its container calls directly (Sequential does) is never gathered: its gradients say so
  auto seq = std::make_shared<nn::Sequential>(
      std::vector<std::shared_ptr<nn::UnaryModule>>{std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::Linear>(4, 2)});
  {
    dist::DataParallel dp(seq, g, factory, {.zero_stage = 3, .shard_modules = {"1"}});
    msg = error_message([&] { seq->forward(ones({2, 3})).sum().backward(); });
    EXPECT_NE(msg.find("sharding unit '1' received gradients, but its forward did not run through its interceptor"),
              std::string::npos) << msg;
  }
  // GPT's wte: called directly (not through run_forward) and tied to the lm_head, which reads its weight
  {
    dist::DataParallel dp(gpt, g, factory, {.zero_stage = 3, .shard_modules = {"transformer.wte"}});
    msg = error_message([&] { gpt_workload().loss(*gpt, 0, 2 * g->rank(), 2, 2 * g->size()).backward(); });
    EXPECT_NE(msg.find("'transformer.wte' received gradients, but its forward did not run through its interceptor"),
              std::string::npos) << msg;
    EXPECT_NE(msg.find("tied weights"), std::string::npos) << msg;
  }
  // a second stage-3 DataParallel on units that already have one
  dist::DataParallel first(gpt, g, factory, {.zero_stage = 3, .shard_modules = {"transformer.h.0"}});
  msg = with(gpt, {"transformer.h.0"});
  EXPECT_NE(msg.find("'transformer.h.0' already has a forward interceptor"), std::string::npos) << msg;
}

TEST(ZeRO, FullOptimizerStateEqualsTheUnshardedOne) {
  auto g = W();
  auto w = mlp_workload();
  const RunSpec s{.micro_batches = 1, .bucket_mb = 1e-3, .steps = 2};
  std::map<int, std::pair<optim::NamedTensors, std::map<std::string, double>>> by_stage;
  for (int stage : {0, 2}) {
    auto model = w.make(42);
    dist::DataParallel dp(model, g, [](const optim::NamedTensors& p) { return make_opt(Opt::adamw, p); },
                          {.zero_stage = stage, .bucket_mb = s.bucket_mb});
    for (int step = 0; step < s.steps; ++step) {
      w.loss(*model, step, g->rank() * 2, 2, 2 * g->size()).backward();
      dp.finish_backward();
      dp.step();
      dp.zero_grad();
    }
    by_stage[stage] = {dp.full_optimizer_state(), dp.full_optimizer_scalars()};
  }
  auto& [t0, c0] = by_stage[0];
  auto& [t2, c2] = by_stage[2];
  std::map<std::string, Tensor> m2(t2.begin(), t2.end());
  ASSERT_EQ(t0.size(), t2.size());
  ASSERT_EQ(t0.size(), 2 * w.make(0)->named_parameters().size());  // exp_avg and exp_avg_sq of every parameter
  for (auto& [name, t] : t0) {
    ASSERT_TRUE(m2.count(name)) << name << " missing from the gathered stage-2 state";
    EXPECT_CLOSE(m2[name], t, 1e-6, 1e-5) << name;
  }
  EXPECT_EQ(c0, c2);
}

// Sharded checkpoints (ckpt/sharded_checkpoint.h): every rank writes only its part; the
// shards and their index make exactly the full state; one rank's failed write fails the
// save on every rank, naming that rank, and commits nothing.
namespace {
std::string shared_temp_dir(dist::ProcessGroup& g, const std::string& name) {
  return dist::all_gather_strings(g, g.rank() == 0 ? fresh_temp_dir(name) : std::string())[0];
}
bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes() == b.sizes() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}
}  // namespace

TEST(ZeRO, ShardedCheckpointEachRankWritesItsPartAndTheShardsMakeTheFullState) {
  auto g = W();
  const int n = g->size(), me = g->rank();
  constexpr int kEqualLayers = 8;  // 8 equal 32x32 layers: ownership balances exactly over 2 and 4 ranks
  auto w = mlp_workload(std::vector<int64_t>(kEqualLayers + 1, 32));
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto model = w.make(42);
    dist::DataParallel dp(model, g, [](const optim::NamedTensors& p) { return make_opt(Opt::adamw, p); },
                          {.zero_stage = stage, .bucket_mb = 1e-3, .shard_modules = stage == 3 ? w.units(*model) : std::vector<std::string>{}});
    for (int step = 0; step < 2; ++step) {
      w.loss(*model, step, me * 2, 2, 2 * n).backward();
      dp.finish_backward();
      dp.step();
      dp.zero_grad();
    }
    const std::string dir = shared_temp_dir(*g, "zero_sharded_ckpt");
    const std::string p = ckpt::save_sharded_checkpoint(*g, dir, 2, {{"model", dp.local_state_dict(), {}}, {"optimizer", dp.local_optimizer_state(), {}}},
                                                        {{"state.json", "{}\n"}});
    ckpt::verify_checkpoint_across(*g, p);
    const ckpt::Manifest m = ckpt::read_manifest(p);
    EXPECT_EQ(m.files.size(), static_cast<std::size_t>(2 * n + 3));  // n shards of each, 2 indexes, state.json
    // Optimizer state: each rank's shard holds ~1/N of it (the layers are equal).
    uint64_t total = 0, largest = 0;
    for (int r = 0; r < n; ++r) {
      uint64_t bytes = 0;
      for (auto& [name, t] : ckpt::load_safetensors(p + "/" + ckpt::shard_file_name("optimizer", r, n)).tensors) bytes += t.nbytes();
      total += bytes;
      largest = std::max(largest, bytes);
    }
    EXPECT_GT(total, 0u);
    EXPECT_LE(static_cast<double>(largest), 1.25 * static_cast<double>(total) / n) << "an optimizer shard is not ~1/N";
    // The merged shards are exactly the gathered full state.
    auto merged_model = ckpt::load_checkpoint_tensors(p, "model").tensors;
    auto merged_optim = ckpt::load_checkpoint_tensors(p, "optimizer").tensors;
    const auto full_model = dp.full_state_dict();
    const auto full_optim = dp.full_optimizer_state();
    std::map<std::string, Tensor> mm(merged_model.begin(), merged_model.end()), mo(merged_optim.begin(), merged_optim.end());
    ASSERT_EQ(mm.size(), full_model.size());
    ASSERT_EQ(mo.size(), full_optim.size());
    for (auto& [name, t] : full_model) EXPECT_TRUE(mm.count(name) && same_bytes(mm[name], t)) << name;
    for (auto& [name, t] : full_optim) EXPECT_TRUE(mo.count(name) && same_bytes(mo[name], t)) << name;
    // The last rank cannot write its shard: every rank fails naming it, step 3 is not committed.
    const std::string bad_prefix = me == n - 1 ? "no_such_dir/model" : "model";
    const std::string msg = error_message([&] {
      ckpt::save_sharded_checkpoint(*g, dir, 3, {{bad_prefix, dp.local_state_dict(), {}}}, {{"state.json", "{}\n"}});
    });
    EXPECT_NE(msg.find("rank " + std::to_string(n - 1) + ": "), std::string::npos) << msg;
    EXPECT_EQ(ckpt::read_latest(dir), "step-000002");
    EXPECT_FALSE(std::filesystem::exists(dir + "/step-000003"));
    g->barrier();
  }
}

// ---------------------------------------------------------------------------
// Resharding scenario (driven by tests/dist/zero_reshard.cmake).
namespace {

constexpr int kReshardSteps = 6, kSaveAfter = 3;
constexpr int64_t kGlobalRows = 8;  // divisible by 1, 2 and 4 ranks

std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// skip_optimizer: resume the weights only (the negative control: must NOT match the reference).
int reshard(const std::string& dir, const std::string& phase, int stage, bool skip_optimizer) {
  auto g = W();
  const int n = g->size(), r = g->rank();
  auto w = block_workload();  // has FullyShardedBlocks, so it runs at every stage
  auto model = w.make(42);
  dist::DataParallel dp(model, g, [](const optim::NamedTensors& p) { return make_opt(Opt::adamw, p); },
                        {.zero_stage = stage, .bucket_mb = 1e-3});
  int first = 0;
  if (phase != "save") {  // the sharded checkpoint of the 4-rank run: each rank reads what it keeps
    const std::string ck = dir + "/checkpoints/" + ckpt::step_dir_name(kSaveAfter);
    ckpt::verify_checkpoint_across(*g, ck);
    auto m = ckpt::load_checkpoint_tensors(ck, "model");
    dp.load_full_state_dict(m.tensors);
    auto o = ckpt::load_checkpoint_tensors(ck, "optimizer");
    std::map<std::string, double> scalars;
    for (auto& [k, v] : o.metadata)
      if (k != "format") scalars[k] = std::stod(v);
    if (!skip_optimizer) dp.load_full_optimizer_state(o.tensors, scalars);
    first = kSaveAfter;
  }
  const int64_t rows = kGlobalRows / n;
  for (int step = first; step < kReshardSteps; ++step) {
    w.loss(*model, step, r * rows, rows, kGlobalRows).backward();
    dp.finish_backward();
    dp.clip_grad_norm(0.05);
    dp.step();
    dp.zero_grad();
    if (phase == "save" && step + 1 == kSaveAfter) {  // each rank writes its part (sharded checkpoint)
      std::map<std::string, std::string> meta;
      for (auto& [k, v] : dp.full_optimizer_scalars()) meta[k] = fmt(v);
      meta["format"] = "test";
      ckpt::save_sharded_checkpoint(*g, dir + "/checkpoints", kSaveAfter,
                                    {{"model", dp.local_state_dict(), {}}, {"optimizer", dp.local_optimizer_state(), meta}}, {});
    }
  }
  if (phase == "save") {
    if (r == 0) ckpt::save_safetensors(dir + "/reference.safetensors", dp.full_state_dict());
    g->barrier();
    return 0;
  }
  auto ref = ckpt::load_safetensors(dir + "/reference.safetensors");
  const double d = max_abs_diff(dp.full_state_dict(), ref.tensors);
  if (r == 0) std::printf("[zero] resumed on %d rank(s) at stage %d: max|w - w_uninterrupted| = %.3g\n", n, stage, d);
  return d <= kTol ? 0 : 1;
}

}  // namespace
}  // namespace athanor

int main(int argc, char** argv) {
  athanor::dist::init_from_mpi(&argc, &argv);
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--reshard=", 10) == 0) {
      // --reshard=DIR,save  or  --reshard=DIR,resume,STAGE
      std::stringstream ss(argv[i] + 10);
      std::string dir, phase, stage = "2";
      std::getline(ss, dir, ',');
      std::getline(ss, phase, ',');
      std::getline(ss, stage, ',');
      int rc = 1;
      try {
        const bool weights_only = phase == "resume_weights_only";
        rc = athanor::reshard(dir, weights_only ? "resume" : phase, std::stoi(stage), weights_only);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
      }
      athanor::dist::finalize();
      return rc;
    }
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  athanor::dist::finalize();
  return rc;
}
