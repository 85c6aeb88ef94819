// Tensor-parallel tests: run under `mpirun --oversubscribe -np 2|4` (tests/CMakeLists.txt).
// Unless a test builds another mesh, the tp group is the whole world (tp = 2 or 4). The
// references are one process's: nn::GPT, nn::Linear, nn::Embedding and cross_entropy, built
// in every rank from the same seed, in f64.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/allocator.h"
#include "athanor/core/rng.h"
#include "athanor/dist/comm_ledger.h"
#include "athanor/dist/device_mesh.h"
#include "athanor/dist/tensor_parallel_dropout.h"
#include "athanor/dist/tensor_parallel_gpt.h"
#include "athanor/dist/vocab_parallel_cross_entropy.h"
#include "athanor/dist/zero.h"
#include "athanor/nn/gpt.h"
#include "athanor/ops.h"
#include "athanor/ops/autocast.h"
#include "athanor/optim/clip.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
using dist::GroupPtr;

namespace {

// dp 1 x tp world (created once: a mesh is a collective).
const dist::DeviceMesh& tp_mesh() {
  static const dist::DeviceMesh mesh = dist::DeviceMesh::from_sizes(dist::world_size());
  return mesh;
}
GroupPtr TP() { return tp_mesh().tp(); }

// Token ids in [0, V) from a private generator: the same on every rank.
Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Generator g(seed);
  return randint(0, V, {B, T}, g);
}

// The logical tensor of a local one (a collective over `tp`).
Tensor logical(const Tensor& local, const dist::ShardSpec& s, const GroupPtr& tp) { return dist::gather_shards(local, s, *tp); }

nn::GPTConfig tiny_gpt(int64_t n_layer = 2, bool ckpt = false, double dropout = 0.0) {
  // vocab 67: not a multiple of 128·tp, so the vocabulary is padded (to 256 at tp 2, 512 at tp 4).
  return nn::GPTConfig{.n_layer = n_layer, .n_head = 4, .n_embd = 32, .block_size = 16, .vocab_size = 67,
                       .dropout = dropout, .bias = true, .gradient_checkpointing = ckpt};
}

struct ModelPair {
  std::shared_ptr<nn::GPT> ref;
  std::shared_ptr<dist::TensorParallelGPT> tp;
};
ModelPair make_pair_f64(const nn::GPTConfig& c, dist::TensorParallelOptions o, const GroupPtr& tp = TP()) {
  ModelPair p;
  manual_seed(31);
  p.ref = std::make_shared<nn::GPT>(c);
  manual_seed(31);
  p.tp = std::make_shared<dist::TensorParallelGPT>(c, tp, o);
  p.ref->to(DType::f64);
  p.tp->to(DType::f64);
  return p;
}


// A DataParallel over the mesh's dp group with the tensor-parallel options (the gradient
// reduction a run does: DDP over dp, the sequence-parallel sums over tp).
std::unique_ptr<dist::DataParallel> wrap(const std::shared_ptr<dist::TensorParallelGPT>& m, const dist::DeviceMesh& mesh,
                                         int stage = 0) {
  dist::DataParallelOptions o;
  o.zero_stage = stage;
  o.tp_group = mesh.tp();
  o.tp_specs = m->shard_specs();
  return std::make_unique<dist::DataParallel>(
      m, mesh.dp(), [](const optim::NamedTensors& owned) { return optim::make_adamw(optim::default_param_groups(owned, 1e-3, 0.1)); },
      o);
}

// Every parameter's gradient, gathered to its logical shape, against the 1-process one.
void expect_same_grads(dist::TensorParallelGPT& tp, nn::GPT& ref, double tol) {
  std::map<std::string, Tensor> want;
  for (auto& [n, p] : ref.named_parameters()) want[n] = p.grad();
  int checked = 0;
  for (auto& [n, p] : tp.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << n;
    const dist::ShardSpec s = dist::spec_of(tp.shard_specs(), n);
    Tensor got = logical(p.grad(), s, tp.tp());
    ASSERT_TRUE(want.count(n)) << n;
    EXPECT_TRUE(all_close(got, want[n], tol, tol)) << n << " (" << s.describe() << ")";
    if (s.sharded() && s.padded != s.logical) {  // the padding rows of the vocabulary get no gradient
      const int64_t real = s.real_rows(s.index), rows = p.grad().size(0);
      for (int64_t r = real; r < rows; ++r)
        for (double v : make_view(p.grad(), {p.grad().size(1)}, {1}, r * p.grad().size(1)).to_vector()) ASSERT_EQ(v, 0.0) << n;
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(want.size()));
}

}  // namespace

// ---- mesh

TEST(TensorParallel, MeshLayoutIsMegatronOrder) {
  const int n = dist::world_size();
  for (int tp : {1, 2}) {
    if (n % tp) continue;
    auto mesh = dist::DeviceMesh::from_sizes(tp);
    EXPECT_EQ(mesh.tp_size(), tp);
    EXPECT_EQ(mesh.dp_size(), n / tp);
    EXPECT_EQ(mesh.pp_size(), 1);
    const int r = dist::rank();
    EXPECT_EQ(mesh.tp_index(), r % tp);
    EXPECT_EQ(mesh.dp_index(), r / tp);
    EXPECT_EQ(mesh.world_rank(mesh.dp_index(), mesh.tp_index(), 0), r);
    // A tp group is consecutive ranks; a dp group strides by tp.
    std::vector<int> tp_ranks = mesh.ranks("tp"), dp_ranks = mesh.ranks("dp");
    for (int i = 0; i < tp; ++i) EXPECT_EQ(tp_ranks[i], (r / tp) * tp + i);
    for (int i = 0; i < n / tp; ++i) EXPECT_EQ(dp_ranks[i], i * tp + r % tp);
    EXPECT_EQ(mesh.group("tp")->size(), tp);
    EXPECT_EQ(mesh.group("dp")->dimension(), "dp");
    EXPECT_EQ(mesh.group("pp")->size(), 1);
    // The groups really are those ranks: the sum of world ranks over each.
    Tensor t = from_vector(std::vector<double>{static_cast<double>(r)}, {1}, TensorOptions(DType::f64));
    mesh.tp()->all_reduce(t);
    EXPECT_EQ(t.item(), std::accumulate(tp_ranks.begin(), tp_ranks.end(), 0.0));
    EXPECT_NE(error_message([&] { (void)mesh.group("xp"); }).find("the dimensions are dp, tp and pp"), std::string::npos);
  }
}

TEST(TensorParallel, MeshRejectsWorldSizesTheLayoutDoesNotDivide) {
  const int n = dist::world_size();
  const std::string msg = error_message([&] { dist::DeviceMesh::from_sizes(3, 1); });
  EXPECT_NE(msg.find("the world size " + std::to_string(n) + " is not divisible by tp x pp = 3 x 1 = 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
  const std::string msg2 = error_message([&] { dist::DeviceMesh::from_sizes(1, n + 1); });
  EXPECT_NE(msg2.find("not divisible by tp x pp = 1 x " + std::to_string(n + 1)), std::string::npos) << msg2;
}

// ---- f and g, the layers

TEST(TensorParallel, ColumnThenRowParallelEqualsTwoLinears) {
  for (bool sp : {false, true}) {
    const int64_t B = 2, T = 8, d = 12, h = 16;
    manual_seed(5);
    auto l1 = std::make_shared<nn::Linear>(d, h);
    auto l2 = std::make_shared<nn::Linear>(h, d);
    manual_seed(5);
    auto c = std::make_shared<dist::ColumnParallelLinear>(d, h, TP(), dist::ColumnParallelLinear::Options{.sequence_parallel = sp});
    auto r = std::make_shared<dist::RowParallelLinear>(h, d, TP(), dist::RowParallelLinear::Options{.sequence_parallel = sp});
    for (nn::Module* m : std::initializer_list<nn::Module*>{l1.get(), l2.get(), c.get(), r.get()}) m->to(DType::f64);
    Tensor x = randn64({B, T, d}, 77);
    Tensor y_ref = l2->forward(tanh(l1->forward(x)));
    Tensor dy = randn64({B, T, d}, 78, false);
    y_ref.backward(dy);
    Tensor x_ref_grad = x.grad();
    x.set_grad(Tensor());
    // Sequence parallel: this rank's slice of the sequence in and out.
    Tensor xin = sp ? dist::split_along(x, *TP(), 1).requires_grad_(true) : x;
    Tensor y = r->forward(tanh(c->forward(xin)));
    EXPECT_TRUE(all_close(sp ? dist::all_gather_along(y, *TP(), 1) : y, y_ref, 1e-12, 1e-12)) << "sp " << sp;
    y.backward(sp ? dist::split_along(dy, *TP(), 1) : dy);
    Tensor dx = sp ? dist::all_gather_along(xin.grad(), *TP(), 1) : x.grad();
    EXPECT_TRUE(all_close(dx, x_ref_grad, 1e-12, 1e-12)) << "sp " << sp;
    auto cs = c->local_shard_specs(), rs = r->local_shard_specs();
    EXPECT_TRUE(all_close(logical(c->weight.grad(), cs["weight"], TP()), l1->weight.grad(), 1e-12, 1e-12));
    EXPECT_TRUE(all_close(logical(c->bias.grad(), cs["bias"], TP()), l1->bias.grad(), 1e-12, 1e-12));
    EXPECT_TRUE(all_close(logical(r->weight.grad(), rs["weight"], TP()), l2->weight.grad(), 1e-12, 1e-12));
    Tensor rb = r->bias.grad().clone();
    if (sp) TP()->all_reduce(rb);  // the bias saw this rank's slice of the sequence only
    EXPECT_TRUE(all_close(rb, l2->bias.grad(), 1e-12, 1e-12)) << "sp " << sp;
  }
}

TEST(TensorParallel, ColumnGatherOutputAndRowSplitInputEqualLinear) {
  // The layers' other modes: a column-parallel layer that gathers its output columns, a
  // row-parallel layer that splits a full input itself; each equals one nn::Linear.
  manual_seed(8);
  nn::Linear a(6, 8), b(8, 6);
  manual_seed(8);
  dist::ColumnParallelLinear ca(6, 8, TP(), {.gather_output = true});
  dist::RowParallelLinear rb(8, 6, TP(), {.input_is_parallel = false});
  for (nn::Module* m : std::initializer_list<nn::Module*>{&a, &b, &ca, &rb}) m->to(DType::f64);
  Tensor x = randn64({5, 6}, 2);
  Tensor y_ref = b.forward(a.forward(x));
  Tensor dy = randn64({5, 6}, 3, false);
  y_ref.backward(dy);
  Tensor gx = x.grad().clone();
  x.set_grad(Tensor());
  Tensor h = ca.forward(x);
  EXPECT_EQ(h.size(1), 8);  // gathered: every column on every rank
  Tensor y = rb.forward(h);
  EXPECT_TRUE(all_close(y, y_ref, 1e-13, 1e-13));
  y.backward(dy);
  EXPECT_TRUE(all_close(x.grad(), gx, 1e-13, 1e-13));
  EXPECT_TRUE(all_close(logical(ca.weight.grad(), ca.local_shard_specs()["weight"], TP()), a.weight.grad(), 1e-13, 1e-13));
  EXPECT_TRUE(all_close(logical(rb.weight.grad(), rb.local_shard_specs()["weight"], TP()), b.weight.grad(), 1e-13, 1e-13));
}

TEST(TensorParallel, FAndGAreConjugate) {
  // <g(f(x)·w_r), u> = <x, f*(g*(u))·w_r>: f's backward is g's forward and vice versa.
  const int t = TP()->size(), r = TP()->rank();
  Tensor x = randn64({3, 5}, 1);
  Tensor w = full({3, 5}, 1.0 + r, TensorOptions(DType::f64));
  dist::comm_ledger().reset();
  Tensor y = dist::reduce_from_tensor_parallel_region(mul(dist::copy_to_tensor_parallel_region(x, TP()), w), TP());
  // forward: y = x · Σ_r (1 + r)
  const double s = t * (t + 1) / 2.0;
  EXPECT_TRUE(all_close(y, mul(x.detach(), s), 1e-14, 1e-14));
  y.backward(ones({3, 5}, TensorOptions(DType::f64)));
  EXPECT_TRUE(all_close(x.grad(), full({3, 5}, s, TensorOptions(DType::f64)), 1e-14, 1e-14));
  auto ops = dist::comm_ledger().by_dimension_and_op()["tp"];
  EXPECT_EQ(ops["all_reduce"].ops, 2);  // g in forward, f in backward
  EXPECT_EQ(ops["all_reduce"].bytes, 2u * 15 * 8);
  EXPECT_DOUBLE_EQ(ops["all_reduce"].wire_bytes, 2 * 2.0 * (t - 1) / t * 15 * 8);  // a ring all-reduce moves 2(t-1)/t of the tensor
  EXPECT_GT(ops["all_reduce"].seconds, 0.0);
  const auto recs = dist::comm_ledger().records();
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].group, "tp");
  EXPECT_EQ(recs[0].dimension, "tp");
  EXPECT_EQ(recs[0].group_size, t);
  EXPECT_TRUE(recs[0].completed);
  EXPECT_NE(recs[0].call_site.find("tensor_parallel_mappings.cpp"), std::string::npos) << recs[0].call_site;
}

TEST(TensorParallel, VocabParallelEmbeddingEqualsEmbedding) {
  const int64_t V = 67, d = 8;
  manual_seed(9);
  nn::Embedding ref(V, d);
  manual_seed(9);
  dist::VocabParallelEmbedding emb(V, d, TP());
  ref.to(DType::f64);
  emb.to(DType::f64);
  EXPECT_EQ(emb.padded, 128 * TP()->size());
  const auto spec = emb.local_shard_specs()["weight"];
  EXPECT_TRUE(all_close(logical(emb.weight, spec, TP()), ref.weight, 0, 0));  // the same init, exactly
  Tensor ids = random_ids(3, 7, V, 4);
  Tensor dy = randn64({3, 7, d}, 5, false);
  Tensor y = emb.forward(ids), y_ref = ref.forward(ids);
  EXPECT_TRUE(all_close(y, y_ref, 0, 0));
  y.backward(dy);
  y_ref.backward(dy);
  EXPECT_TRUE(all_close(logical(emb.weight.grad(), spec, TP()), ref.weight.grad(), 1e-14, 1e-14));
  EXPECT_NE(error_message([&] { emb.forward(from_vector(std::vector<int64_t>{0, 67}, {1, 2})); }).find("outside the vocabulary"),
            std::string::npos);
}

TEST(TensorParallel, VocabParallelCrossEntropyEqualsCrossEntropy) {
  const int t = TP()->size();
  const int64_t N = 9, V = 37, Vl = (V + t - 1) / t + 1;  // one padding column at least on the last rank
  Tensor full_logits = randn64({N, Vl * t}, 11, false);
  std::vector<int64_t> tv(N);
  for (int64_t n = 0; n < N; ++n) tv[n] = (n * 7) % V;
  tv[3] = -100;  // ignored
  Tensor target = from_vector(tv, {N});
  Tensor ref_in = narrow(full_logits, 1, 0, V).contiguous().requires_grad_(true);
  for (Reduction red : {Reduction::mean, Reduction::sum, Reduction::none}) {
    Tensor ref = cross_entropy(ref_in, target, -100, 0.0, red);
    Tensor local = narrow(full_logits, 1, TP()->rank() * Vl, Vl).contiguous().requires_grad_(true);
    dist::comm_ledger().reset();
    Tensor got = dist::vocab_parallel_cross_entropy(local, target, V, TP(), -100, red);
    auto ops = dist::comm_ledger().by_dimension_and_op()["tp"];
    EXPECT_EQ(ops.size(), 1u);
    EXPECT_EQ(ops.at("all_reduce").ops, 3);  // max, sum of exps, target logit: N values each
    EXPECT_EQ(ops.at("all_reduce").bytes, 3u * N * 8);
    EXPECT_TRUE(all_close(got, ref, 1e-13, 1e-13));
    Tensor w = red == Reduction::none ? randn64({N}, 3, false) : scalar_tensor(1.7, TensorOptions(DType::f64));
    ref_in.set_grad(Tensor());
    ref.backward(w);
    dist::comm_ledger().reset();
    got.backward(w);
    EXPECT_TRUE(dist::comm_ledger().by_dimension().empty());  // no communication in backward
    Tensor g_all = dist::all_gather_along(local.grad(), *TP(), 1);
    EXPECT_TRUE(all_close(narrow(g_all, 1, 0, V), ref_in.grad(), 1e-13, 1e-13));
    for (double v : narrow(g_all, 1, V, Vl * t - V).contiguous().to_vector()) EXPECT_EQ(v, 0.0);  // padding columns
  }
  EXPECT_NE(error_message([&] { dist::vocab_parallel_cross_entropy(zeros({1, Vl}, DType::f64), from_vector(std::vector<int64_t>{V}, {1}), V, TP()); })
                .find("out of range for a vocabulary of 37"),
            std::string::npos);
}

// ---- the GPT: forward loss and every gradient equal to one process (f64)

TEST(TensorParallel, GPTInitialisationEqualsOneProcess) {
  const nn::GPTConfig c = tiny_gpt();
  manual_seed(31);
  nn::GPT ref(c);
  const GeneratorState after_ref = default_generator().state();
  manual_seed(31);
  dist::TensorParallelGPT tp(c, TP(), {});
  EXPECT_EQ(default_generator().state(), after_ref);  // the generator advanced as in one process
  const nn::StateDict logical_sd = tp.logical_state_dict();
  const nn::StateDict want = ref.state_dict();
  ASSERT_EQ(logical_sd.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(logical_sd[i].first, want[i].first);
    EXPECT_TRUE(all_close(logical_sd[i].second, want[i].second, 0, 0)) << want[i].first;
  }
  EXPECT_EQ(tp.logical_parameters_count(), ref.parameters_count());
  // And back: another model loads the logical state, each rank its shard.
  manual_seed(99);
  dist::TensorParallelGPT other(c, TP(), {});
  other.load_logical_state_dict(want);
  const nn::StateDict again = other.logical_state_dict();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(all_close(again[i].second, want[i].second, 0, 0)) << want[i].first;
  EXPECT_NE(error_message([&] { other.load_logical_state_dict(tp.state_dict()); }).find("expects 67 rows in dim 0"), std::string::npos);
}

struct GradCase {
  bool sp, regather, ckpt;
};

TEST(TensorParallel, GPTLossAndEveryGradientEqualOneProcessF64) {
  const int64_t B = 3, T = 16;
  for (GradCase gc : {GradCase{false, true, false}, GradCase{true, true, false}, GradCase{true, false, false},
                      GradCase{false, true, true}, GradCase{true, true, true}}) {
    SCOPED_TRACE("sequence_parallel " + std::to_string(gc.sp) + " regather " + std::to_string(gc.regather) + " checkpointing " +
                 std::to_string(gc.ckpt));
    ModelPair p = make_pair_f64(tiny_gpt(2, gc.ckpt), {.sequence_parallel = gc.sp, .regather = gc.regather});
    auto dp = wrap(p.tp, tp_mesh());
    Tensor ids = random_ids(B, T, 67, 100), tgt = random_ids(B, T, 67, 101);
    Tensor l_ref = p.ref->loss(ids, tgt);
    l_ref.backward();
    Tensor l = p.tp->loss(ids, tgt);
    EXPECT_NEAR(l.item(), l_ref.item(), 1e-10 * std::fabs(l_ref.item()));
    l.backward();
    dp->finish_backward();  // sums the sequence-parallel replicated gradients over tp
    expect_same_grads(*p.tp, *p.ref, 1e-10);
    // The global gradient norm counts each shard once and each replicated parameter once.
    EXPECT_NEAR(dp->grad_norm(), optim::grad_norm(p.ref->parameters()), 1e-10);
  }
}

TEST(TensorParallel, DropoutMasksAreThoseOfOneProcess) {
  // Outside tp regions every rank draws the replicated stream; on a sequence-parallel slice
  // it draws its part of the logical mask: both equal one process's masks.
  const int64_t B = 2, T = 16;
  for (bool sp : {false, true}) {
    ModelPair p = make_pair_f64(tiny_gpt(2, false, 0.1), {.sequence_parallel = sp});
    auto dp = wrap(p.tp, tp_mesh());
    Tensor ids = random_ids(B, T, 67, 7), tgt = random_ids(B, T, 67, 8);
    manual_seed(1234);
    Tensor l_ref = p.ref->loss(ids, tgt);
    l_ref.backward();
    manual_seed(1234);
    Tensor l = p.tp->loss(ids, tgt);
    l.backward();
    dp->finish_backward();
    EXPECT_NEAR(l.item(), l_ref.item(), 1e-10 * std::fabs(l_ref.item())) << "sp " << sp;
    expect_same_grads(*p.tp, *p.ref, 1e-10);
  }
}

TEST(TensorParallel, RegionDropoutDrawsAPerRankStream) {
  const int t = TP()->size();
  Tensor x = ones({4, 64}, TensorOptions(DType::f64));
  manual_seed(3);
  Tensor a = dist::tensor_parallel_region_dropout(x, 0.5, true, TP()->rank());
  const GeneratorState after = default_generator().state();
  manual_seed(3);
  Tensor b = dist::tensor_parallel_region_dropout(x, 0.5, true, TP()->rank());
  EXPECT_TRUE(all_close(a, b, 0, 0));  // deterministic given (seed, rank)
  // The replicated stream advanced by the same amount on every rank.
  Tensor off = from_vector(std::vector<double>{static_cast<double>(after.offset)}, {1}, TensorOptions(DType::f64));
  Tensor mx = off.clone();
  TP()->all_reduce(mx, dist::ReduceOp::max);
  EXPECT_EQ(mx.item(), off.item());
  // Different ranks, different masks (and none equal to the replicated stream's).
  Tensor all = dist::all_gather_along(reshape(a, {1, 4, 64}), *TP(), 0);
  for (int i = 0; i < t; ++i)
    for (int j = i + 1; j < t; ++j) EXPECT_FALSE(all_close(narrow(all, 0, i, 1), narrow(all, 0, j, 1), 0, 0)) << i << " " << j;
  manual_seed(3);
  Tensor rep = dropout(x, 0.5, true);
  EXPECT_FALSE(all_close(a, rep, 0, 0));
  // The stream of rank r is the one sequence_parallel_dropout / dropout do not use (stream 1 + r).
  EXPECT_NEAR(a.mean().item(), 1.0, 0.25);
}

// ---- composition with data parallelism (DDP, ZeRO 1/2/3 on the dp dimension)

TEST(TensorParallel, ComposesWithDataParallelAndZero) {
  const int n = dist::world_size();
  const int tp = 2, dp = n / tp;
  auto mesh = dist::DeviceMesh::from_sizes(tp);
  const int64_t B = 4, T = 16;  // global batch: dp ranks take B/dp rows each
  Tensor ids = random_ids(B, T, 67, 200), tgt = random_ids(B, T, 67, 201);
  for (int stage : {0, 1, 2, 3}) {
    for (bool sp : {false, true}) {
      SCOPED_TRACE("zero_stage " + std::to_string(stage) + " sequence_parallel " + std::to_string(sp));
      ModelPair p = make_pair_f64(tiny_gpt(), {.sequence_parallel = sp}, mesh.tp());
      auto ref_opt = optim::make_adamw(optim::default_param_groups(p.ref->named_parameters(), 1e-3, 0.1));
      p.ref->loss(ids, tgt).backward();
      const double ref_norm = optim::clip_grad_norm(p.ref->parameters(), 0.05);
      ref_opt->step();

      dist::DataParallelOptions o;
      o.zero_stage = stage;
      o.tp_group = mesh.tp();
      o.tp_specs = p.tp->shard_specs();
      if (stage == 3) o.shard_modules = p.tp->shard_units();
      dist::DataParallel d(p.tp, mesh.dp(), [](const optim::NamedTensors& owned) {
        return optim::make_adamw(optim::default_param_groups(owned, 1e-3, 0.1));
      }, o);
      const int64_t rows = B / dp, r0 = mesh.dp_index() * rows;
      p.tp->loss(narrow(ids, 0, r0, rows).contiguous(), narrow(tgt, 0, r0, rows).contiguous()).backward();
      d.finish_backward();
      EXPECT_NEAR(d.clip_grad_norm(0.05), ref_norm, 1e-10);
      d.step();
      const nn::StateDict local = d.full_state_dict();  // this tp rank's shards (stage 3 gathers over dp)
      std::map<std::string, Tensor> want;
      for (auto& [name, t] : p.ref->state_dict()) want[name] = t;
      for (auto& [name, t] : local)
        EXPECT_TRUE(all_close(logical(t, dist::spec_of(p.tp->shard_specs(), name), mesh.tp()), want.at(name), 1e-10, 1e-10)) << name;
    }
  }
}

TEST(TensorParallel, ANonFiniteShardIsSeenByEveryRank) {
  // One rank's shard gradient overflows (a hook replaces it with inf before it is accumulated,
  // as an f16 overflow in that rank's GEMM would): the gradient norm, which the trainer's
  // found_inf reads, is non-finite on every rank of every group, so all skip the step together.
  auto mesh = dist::DeviceMesh::from_sizes(2);
  for (int stage : {0, 1, 2}) {
    ModelPair p = make_pair_f64(tiny_gpt(), {}, mesh.tp());
    auto d = wrap(p.tp, mesh, stage);
    if (dist::rank() == dist::world_size() - 1)  // one tp rank of one dp group
      for (auto& [n, t] : p.tp->named_parameters())
        if (n == "transformer.h.1.mlp.c_fc.weight") t.register_hook([](const Tensor& g) { return full(g.sizes(), INFINITY, TensorOptions(g.dtype())); });
    p.tp->loss(random_ids(2, 16, 67, 1), random_ids(2, 16, 67, 2)).backward();
    d->finish_backward();
    EXPECT_FALSE(std::isfinite(d->grad_norm())) << "zero_stage " << stage;
  }
}

// ---- autocast

TEST(TensorParallel, GPTUnderBf16AutocastTracksOneProcess) {
  const int64_t B = 2, T = 16;
  for (bool sp : {false, true}) {
    manual_seed(31);
    nn::GPT ref(tiny_gpt());
    manual_seed(31);
    auto tp = std::make_shared<dist::TensorParallelGPT>(tiny_gpt(), TP(), dist::TensorParallelOptions{.sequence_parallel = sp});
    auto dp = wrap(tp, tp_mesh());
    Tensor ids = random_ids(B, T, 67, 300), tgt = random_ids(B, T, 67, 301);
    Tensor l_ref, l;
    {
      autocast ac(DType::bf16);
      l_ref = ref.loss(ids, tgt);
    }
    l_ref.backward();
    {
      autocast ac(DType::bf16);
      l = tp->loss(ids, tgt);
    }
    EXPECT_EQ(l.dtype(), DType::f32);
    l.backward();
    dp->finish_backward();
    // bf16 GEMMs round differently when their sums are split across ranks: close, not equal.
    EXPECT_NEAR(l.item(), l_ref.item(), 2e-3 * std::fabs(l_ref.item())) << "sp " << sp;
    std::map<std::string, Tensor> want;
    for (auto& [n, p] : ref.named_parameters()) want[n] = p.grad();
    for (auto& [n, p] : tp->named_parameters()) {
      ASSERT_EQ(p.grad().dtype(), DType::f32) << n;  // f32 master gradients
      Tensor got = logical(p.grad(), dist::spec_of(tp->shard_specs(), n), TP());
      const double err = std::sqrt(square(sub(got, want[n])).sum().item()), ref_norm = std::sqrt(square(want[n]).sum().item());
      EXPECT_LT(err, 0.05 * ref_norm + 1e-6) << n << " sp " << sp;
    }
  }
}

// ---- the communication ledger against the theory

struct Traffic {
  uint64_t all_reduce = 0, all_gather = 0, reduce_scatter = 0;
  int64_t ar_ops = 0, ag_ops = 0, rs_ops = 0;
};
Traffic tp_traffic() {
  Traffic t;
  const auto by_op = dist::comm_ledger().by_dimension_and_op();
  if (!by_op.count("tp")) return t;
  for (auto& [op, c] : by_op.at("tp")) {
    if (op == "all_reduce") t.all_reduce = c.bytes, t.ar_ops = c.ops;
    else if (op == "all_gather") t.all_gather = c.bytes, t.ag_ops = c.ops;
    else if (op == "reduce_scatter") t.reduce_scatter = c.bytes, t.rs_ops = c.ops;
    else ADD_FAILURE() << "unexpected tp op " << op;
  }
  return t;
}

TEST(TensorParallel, LedgerHoldsTheTrafficToTheTheory) {
  const int t = TP()->size();
  const int64_t B = 2, T = 16, d = 32, L = 2;
  const uint64_t act = B * T * d * 8, ce = 3 * B * T * 8;  // f64 activations; three all-reduces of B·T f64 values
  double wire_tp = 0, wire_sp = 0;
  for (GradCase gc : {GradCase{false, true, false}, GradCase{true, false, false}, GradCase{true, true, false}}) {
    SCOPED_TRACE("sp " + std::to_string(gc.sp) + " regather " + std::to_string(gc.regather));
    ModelPair p = make_pair_f64(tiny_gpt(L), {.sequence_parallel = gc.sp, .regather = gc.regather});
    Tensor ids = random_ids(B, T, 67, 5), tgt = random_ids(B, T, 67, 6);
    dist::comm_ledger().reset();
    p.tp->loss(ids, tgt).backward();
    const Traffic got = tp_traffic();
    double wire = 0;
    const auto by_op = dist::comm_ledger().by_dimension_and_op();
    for (auto& [op, c] : by_op.at("tp")) wire += c.wire_bytes;
    if (!gc.sp) {
      // Per layer and micro-batch 4 all-reduces of B·T·d (g ×2 forward, f ×2 backward); the
      // embedding's g and the lm_head's f; the loss's three of B·T.
      EXPECT_EQ(got.ar_ops, 4 * L + 2 + 3);
      EXPECT_EQ(got.all_reduce, (4 * L + 2) * act + ce);
      EXPECT_EQ(got.ag_ops + got.rs_ops, 0);
      wire_tp = wire;
    } else {
      // Per layer: all-gathers before c_attn and c_fc and reduce-scatters after the c_projs in
      // forward, the conjugates in backward (4 + 4 of B·T·d); the embedding's reduce-scatter
      // and the lm_head's all-gather (and their conjugates); regather: one more all-gather
      // per column-parallel layer (2 per layer, the lm_head) in backward.
      const int64_t extra = gc.regather ? 2 * L + 1 : 0;
      EXPECT_EQ(got.ar_ops, 3);
      EXPECT_EQ(got.all_reduce, ce);
      EXPECT_EQ(got.ag_ops, 4 * L + 2 + extra);
      EXPECT_EQ(got.all_gather, static_cast<uint64_t>(4 * L + 2 + extra) * act);
      EXPECT_EQ(got.rs_ops, 4 * L + 2);
      EXPECT_EQ(got.reduce_scatter, static_cast<uint64_t>(4 * L + 2) * act);
      if (!gc.regather) wire_sp = wire;
    }
  }
  // An all-reduce moves what an all-gather and a reduce-scatter move together: without the
  // backward re-gather, sequence parallelism sends exactly what tensor parallelism sends.
  EXPECT_EQ(wire_sp, wire_tp);
  EXPECT_DOUBLE_EQ(wire_tp, (4 * L + 2) * 2.0 * (t - 1) / t * static_cast<double>(act) + 2.0 * (t - 1) / t * static_cast<double>(ce));
}

// ---- memory: the allocator's tags at tp = 1 and tp = t

struct Bytes {
  int64_t param = 0, grad = 0, optim = 0, replicated_param = 0;
  double act_per_layer = 0;
};
int64_t tag_bytes(MemTag t) { return static_cast<int64_t>(Allocator::cpu().stats().current[static_cast<int>(t)]); }

// Forward activation bytes (what the graph keeps) of an L-layer model, f32.
int64_t activation_bytes(const nn::GPTConfig& c, const GroupPtr& tp, bool sp, const Tensor& ids, const Tensor& tgt) {
  manual_seed(1);
  dist::TensorParallelGPT m(c, tp, {.sequence_parallel = sp});
  const int64_t before = tag_bytes(MemTag::activation);
  Tensor loss;
  {
    MemTagScope tag(MemTag::activation);  // as the trainer's forward
    loss = m.loss(ids, tgt);
  }
  const int64_t held = tag_bytes(MemTag::activation) - before;
  loss.backward();
  return held;
}

Bytes measure_memory(const GroupPtr& tp, bool sp) {
  // vocab 1000 pads to 1024 at tp 1, 2 and 4: the vocabulary shard is exactly 1/tp of it.
  nn::GPTConfig c{.n_layer = 2, .n_head = 4, .n_embd = 64, .block_size = 32, .vocab_size = 1000, .bias = true};
  const int64_t B = 2, T = 32;
  Tensor ids = random_ids(B, T, c.vocab_size, 1), tgt = random_ids(B, T, c.vocab_size, 2);
  Bytes b;
  {
    const int64_t p0 = tag_bytes(MemTag::parameter), g0 = tag_bytes(MemTag::gradient), o0 = tag_bytes(MemTag::optimizer_state);
    manual_seed(1);
    auto m = std::make_shared<dist::TensorParallelGPT>(c, tp, dist::TensorParallelOptions{.sequence_parallel = sp});
    b.param = tag_bytes(MemTag::parameter) - p0;
    for (auto& [n, p] : m->named_parameters())
      if (!dist::spec_of(m->shard_specs(), n).sharded()) b.replicated_param += static_cast<int64_t>(p.nbytes());
    m->loss(ids, tgt).backward();
    b.grad = tag_bytes(MemTag::gradient) - g0;
    auto opt = optim::make_adamw(optim::default_param_groups(m->named_parameters(), 1e-3, 0.1));
    opt->step();
    b.optim = tag_bytes(MemTag::optimizer_state) - o0;
  }
  nn::GPTConfig c4 = c;
  c4.n_layer = 4;
  b.act_per_layer = (activation_bytes(c4, tp, sp, ids, tgt) - activation_bytes(c, tp, sp, ids, tgt)) / 2.0;
  return b;
}

TEST(TensorParallel, MemoryPerRankDropsByTp) {
  const int t = TP()->size();
  auto one = dist::DeviceMesh::from_sizes(1);  // tp = 1: every rank holds the whole model
  const Bytes b1 = measure_memory(one.tp(), false), bt = measure_memory(TP(), false);
  const Bytes s1 = measure_memory(one.tp(), true), st = measure_memory(TP(), true);
  // The split layers' parameters, gradients and AdamW state (2 per parameter): 1/t per rank.
  const int64_t R = b1.replicated_param;
  EXPECT_EQ(bt.replicated_param, R);
  EXPECT_EQ((bt.param - R) * t, b1.param - R);
  EXPECT_EQ((bt.grad - R) * t, b1.grad - R);
  EXPECT_EQ((bt.optim - 2 * R) * t, b1.optim - 2 * R);
  EXPECT_GT(b1.param - R, 5 * R);  // the split layers are most of the model
  // Activations per layer (Korthikanti et al. 2022): tensor parallelism alone splits what lies
  // inside the tp regions and keeps the rest whole: with s·b·h = T·B·d f32 elements, the
  // replicated part is 4 sbh (the inputs of ln_1 and ln_2, and their outputs, which c_attn and
  // c_fc keep) plus the LayerNorms' mean and rstd (2 × 2 × B·T); everything else (q, k, v,
  // the attention output and its log-sum-exp, c_fc's output) is split: A(t) = R + (A(1) - R)/t.
  // (Megatron's sbh(10 + 24/t + 5as/(ht)) in fp16 bytes counts the dropout masks, which athanor
  // recomputes, and the attention matrix, which its flash-style attention never stores.) With
  // sequence parallelism the replicated part is sliced too: the whole layer's activations / t.
  const int64_t B = 2, T = 32, d = 64;
  const double replicated_act = 4.0 * B * T * d * 4 + 2 * 2 * B * T * 4;
  EXPECT_EQ(bt.act_per_layer, replicated_act + (b1.act_per_layer - replicated_act) / t);
  EXPECT_EQ(st.act_per_layer * t, s1.act_per_layer);
  EXPECT_EQ(s1.act_per_layer, b1.act_per_layer);  // at tp 1 sequence parallelism changes nothing
  if (dist::rank() == 0)
    std::printf("[memory] tp %d: params %lld -> %lld B, grads %lld -> %lld B, AdamW state %lld -> %lld B (replicated params %lld B); "
                "activations per layer: tp %.0f -> %.0f B (x%.3f), with sequence parallelism %.0f -> %.0f B (x%.3f)\n",
                t, (long long)b1.param, (long long)bt.param, (long long)b1.grad, (long long)bt.grad, (long long)b1.optim,
                (long long)bt.optim, (long long)R, b1.act_per_layer, bt.act_per_layer, bt.act_per_layer / b1.act_per_layer,
                s1.act_per_layer, st.act_per_layer, st.act_per_layer / s1.act_per_layer);
}

// ---- bad input: a clear Error before any work

TEST(TensorParallel, BadShapesAreClearErrors) {
  const int t = TP()->size();
  nn::GPTConfig c = tiny_gpt();
  c.n_head = t + 1;
  c.n_embd = 12 * (t + 1);
  std::string msg = error_message([&] { dist::TensorParallelGPT m(c, TP(), {}); });
  EXPECT_NE(msg.find("model.n_head (" + std::to_string(t + 1) + ") is not divisible by dist.tp (" + std::to_string(t) + ")"),
            std::string::npos) << msg;
  msg = error_message([&] { dist::VocabParallelEmbedding e(4 * t + 1, 8, TP(), 1); });
  EXPECT_NE(msg.find("the vocabulary of " + std::to_string(4 * t + 1) + " tokens is not divisible by tp = " + std::to_string(t)),
            std::string::npos) << msg;
  c = tiny_gpt();
  c.block_size = 4 * t + 1;
  msg = error_message([&] { dist::TensorParallelGPT m(c, TP(), {.sequence_parallel = true}); });
  EXPECT_NE(msg.find("model.block_size (" + std::to_string(4 * t + 1) + ") must be divisible by dist.tp"), std::string::npos) << msg;
  msg = error_message([&] { dist::ColumnParallelLinear l(8, 3 * t + 1, TP(), {}); });
  EXPECT_NE(msg.find("cannot be split evenly across tp = " + std::to_string(t)), std::string::npos) << msg;
}

// ---- logical <-> local tensors (checkpoints)

TEST(TensorParallel, ShardsAssembleToTheLogicalTensor) {
  for (int count : {2, 3, 4}) {
    for (auto [parts, logical, padded] : std::vector<std::tuple<int, int64_t, int64_t>>{{3, 24, 24}, {1, 67, 128 * count}, {1, 12, 12}}) {
      if ((padded / parts) % count) continue;
      Tensor full = randn64({logical, 5}, 3, false);
      std::vector<Tensor> reals;
      for (int k = 0; k < count; ++k) {
        dist::ShardSpec s{.dim = 0, .parts = parts, .logical = logical, .padded = padded, .index = k, .count = count};
        Tensor local = dist::shard_of(full, s);
        EXPECT_EQ(local.size(0), padded / count);
        reals.push_back(dist::real_part(local, s));
      }
      dist::ShardSpec s{.dim = 0, .parts = parts, .logical = logical, .padded = padded, .index = 0, .count = count};
      EXPECT_TRUE(all_close(dist::assemble_shards(reals, s, full.sizes()), full, 0, 0)) << parts << " " << logical << " " << count;
    }
  }
}

}  // namespace athanor

int main(int argc, char** argv) {
  athanor::dist::init_from_mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  athanor::dist::finalize();
  return rc;
}
