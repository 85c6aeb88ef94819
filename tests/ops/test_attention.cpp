// scaled_dot_product_attention: gradcheck in f64 (Tq != Tk with the causal mask, T not a multiple
// of the 64-row tile, a non-contiguous q from a transpose), the op against
// the naive reference, causal semantics, dtypes, the memory bound (no T x T score tensor) and
// error messages.
// The f64 gradchecks over the op's registered shapes (broadcast, transposed, strided) are the
// op harness's (tests/ops/test_op_harness.cpp); this file keeps what the harness does not do.
#include <cmath>

#include "backend/cpu/attention.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
::testing::AssertionResult check_sdpa(const Shape& qs, const Shape& ks, const Shape& vs, bool causal, uint64_t seed,
                                      std::optional<double> scale = std::nullopt) {
  Tensor q = randn64(qs, seed), k = randn64(ks, seed + 1), v = randn64(vs, seed + 2);
  return gradcheck(
      [&](const std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0], x[1], x[2], causal, scale); },
      {q, k, v});
}
}  // namespace

TEST(Attention, GradcheckTqDiffersFromTk) {
  EXPECT_TRUE(check_sdpa({1, 2, 4, 8}, {1, 2, 9, 8}, {1, 2, 9, 8}, false, 4));
  EXPECT_TRUE(check_sdpa({1, 2, 9, 8}, {1, 2, 4, 8}, {1, 2, 4, 8}, false, 5));
  EXPECT_TRUE(check_sdpa({1, 2, 4, 8}, {1, 2, 9, 8}, {1, 2, 9, 8}, true, 6));  // top-left aligned mask
  EXPECT_TRUE(check_sdpa({1, 2, 9, 8}, {1, 2, 4, 8}, {1, 2, 4, 8}, true, 7));
}

TEST(Attention, GradcheckAcrossTiles) {
  // 70 rows: a full 64-row tile plus a 6-row tail, for queries and keys; causal skips the
  // second key tile for the first query tile.
  EXPECT_TRUE(check_sdpa({1, 1, 70, 8}, {1, 1, 70, 8}, {1, 1, 70, 8}, true, 9));
  EXPECT_TRUE(check_sdpa({1, 1, 67, 8}, {1, 1, 66, 8}, {1, 1, 66, 8}, false, 10));
}

TEST(Attention, GradcheckNonContiguousQueryFromTranspose) {
  // The usual call: q is [B, T, H, D] split into heads by a transposed view.
  Tensor qb = randn64({2, 6, 3, 8}, 11), k = randn64({2, 3, 6, 8}, 12), v = make_noncontiguous(randn64({2, 3, 6, 8}, 13));
  ASSERT_FALSE(transpose(qb, 1, 2).is_contiguous());
  ASSERT_FALSE(v.is_contiguous());
  for (bool causal : {false, true})
    EXPECT_TRUE(gradcheck(
        [&](const std::vector<Tensor>& x) {
          return scaled_dot_product_attention(transpose(x[0], 1, 2), x[1], x[2], causal);
        },
        {qb, k, v}));
}

TEST(Attention, MatchesReferenceF32AndDefaultScale) {
  Generator g(21);
  Tensor q = randn({2, 3, 33, 16}, {}, g), k = randn({2, 3, 40, 16}, {}, g), v = randn({2, 3, 40, 16}, {}, g);
  // f32 sums of <= 40 terms: ~1e-6 error against the double reference.
  EXPECT_CLOSE(scaled_dot_product_attention(q, k, v), cpu::ref::attention(q, k, v, false, 0.25), 1e-5, 1e-5);
  EXPECT_CLOSE(scaled_dot_product_attention(q, k, v, true, 0.5), cpu::ref::attention(q, k, v, true, 0.5), 1e-5, 1e-5);
}

TEST(Attention, CausalFirstQuerySeesOnlyFirstKey) {
  // Independent of any reference: with the causal mask, query 0 attends only to key 0, so
  // output row 0 is v[0]; and the last query row of a square problem sees every key.
  Generator g(22);
  Tensor q = randn({1, 2, 5, 4}, {}, g), k = randn({1, 2, 5, 4}, {}, g), v = randn({1, 2, 5, 4}, {}, g);
  Tensor o = scaled_dot_product_attention(q, k, v, true);
  EXPECT_CLOSE(slice(o, 2, 0, 1), slice(v, 2, 0, 1), 1e-6, 0);
  Tensor full = scaled_dot_product_attention(q, k, v, false);
  EXPECT_CLOSE(slice(o, 2, 4, 5), slice(full, 2, 4, 5), 1e-6, 1e-6);
  // With all scores equal the output is the mean of the visible values.
  Tensor z = zeros({1, 1, 3, 2}), vv = from_vector(std::vector<double>{1, 10, 2, 20, 6, 60}, {1, 1, 3, 2});
  EXPECT_CLOSE(scaled_dot_product_attention(z, z, vv, true),
               from_vector(std::vector<double>{1, 10, 1.5, 15, 3, 30}, {1, 1, 3, 2}), 1e-6, 1e-6);
}

TEST(Attention, LowPrecisionKeepsDtype) {
  Generator g(23);
  Tensor q = randn({1, 2, 9, 8}, {}, g), k = randn({1, 2, 9, 8}, {}, g), v = randn({1, 2, 9, 8}, {}, g);
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor qh = q.to(dt), kh = k.to(dt), vh = v.to(dt);
    qh.requires_grad_(true);
    Tensor o = scaled_dot_product_attention(qh, kh, vh, true);
    EXPECT_EQ(o.dtype(), dt);
    EXPECT_CLOSE(o, cpu::ref::attention(qh, kh, vh, true, 1.0 / std::sqrt(8.0)), 2e-2, 2e-2);
    o.sum().backward();
    ASSERT_TRUE(qh.grad().defined());
    EXPECT_EQ(qh.grad().dtype(), dt);
  }
}

// GPT's call: bf16 q, k, v as transposed views of [B, T, H, D] (the op copies them into
// [B, H, T, D]), T = 130 (a ragged third tile), D = 64, causal — the bf16 tile-product path.
// Gradients through autograd vs the naive f64 backward on the same bf16 values; tolerance as
// the kernel test: P and dS are rounded to bf16 for their products and results to bf16.
TEST(Attention, Bf16GradientsThroughAutogradMatchReference) {
  Generator g(29);
  const int64_t B = 1, T = 130, H = 2, D = 64;
  auto leaf_bthd = [&] { return randn({B, T, H, D}, DType::bf16, g).requires_grad_(true); };
  Tensor qb = leaf_bthd(), kb = leaf_bthd(), vb = leaf_bthd();
  Tensor dout = randn({B, H, T, D}, DType::bf16, g);
  Tensor o = scaled_dot_product_attention(qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2), true);
  ASSERT_EQ(o.dtype(), DType::bf16);
  backward({o}, {dout});
  const Tensor q = qb.detach().transpose(1, 2), k = kb.detach().transpose(1, 2), v = vb.detach().transpose(1, 2);
  EXPECT_CLOSE(o, cpu::ref::attention(q, k, v, true, 0.125), 2e-2, 2e-2);
  const auto [dq, dk, dv] = cpu::ref::attention_backward(q, k, v, dout, true, 0.125);
  EXPECT_CLOSE(qb.grad().transpose(1, 2), dq, 2e-2, 2e-2);
  EXPECT_CLOSE(kb.grad().transpose(1, 2), dk, 2e-2, 2e-2);
  EXPECT_CLOSE(vb.grad().transpose(1, 2), dv, 2e-2, 2e-2);
}

TEST(Attention, BackwardMatchesReferenceF32) {
  Generator g(24);
  Tensor q = randn({1, 2, 80, 16}, {}, g), k = randn({1, 2, 80, 16}, {}, g), v = randn({1, 2, 80, 16}, {}, g);
  Tensor w = randn({1, 2, 80, 16}, {}, g);
  q.requires_grad_(true), k.requires_grad_(true), v.requires_grad_(true);
  backward({scaled_dot_product_attention(q, k, v, true)}, {w});
  const auto [dq, dk, dv] = cpu::ref::attention_backward(q, k, v, w, true, 0.25);
  EXPECT_CLOSE(q.grad(), dq, 1e-4, 1e-3);
  EXPECT_CLOSE(k.grad(), dk, 1e-4, 1e-3);
  EXPECT_CLOSE(v.grad(), dv, 1e-4, 1e-3);
}

TEST(Attention, MemoryDoesNotScaleWithScoreMatrix) {
  // B=1, H=8, T=1024, D=32: a materialized f32 score tensor would take 1024*1024*8*4 = 32 MiB.
  // The tiled kernel allocates the output (1 MiB), lse (32 KiB) and a few tiles per thread.
  Generator g(25);
  const Shape s{1, 8, 1024, 32};
  Tensor q = randn(s, {}, g), k = randn(s, {}, g), v = randn(s, {}, g);
  const std::size_t scores = std::size_t{1024} * 1024 * 8 * 4;
  Allocator& a = Allocator::cpu();
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    const std::size_t before = a.stats().current_total;
    a.reset_peak();
    Tensor o = scaled_dot_product_attention(q, k, v, causal);
    const std::size_t peak = a.stats().peak_total - before;
    EXPECT_GE(peak, o.nbytes());  // the accounting sees at least the output
    EXPECT_LT(peak, scores / 16) << "forward peak " << peak << " bytes";
  }
  // Backward too: dq, dk, dv, dO and a per-thread slice of scratch, nothing of size T x T.
  q.requires_grad_(true), k.requires_grad_(true), v.requires_grad_(true);
  Tensor o = scaled_dot_product_attention(q, k, v, true);
  Tensor w = ones_like(o);
  const std::size_t before = a.stats().current_total;
  a.reset_peak();
  backward({o}, {w});
  EXPECT_LT(a.stats().peak_total - before, scores / 4) << "backward peak " << a.stats().peak_total - before;
}

TEST(Attention, ErrorsNameOpAndShapes) {
  const std::string op = "scaled_dot_product_attention";
  auto expect_msg = [&](const std::function<void()>& fn, const std::vector<std::string>& parts) {
    const std::string msg = error_message(fn);
    EXPECT_NE(msg.find(op), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
  };
  Tensor q = zeros({2, 3, 5, 8}), k = zeros({2, 3, 7, 8}), v = zeros({2, 3, 7, 8});
  // D mismatch between q and k
  expect_msg([&] { scaled_dot_product_attention(q, zeros({2, 3, 7, 4}), v); }, {"[2, 3, 5, 8]", "[2, 3, 7, 4]", "[2, 3, 7, 8]", "head dim"});
  // Tk != Tv
  expect_msg([&] { scaled_dot_product_attention(q, k, zeros({2, 3, 6, 8})); }, {"[2, 3, 5, 8]", "[2, 3, 7, 8]", "[2, 3, 6, 8]", "sequence length"});
  // batch / head mismatch
  expect_msg([&] { scaled_dot_product_attention(q, zeros({2, 4, 7, 8}), zeros({2, 4, 7, 8})); }, {"[2, 3, 5, 8]", "[2, 4, 7, 8]"});
  // wrong rank
  expect_msg([&] { scaled_dot_product_attention(zeros({3, 5, 8}), k, v); }, {"4-D", "[3, 5, 8]", "hint:"});
  // dtype mismatch
  expect_msg([&] { scaled_dot_product_attention(q, k, zeros({2, 3, 7, 8}, DType::f64)); }, {"f64", "f32"});
}

}  // namespace athanor
