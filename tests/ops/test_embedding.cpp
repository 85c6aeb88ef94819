// embedding (src/ops/embedding.cpp): values, gradients (finite differences and
// a hand-computed scatter-add with repeated ids), padding_idx, low precision,
// determinism across thread counts, the backward kernel vs its reference, and
// the out-of-range error.
#include <omp.h>

#include <cmath>
#include <optional>

#include "backend/cpu/index.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
Tensor ids64(const std::vector<int64_t>& v, const Shape& s) { return from_vector(v, s, DType::i64); }
}  // namespace

TEST(Embedding, ValuesAreRowsOfTheTable) {
  Tensor w = arange(0, 12, DType::f64).reshape({4, 3});  // row r = [3r, 3r+1, 3r+2]
  Tensor ids = ids64({3, 0, 3, 1, 2, 2}, {2, 3});
  Tensor y = embedding(w, ids);
  ASSERT_EQ(y.sizes(), (Shape{2, 3, 3}));
  std::vector<double> want;
  for (int64_t id : {3, 0, 3, 1, 2, 2})
    for (int64_t k = 0; k < 3; ++k) want.push_back(3.0 * id + k);
  EXPECT_EQ(y.to_vector(), want);
  EXPECT_EQ(embedding(w, ids.to(DType::i32)).to_vector(), want);
  EXPECT_EQ(embedding(make_noncontiguous(w), make_noncontiguous(ids)).to_vector(), want);
  // 0-d ids give one row.
  EXPECT_EQ(embedding(w, scalar_tensor(2, DType::i64)).to_vector(), (std::vector<double>{6, 7, 8}));
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    Tensor yl = embedding(w.to(dt), ids);
    EXPECT_EQ(yl.dtype(), dt);
    EXPECT_EQ(yl.to_vector(), want);  // small integers: exact in every dtype
  }
}

TEST(Embedding, Gradcheck) {
  const Tensor ids = ids64({1, 4, 1, 0, 4, 4}, {3, 2});
  for (bool strided : {false, true}) {
    SCOPED_TRACE(strided ? "strided" : "contiguous");
    Tensor w = randn64({5, 3}, 70);
    if (strided) w = make_noncontiguous(w);
    EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return embedding(in[0], ids); }, {w}));
    // A padding_idx that no id uses changes nothing (a used one zeroes that row's gradient on purpose,
    // which finite differences would flag; see BackwardScatterAddsAndSkipsPadding).
    EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return embedding(in[0], ids, 2); }, {w}));
    EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return embedding(in[0], ids.to(DType::i32), -2); }, {w}));
  }
}

TEST(Embedding, BackwardScatterAddsAndSkipsPadding) {
  Tensor w = zeros({4, 2}, DType::f64).requires_grad_();
  Tensor ids = ids64({2, 0, 2, 3, 0}, {5});
  Tensor g = from_vector(std::vector<double>{1, 2, 10, 20, 100, 200, 1000, 2000, 5, 5}, {5, 2}, DType::f64);
  backward({embedding(w, ids)}, {g});
  // row 0: g[1] + g[4]; row 1: never used; row 2: g[0] + g[2]; row 3: g[3]
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{15, 25, 0, 0, 101, 202, 1000, 2000}));
  w.set_grad(Tensor());
  backward({embedding(w, ids, /*padding_idx=*/2)}, {g});
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{15, 25, 0, 0, 0, 0, 1000, 2000}));
  w.set_grad(Tensor());
  backward({embedding(w, ids, /*padding_idx=*/-1)}, {g});  // -1 wraps to row 3
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{15, 25, 0, 0, 101, 202, 0, 0}));
  // The forward still returns the padding row's values (only its gradient is zero).
  Tensor w2 = arange(0, 8, DType::f64).reshape({4, 2});
  EXPECT_EQ(embedding(w2, ids64({3}, {1}), 3).to_vector(), (std::vector<double>{6, 7}));
}

TEST(Embedding, LowPrecisionGradientAccumulatesInF32) {
  Tensor w = zeros({3, 2}, DType::bf16).requires_grad_();
  Tensor ids = ids64({1, 1, 1}, {3});
  backward({embedding(w, ids)}, {from_vector(std::vector<double>{256, 256, 1, 1, 1, 1}, {3, 2}, DType::bf16)});
  EXPECT_EQ(w.grad().dtype(), DType::bf16);
  // 256 + 1 + 1 = 258 is a bf16 value, but bf16 accumulation would round 257 back to 256.
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{0, 0, 258, 258, 0, 0}));
}

TEST(Embedding, BackwardKernelMatchesReferenceAndIsDeterministic) {
  // Tolerance: exact. Fast and reference add each row's contributions in the same
  // (increasing position) order, so the f32 sums are bit-identical; the fast
  // kernel's grouping by id makes the result independent of the thread count.
  Generator gen(11);
  const int64_t num = 1000, dim = 48, n = 40000;  // 1.9e6 gradient elements, ~40 uses per row
  Tensor w = randn({num, dim}, {}, gen);
  Tensor ids = randint(0, num, {n}, gen);
  Generator wg(12);
  Tensor g = randn({n, dim}, {}, wg);
  std::vector<float> ref(num * dim);
  cpu::ref::index_add_3d<float, int64_t>(g.data_ptr<float>(), ids.data_ptr<int64_t>(), ref.data(), 1, num, n, dim, 7);
  std::vector<std::vector<double>> grads;
  for (int threads : {1, 2, 4}) {
    const int prev = omp_get_max_threads();
    omp_set_num_threads(threads);
    Tensor wr = w.detach().requires_grad_();
    backward({embedding(wr, ids, 7)}, {g});
    omp_set_num_threads(prev);
    grads.push_back(wr.grad().to_vector());
  }
  EXPECT_TRUE(grads[0] == grads[1]);  // bitwise, 1 vs 2 threads
  EXPECT_TRUE(grads[0] == grads[2]);  // 1 vs 4 threads
  for (int64_t i = 0; i < num * dim; ++i) ASSERT_EQ(grads[0][i], static_cast<double>(ref[i])) << "element " << i;
  for (int64_t k = 0; k < dim; ++k) EXPECT_EQ(grads[0][7 * dim + k], 0.0);  // padding row
}

// A table used twice (GPT's tied token embedding / lm_head): the embedding's row-sparse
// gradient is added into the linear's dense one. Reference: the same graph with two untied
// copies of the table, whose gradients are summed afterwards (exactly what the engine did
// before with a dense embedding gradient); tolerance: exact (same sums in the same order).
TEST(Embedding, TiedTableGradientEqualsTheSumOfUntiedGradients) {
  const int64_t V = 37, C = 16;
  Tensor ids = ids64({3, 5, 3, 0, 36, 5, 5, 12, 3, 9}, {2, 5});
  Generator gen(21);
  Tensor table = randn({V, C}, {}, gen);
  Generator gg(22);
  Tensor g = randn({2, 5, V}, {}, gg);
  for (std::optional<int64_t> pad : {std::optional<int64_t>{}, std::optional<int64_t>{5}}) {
    SCOPED_TRACE(pad ? "padding_idx 5" : "no padding");
    Tensor w = table.detach().requires_grad_();
    Tensor we = table.detach().requires_grad_(), wl = table.detach().requires_grad_();
    std::vector<double> before(V * C, 0.0);
    for (int pass = 0; pass < 2; ++pass) {  // second pass: accumulation into an existing .grad
      backward({linear(embedding(w, ids, pad), w)}, {g});
      we.set_grad(Tensor());
      wl.set_grad(Tensor());
      backward({linear(embedding(we, ids, pad), wl)}, {g});
      const auto tied = w.grad().to_vector(), e = we.grad().to_vector(), l = wl.grad().to_vector();
      for (int64_t i = 0; i < V * C; ++i) {
        const float step = static_cast<float>(e[i]) + static_cast<float>(l[i]);
        const float want = pass == 0 ? step : static_cast<float>(before[i]) + step;
        ASSERT_EQ(tied[i], static_cast<double>(want)) << "pass " << pass << " element " << i;
      }
      before = tied;
    }
  }
}

// The row-sparse gradient keeps the autograd contract: a tensor hook sees the dense gradient,
// post-accumulate hooks fire once per backward, retain_graph replays, and anomaly mode names
// the embedding when its gradient rows hold a NaN.
TEST(Embedding, RowSparseGradientKeepsHooksRetainGraphAndAnomalyMode) {
  Tensor ids = ids64({2, 0, 2}, {3});
  Tensor g = from_vector(std::vector<double>{1, 2, 10, 20, 100, 200}, {3, 2}, DType::f32);
  Tensor w = zeros({4, 2}).requires_grad_();
  std::vector<double> hooked;
  int post = 0;
  w.register_hook([&](const Tensor& gw) { hooked = gw.to_vector(); return Tensor(); });
  w.register_post_accumulate_grad_hook([&](Tensor&) { ++post; });
  Tensor y = embedding(w, ids);
  backward({y}, {g}, /*retain_graph=*/true);
  const std::vector<double> once{10, 20, 0, 0, 101, 202, 0, 0};
  EXPECT_EQ(hooked, once);
  EXPECT_EQ(w.grad().to_vector(), once);
  backward({y}, {g});
  EXPECT_EQ(post, 2);
  std::vector<double> twice;
  for (double v : once) twice.push_back(2 * v);
  EXPECT_EQ(w.grad().to_vector(), twice);

  // No hooks, existing .grad: rows go straight into it.
  Tensor w2 = zeros({4, 2}).requires_grad_();
  w2.set_grad(full({4, 2}, 0.5));
  int post2 = 0;
  w2.register_post_accumulate_grad_hook([&](Tensor&) { ++post2; });
  backward({embedding(w2, ids)}, {g});
  EXPECT_EQ(w2.grad().to_vector(), (std::vector<double>{10.5, 20.5, 0.5, 0.5, 101.5, 202.5, 0.5, 0.5}));
  EXPECT_EQ(post2, 1);

  AnomalyModeGuard on;
  Tensor w3 = zeros({4, 2}).requires_grad_();
  Tensor bad = from_vector(std::vector<double>{1, 2, NAN, 20, 100, 200}, {3, 2}, DType::f32);
  const std::string msg = error_message([&] { backward({embedding(w3, ids)}, {bad}); });
  EXPECT_NE(msg.find("embedding"), std::string::npos) << msg;
}

TEST(Embedding, OutOfRangeIdErrorNamesIdPositionAndTableSize) {
  Tensor w = zeros({10, 4});
  Tensor ids = ids64({1, 2, 3, 4, 5, 12, 6, 7}, {2, 4});
  std::string msg = error_message([&] { embedding(w, ids); });
  EXPECT_NE(msg.find("embedding"), std::string::npos) << msg;
  EXPECT_NE(msg.find("id 12"), std::string::npos) << msg;
  EXPECT_NE(msg.find("position [1, 1]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("10 rows"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[10, 4]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
  msg = error_message([&] { embedding(w, ids64({-1}, {1}).to(DType::i32)); });
  EXPECT_NE(msg.find("id -1"), std::string::npos) << msg;
  msg = error_message([&] { embedding(w, ids64({0}, {1}), 10); });
  EXPECT_NE(msg.find("padding_idx"), std::string::npos) << msg;
  msg = error_message([&] { embedding(w, from_vector(std::vector<double>{1}, {1})); });
  EXPECT_NE(msg.find("i64"), std::string::npos) << msg;
  msg = error_message([&] { embedding(zeros({10}), ids64({0}, {1})); });
  EXPECT_NE(msg.find("2-D"), std::string::npos) << msg;
}

}  // namespace athanor
