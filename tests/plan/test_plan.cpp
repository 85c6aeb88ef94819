// The planner against known layouts and formulas: Megatron's GPT-3 175B layout on 1024
// A100s, the ZeRO paper's model-state bytes, the pipeline schedules' in-flight counts against
// the real schedules' action lists, and the bad inputs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "athanor/core/error.h"
#include "athanor/dist/pipeline_schedule.h"
#include "athanor/plan/search.h"

namespace athanor::plan {
namespace {

TrainSpec gpt3_175b() {
  TrainSpec s;
  s.model = {"gpt3-175b", 96, 96, 12288, 2048, 51200, true, 0.0};
  s.precision = Precision::bf16;
  s.optimizer = "adam";
  s.packed_weights = false;  // GPUs: no CPU GEMM-layout copies
  s.micro_batch = 1;
  s.accum = 1536;
  return s;
}

TEST(Plan, Gpt3OnA100sHasMegatronsLayoutAmongTheTop) {
  // Narayanan et al. 2021 trained GPT-3 175B on 1024 A100 80 GB at t = 8, p = 16 (global batch 1536).
  const Cluster c = load_cluster("a100-80gb", 128);
  ASSERT_EQ(c.devices(), 1024);
  SearchOptions o;
  o.global_batch = 1536;
  o.top = 5;
  const PlanResult r = search(gpt3_175b(), c, o);
  ASSERT_FALSE(r.ranked.empty());
  bool megatron_like = false;
  for (const auto& cand : r.ranked) megatron_like |= cand.layout.tp == 8 && cand.layout.pp >= 8;
  std::string top;
  for (const auto& cand : r.ranked) top += cand.layout.str() + "\n";
  EXPECT_TRUE(megatron_like) << "top layouts:\n" << top;
  // Data parallelism alone cannot hold it: the tree says so first.
  ASSERT_FALSE(r.tree.empty());
  EXPECT_NE(r.tree[0].find("does not fit"), std::string::npos) << r.tree[0];
  // Every ranked layout fits its device with the margin.
  for (const auto& cand : r.ranked) EXPECT_LE(cand.stages[cand.worst_stage].needs(kFragmentationMargin), c.memory_bytes);
}

TEST(Plan, ZeroPaperModelStatesFor7_5BAtDp64) {
  // Rajbhandari et al. 2020, Figure 1: Ψ = 7.5B, Nd = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
  const double psi = 7.5e9;
  EXPECT_NEAR(zero_model_state_bytes(psi, 64, 0, kZeroPaperBytes) / 1e9, 120.0, 0.05);
  EXPECT_NEAR(zero_model_state_bytes(psi, 64, 1, kZeroPaperBytes) / 1e9, 31.4, 0.05);
  EXPECT_NEAR(zero_model_state_bytes(psi, 64, 2, kZeroPaperBytes) / 1e9, 16.6, 0.05);
  EXPECT_NEAR(zero_model_state_bytes(psi, 64, 3, kZeroPaperBytes) / 1e9, 1.9, 0.05);
}

TEST(Plan, AthanorModelStatesFollowTheZeroFormulasInItsF32Layout) {
  // A 7.5B GPT (64 layers of width 3072) at dp 64, tp = pp = 1, AdamW: f32 weights (4), f32
  // gradients (4), m and v (K = 8). ZeRO-3 shards the blocks' weights only: the embeddings and
  // the final LayerNorm stay whole on every rank (their gradients and states are sharded as at
  // stage 2), so stage 3 is the formula for the blocks plus stage 2's for the rest.
  TrainSpec s;
  s.model = {"gpt-7.5b", 64, 32, 3072, 2048, 50257, true, 0.0};
  s.precision = Precision::bf16;
  const double h = 3072;
  const double psi_blocks = 64 * (12 * h * h + 13 * h);
  const double psi_rest = (50257 + 2048) * h + 2 * h;
  ASSERT_NEAR(psi_blocks + psi_rest, 7.42e9, 0.01e9);
  ASSERT_EQ(static_cast<double>(s.model.total_params()), psi_blocks + psi_rest);
  const StateBytes athanor{4, 4, 8};
  for (int stage = 0; stage <= 3; ++stage) {
    Layout l;
    l.dp = 64;
    l.zero = stage;
    const StageMemory m = stage_memory(s, l, 0);
    const double states = m.state_params + m.state_grads + m.state_optimizer;
    const double want = stage == 3 ? zero_model_state_bytes(psi_blocks, 64, 3, athanor) + zero_model_state_bytes(psi_rest, 64, 2, athanor)
                                   : zero_model_state_bytes(psi_blocks + psi_rest, 64, stage, athanor);
    EXPECT_NEAR(states, want, 1.0) << "ZeRO-" << stage;
  }
}

TEST(Plan, InFlightMicroBatchesMatchTheSchedulesActionLists) {
  // The memory model's in-flight count against the real schedules (dist/pipeline_schedule.h):
  // the most forwards a stage has done and not yet finished the backward of.
  for (Schedule s : {Schedule::gpipe, Schedule::one_f_one_b, Schedule::zb_h1, Schedule::interleaved}) {
    for (int pp : {2, 4}) {
      for (int m : {4, 8}) {
        const int v = s == Schedule::interleaved ? 2 : 1;
        Layout l;
        l.pp = pp;
        l.accum = m;
        l.schedule = s;
        l.virtual_stages = v;
        const auto kind = dist::parse_schedule(schedule_name(s));
        for (int stage = 0; stage < pp; ++stage) {
          const auto actions = dist::make_schedule(kind, pp, stage, m, v);
          int live = 0, most = 0;
          for (const auto& a : actions) {
            if (a.kind == dist::ActionKind::forward) most = std::max(most, ++live);
            // A zero-bubble micro-batch is done with at its weight-gradient pass (pipeline_executor.cpp).
            if (a.kind == dist::ActionKind::backward || a.kind == dist::ActionKind::backward_weight) --live;
          }
          EXPECT_NEAR(in_flight(l, stage) * v, most, 1e-9)
              << schedule_name(s) << " pp " << pp << " m " << m << " stage " << stage;
        }
      }
    }
  }
}

TEST(Plan, UnknownPresetSuggestsTheNearest) {
  try {
    load_cluster("a100-80g");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown cluster preset 'a100-80g'"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("did you mean 'a100-80gb'?"), std::string::npos) << e.hint();
  }
}

TEST(Plan, AModelThatDoesNotDivideIsRefusedWithTheReason) {
  TrainSpec s;
  s.model = {"gpt", 12, 12, 768, 1024, 50257, true, 0.0};
  Layout l;
  l.tp = 8;
  try {
    check_layout(s, l);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_head 12 does not divide by tp 8"), std::string::npos) << e.what();
  }
  l.tp = 1;
  l.pp = 5;
  try {
    check_layout(s, l);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_layer 12 does not divide by pp 5"), std::string::npos) << e.what();
  }
  s.model.n_embd = 770;
  EXPECT_THROW(check_model(s.model), Error);
}

TEST(Plan, ALayoutNoDeviceHoldsNamesTheSmallestClusterThatWould) {
  // GPT-3 175B on one node of 8 A100s: nothing fits; the error names the smallest node count,
  // which must hold it while half as many nodes must not.
  TrainSpec s = gpt3_175b();
  SearchOptions o;
  o.global_batch = 1536;
  const Cluster one = load_cluster("a100-80gb", 1);
  std::string msg, hint;
  try {
    search(s, one, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    msg = e.what();
    hint = e.hint();
  }
  EXPECT_NE(msg.find("fits on 8 a100-80gb devices"), std::string::npos) << msg;
  const int n = smallest_fitting_nodes(s, one, 1536);
  ASSERT_GT(n, 1);
  EXPECT_NE(hint.find("--nodes " + std::to_string(n)), std::string::npos) << hint;
  EXPECT_NO_THROW(search(s, load_cluster("a100-80gb", n), o));
  if (n > 1) {
    EXPECT_THROW(search(s, load_cluster("a100-80gb", n / 2), o), Error);
  }
}

TEST(Plan, ClusterFileErrorsNameTheKey) {
  const auto dir = std::filesystem::temp_directory_path() / "athanor_plan_test";
  std::filesystem::create_directories(dir);
  const auto p = (dir / "c.yaml").string();
  std::ofstream(p) << "devices_per_node: 4\nmemory_gb: 16\npeak_tflops: {f32: 10}\n";
  try {
    load_cluster(p);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown key 'memory_gb'"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("memory_gib"), std::string::npos) << e.hint();
  }
  std::ofstream(p) << "devices_per_node: 4\nnodes: 2\nmemory_gib: 16\npeak_tflops: {f32: 10, bf16: 40}\n";
  const Cluster c = load_cluster(p);
  EXPECT_EQ(c.devices(), 8);
  EXPECT_DOUBLE_EQ(c.peak(Precision::bf16), 40e12);
  std::filesystem::remove_all(dir);
}

// The CPU preset's measured latencies and rank slowdown survive its cache, and a cache from
// before them (no comm_probe) still loads, with the even-sharing fallback.
TEST(Plan, MeasuredCommunicationRoundTripsThroughTheCache) {
  const auto dir = std::filesystem::temp_directory_path() / "athanor_plan_test_comm";
  std::filesystem::create_directories(dir);
  const auto p = (dir / "cpu.yaml").string();
  std::ofstream(p) << "devices_per_node: 8\nmemory_gib: 2\npeak_tflops: {f32: 0.1}\nshared_compute: true\ncores: 2\n";
  const Cluster old = load_cluster(p);
  EXPECT_TRUE(old.comm_probe.empty());
  EXPECT_DOUBLE_EQ(old.rank_slowdown(1), 1.0);
  EXPECT_DOUBLE_EQ(old.rank_slowdown(2), 1.0);
  EXPECT_DOUBLE_EQ(old.rank_slowdown(4), 2.0);  // 4 ranks on 2 cores
  Cluster c = old;
  c.intra.latency_s = c.inter.latency_s = 300e-6;
  c.latency_oversubscribed_s = 900e-6;
  c.slowdown_at_cores = 1.5;
  c.slowdown_at_2cores = 3.5;
  c.comm_probe = "mpirun";
  std::ofstream(p) << to_yaml(c);
  const Cluster back = load_cluster(p);
  EXPECT_EQ(back.comm_probe, "mpirun");
  EXPECT_NEAR(back.intra.latency_s, 300e-6, 1e-12);
  EXPECT_NEAR(back.latency_oversubscribed_s, 900e-6, 1e-12);
  EXPECT_DOUBLE_EQ(back.rank_slowdown(1), 1.0);
  EXPECT_DOUBLE_EQ(back.rank_slowdown(2), 1.5);
  EXPECT_DOUBLE_EQ(back.rank_slowdown(3), 2.5);
  EXPECT_DOUBLE_EQ(back.rank_slowdown(4), 3.5);
  EXPECT_DOUBLE_EQ(back.rank_slowdown(8), 7.0);

  // The measured terms enter the step time: tp 2 pays 4 all-reduces per layer of 2 hops of α
  // plus the trainer's per-step collectives; 4 oversubscribed ranks pay the oversubscribed α.
  TrainSpec s;
  s.model = {"tiny", 4, 4, 64, 64, 256, true, 0.0};
  s.precision = Precision::f32;
  s.optimizer = "adamw";
  Layout tp2;
  tp2.tp = 2;
  const StepTime t_old = step_time(s, tp2, old), t_new = step_time(s, tp2, back);
  EXPECT_NEAR(t_new.tp_comm - t_old.tp_comm, 4 * 4 * 2 * (300e-6 - old.intra.latency_s), 1e-9);
  EXPECT_NEAR(t_new.sync, (2 + 2) * 300e-6, 1e-12);  // the world's found-inf vote and tp's norm, 2 hops each
  Layout dp4;
  dp4.dp = 4;
  EXPECT_NEAR(step_time(s, dp4, back).sync, (6 + 2 * 3) * 900e-6, 1e-12);  // world all-reduce + 2 dp all-gathers
  EXPECT_NEAR(step_time(s, dp4, back).compute, 3.5 * step_time(s, Layout{}, back).compute, 1e-12);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace athanor::plan
