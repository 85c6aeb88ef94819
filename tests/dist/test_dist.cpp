// Distributed tests: run under `mpirun --oversubscribe -np 2|4` (see tests/CMakeLists.txt).
// Every rank runs every test; a failure on any rank makes mpirun exit non-zero.
//
//   test_dist                       gtest: collectives per op/dtype, async overlap, ledger, mesh, DDP
//   test_dist --scenario=skip       rank 1 skips collective #4 of group dp: every rank must abort
//                                   with the timeout message naming #4 and rank 1
//   test_dist --scenario=die        rank 1 kills itself: every rank must exit, none hangs
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/rng.h"
#include "athanor/dist/ddp.h"
#include "athanor/dist/device_mesh.h"
#include "athanor/dist/process_group.h"
#include "athanor/dist/sampler.h"
#include "athanor/nn/mlp.h"
#include "athanor/optim/optimizer.h"
#include "athanor/train/config.h"
#include "athanor/train/parallel_context.h"
#include "test_util.h"
#if ATHANOR_HAS_CUDA
#include "backend/cuda/runtime.h"
#endif

namespace athanor {
using namespace athanor::testing;
using dist::ReduceOp;

namespace {

std::shared_ptr<dist::ProcessGroup> W() { return dist::world(); }

std::vector<double> iota_plus(int64_t n, double add) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>(i) + add;
  return v;
}

const DType kDTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64};

}  // namespace

TEST(Dist, WorldInfo) {
  EXPECT_TRUE(dist::is_initialized());
  EXPECT_GE(dist::world_size(), 2);
  EXPECT_EQ(W()->size(), dist::world_size());
  EXPECT_EQ(W()->rank(), dist::rank());
  EXPECT_GE(dist::local_rank(), 0);
  EXPECT_LT(dist::local_rank(), dist::world_size());
  const std::string lvl = dist::thread_level_name();
  if (dist::rank() == 0) std::printf("MPI thread level: %s, world %d\n", lvl.c_str(), dist::world_size());
  EXPECT_TRUE(lvl == "MPI_THREAD_MULTIPLE" || lvl == "MPI_THREAD_SERIALIZED" || lvl == "MPI_THREAD_FUNNELED") << lvl;
}

TEST(Dist, AllReduceEveryOpAndDType) {
  auto g = W();
  const int n = g->size(), r = g->rank();
  const double S = n * (n - 1) / 2.0;  // sum of ranks
  for (DType dt : kDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    // element i = i + rank: sum = n*i + S, max = i + n - 1
    Tensor a = from_vector(iota_plus(6, r), {2, 3}, TensorOptions(dt));
    g->all_reduce(a, ReduceOp::sum);
    std::vector<double> want(6);
    for (int i = 0; i < 6; ++i) want[i] = n * i + S;
    EXPECT_EQ(a.to_vector(), want);
    EXPECT_EQ(a.dtype(), dt);

    Tensor m = from_vector(iota_plus(6, r), {6}, TensorOptions(dt));
    g->all_reduce(m, ReduceOp::max);
    for (int i = 0; i < 6; ++i) want[i] = i + n - 1;
    EXPECT_EQ(m.to_vector(), want);

    // avg of i*n + 2*rank = i*n + (n - 1): exact for integers too
    std::vector<double> v(6);
    for (int i = 0; i < 6; ++i) v[i] = i * n + 2.0 * r;
    Tensor av = from_vector(v, {6}, TensorOptions(dt));
    g->all_reduce(av, ReduceOp::avg);
    for (int i = 0; i < 6; ++i) want[i] = i * n + (n - 1);
    EXPECT_EQ(av.to_vector(), want);
  }
}

TEST(Dist, AllReduceNonContiguousView) {
  auto g = W();
  Tensor base = from_vector(iota_plus(6, g->rank()), {2, 3});
  Tensor tv = base.t();  // [3, 2] view, non-contiguous
  ASSERT_FALSE(tv.is_contiguous());
  g->all_reduce(tv, ReduceOp::sum);
  const int n = g->size();
  const double S = n * (n - 1) / 2.0;
  std::vector<double> want(6);
  for (int i = 0; i < 6; ++i) want[i] = n * i + S;
  EXPECT_EQ(base.to_vector(), want);  // written through the view into the base
}

TEST(Dist, ReduceScatterAllGatherBroadcastEveryDType) {
  auto g = W();
  const int n = g->size(), r = g->rank();
  const double S = n * (n - 1) / 2.0;
  for (DType dt : kDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    // reduce_scatter: in[k] = k + rank; out[j] = n*(r*3 + j) + S
    Tensor in = from_vector(iota_plus(3 * n, r), {3 * n}, TensorOptions(dt));
    Tensor out = zeros({3}, TensorOptions(dt));
    g->reduce_scatter(out, in, ReduceOp::sum);
    std::vector<double> want(3);
    for (int j = 0; j < 3; ++j) want[j] = n * (r * 3 + j) + S;
    EXPECT_EQ(out.to_vector(), want);

    Tensor out_max = zeros({3}, TensorOptions(dt));
    g->reduce_scatter(out_max, in, ReduceOp::max);
    for (int j = 0; j < 3; ++j) want[j] = r * 3 + j + n - 1;
    EXPECT_EQ(out_max.to_vector(), want);

    // all_gather: rank q contributes {q, q+0.5*0, …}: out[k] = k / 2
    Tensor mine = full({2}, r, TensorOptions(dt));
    Tensor all = zeros({n, 2}, TensorOptions(dt));
    g->all_gather(all, mine);
    std::vector<double> gw(2 * n);
    for (int k = 0; k < 2 * n; ++k) gw[k] = k / 2;
    EXPECT_EQ(all.to_vector(), gw);

    // broadcast from the last rank
    Tensor b = from_vector(iota_plus(4, 10 * r), {4}, TensorOptions(dt));
    g->broadcast(b, n - 1);
    EXPECT_EQ(b.to_vector(), iota_plus(4, 10 * (n - 1)));
  }
}

TEST(Dist, SendRecvRing) {
  auto g = W();
  const int n = g->size(), r = g->rank();
  for (DType dt : kDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor s = from_vector(iota_plus(5, r), {5}, TensorOptions(dt));
    Tensor got = zeros({5}, TensorOptions(dt));
    auto rw = g->recv_async(got, (r + n - 1) % n);
    auto sw = g->send_async(s, (r + 1) % n);
    sw->wait();
    rw->wait();
    EXPECT_EQ(got.to_vector(), iota_plus(5, (r + n - 1) % n));
  }
  g->barrier();
}

TEST(Dist, AsyncCollectiveReturnsAtOnceAndOverlaps) {
  auto g = W();
  const int r = g->rank();
  using Clock = std::chrono::steady_clock;
  g->barrier();
  // Every rank but 0 arrives 300 ms late; rank 0 posts at once and computes meanwhile.
  if (r != 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Tensor a = full({1000}, 1.0), b = full({10}, 2.0);
  const auto t0 = Clock::now();
  auto wa = g->all_reduce_async(a, ReduceOp::sum);
  auto wb = g->all_reduce_async(b, ReduceOp::avg);
  const double post_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (r == 0) {
    EXPECT_LT(post_ms, 100.0) << "posting an asynchronous all_reduce must not wait for the other ranks";
    EXPECT_FALSE(wa->test());  // the others are still asleep
    // "compute" while the collectives are in flight
    Tensor x = full({64, 64}, 0.5);
    Tensor y = matmul(x, x);
    EXPECT_NEAR(y.to_vector()[0], 16.0, 1e-5);
  }
  wb->wait();  // out of order
  wa->wait();
  const double total_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (r == 0) {
    EXPECT_GT(total_ms, 150.0);
  }
  EXPECT_EQ(a.to_vector(), std::vector<double>(1000, g->size()));
  EXPECT_EQ(b.to_vector(), std::vector<double>(10, 2.0));
  EXPECT_TRUE(wa->completed());
}

TEST(Dist, SequenceNumbersAndLedgerAgreeAcrossRanks) {
  auto g = W();
  Tensor t = ones({3});
  const uint64_t before = g->last_posted_seq();
  g->all_reduce(t);
  const int line = __LINE__ - 1;
  EXPECT_EQ(g->last_posted_seq(), before + 1);
  EXPECT_EQ(g->last_completed_seq(), g->last_posted_seq());
  auto led = g->ledger();
  ASSERT_FALSE(led.empty());
  EXPECT_EQ(led.back().op, "all_reduce");
  EXPECT_EQ(led.back().bytes, 12u);
  EXPECT_EQ(led.back().group, "world");
  EXPECT_TRUE(led.back().completed);
  std::ostringstream site;
  site << "test_dist.cpp:" << line;
  EXPECT_NE(led.back().call_site.find(site.str()), std::string::npos) << led.back().call_site;
  // every rank has the same sequence number
  Tensor seq = from_vector(std::vector<int64_t>{static_cast<int64_t>(g->last_posted_seq())}, {1});
  Tensor all = zeros({g->size()}, DType::i64);
  g->all_gather(all, seq);
  for (double v : all.to_vector()) EXPECT_EQ(v, static_cast<double>(g->last_posted_seq() - 1));  // the gather is #+1
}

TEST(Dist, DeviceMeshSplitsTheWorld) {
  const int n = dist::world_size();
  const int tp = n % 2 == 0 ? 2 : 1;
  dist::DeviceMesh mesh(n / tp, tp, 1);
  EXPECT_EQ(mesh.dp()->size(), n / tp);
  EXPECT_EQ(mesh.tp()->size(), tp);
  EXPECT_EQ(mesh.pp()->size(), 1);
  EXPECT_EQ(mesh.dp()->name(), "dp");
  const int r = dist::rank();
  EXPECT_EQ(mesh.tp_index(), r % tp);
  EXPECT_EQ(mesh.dp_index(), r / tp);
  // sum of world ranks within each group
  Tensor x = full({1}, r, DType::i64);
  mesh.dp()->all_reduce(x);
  double want = 0;
  for (int d = 0; d < n / tp; ++d) want += d * tp + mesh.tp_index();
  EXPECT_EQ(x.item(), want);
  Tensor y = full({1}, r, DType::i64);
  mesh.tp()->all_reduce(y);
  want = 0;
  for (int t = 0; t < tp; ++t) want += mesh.dp_index() * tp + t;
  EXPECT_EQ(y.item(), want);
  EXPECT_EQ(mesh.dp()->world_rank_of(mesh.dp()->rank()), r);
  EXPECT_THROW(dist::DeviceMesh(n + 1, 1, 1), Error);
}

// ---------------------------------------------------------------------------
// DDP: N ranks with micro-batch b == 1 process with batch N*b.
namespace {

constexpr int64_t kIn = 5, kOut = 3;

std::shared_ptr<nn::MLP> make_mlp(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::MLP>(std::vector<int64_t>{kIn, 16, 16, kOut}, "tanh");
}

// Deterministic data for step `step`: rows [row0, row0 + rows) of the global batch.
std::pair<Tensor, Tensor> batch(int step, int64_t row0, int64_t rows, int64_t global_rows) {
  std::mt19937 rng(1000 + step);
  std::normal_distribution<float> nd;
  std::vector<float> x(global_rows * kIn), y(global_rows * kOut);
  for (auto& v : x) v = nd(rng);
  for (auto& v : y) v = nd(rng);
  std::vector<float> xs(x.begin() + row0 * kIn, x.begin() + (row0 + rows) * kIn);
  std::vector<float> ys(y.begin() + row0 * kOut, y.begin() + (row0 + rows) * kOut);
  return {from_vector(xs, {rows, kIn}), from_vector(ys, {rows, kOut})};
}

std::unique_ptr<optim::Optimizer> sgd(nn::Module& m) {
  optim::ParamGroup pg;
  pg.name = "all";
  pg.params = m.named_parameters();
  pg.lr = pg.base_lr = 0.05;
  return optim::make_sgd({pg}, optim::SgdOptions{.momentum = 0.9});
}

void run_ddp_equivalence(double bucket_cap_mb, int micro_batches) {
  auto g = W();
  const int n = g->size(), r = g->rank();
  const int64_t b = 4;                            // rows per micro-batch per rank
  const int64_t global = int64_t(n) * micro_batches * b;
  // different init per rank: DDP must broadcast rank 0's
  auto model = make_mlp(r == 0 ? 42 : 7 + r);
  dist::DistributedDataParallel ddp(model, g, dist::DDPOptions{.bucket_cap_mb = bucket_cap_mb});
  auto ref = make_mlp(42);
  for (auto& [name, p] : ref->named_parameters()) {
    Tensor mine;
    for (auto& [n2, q] : model->named_parameters())
      if (n2 == name) mine = q;
    EXPECT_CLOSE(mine, p, 0, 0) << "after broadcast: " << name;
  }
  auto opt = sgd(*model), ref_opt = sgd(*ref);
  for (int step = 0; step < 5; ++step) {
    for (int mb = 0; mb < micro_batches; ++mb) {
      // micro-batch mb of rank r: rows [(mb*n + r)*b, +b)
      auto [x, y] = batch(step, (int64_t(mb) * n + r) * b, b, global);
      Tensor loss = mul(mse_loss(model->forward(x), y), 1.0 / micro_batches);
      if (mb + 1 < micro_batches) {
        auto ns = ddp.no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    ddp.finish();
    opt->step();
    opt->zero_grad();

    auto [X, Y] = batch(step, 0, global, global);
    mse_loss(ref->forward(X), Y).backward();
    ref_opt->step();
    ref_opt->zero_grad();
  }
  // f32 throughout; only the summation order differs (per-rank means averaged vs one mean)
  auto mine = model->named_parameters(), want = ref->named_parameters();
  ASSERT_EQ(mine.size(), want.size());
  for (std::size_t i = 0; i < mine.size(); ++i) EXPECT_CLOSE(mine[i].second, want[i].second, 2e-6, 1e-5) << mine[i].first;
}

}  // namespace

TEST(DDP, MatchesSingleProcessWithTheGlobalBatchOneBucket) { run_ddp_equivalence(25.0, 1); }
TEST(DDP, MatchesSingleProcessWithManySmallBuckets) { run_ddp_equivalence(1e-4, 1); }
TEST(DDP, NoSyncGradientAccumulationMatchesTheGlobalBatch) { run_ddp_equivalence(1e-3, 3); }

TEST(DDP, BucketsFollowReverseRegistrationOrder) {
  auto model = make_mlp(1);
  dist::DistributedDataParallel ddp(model, W(), dist::DDPOptions{.bucket_cap_mb = 1e-6});
  auto names = ddp.bucket_names();
  auto params = model->named_parameters();
  ASSERT_EQ(names.size(), params.size());  // each parameter exceeds the cap: a bucket each
  for (std::size_t i = 0; i < params.size(); ++i) EXPECT_EQ(names[i], std::vector<std::string>{params[params.size() - 1 - i].first});
  dist::DistributedDataParallel one(model, W());
  EXPECT_EQ(one.bucket_names().size(), 1u);
}

TEST(DDP, BucketsAreLaunchedFromTheHooksDuringBackward) {
  auto g = W();
  auto model = make_mlp(9);
  dist::DistributedDataParallel ddp(model, g, dist::DDPOptions{.bucket_cap_mb = 1e-6});  // a bucket per parameter
  const auto params = model->named_parameters();
  ASSERT_EQ(params.size(), 6u);
  ASSERT_EQ(params[0].first, "layers.0.weight");
  // runs after DDP's own hook on the first layer's weight, i.e. late in backward
  uint64_t posted_when_first_layer_ready = 0;
  Tensor w0 = params[0].second;
  const int h = w0.register_post_accumulate_grad_hook([&](Tensor&) { posted_when_first_layer_ready = g->last_posted_seq(); });
  auto [x, y] = batch(0, 0, 4, 4);
  // inside no_sync nothing is posted
  uint64_t before = g->last_posted_seq();
  {
    auto ns = ddp.no_sync();
    mse_loss(model->forward(x), y).backward();
  }
  EXPECT_EQ(g->last_posted_seq(), before);
  before = g->last_posted_seq();
  mse_loss(model->forward(x), y).backward();
  // the buckets of layers.4 and layers.2 were in flight before backward reached layers.0
  EXPECT_GE(posted_when_first_layer_ready, before + 4);
  EXPECT_EQ(g->last_posted_seq(), before + 6);  // all six launched by the end of backward, before finish()
  auto led = g->ledger();
  EXPECT_NE(led.back().call_site.find("ddp.cpp"), std::string::npos) << led.back().call_site;
  ddp.finish();
  EXPECT_EQ(g->last_completed_seq(), before + 6);
  w0.remove_hook(h);
}

TEST(DDP, Bf16ParametersAreAveragedInF32) {
  auto g = W();
  auto model = make_mlp(11 + g->rank());
  model->to(DType::bf16);
  dist::DistributedDataParallel ddp(model, g);
  auto plain = make_mlp(0);  // same weights, no DDP: the local gradient
  plain->to(DType::bf16);
  plain->load_state_dict(model->state_dict());
  auto [x, y] = batch(3, 4 * g->rank(), 4, 4 * g->size());
  Tensor xb = x.to(DType::bf16), yb = y.to(DType::bf16);
  mse_loss(model->forward(xb), yb).backward();
  ddp.finish();
  mse_loss(plain->forward(xb), yb).backward();
  auto got = model->named_parameters(), local = plain->named_parameters();
  for (std::size_t i = 0; i < got.size(); ++i) {
    Tensor want = local[i].second.grad().to(DType::f32);
    g->all_reduce(want, ReduceOp::avg);  // f32 average of the bf16 local gradients
    EXPECT_EQ(got[i].second.grad().dtype(), DType::bf16);
    EXPECT_CLOSE(got[i].second.grad().to(DType::f32), want.to(DType::bf16).to(DType::f32), 0, 0) << got[i].first;
  }
}

namespace {
struct TwoHeads : nn::Module {
  TwoHeads() {
    used = register_module("used", std::make_shared<nn::Linear>(3, 2));
    unused = register_module("unused", std::make_shared<nn::Linear>(3, 2));
  }
  std::shared_ptr<nn::Linear> used, unused;
};
}  // namespace

TEST(DDP, UnusedParameterIsAnErrorNamingIt) {
  manual_seed(3);
  auto m = std::make_shared<TwoHeads>();
  dist::DistributedDataParallel ddp(m, W());
  sum(m->used->forward(ones({2, 3}))).backward();
  const std::string msg = error_message([&] { ddp.finish(); });
  EXPECT_NE(msg.find("'unused.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'unused.bias'"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("'used.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no gradient"), std::string::npos) << msg;
  // the wrapper is usable again for a step that uses everything
  m->zero_grad();
  sum(add(m->used->forward(ones({2, 3})), m->unused->forward(ones({2, 3})))).backward();
  ddp.finish();
  EXPECT_CLOSE(m->unused->bias.grad(), full({2}, 2.0), 0, 0);
}

TEST(DistributedSampler, RanksShareTheEpochDisjointlyAndEqually) {
  auto g = W();
  const int n = g->size(), r = g->rank();
  for (bool drop_last : {false, true}) {
    SCOPED_TRACE(drop_last ? "drop_last" : "pad");
    const int64_t len = 10 * n + 1;  // not a multiple of the world size
    auto base = data::random_sampler(len, 5);
    dist::DistributedSampler s(base, r, n, drop_last);
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      auto mine = s.indices(epoch);
      const int64_t per = drop_last ? 10 : 11;
      ASSERT_EQ(static_cast<int64_t>(mine.size()), per);
      // gather every rank's share: together they are the base order (padded / cut)
      Tensor all = zeros({n, per}, DType::i64);
      g->all_gather(all, from_vector(mine, {per}));
      auto got = all.to_vector();
      auto order = base->indices(epoch);
      for (int q = 0; q < n; ++q)
        for (int64_t k = 0; k < per; ++k) {
          const int64_t pos = k * n + q;
          EXPECT_EQ(got[q * per + k], static_cast<double>(order[pos % len]));
        }
    }
    EXPECT_NE(s.indices(0), s.indices(1));  // reshuffled per epoch
  }
  EXPECT_THROW(dist::DistributedSampler(data::sequential_sampler(4), n, n), Error);
}

// The backend of CUDA tensors (dist.backend): what auto picks, and the errors given before any
// work for what cannot run here.
TEST(Backend, ResolutionAndItsErrors) {
  using dist::Backend;
  EXPECT_EQ(dist::resolve_backend(Backend::mpi, Device::cuda(0)), Backend::mpi);
  EXPECT_EQ(dist::resolve_backend(Backend::automatic, Device::cpu()), Backend::mpi);
  std::string msg = error_message([] { dist::resolve_backend(Backend::nccl, Device::cpu()); });
  EXPECT_NE(msg.find("nccl moves CUDA tensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
  int gpus = 0;
#if ATHANOR_HAS_CUDA
  gpus = cuda::device_count();
#endif
  // Every rank names cuda:0 here: its own GPU only when there is one rank.
  const bool nccl_fits = dist::nccl_built() && gpus > 0 && W()->size() == 1;
  EXPECT_EQ(dist::resolve_backend(Backend::automatic, Device::cuda(0)), nccl_fits ? Backend::nccl : Backend::mpi);
  if (!nccl_fits) {
    msg = error_message([] { dist::resolve_backend(Backend::nccl, Device::cuda(0)); });
    EXPECT_NE(msg.find(dist::nccl_built() ? "one GPU of its own per process" : "this build has no NCCL"), std::string::npos) << msg;
    if (dist::nccl_built()) {
      EXPECT_NE(msg.find(gpus == 0 ? "rank 0 has no cuda:0" : "ranks 0 and 1 drive the same GPU"), std::string::npos) << msg;
    }
  }
  EXPECT_EQ(std::string(dist::backend_name(Backend::automatic)), "auto");
  EXPECT_EQ(dist::nccl_version().empty(), !dist::nccl_built());
  // A group without a communicator: CPU tensors through MPI; no NCCL before init_nccl.
  EXPECT_FALSE(W()->uses_nccl());
  EXPECT_EQ(W()->backend_for(ones({1})), "mpi");
  if (!dist::nccl_built() || gpus == 0) {
    // Every rank fails alike, before the bootstrap's broadcast (no collective is left dangling).
    msg = error_message([] { W()->init_nccl(0); });
    EXPECT_NE(msg.find(dist::nccl_built() ? "cuda" : "this build has no NCCL"), std::string::npos) << msg;
    EXPECT_FALSE(W()->uses_nccl());
    W()->barrier();
  }
}

TEST(Backend, TrainerRefusesNcclForCpuTraining) {
  const auto c = train::Config::parse("model: {type: gpt}\n", "gpt.yaml", {"dist.backend=nccl", "trainer.device=cpu"});
  const std::string msg = error_message([&] { train::ParallelContext::check_config(c); });
  EXPECT_NE(msg.find("dist.backend is nccl but trainer.device is cpu"), std::string::npos) << msg;
  const auto bad = error_message([] { train::Config::parse("model: {type: gpt}\n", "gpt.yaml", {"dist.backend=gloo"}); });
  EXPECT_NE(bad.find("nccl"), std::string::npos) << "the allowed values name nccl: " << bad;
}

// ---------------------------------------------------------------------------
namespace {

// Rank 1 skips collective #4 of the dp group and then hangs outside any collective.
int scenario_skip() {
  dist::DeviceMesh mesh(dist::world_size());
  auto dp = mesh.dp();
  Tensor t = ones({256});
  for (int i = 1; i <= 3; ++i) dp->all_reduce(t);
  if (dp->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(120));  // never reaches #4 in time
    return 0;
  }
  dp->all_reduce(t);  // #4: must time out and abort every rank
  std::fprintf(stderr, "rank %d: collective #4 completed although rank 1 skipped it\n", dp->rank());
  return 0;
}

// 4 ranks, mesh dp=2 x tp=2 (tp groups {0,1} and {2,3}): rank 1 skips world
// collective #4 and waits in a barrier of its tp group instead. Rank 0 (in the
// world all_reduce) and rank 1 (in the tp barrier) both time out; either names
// the other: world #4 -> [1] (rank 1 answers the probe from inside the tp
// barrier), tp barrier #1 -> [0].
int scenario_other_group() {
  auto g = W();
  dist::DeviceMesh mesh(2, 2, 1);
  Tensor t = ones({8});
  for (int i = 1; i <= 3; ++i) g->all_reduce(t);
  if (g->rank() == 1) {
    mesh.tp()->barrier();
    return 0;
  }
  g->all_reduce(t);
  std::fprintf(stderr, "rank %d: collective #4 completed although rank 1 skipped it\n", g->rank());
  return 0;
}

// Rank 1 dies (SIGKILL) before collective #3.
int scenario_die() {
  auto g = W();
  Tensor t = ones({256});
  for (int i = 1; i <= 2; ++i) g->all_reduce(t);
  if (g->rank() == 1) std::raise(SIGKILL);
  g->all_reduce(t);
  std::fprintf(stderr, "rank %d: collective #3 completed although rank 1 died\n", g->rank());
  return 0;
}

}  // namespace
}  // namespace athanor

int main(int argc, char** argv) {
  athanor::dist::init_from_mpi(&argc, &argv);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--scenario=skip") == 0) {
      const int rc = athanor::scenario_skip();
      athanor::dist::finalize();
      return rc;
    }
    if (std::strcmp(argv[i], "--scenario=other_group") == 0) {
      const int rc = athanor::scenario_other_group();
      athanor::dist::finalize();
      return rc;
    }
    if (std::strcmp(argv[i], "--scenario=die") == 0) {
      const int rc = athanor::scenario_die();
      athanor::dist::finalize();
      return rc;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  athanor::dist::finalize();
  return rc;
}
