// The Llama under tensor and pipeline parallelism: run under `mpirun --oversubscribe -np 2|4`
// (tests/CMakeLists.txt). The reference is one process's nn::Llama built in every rank from the
// same seed: its loss and every gradient in f64 (1e-10, as the GPT's tests), AdamW steps in f32
// (the trainer tests' tolerances), its initial weights and generated tokens exactly.
// Configs: n_head 4 with n_kv_head 2 (GQA), 4 (MHA) and 1 (MQA: the kv head replicated on
// every tp rank); vocabulary 67, padded to 256 at tp 2 and 512 at tp 4.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/rng.h"
#include "athanor/dist/device_mesh.h"
#include "athanor/dist/pipeline_executor.h"
#include "athanor/dist/pipeline_llama.h"
#include "athanor/dist/pipeline_schedule.h"
#include "athanor/dist/tensor_parallel_llama.h"
#include "athanor/dist/zero.h"
#include "athanor/nn/llama.h"
#include "athanor/ops.h"
#include "athanor/optim/clip.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
using dist::GroupPtr;
using dist::ScheduleKind;

namespace {

nn::LlamaConfig tiny_llama(int64_t n_kv_head, bool tied = false, double dropout = 0.0, bool ckpt = false, int64_t n_layer = 2) {
  return nn::LlamaConfig{.vocab_size = 67, .n_layer = n_layer, .n_head = 4, .n_kv_head = n_kv_head, .n_embd = 32,
                         .intermediate_size = 48, .block_size = 16, .tie_embeddings = tied, .dropout = dropout,
                         .gradient_checkpointing = ckpt};
}

std::string describe(const nn::LlamaConfig& c) {
  return "n_kv_head " + std::to_string(c.n_kv_head) + (c.tie_embeddings ? " tied" : "") + (c.dropout > 0 ? " dropout" : "") +
         (c.gradient_checkpointing ? " checkpointing" : "");
}

Tensor random_ids(int64_t B, int64_t T, uint64_t seed) {
  Generator g(seed);
  return randint(0, 67, {B, T}, g);
}

const dist::DeviceMesh& tp_mesh() {  // dp 1 x tp world
  static const dist::DeviceMesh mesh = dist::DeviceMesh::from_sizes(dist::world_size());
  return mesh;
}
const dist::DeviceMesh& pp_mesh() {  // dp 1 x tp 1 x pp world
  static const dist::DeviceMesh mesh = dist::DeviceMesh::from_sizes(1, dist::world_size());
  return mesh;
}

// Every parameter's gradient, gathered to its logical shape, against the 1-process one.
void expect_same_grads(nn::Module& m, const dist::ShardSpecs& specs, const GroupPtr& tp, nn::Llama& ref, double tol) {
  std::map<std::string, Tensor> want;
  for (auto& [n, p] : ref.named_parameters()) want[n] = p.grad();
  int checked = 0;
  for (auto& [n, p] : m.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << n;
    ASSERT_TRUE(want.count(n)) << n;
    const dist::ShardSpec s = dist::spec_of(specs, n);
    EXPECT_TRUE(all_close(dist::gather_shards(p.grad(), s, *tp), want[n], tol, tol)) << n << " (" << s.describe() << ")";
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

std::unique_ptr<dist::DataParallel> wrap(const std::shared_ptr<dist::TensorParallelLlama>& m, const dist::DeviceMesh& mesh,
                                         int stage = 0, double lr = 1e-3) {
  dist::DataParallelOptions o;
  o.zero_stage = stage;
  o.tp_group = mesh.tp();
  o.tp_specs = m->shard_specs();
  if (stage == 3) o.shard_modules = m->shard_units();
  return std::make_unique<dist::DataParallel>(
      m, mesh.dp(), [lr](const optim::NamedTensors& owned) { return optim::make_adamw(optim::default_param_groups(owned, lr, 0.1)); },
      o);
}

}  // namespace

// ---- tensor parallelism

TEST(LlamaTensorParallel, InitialisationEqualsOneProcess) {
  for (int64_t kv : {2, 1})
    for (bool tied : {false, true}) {
      const nn::LlamaConfig c = tiny_llama(kv, tied);
      SCOPED_TRACE(describe(c));
      manual_seed(31);
      nn::Llama ref(c);
      const GeneratorState after_ref = default_generator().state();
      manual_seed(31);
      dist::TensorParallelLlama tp(c, tp_mesh().tp(), {});
      EXPECT_EQ(default_generator().state(), after_ref);  // the generator advanced as in one process
      const nn::StateDict got = tp.logical_state_dict(), want = ref.state_dict();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got[i].first, want[i].first);
        EXPECT_TRUE(all_close(got[i].second, want[i].second, 0, 0)) << want[i].first;
      }
      EXPECT_EQ(tp.logical_parameters_count(), ref.parameters_count());
      EXPECT_DOUBLE_EQ(tp.flops_per_token(16), ref.flops_per_token(16));
      // And back: another model loads the logical state, each rank its shard.
      manual_seed(99);
      dist::TensorParallelLlama other(c, tp_mesh().tp(), {});
      other.load_logical_state_dict(want);
      const nn::StateDict again = other.logical_state_dict();
      for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(all_close(again[i].second, want[i].second, 0, 0)) << want[i].first;
    }
  // q_proj is split by query heads and k_proj by kv heads (GQA), or k_proj replicated (MQA).
  dist::TensorParallelLlama gqa(tiny_llama(2), tp_mesh().tp(), {}), mqa(tiny_llama(1), tp_mesh().tp(), {});
  const int t = tp_mesh().tp_size();
  const std::string k = "model.layers.0.self_attn.k_proj.weight";
  const dist::ShardSpec q = dist::spec_of(gqa.shard_specs(), "model.layers.0.self_attn.q_proj.weight");
  EXPECT_TRUE(q.dim == 0 && q.parts == 1 && q.logical == 32 && q.padded == 32 && q.count == t) << q.describe();
  EXPECT_EQ(dist::spec_of(mqa.shard_specs(), k).sharded(), false);
  EXPECT_TRUE(dist::spec_of(mqa.shard_specs(), k).sum_grad_over_tp);
  EXPECT_EQ(dist::spec_of(gqa.shard_specs(), k).sharded(), t <= 2);  // tp 4 > 2 kv heads: replicated
}

TEST(LlamaTensorParallel, LossAndEveryGradientEqualOneProcessF64) {
  const int64_t B = 3, T = 16;
  struct Case {
    nn::LlamaConfig c;
    bool sp, regather;
  };
  std::vector<Case> cases;
  for (int64_t kv : {2, 4, 1})
    for (bool sp : {false, true}) cases.push_back({tiny_llama(kv), sp, true});
  cases.push_back({tiny_llama(2, /*tied=*/true), true, false});
  cases.push_back({tiny_llama(2, false, 0.0, /*ckpt=*/true), true, true});
  cases.push_back({tiny_llama(1, true, /*dropout=*/0.1, true), false, true});
  cases.push_back({tiny_llama(2, false, /*dropout=*/0.1), true, true});
  for (const Case& k : cases) {
    SCOPED_TRACE(describe(k.c) + " sequence_parallel " + std::to_string(k.sp) + " regather " + std::to_string(k.regather));
    manual_seed(31);
    nn::Llama ref(k.c);
    manual_seed(31);
    auto tp = std::make_shared<dist::TensorParallelLlama>(k.c, tp_mesh().tp(), dist::TensorParallelOptions{.sequence_parallel = k.sp, .regather = k.regather});
    ref.to(DType::f64);
    tp->to(DType::f64);
    auto dp = wrap(tp, tp_mesh());  // the reduction a run does: sums the partial replicated gradients over tp
    Tensor ids = random_ids(B, T, 100), tgt = random_ids(B, T, 101);
    manual_seed(1234);  // dropout: the masks are one process's
    Tensor l_ref = ref.loss(ids, tgt);
    l_ref.backward();
    manual_seed(1234);
    Tensor l = tp->loss(ids, tgt);
    EXPECT_NEAR(l.item(), l_ref.item(), 1e-10 * std::fabs(l_ref.item()));
    l.backward();
    dp->finish_backward();
    expect_same_grads(*tp, tp->shard_specs(), tp->tp(), ref, 1e-10);
    EXPECT_NEAR(dp->grad_norm(), optim::grad_norm(ref.parameters()), 1e-10);  // each shard and replica counted once
  }
}

TEST(LlamaTensorParallel, AdamWStepsWithDataParallelAndZeroEqualOneProcessF32) {
  // tp 2 x dp (world / 2): 4 AdamW steps with clipping at ZeRO 0, 1, 3, f32 as a run trains;
  // GQA, MHA and MQA (its replicated kv projections' partial gradients summed over tp); the
  // tolerances of the trainer tests (tests/dist/tp_trainer.cmake).
  auto mesh = dist::DeviceMesh::from_sizes(2);
  const int dp = mesh.dp_size();
  const int64_t B = 4, T = 16;
  for (int64_t kv : {2, 4, 1})
    for (int stage : {0, 1, 3}) {
      if (kv == 1 && stage != 3) continue;  // MQA's gradients at stage 0: LossAndEveryGradientEqualOneProcessF64
      const nn::LlamaConfig c = tiny_llama(kv);
      SCOPED_TRACE(describe(c) + " zero_stage " + std::to_string(stage));
      manual_seed(31);
      nn::Llama ref(c);
      manual_seed(31);
      auto tp = std::make_shared<dist::TensorParallelLlama>(c, mesh.tp(), dist::TensorParallelOptions{.sequence_parallel = stage == 3});
      auto ref_opt = optim::make_adamw(optim::default_param_groups(ref.named_parameters(), 1e-2, 0.1));
      auto d = wrap(tp, mesh, stage, 1e-2);
      for (int step = 0; step < 4; ++step) {
        Tensor ids = random_ids(B, T, 200 + step), tgt = random_ids(B, T, 300 + step);
        Tensor l_ref = ref.loss(ids, tgt);
        l_ref.backward();
        optim::clip_grad_norm(ref.parameters(), 0.5);
        ref_opt->step();
        ref_opt->zero_grad();
        const int64_t rows = B / dp, r0 = mesh.dp_index() * rows;
        Tensor l = tp->loss(narrow(ids, 0, r0, rows).contiguous(), narrow(tgt, 0, r0, rows).contiguous());
        l.backward();
        d->finish_backward();
        d->clip_grad_norm(0.5);
        d->step();
        d->zero_grad();
        Tensor mean = from_vector(std::vector<double>{l.item()}, {1}, TensorOptions(DType::f64));
        mesh.dp()->all_reduce(mean);  // equal micro-batch sizes: the mean of the dp ranks' means
        EXPECT_NEAR(mean.item() / dp, l_ref.item(), 1e-5 * std::fabs(l_ref.item())) << "step " << step;
      }
      std::map<std::string, Tensor> want;
      for (auto& [name, t] : ref.state_dict()) want[name] = t;
      for (auto& [name, t] : d->full_state_dict())
        EXPECT_TRUE(all_close(dist::gather_shards(t, dist::spec_of(tp->shard_specs(), name), *mesh.tp()), want.at(name), 1e-4, 2e-5))
            << name;
    }
}

TEST(LlamaTensorParallel, GeneratesTheOneProcessTokens) {
  const nn::LlamaConfig c = tiny_llama(2);
  manual_seed(31);
  nn::Llama ref(c);
  manual_seed(31);
  dist::TensorParallelLlama tp(c, tp_mesh().tp(), {.sequence_parallel = true});
  Generator g1(5), g2(5);
  EXPECT_EQ(tp.generate({1, 2, 3}, 20, 1.0, 0, g2), ref.generate({1, 2, 3}, 20, 1.0, 0, g1));  // 23 tokens: past block_size
}

TEST(LlamaTensorParallel, ShapesTheRanksCannotSplitAreClearErrors) {
  const int t = tp_mesh().tp_size();
  const std::string ts = std::to_string(t);
  // 3 kv heads over 2 or 4 ranks: neither divides the other.
  nn::LlamaConfig c = tiny_llama(3);
  c.n_head = 3 * t;
  c.n_embd = 4 * c.n_head;
  std::string msg = error_message([&] { dist::TensorParallelLlama m(c, tp_mesh().tp(), {}); });
  EXPECT_NE(msg.find("model.n_kv_head (3) and dist.tp (" + ts + ") do not divide one another"), std::string::npos) << msg;
  EXPECT_NE(msg.find("multi-query attention"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
  c = tiny_llama(2);
  c.n_head = 2;
  c.n_kv_head = 1;
  if (t > 2) {
    msg = error_message([&] { dist::TensorParallelLlama m(c, tp_mesh().tp(), {}); });
    EXPECT_NE(msg.find("model.n_head (2) is not divisible by dist.tp (" + ts + ")"), std::string::npos) << msg;
  }
  c = tiny_llama(2);
  c.intermediate_size = 4 * t + 1;
  msg = error_message([&] { dist::TensorParallelLlama m(c, tp_mesh().tp(), {}); });
  EXPECT_NE(msg.find("model.intermediate_size (" + std::to_string(4 * t + 1) + ") is not divisible by dist.tp (" + ts + ")"),
            std::string::npos) << msg;
  c = tiny_llama(2);
  c.vocab_size = 4 * t + 1;
  msg = error_message([&] { dist::TensorParallelLlama m(c, tp_mesh().tp(), {.vocab_pad_multiple = 1}); });
  EXPECT_NE(msg.find("the vocabulary of " + std::to_string(4 * t + 1) + " tokens is not divisible by tp = " + ts), std::string::npos)
      << msg;
  c = tiny_llama(2);
  c.block_size = 4 * t + 1;
  msg = error_message([&] { dist::TensorParallelLlama m(c, tp_mesh().tp(), {.sequence_parallel = true}); });
  EXPECT_NE(msg.find("model.block_size (" + std::to_string(4 * t + 1) + ") must be divisible by dist.tp"), std::string::npos) << msg;
  c = tiny_llama(2);
  c.n_kv_head = 3;  // the Llama's own check comes first
  msg = error_message([&] { dist::PipelineLlama m(c, dist::PipelineLayout(2, 1), 0, tp_mesh().tp(), {}); });
  EXPECT_NE(msg.find("n_kv_head (3) must divide n_head (4)"), std::string::npos) << msg;
}

// ---- pipeline parallelism (and tp x pp)

namespace {

struct MicroBatch {
  Tensor ids, targets;
  double weight = 0;  // n_k / N: the token-weighted mean over the step
};

std::vector<MicroBatch> batches(int m, int64_t B, int64_t T, uint64_t seed) {
  std::vector<MicroBatch> out;
  int64_t total = 0;
  Generator g(seed);
  for (int k = 0; k < m; ++k) {
    MicroBatch b{randint(0, 67, {B, T}, g), randint(0, 67, {B, T}, g), 0};
    int64_t* t = b.targets.data_ptr<int64_t>();
    for (int64_t i = 0; i < k % 3; ++i) t[i] = -100;  // some targets ignored: the weights differ
    int64_t n = 0;
    for (int64_t i = 0; i < B * T; ++i) n += t[i] != -100;
    b.weight = static_cast<double>(n);
    total += n;
    out.push_back(b);
  }
  for (auto& b : out) b.weight /= static_cast<double>(total);
  return out;
}

double reference(nn::Llama& ref, const std::vector<MicroBatch>& mbs) {
  double loss = 0;
  for (const auto& b : mbs) {
    Tensor l = ref.loss(b.ids, b.targets);
    loss += l.item() * b.weight;
    mul(l, b.weight).backward();
  }
  return loss;
}

// One step of the schedule over the micro-batches: the weighted loss on the last stage (0 elsewhere).
double run_pipeline(dist::PipelineLM& model, const GroupPtr& pp, ScheduleKind k, const std::vector<MicroBatch>& mbs) {
  const int m = static_cast<int>(mbs.size());
  dist::PipelineExecutor ex(pp, k, m, model.layout().virtual_stages());
  std::vector<GeneratorState> rng;  // each micro-batch's forward starts where one process's would (dropout)
  GeneratorState at = default_generator().state();
  for (const auto& b : mbs) {
    rng.push_back(at);
    at.offset += model.dropout_blocks(b.ids.size(0), b.ids.size(1));
  }
  double loss = 0;
  dist::PipelineCallbacks cb;
  cb.activation_dtype = model.parameters().front().dtype();
  cb.activation_shape = [&](int mb) { return model.activation_shape(mbs[mb].ids.size(0), mbs[mb].ids.size(1)); };
  cb.weights = model.parameters();
  cb.forward = [&](int chunk, int mb, const Tensor& input) {
    Tensor out = model.forward_chunk(chunk, {input, mbs[mb].ids, mbs[mb].targets, &rng[mb]});
    if (!model.chunk(chunk).head) return out;
    loss += out.item() * mbs[mb].weight;
    return mul(out, mbs[mb].weight);
  };
  ex.run(cb);
  default_generator().set_state(at);
  model.sum_tied_gradients();
  return loss;
}

// The schedule's step against one process's: loss, every gradient (tp shards gathered, the
// partial replicated gradients summed over tp first, as DataParallel does), the generator.
void equal_to_one_process(const dist::DeviceMesh& mesh, const GroupPtr& eg, ScheduleKind k, int m, int v, const nn::LlamaConfig& c,
                          bool sp = false) {
  SCOPED_TRACE(std::string(dist::schedule_name(k)) + " pp " + std::to_string(mesh.pp_size()) + " tp " + std::to_string(mesh.tp_size()) +
               " m " + std::to_string(m) + " v " + std::to_string(v) + " " + describe(c) + (sp ? " sequence parallel" : ""));
  const auto mbs = batches(m, 2, 8, 100 + m);
  manual_seed(31);
  nn::Llama ref(c);
  ref.to(DType::f64);
  const double want = reference(ref, mbs);
  const GeneratorState after_ref = default_generator().state();
  manual_seed(31);
  dist::PipelineLlama model(c, dist::PipelineLayout(c.n_layer, mesh.pp_size(), v), mesh.pp_index(), mesh.tp(),
                            {.sequence_parallel = sp}, eg);
  model.to(DType::f64);
  const double loss = run_pipeline(model, mesh.pp(), k, mbs);
  EXPECT_EQ(default_generator().state(), after_ref) << "the generator ends the step where one process's does";
  if (model.holds_head()) {
    EXPECT_NEAR(loss, want, 1e-10 * std::fabs(want));
  }
  for (auto& [n, p] : model.named_parameters())
    if (dist::spec_of(model.shard_specs(), n).sum_grad_over_tp) mesh.tp()->all_reduce(p.grad());
  expect_same_grads(model, model.shard_specs(), model.tp(), ref, 1e-10);
}

const GroupPtr& pp_embedding_group() {
  static const GroupPtr g = dist::make_embedding_group(pp_mesh());
  return g;
}

}  // namespace

TEST(LlamaPipeline, EverySchedulesGradientsEqualOneProcessInF64) {
  const int p = dist::world_size();
  for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved, ScheduleKind::zero_bubble}) {
    const int v = k == ScheduleKind::interleaved ? 2 : 1;
    if (k == ScheduleKind::interleaved && p != 2) continue;  // interleaved: pp 2 x v 2 (np 2)
    equal_to_one_process(pp_mesh(), pp_embedding_group(), k, 4, v, tiny_llama(2, false, 0.0, false, 4));
  }
  // MHA with the tied embedding (its two copies' gradients summed), dropout and checkpointing.
  equal_to_one_process(pp_mesh(), pp_embedding_group(), ScheduleKind::one_f_one_b, 4, 1, tiny_llama(4, true, 0.1, true, 4));
}

TEST(LlamaPipeline, EverySchedulesAdamWStepsEqualOneProcessF32) {
  // 4 AdamW steps (f32, as a run trains) through each schedule at pp = world, the tied
  // embedding's two copies kept equal by the summed gradient; the trainer tests' tolerances.
  const int p = dist::world_size();
  const nn::LlamaConfig c = tiny_llama(2, /*tied=*/true, 0.0, false, 4);
  for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved, ScheduleKind::zero_bubble}) {
    const int v = k == ScheduleKind::interleaved ? 2 : 1;
    if (k == ScheduleKind::interleaved && p != 2) continue;
    SCOPED_TRACE(dist::schedule_name(k));
    manual_seed(31);
    nn::Llama ref(c);
    manual_seed(31);
    dist::PipelineLlama model(c, dist::PipelineLayout(4, p, v), pp_mesh().pp_index(), pp_mesh().tp(), {.vocab_pad_multiple = 1},
                              pp_embedding_group());
    auto ref_opt = optim::make_adamw(optim::default_param_groups(ref.named_parameters(), 1e-2, 0.1));
    auto opt = optim::make_adamw(optim::default_param_groups(model.named_parameters(), 1e-2, 0.1));
    for (int step = 0; step < 4; ++step) {
      const auto mbs = batches(4, 2, 8, 500 + step);
      const double want = reference(ref, mbs);
      ref_opt->step();
      ref_opt->zero_grad();
      Tensor loss = from_vector(std::vector<double>{run_pipeline(model, pp_mesh().pp(), k, mbs)}, {1}, TensorOptions(DType::f64));
      pp_mesh().pp()->broadcast(loss, p - 1);
      EXPECT_NEAR(loss.item(), want, 1e-5 * std::fabs(want)) << "step " << step;
      opt->step();
      opt->zero_grad();
    }
    std::map<std::string, Tensor> want;
    for (auto& [n, t] : ref.named_parameters()) want[n] = t;
    for (auto& [n, t] : model.named_parameters()) EXPECT_TRUE(all_close(t, want.at(n), 1e-4, 2e-5)) << n;
  }
}

TEST(LlamaPipeline, StagesHoldTheirLayersAndTheTiedEmbedding) {
  const int p = dist::world_size(), r = pp_mesh().pp_index();
  for (bool tied : {false, true}) {
    const nn::LlamaConfig c = tiny_llama(2, tied, 0.0, false, 4);
    manual_seed(31);
    nn::Llama ref(c);
    const GeneratorState after_ref = default_generator().state();
    manual_seed(31);
    // tp 1: no vocabulary padding (as the trainer builds it), so every tensor is one process's.
    dist::PipelineLlama model(c, dist::PipelineLayout(4, p), r, pp_mesh().tp(), {.vocab_pad_multiple = 1}, pp_embedding_group());
    EXPECT_EQ(default_generator().state(), after_ref);
    std::map<std::string, Tensor> want;
    for (auto& [n, t] : ref.named_parameters()) want[n] = t;
    std::set<std::string> names;
    for (auto& [n, t] : model.named_parameters()) {
      names.insert(n);
      EXPECT_TRUE(all_close(t, want.at(n), 0, 0)) << n;  // one process's initial value
    }
    EXPECT_EQ(names.count("model.embed_tokens.weight"), r == 0 || (tied && r == p - 1) ? 1u : 0u) << tied;
    EXPECT_EQ(names.count("model.norm.weight"), r == p - 1 ? 1u : 0u);
    EXPECT_EQ(names.count("lm_head.weight"), !tied && r == p - 1 ? 1u : 0u);
    EXPECT_EQ(names.count("model.layers." + std::to_string(4 / p * r) + ".self_attn.q_proj.weight"), 1u);
    EXPECT_EQ(model.duplicate_parameters().size(), tied && r == p - 1 ? 1u : 0u);
    EXPECT_EQ(model.logical_parameters_count(), ref.parameters_count());
    // The stages' FLOPs add up to one process's.
    Tensor f = from_vector(std::vector<double>{model.flops_per_token(8)}, {1}, TensorOptions(DType::f64));
    pp_mesh().pp()->all_reduce(f);
    EXPECT_NEAR(f.item(), ref.flops_per_token(8), 1e-9 * ref.flops_per_token(8));
  }
}

TEST(LlamaPipeline, TensorAndPipelineParallelTogetherEqualOneProcess) {
  if (dist::world_size() != 4) GTEST_SKIP() << "tp 2 x pp 2 needs 4 ranks";
  static const dist::DeviceMesh mesh = dist::DeviceMesh::from_sizes(2, 2);
  static const GroupPtr eg = dist::make_embedding_group(mesh);
  // GQA split by kv group; MQA's replicated kv head; MHA with the tied embedding split over tp
  // and shared by the first and the last stage (dropout masks: one process's).
  equal_to_one_process(mesh, eg, ScheduleKind::one_f_one_b, 4, 1, tiny_llama(2, false, 0.1, false, 4), false);
  equal_to_one_process(mesh, eg, ScheduleKind::one_f_one_b, 4, 1, tiny_llama(1, false, 0.1, false, 4), true);
  equal_to_one_process(mesh, eg, ScheduleKind::zero_bubble, 4, 1, tiny_llama(4, true, 0.1, true, 4), true);
}

}  // namespace athanor

int main(int argc, char** argv) {
  athanor::dist::init_from_mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  athanor::dist::finalize();
  return rc;
}
