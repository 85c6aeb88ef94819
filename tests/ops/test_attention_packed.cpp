// causal_self_attention(qkv, n_head): the fused GPT attention that reads q, k, v out of the
// packed [B, T, 3d] projection and writes [B, T, d]. Checked three ways: finite differences in
// f64 (ragged T across the 64-row tiles), the naive double reference per head (values and
// gradients, f32 / bf16 / f16), and the unfused composition split -> heads -> sdpa -> merge.
#include <cmath>

#include "athanor/ops/autocast.h"
#include "backend/cpu/attention.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
// The unfused composition GPT used before: split, [B, H, T, hd] views, sdpa, merge.
Tensor unfused(const Tensor& qkv, int64_t H) {
  const int64_t B = qkv.size(0), T = qkv.size(1), d = qkv.size(2) / 3, hd = d / H;
  std::vector<Tensor> parts = split(qkv, d, 2);
  auto heads = [&](const Tensor& t) { return transpose(reshape(t, {B, T, H, hd}), 1, 2); };
  Tensor y = scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), true);
  return reshape(transpose(y, 1, 2), {B, T, d});
}

// Column block `which` (0 q, 1 k, 2 v) of qkv as [B, H, T, hd], contiguous (no history).
Tensor head_block(const Tensor& qkv, int64_t H, int which) {
  const int64_t B = qkv.size(0), T = qkv.size(1), d = qkv.size(2) / 3;
  return slice(qkv.detach(), 2, which * d, (which + 1) * d).reshape({B, T, H, d / H}).transpose(1, 2).contiguous();
}
// [B, H, T, hd] -> [B, T, H hd]
Tensor merge_heads(const Tensor& t) {
  return t.transpose(1, 2).contiguous().reshape({t.size(0), t.size(2), t.size(1) * t.size(3)});
}

// Output and d(qkv) of the naive double reference (cpu::ref, full score matrix per head).
struct RefResult {
  Tensor out, dqkv;
};
RefResult reference(const Tensor& qkv, const Tensor& dout, int64_t H, double scale) {
  const Tensor q = head_block(qkv, H, 0), k = head_block(qkv, H, 1), v = head_block(qkv, H, 2);
  const int64_t B = qkv.size(0), T = qkv.size(1), hd = q.size(3);
  const Tensor g = dout.detach().reshape({B, T, H, hd}).transpose(1, 2).contiguous();
  const auto [dq, dk, dv] = cpu::ref::attention_backward(q, k, v, g, true, scale);
  return {merge_heads(cpu::ref::attention(q, k, v, true, scale)),
          cat({merge_heads(dq), merge_heads(dk), merge_heads(dv)}, 2)};
}
}  // namespace

TEST(AttentionPacked, GradcheckF64) {
  // Small heads, several heads and batches; then 70 tokens: a full 64-row tile plus a ragged one.
  for (auto [B, T, H, hd] : {std::array<int64_t, 4>{2, 5, 2, 4}, std::array<int64_t, 4>{1, 70, 2, 3}}) {
    SCOPED_TRACE("T " + std::to_string(T));
    Tensor qkv = randn64({B, T, 3 * H * hd}, 41 + T);
    EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& x) { return causal_self_attention(x[0], H); }, {qkv}));
  }
  Tensor qkv = randn64({1, 6, 12}, 47);
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& x) { return causal_self_attention(x[0], 2, 0.3); }, {qkv}));
}

TEST(AttentionPacked, F32MatchesNaiveReferenceAndUnfusedComposition) {
  // T = 130: two full 64-row tiles and a ragged third; H = 3, hd = 16. Tolerances as the
  // sdpa f32 tests (f32 sums of <= 130 terms against exact double).
  Generator g(43);
  const int64_t B = 2, T = 130, H = 3, hd = 16;
  Tensor qkv = randn({B, T, 3 * H * hd}, {}, g).requires_grad_(true);
  Tensor dout = randn({B, T, H * hd}, {}, g);
  Tensor y = causal_self_attention(qkv, H);
  ASSERT_EQ(y.sizes(), (Shape{B, T, H * hd}));
  backward({y}, {dout});
  const RefResult ref = reference(qkv, dout, H, 0.25);
  EXPECT_CLOSE(y, ref.out, 2e-5, 1e-4);
  EXPECT_CLOSE(qkv.grad(), ref.dqkv, 1e-4, 1e-3);

  Tensor qkv2 = qkv.detach().clone().requires_grad_(true);
  Tensor y2 = unfused(qkv2, H);
  backward({y2}, {dout});
  EXPECT_CLOSE(y, y2, 1e-6, 1e-5);
  EXPECT_CLOSE(qkv.grad(), qkv2.grad(), 1e-5, 1e-4);
}

TEST(AttentionPacked, Bf16MatchesNaiveReferenceAndUnfusedComposition) {
  // hd = 64 (the AVX512_BF16 tile path where the CPU has it), T = 130, 2 heads. Tolerance as
  // the sdpa bf16 tests: P and dS are rounded to bf16 for their products, results to bf16.
  Generator g(44);
  const int64_t B = 2, T = 130, H = 2, hd = 64;
  Tensor qkv = randn({B, T, 3 * H * hd}, DType::bf16, g).requires_grad_(true);
  Tensor dout = randn({B, T, H * hd}, DType::bf16, g);
  Tensor y = causal_self_attention(qkv, H);
  ASSERT_EQ(y.dtype(), DType::bf16);
  backward({y}, {dout});
  ASSERT_EQ(qkv.grad().dtype(), DType::bf16);
  const RefResult ref = reference(qkv, dout, H, 0.125);
  EXPECT_CLOSE(y, ref.out, 2e-2, 2e-2);
  EXPECT_CLOSE(qkv.grad(), ref.dqkv, 2e-2, 2e-2);

  // Same kernels, other layout: the unfused path must agree to bf16 rounding of the results.
  Tensor qkv2 = qkv.detach().clone().requires_grad_(true);
  Tensor y2 = unfused(qkv2, H);
  backward({y2}, {dout});
  EXPECT_CLOSE(y, y2, 1e-2, 1e-2);
  EXPECT_CLOSE(qkv.grad(), qkv2.grad(), 1e-2, 1e-2);
}

TEST(AttentionPacked, HalfInputsWithOddHeadDimMatchReference) {
  // f16 and bf16 with hd = 5: the generic kernels, converting strided rows into f32 tiles.
  Generator g(45);
  const int64_t B = 1, T = 67, H = 2, hd = 5;
  for (DType dt : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor qkv = randn({B, T, 3 * H * hd}, dt, g).requires_grad_(true);
    Tensor dout = randn({B, T, H * hd}, dt, g);
    Tensor y = causal_self_attention(qkv, H);
    backward({y}, {dout});
    const RefResult ref = reference(qkv, dout, H, 1.0 / std::sqrt(5.0));
    EXPECT_CLOSE(y, ref.out, 2e-2, 2e-2);
    EXPECT_CLOSE(qkv.grad(), ref.dqkv, 3e-2, 3e-2);
  }
}

TEST(AttentionPacked, NonContiguousInputAndFirstTokenSeesOnlyItself) {
  // A strided qkv (a slice of a wider tensor) is accepted; token 0's output is its own v.
  Generator g(46);
  const int64_t H = 2, hd = 4, d = H * hd;
  Tensor wide = randn({2, 9, 3 * d + 5}, {}, g);
  Tensor qkv = slice(wide, 2, 0, 3 * d);
  ASSERT_FALSE(qkv.is_contiguous());
  Tensor y = causal_self_attention(qkv, H);
  EXPECT_CLOSE(y, unfused(qkv.contiguous(), H), 1e-6, 1e-6);
  EXPECT_CLOSE(slice(y, 1, 0, 1), slice(slice(qkv, 2, 2 * d, 3 * d), 1, 0, 1), 1e-6, 0);
}

TEST(AttentionPacked, AutocastRunsInBf16) {
  Generator g(48);
  Tensor qkv = randn({1, 10, 3 * 2 * 8}, {}, g);
  autocast ac(DType::bf16);
  EXPECT_EQ(causal_self_attention(qkv, 2).dtype(), DType::bf16);
}

TEST(AttentionPacked, ErrorsSayWhatAndShapes) {
  auto expect_msg = [](const std::function<void()>& fn, const std::vector<std::string>& parts) {
    const std::string msg = error_message(fn);
    EXPECT_NE(msg.find("causal_self_attention"), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
  };
  expect_msg([] { causal_self_attention(zeros({2, 5, 3, 8}), 2); }, {"[2, 5, 3, 8]", "[B, T, 3 d]", "hint:"});
  expect_msg([] { causal_self_attention(zeros({2, 5, 20}), 4); }, {"[2, 5, 20]", "n_head = 4", "12", "hint:"});
  expect_msg([] { causal_self_attention(zeros({2, 5, 24}), 0); }, {"n_head", "[2, 5, 24]"});
  expect_msg([] { causal_self_attention(zeros({2, 5, 24}, DType::i64), 2); }, {"qkv"});
}

}  // namespace athanor
