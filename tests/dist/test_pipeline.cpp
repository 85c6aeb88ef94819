// Pipeline parallelism: run under `mpirun --oversubscribe -np 2|4` (tests/CMakeLists.txt).
// Unless a test builds another mesh, the pp group is the whole world (pp = 2 or 4).
//  - the schedules as data: every micro-batch's forward and backward once, in order, and the
//    lists of every rank run without a deadlock (simulate), with the theory's bubble;
//  - the real thing: every schedule at pp = world, m = 4 and 8 (interleaved at v = 2): the loss
//    and every parameter's gradient equal one process (nn::GPT) in f64 to 1e-10; dropout and
//    gradient checkpointing too; tp 2 x pp 2; the tied embedding's two copies;
//  - memory: stage 0's peak activation bytes per schedule, ordered as the theory says;
//  - errors before any work.
// Scenarios for expect_abort.cmake (not gtest):
//   test_pipeline --scenario=hang   the last stage stops before its forward of micro-batch 2:
//                                   the stage waiting for it times out, naming stage, micro-batch, peer
//   test_pipeline --scenario=die    the last stage kills itself there: every rank ends
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <map>
#include <set>

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/allocator.h"
#include "athanor/core/rng.h"
#include "athanor/dist/device_mesh.h"
#include "athanor/dist/pipeline_executor.h"
#include "athanor/dist/pipeline_gpt.h"
#include "athanor/dist/pipeline_schedule.h"
#include "athanor/nn/gpt.h"
#include "athanor/ops.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
using dist::ActionKind;
using dist::ScheduleKind;

namespace {

const std::vector<ScheduleKind> kAll = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                                        ScheduleKind::zero_bubble};

// ---- the schedules as data

// Every (mb, chunk) is forwarded once and backwarded once (or input + weight once each), the
// backward after the forward, the weight pass after the input pass; receives before their
// compute action, sends after.
void check_lists(ScheduleKind k, int p, int m, int v) {
  const auto lists = dist::make_schedules(k, p, m, v);
  for (int r = 0; r < p; ++r) {
    std::map<std::tuple<int, int, int>, int> at;  // (kind, mb, chunk) -> position
    for (std::size_t i = 0; i < lists[r].size(); ++i) {
      const auto& a = lists[r][i];
      const auto key = std::make_tuple(static_cast<int>(a.kind), a.mb, a.chunk);
      ASSERT_EQ(at.count(key), 0u) << dist::to_string(a) << " twice on rank " << r;
      at[key] = static_cast<int>(i);
    }
    const bool split = k == ScheduleKind::zero_bubble;
    for (int c = 0; c < v; ++c)
      for (int mb = 0; mb < m; ++mb) {
        auto pos = [&](ActionKind kind) {
          auto it = at.find({static_cast<int>(kind), mb, c});
          return it == at.end() ? -1 : it->second;
        };
        const int f = pos(ActionKind::forward), b = pos(split ? ActionKind::backward_input : ActionKind::backward);
        ASSERT_GE(f, 0) << "no forward of " << mb << "." << c;
        ASSERT_GT(b, f) << "backward of " << mb << "." << c << " missing or before its forward";
        if (split) {
          EXPECT_GT(pos(ActionKind::backward_weight), b);
        }
        else EXPECT_EQ(pos(ActionKind::backward_weight), -1);
        const int s = c * p + r;
        if (s > 0) {
          EXPECT_EQ(pos(ActionKind::recv_activation), f - 1);
        }
        if (s < p * v - 1) {
          EXPECT_EQ(pos(ActionKind::send_activation), f + 1);
        }
        if (s < p * v - 1) {
          EXPECT_EQ(pos(ActionKind::recv_grad), b - 1);
        }
        if (s > 0) {
          EXPECT_EQ(pos(ActionKind::send_grad), b + 1);
        }
      }
  }
}

}  // namespace

TEST(PipelineSchedule, EveryMicroBatchOnceInOrderAndNoDeadlock) {
  for (ScheduleKind k : kAll)
    for (int p = 1; p <= 5; ++p)
      for (int m = 1; m <= 12; ++m)
        for (int v : {1, 2, 3}) {
          if (k != ScheduleKind::interleaved && v > 1) continue;
          if (k == ScheduleKind::interleaved && m % p) continue;
          SCOPED_TRACE(std::string(dist::schedule_name(k)) + " p " + std::to_string(p) + " m " + std::to_string(m) + " v " +
                       std::to_string(v));
          check_lists(k, p, m, v);
          const auto sim = dist::simulate(dist::make_schedules(k, p, m, v), p, v);
          ASSERT_FALSE(sim.deadlock) << sim.stuck;
        }
}

TEST(PipelineSchedule, SimulatedBubbleIsTheTheorys) {
  // Equal stages, a backward twice a forward: GPipe and 1F1B (p-1)/(m+p-1), interleaved
  // (p-1)/(vm+p-1); ZB-H1 below 1F1B at the same m.
  const dist::SimulationCosts costs{1.0, 1.0, 1.0};
  for (int p : {2, 4})
    for (int m : {4, 8, 16}) {
      for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b}) {
        const auto sim = dist::simulate(dist::make_schedules(k, p, m), p, 1, costs);
        EXPECT_NEAR(sim.bubble(), dist::theoretical_bubble(k, p, m), 1e-12) << dist::schedule_name(k) << " p " << p << " m " << m;
        EXPECT_NEAR(sim.bubble(), (p - 1.0) / (m + p - 1.0), 1e-12);
      }
      const auto inter = dist::simulate(dist::make_schedules(ScheduleKind::interleaved, p, m, 2), p, 2, costs);
      EXPECT_NEAR(inter.bubble(), (p - 1.0) / (2.0 * m + p - 1.0), 1e-12) << "interleaved p " << p << " m " << m;
      const double zb = dist::simulate(dist::make_schedules(ScheduleKind::zero_bubble, p, m), p, 1, costs).bubble();
      EXPECT_LT(zb, (p - 1.0) / (m + p - 1.0) - 0.02) << "zb-h1 p " << p << " m " << m;
      EXPECT_NEAR(zb, dist::theoretical_bubble(ScheduleKind::zero_bubble, p, m), 1e-12);
    }
}

TEST(PipelineSchedule, MicroBatchesInFlightAsTheTheorySays) {
  const int p = 4, m = 8;
  auto peak = [&](ScheduleKind k, int v, int rank) {
    return dist::simulate(dist::make_schedules(k, p, m, v), p, v).ranks[rank].peak_in_flight;
  };
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(peak(ScheduleKind::gpipe, 1, r), m);
    EXPECT_EQ(peak(ScheduleKind::one_f_one_b, 1, r), p - r);
    EXPECT_LE(peak(ScheduleKind::zero_bubble, 1, r), p);  // ZB-H1's bound: 1F1B's peak (rank 0's)
  }
  EXPECT_EQ(peak(ScheduleKind::zero_bubble, 1, 0), p);
  // Interleaved rank 0: 2(p-1) + (v-1)p warm-up chunk forwards plus the steady state's one.
  EXPECT_EQ(peak(ScheduleKind::interleaved, 2, 0), 2 * (p - 1) + p + 1);
}

TEST(PipelineSchedule, BadSchedulesAreRefusedBeforeAnyWork) {
  auto msg = error_message([] { dist::make_schedule(ScheduleKind::interleaved, 4, 0, 6, 2); });
  EXPECT_NE(msg.find("trainer.accum_steps (6 micro-batches) must be a multiple of dist.pp (4)"), std::string::npos) << msg;
  msg = error_message([] { dist::make_schedule(ScheduleKind::one_f_one_b, 2, 0, 4, 2); });
  EXPECT_NE(msg.find("dist.virtual_stages 2 is for the interleaved schedule, not 1f1b"), std::string::npos) << msg;
  msg = error_message([] { dist::parse_schedule("pipedream"); });
  EXPECT_NE(msg.find("unknown pipeline schedule 'pipedream'"), std::string::npos) << msg;
  msg = error_message([] { dist::PipelineLayout(3, 4); });
  EXPECT_NE(msg.find("model.n_layer (3) is smaller than the 4 stages (dist.pp): a stage would hold no transformer block"),
            std::string::npos) << msg;
  msg = error_message([] { dist::PipelineLayout(8, 2, 2, {2, 2, 4}); });
  EXPECT_NE(msg.find("dist.pp_layers lists 3 stages but the pipeline has 4 virtual stages"), std::string::npos) << msg;
  msg = error_message([] { dist::PipelineLayout(8, 2, 1, {8, 0}); });
  EXPECT_NE(msg.find("dist.pp_layers gives stage 1 0 blocks"), std::string::npos) << msg;
  msg = error_message([] { dist::PipelineLayout(8, 2, 1, {3, 4}); });
  EXPECT_NE(msg.find("dist.pp_layers sums to 7 blocks but model.n_layer is 8"), std::string::npos) << msg;
  EXPECT_NE(error_message([] { dist::DeviceMesh::from_sizes(1, dist::world_size() + 1); }).find("not divisible by tp x pp"),
            std::string::npos);
}

TEST(PipelineSchedule, BalancedLayoutGivesTheExtraBlocksToInnerStagesFirst) {
  dist::PipelineLayout a(10, 4);  // 2 each, 2 extra: stages 1 and 2
  EXPECT_EQ(a.describe(), "blocks per stage: [0, 2) [2, 5) [5, 8) [8, 10)");
  dist::PipelineLayout b(7, 2, 2);  // 4 virtual stages: 1 each, 3 extra: 1, 2, then 0
  EXPECT_EQ(b.describe(), "blocks per stage: [0, 2) [2, 4) [4, 6) [6, 7)");
  dist::PipelineLayout c(6, 2, 1, {1, 5});
  EXPECT_EQ(c.first_layer(1), 1);
  EXPECT_EQ(c.end_layer(1), 6);
}

// ---- the real thing: f64 against one process

namespace {

nn::GPTConfig tiny(int64_t n_layer, double dropout = 0.0, bool ckpt = false) {
  return nn::GPTConfig{.n_layer = n_layer, .n_head = 4, .n_embd = 16, .block_size = 8, .vocab_size = 67, .dropout = dropout,
                       .bias = true, .gradient_checkpointing = ckpt};
}

struct MicroBatch {
  Tensor ids, targets;
  double weight = 0;  // n_k / N: the token-weighted mean over the step
};

// m micro-batches of B x T tokens (some targets ignored, so the weights differ).
std::vector<MicroBatch> batches(int m, int64_t B, int64_t T, uint64_t seed) {
  std::vector<MicroBatch> out;
  int64_t total = 0;
  Generator g(seed);
  for (int k = 0; k < m; ++k) {
    MicroBatch b{randint(0, 67, {B, T}, g), randint(0, 67, {B, T}, g), 0};
    int64_t* t = b.targets.data_ptr<int64_t>();
    for (int64_t i = 0; i < k % 3; ++i) t[i] = -100;
    int64_t n = 0;
    for (int64_t i = 0; i < B * T; ++i) n += t[i] != -100;
    b.weight = static_cast<double>(n);
    total += n;
    out.push_back(b);
  }
  for (auto& b : out) b.weight /= static_cast<double>(total);
  return out;
}

// One process: the weighted sum of the micro-batches' losses, its gradients (in ref's .grad).
double reference(nn::GPT& ref, const std::vector<MicroBatch>& mbs) {
  double loss = 0;
  for (const auto& b : mbs) {
    Tensor l = ref.loss(b.ids, b.targets);
    loss += l.item() * b.weight;
    mul(l, b.weight).backward();
  }
  return loss;
}

struct PipelineRun {
  double loss = 0;  // on the last stage (0 elsewhere)
  dist::PipelineStats stats;
};

PipelineRun run_pipeline(dist::PipelineGPT& model, const dist::GroupPtr& pp, ScheduleKind k, const std::vector<MicroBatch>& mbs,
                         DType dt = DType::f64) {
  const int m = static_cast<int>(mbs.size());
  dist::PipelineExecutor ex(pp, k, m, model.layout().virtual_stages());
  // Each micro-batch's forward starts where one process's would (dropout).
  std::vector<GeneratorState> rng;
  GeneratorState at = default_generator().state();
  for (const auto& b : mbs) {
    rng.push_back(at);
    at.offset += model.dropout_blocks(b.ids.size(0), b.ids.size(1));
  }
  PipelineRun run;
  dist::PipelineCallbacks cb;
  cb.activation_dtype = dt;
  cb.activation_shape = [&](int mb) { return model.activation_shape(mbs[mb].ids.size(0), mbs[mb].ids.size(1)); };
  cb.weights = model.parameters();
  cb.forward = [&](int chunk, int mb, const Tensor& input) {
    const auto& ch = model.chunk(chunk);
    Tensor out = model.forward_chunk(chunk, {input, mbs[mb].ids, mbs[mb].targets, &rng[mb]});
    if (!ch.head) return out;
    run.loss += out.item() * mbs[mb].weight;
    return mul(out, mbs[mb].weight);
  };
  run.stats = ex.run(cb);
  default_generator().set_state(at);
  model.sum_tied_gradients();
  return run;
}

// Every parameter this rank holds against one process's (tp shards gathered first).
void expect_same_grads(dist::PipelineGPT& model, nn::GPT& ref, double tol) {
  std::map<std::string, Tensor> want;
  for (auto& [n, p] : ref.named_parameters()) want[n] = p.grad();
  int checked = 0;
  for (auto& [n, p] : model.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << n << " has no gradient on stage " << model.rank();
    ASSERT_TRUE(want.count(n)) << n;
    Tensor g = dist::gather_shards(p.grad(), dist::spec_of(model.shard_specs(), n), *model.tp());
    EXPECT_TRUE(all_close(g, want[n], tol, tol)) << n << " on stage " << model.rank();
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

const dist::DeviceMesh& pp_mesh() {  // dp 1 x tp 1 x pp world
  static const dist::DeviceMesh mesh = dist::DeviceMesh::from_sizes(1, dist::world_size());
  return mesh;
}
const dist::GroupPtr& embedding_group() {
  static const dist::GroupPtr g = dist::make_embedding_group(pp_mesh());
  return g;
}

void equal_to_one_process(ScheduleKind k, int m, int v, const nn::GPTConfig& c) {
  const auto& mesh = pp_mesh();
  const int p = mesh.pp_size();
  SCOPED_TRACE(std::string(dist::schedule_name(k)) + " pp " + std::to_string(p) + " m " + std::to_string(m) + " v " +
               std::to_string(v) + (c.dropout > 0 ? " dropout" : "") + (c.gradient_checkpointing ? " checkpointing" : ""));
  const auto mbs = batches(m, 2, 8, 100 + m);
  manual_seed(31);
  nn::GPT ref(c);
  ref.to(DType::f64);
  const double want = reference(ref, mbs);
  const GeneratorState after_ref = default_generator().state();
  manual_seed(31);
  dist::PipelineGPT model(c, dist::PipelineLayout(c.n_layer, p, v), mesh.pp_index(), mesh.tp(), {}, embedding_group());
  model.to(DType::f64);
  const PipelineRun run = run_pipeline(model, mesh.pp(), k, mbs);
  EXPECT_EQ(default_generator().state(), after_ref) << "the generator ends the step where one process's does";
  if (model.holds_head()) {
    EXPECT_NEAR(run.loss, want, 1e-10 * std::fabs(want));
  }
  expect_same_grads(model, ref, 1e-10);
}

}  // namespace

TEST(Pipeline, EverySchedulesGradientsEqualOneProcessInF64) {
  const int p = dist::world_size();
  for (ScheduleKind k : kAll)
    for (int m : {4, 8}) {
      const int v = k == ScheduleKind::interleaved ? 2 : 1;
      if (k == ScheduleKind::interleaved && p != 2) continue;  // interleaved: pp 2 x v 2 (np 2)
      equal_to_one_process(k, m, v, tiny(4));
    }
}

TEST(Pipeline, DropoutAndCheckpointingEqualOneProcess) {
  // The masks are those of one process (the generator is put where its forward would be at
  // each chunk), and a checkpointed stage recomputes the same ones.
  const int v = dist::world_size() == 2 ? 2 : 1;
  equal_to_one_process(ScheduleKind::one_f_one_b, 4, 1, tiny(4, 0.2));
  equal_to_one_process(ScheduleKind::zero_bubble, 4, 1, tiny(4, 0.2, true));
  equal_to_one_process(v == 2 ? ScheduleKind::interleaved : ScheduleKind::gpipe, 4, v, tiny(4, 0.1, true));
}

TEST(Pipeline, UnbalancedLayoutEqualsOneProcess) {
  const int p = dist::world_size();
  std::vector<int64_t> layers(p, 1);
  layers[0] = 3;  // 3 + 1 + … blocks
  const auto c = tiny(static_cast<int64_t>(p) + 2);
  const auto mbs = batches(4, 2, 8, 7);
  manual_seed(31);
  nn::GPT ref(c);
  ref.to(DType::f64);
  reference(ref, mbs);
  manual_seed(31);
  dist::PipelineGPT model(c, dist::PipelineLayout(c.n_layer, p, 1, layers), pp_mesh().pp_index(), pp_mesh().tp(), {}, embedding_group());
  model.to(DType::f64);
  EXPECT_EQ(model.chunk(0).end - model.chunk(0).first, layers[pp_mesh().pp_index()]);
  run_pipeline(model, pp_mesh().pp(), ScheduleKind::one_f_one_b, mbs);
  expect_same_grads(model, ref, 1e-10);
}

TEST(Pipeline, TheTiedEmbeddingLivesOnTheFirstAndTheLastStage) {
  const int p = dist::world_size(), r = pp_mesh().pp_index();
  manual_seed(31);
  dist::PipelineGPT model(tiny(4), dist::PipelineLayout(4, p), r, pp_mesh().tp(), {}, embedding_group());
  std::set<std::string> names;
  for (auto& [n, t] : model.named_parameters()) names.insert(n);
  EXPECT_EQ(names.count("transformer.wte.weight"), r == 0 || r == p - 1 ? 1u : 0u);
  EXPECT_EQ(names.count("transformer.wpe.weight"), r == 0 ? 1u : 0u);
  EXPECT_EQ(names.count("transformer.ln_f.weight"), r == p - 1 ? 1u : 0u);
  EXPECT_EQ(model.duplicate_parameters().size(), r == p - 1 ? 1u : 0u);
  // Both copies start as one process's wte.
  manual_seed(31);
  nn::GPT ref(tiny(4));
  if (names.count("transformer.wte.weight")) {
    Tensor mine;
    for (auto& [n, t] : model.named_parameters())
      if (n == "transformer.wte.weight") mine = t;
    for (auto& [n, t] : ref.named_parameters())
      if (n == "transformer.wte.weight") {
        EXPECT_TRUE(all_close(narrow(mine, 0, 0, 67), t, 0, 0));
      }
  }
  EXPECT_EQ(model.logical_parameters_count(), ref.parameters_count());
}

TEST(Pipeline, TensorAndPipelineParallelTogetherEqualOneProcess) {
  if (dist::world_size() != 4) GTEST_SKIP() << "tp 2 x pp 2 needs 4 ranks";
  static const dist::DeviceMesh mesh = dist::DeviceMesh::from_sizes(2, 2);
  static const dist::GroupPtr eg = dist::make_embedding_group(mesh);
  for (bool sp : {false, true})
    for (ScheduleKind k : {ScheduleKind::one_f_one_b, ScheduleKind::zero_bubble}) {
      SCOPED_TRACE(std::string(dist::schedule_name(k)) + (sp ? " sequence parallel" : ""));
      const auto c = tiny(4, 0.1);
      const auto mbs = batches(4, 2, 8, 5);
      manual_seed(31);
      nn::GPT ref(c);
      ref.to(DType::f64);
      const double want = reference(ref, mbs);
      manual_seed(31);
      dist::PipelineGPT model(c, dist::PipelineLayout(4, 2), mesh.pp_index(), mesh.tp(), {.sequence_parallel = sp}, eg);
      model.to(DType::f64);
      const PipelineRun run = run_pipeline(model, mesh.pp(), k, mbs);
      if (model.holds_head()) {
        EXPECT_NEAR(run.loss, want, 1e-10 * std::fabs(want));
      }
      // The sequence-parallel replicated gradients are partial per tp rank: summed over tp as DataParallel does.
      if (sp)
        for (auto& [n, p] : model.named_parameters())
          if (dist::spec_of(model.shard_specs(), n).sum_grad_over_tp) mesh.tp()->all_reduce(p.grad());
      expect_same_grads(model, ref, 1e-10);
    }
}

// ---- memory: stage 0's peak activation bytes by schedule

TEST(Pipeline, StageZerosPeakActivationMemoryIsOrderedAsTheTheory) {
  // GPipe holds m micro-batches of L/p blocks, 1F1B p of them (L blocks' worth), interleaved
  // L (1 + (p-1)/(pv)), ZB-H1 as 1F1B. f32, 8 micro-batches, 8 blocks; every rank prints its
  // figures (bench/RESULTS.md has them).
  const int p = dist::world_size(), m = 8;
  const auto c = nn::GPTConfig{.n_layer = 8, .n_head = 4, .n_embd = 64, .block_size = 32, .vocab_size = 67};
  const auto mbs = batches(m, 4, 32, 3);
  std::map<ScheduleKind, double> peak;
  for (ScheduleKind k : kAll) {
    const int v = k == ScheduleKind::interleaved ? 2 : 1;
    manual_seed(31);
    dist::PipelineGPT model(c, dist::PipelineLayout(8, p, v), pp_mesh().pp_index(), pp_mesh().tp(), {}, embedding_group());
    run_pipeline(model, pp_mesh().pp(), k, batches(p, 4, 32, 1), DType::f32);  // warm-up
    model.zero_grad();
    Allocator::cpu().reset_peak();
    const auto before = Allocator::cpu().stats().current[static_cast<int>(MemTag::activation)];
    run_pipeline(model, pp_mesh().pp(), k, mbs, DType::f32);
    peak[k] = static_cast<double>(Allocator::cpu().stats().peak[static_cast<int>(MemTag::activation)] - before);
  }
  if (pp_mesh().pp_index() != 0) return;
  std::printf("stage 0 of %d, m %d, L 8: peak activation MiB: gpipe %.2f, 1f1b %.2f, interleaved(v2) %.2f, zb-h1 %.2f\n", p, m,
              peak[ScheduleKind::gpipe] / 1048576, peak[ScheduleKind::one_f_one_b] / 1048576,
              peak[ScheduleKind::interleaved] / 1048576, peak[ScheduleKind::zero_bubble] / 1048576);
  // The theory in units of 1F1B's peak (L blocks of one micro-batch): GPipe m/p, interleaved 1 + (p-1)/(pv).
  const double one = peak[ScheduleKind::one_f_one_b];
  EXPECT_GT(peak[ScheduleKind::gpipe], 1.5 * one);
  EXPECT_NEAR(peak[ScheduleKind::gpipe] / one, static_cast<double>(m) / p, 0.25 * m / p);
  EXPECT_GT(peak[ScheduleKind::interleaved], one);
  EXPECT_LT(peak[ScheduleKind::interleaved], peak[ScheduleKind::gpipe]);
  EXPECT_NEAR(peak[ScheduleKind::interleaved] / one, 1.0 + (p - 1.0) / (2.0 * p), 0.15);
  EXPECT_NEAR(peak[ScheduleKind::zero_bubble] / one, 1.0, 0.1);
}

// ---- injected failures (expect_abort.cmake)

namespace {
int scenario(bool die) {
  const auto& mesh = pp_mesh();
  const int p = mesh.pp_size(), r = mesh.pp_index();
  const auto c = tiny(4);
  const auto mbs = batches(4, 2, 8, 1);
  manual_seed(31);
  dist::PipelineGPT model(c, dist::PipelineLayout(4, p), r, mesh.tp(), {}, embedding_group());
  dist::PipelineExecutor ex(mesh.pp(), ScheduleKind::one_f_one_b, 4);
  dist::PipelineCallbacks cb;
  cb.activation_shape = [&](int mb) { return model.activation_shape(mbs[mb].ids.size(0), mbs[mb].ids.size(1)); };
  cb.forward = [&](int chunk, int mb, const Tensor& input) {
    return model.forward_chunk(chunk, {input, mbs[mb].ids, mbs[mb].targets});
  };
  cb.before_action = [&](std::size_t, const dist::Action& a) {
    if (r == p - 1 && a.kind == ActionKind::forward && a.mb == 2) {
      std::fprintf(stderr, "stage %d: %s before its forward of micro-batch 2\n", r, die ? "dying (SIGKILL)" : "hanging");
      std::fflush(stderr);
      if (die) std::raise(SIGKILL);
      for (;;) ::pause();
    }
  };
  ex.run(cb);
  std::fprintf(stderr, "stage %d: the step completed although the last stage stopped\n", r);
  return 0;
}
}  // namespace

}  // namespace athanor

int main(int argc, char** argv) {
  athanor::dist::init_from_mpi(&argc, &argv);
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--scenario=", 11) == 0) {
      const int rc = athanor::scenario(std::strcmp(argv[i] + 11, "die") == 0);
      athanor::dist::finalize();
      return rc;
    }
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  athanor::dist::finalize();
  return rc;
}
