// Grouped-query attention (scaled_dot_product_attention's enable_gqa): the kernels against the
// naive reference on repeated k and v at every ISA level and dtype with tiles shrunk so that T is
// not a multiple of them; f64 gradchecks through the op (H=4 with Hkv=2 and Hkv=1, causal and
// not, across the 64-row tile, non-contiguous inputs, the Llama block's rope -> sdpa -> reshape
// path); the backward's determinism over thread counts; no copies of [B, T, H, D]-view inputs;
// errors. The registered cases run in the op harness (test_op_harness.cpp) too.
#include <cmath>

#include "athanor/ops/rope.h"
#include "backend/cpu/attention.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
// [B, Hkv, T, D] -> [B, H, T, D]: kv head h / (H / Hkv) at head h (what the kernels must not do).
Tensor repeat_heads(const Tensor& x, int64_t H) {
  const int64_t B = x.size(0), Hkv = x.size(1), T = x.size(2), D = x.size(3);
  const std::vector<double> v = x.to_vector();
  std::vector<double> out(static_cast<size_t>(B * H * T * D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T * D; ++i) out[(b * H + h) * T * D + i] = v[(b * Hkv + h / (H / Hkv)) * T * D + i];
  return from_vector(out, {B, H, T, D}, TensorOptions(DType::f64));
}
// [B, H, T, D] -> [B, Hkv, T, D]: the sum over each group's heads (the gradient of repeat_heads).
Tensor sum_groups(const Tensor& x, int64_t Hkv) {
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
  const std::vector<double> v = x.to_vector();
  std::vector<double> out(static_cast<size_t>(B * Hkv * T * D), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T * D; ++i) out[(b * Hkv + h / (H / Hkv)) * T * D + i] += v[(b * H + h) * T * D + i];
  return from_vector(out, {B, Hkv, T, D}, TensorOptions(DType::f64));
}
template <class T> T* ptr(const Tensor& t) { return static_cast<T*>(t.raw_data()); }
}  // namespace

// The kernels straight, with 4 x 3 tiles (T = 11 and 9: no multiple of either), against the
// reference on repeated k and v: forward O and lse, backward dq, and dk, dv summed over groups.
TEST(AttentionGqa, KernelsMatchReferenceAcrossTilesDtypesAndLevels) {
  struct Dims {
    int64_t H, Hkv, Tq, Tk;
  };
  for_each_isa_level([&](int) {
    for (const Dims& s : {Dims{4, 2, 11, 11}, Dims{4, 1, 11, 9}, Dims{6, 3, 9, 11}})
      for (bool causal : {false, true})
        for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
          SCOPED_TRACE("H " + std::to_string(s.H) + ", Hkv " + std::to_string(s.Hkv) + (causal ? ", causal, " : ", ") +
                       dtype_name(dt));
          Generator g(41);
          const int64_t B = 2, D = 8;
          const Tensor q = randn({B, s.H, s.Tq, D}, dt, g), k = randn({B, s.Hkv, s.Tk, D}, dt, g),
                       v = randn({B, s.Hkv, s.Tk, D}, dt, g), dout = randn({B, s.H, s.Tq, D}, dt, g);
          const cpu::AttentionDims d{.B = B, .H = s.H, .Tq = s.Tq, .Tk = s.Tk, .D = D, .Dv = D, .Hkv = s.Hkv};
          const cpu::AttentionTiles tiles{4, 3};
          const DType acc = dt == DType::f64 ? DType::f64 : DType::f32;
          Tensor o = empty(q.sizes(), TensorOptions(dt)), lse = empty({B, s.H, s.Tq}, TensorOptions(acc));
          Tensor dq = empty(q.sizes(), TensorOptions(dt)), dk = empty(k.sizes(), TensorOptions(dt)),
                 dv = empty(v.sizes(), TensorOptions(dt));
          dispatch(dt, [&]<class T>() {
            if constexpr (is_float_type_v<T>) {
              using C = cpu::attn_acc_t<T>;
              cpu::attention_forward<T>(ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(o), ptr<C>(lse), d,
                                        cpu::AttentionLayout::contiguous(d), causal, 0.3, tiles);
              cpu::attention_backward<T>(ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(o), ptr<T>(dout), ptr<C>(lse), ptr<T>(dq),
                                         ptr<T>(dk), ptr<T>(dv), d, cpu::AttentionLayout::contiguous(d), causal, 0.3, tiles);
            }
          });
          const Tensor kr = repeat_heads(k.to(DType::f64), s.H), vr = repeat_heads(v.to(DType::f64), s.H);
          const double tol = dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 1e-5 : 3e-2;
          EXPECT_CLOSE(o, cpu::ref::attention(q, kr, vr, causal, 0.3), tol, tol);
          const auto [rdq, rdk, rdv] = cpu::ref::attention_backward(q, kr, vr, dout, causal, 0.3);
          EXPECT_CLOSE(dq, rdq, tol, tol);
          EXPECT_CLOSE(dk, sum_groups(rdk, s.Hkv), tol, tol);
          EXPECT_CLOSE(dv, sum_groups(rdv, s.Hkv), tol, tol);
        }
  });
}

TEST(AttentionGqa, GradcheckGroupsAndMultiQuery) {
  for (int64_t Hkv : {2, 1})
    for (bool causal : {false, true}) {
      SCOPED_TRACE("Hkv " + std::to_string(Hkv) + (causal ? ", causal" : ""));
      Tensor q = randn64({2, 4, 5, 6}, 51), k = randn64({2, Hkv, 7, 6}, 52), v = randn64({2, Hkv, 7, 6}, 53);
      EXPECT_TRUE(gradcheck(
          [&](const std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0], x[1], x[2], causal, {}, true); },
          {q, k, v}));
    }
}

TEST(AttentionGqa, GradcheckAcrossTheTileNonContiguous) {
  // 67 queries, 66 keys: a full 64-row tile and a tail; k from a transposed [B, T, Hkv, D], v
  // with its dims reversed in memory (copied), q contiguous.
  Tensor q = randn64({1, 2, 67, 4}, 61), kb = randn64({1, 66, 1, 4}, 62), v = make_noncontiguous(randn64({1, 1, 66, 4}, 63));
  for (bool causal : {false, true})
    EXPECT_TRUE(gradcheck(
        [&](const std::vector<Tensor>& x) {
          return scaled_dot_product_attention(x[0], transpose(x[1], 1, 2), x[2], causal, {}, true);
        },
        {q, kb, v}));
}

// The Llama block's attention as nn::Llama calls it: rope on [B, T, H, D] views of the
// projections, GQA on their transposes, the result back to [B, T, H D].
TEST(AttentionGqa, GradcheckRopeGqaPathOfALlamaBlock) {
  const int64_t B = 2, T = 5, H = 4, Hkv = 2, D = 6;
  Tensor xq = randn64({B, T, H * D}, 71), xk = randn64({B, T, Hkv * D}, 72), xv = randn64({B, T, Hkv * D}, 73);
  const RopeOptions opt{.theta = 10000.0, .llama3 = std::nullopt, .position_offset = 2};
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& x) {
        const Tensor q = rope(x[0].view({B, T, H, D}), opt), k = rope(x[1].view({B, T, Hkv, D}), opt),
                     v = x[2].view({B, T, Hkv, D});
        const Tensor o = scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), true, {}, true);
        return o.transpose(1, 2).reshape({B, T, H * D});
      },
      {xq, xk, xv}));
}

// Each kv head's dk, dv is summed over its group's query heads by one thread in a fixed order:
// the same bits whatever the thread count.
TEST(AttentionGqa, BackwardIsDeterministicAcrossThreadCounts) {
  Generator g(81);
  const Tensor q0 = randn({2, 8, 96, 32}, {}, g), k0 = randn({2, 2, 96, 32}, {}, g), v0 = randn({2, 2, 96, 32}, {}, g),
               w = randn({2, 8, 96, 32}, {}, g);
  auto grads = [&](int threads) {
    ThreadCount tc(threads);
    Tensor q = q0.detach().requires_grad_(true), k = k0.detach().requires_grad_(true), v = v0.detach().requires_grad_(true);
    backward({scaled_dot_product_attention(q, k, v, true, {}, true)}, {w});
    return std::array<std::vector<double>, 3>{q.grad().to_vector(), k.grad().to_vector(), v.grad().to_vector()};
  };
  const auto one = grads(1), two = grads(2), three = grads(3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(one[i], two[i]) << "input " << i;
    EXPECT_EQ(one[i], three[i]) << "input " << i;
  }
}

// q, k, v as the model passes them (transposed views of [B, T, H, D] projections) are read in
// place: the forward allocates the output, lse and per-thread tiles, no copy of q (or k, v), and
// the output is laid out [B, T, H, D] so that the model's transpose back is contiguous.
TEST(AttentionGqa, ReadsTransposedViewsWithoutCopies) {
  Generator g(91);
  const int64_t B = 2, T = 256, H = 8, Hkv = 2, D = 32;
  const Tensor qb = randn({B, T, H, D}, {}, g), kb = randn({B, T, Hkv, D}, {}, g), vb = randn({B, T, Hkv, D}, {}, g);
  const Tensor q = qb.transpose(1, 2), k = kb.transpose(1, 2), v = vb.transpose(1, 2);
  Allocator& a = Allocator::cpu();
  const std::size_t before = a.stats().current_total;
  a.reset_peak();
  const Tensor o = scaled_dot_product_attention(q, k, v, true, {}, true);
  const std::size_t peak = a.stats().peak_total - before;
  const std::size_t lse = static_cast<std::size_t>(B * H * T) * sizeof(float);
  // A copy of q alone would add qb.nbytes() (512 KiB); the kernel's tiles per thread are ~70 KiB.
  EXPECT_LT(peak, o.nbytes() + lse + qb.nbytes() / 2) << "forward peak " << peak << " bytes";
  EXPECT_TRUE(o.transpose(1, 2).is_contiguous());
  EXPECT_CLOSE(o, cpu::ref::attention(q, repeat_heads(k.to(DType::f64), H), repeat_heads(v.to(DType::f64), H), true,
                                      1.0 / std::sqrt(32.0)),
               1e-5, 1e-5);
}

TEST(AttentionGqa, Errors) {
  const std::string op = "scaled_dot_product_attention";
  auto expect_msg = [&](const std::function<void()>& fn, const std::vector<std::string>& parts) {
    const std::string msg = error_message(fn);
    EXPECT_NE(msg.find(op), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
  };
  const Tensor q = zeros({2, 4, 5, 8}), k3 = zeros({2, 3, 5, 8}), k2 = zeros({2, 2, 5, 8});
  expect_msg([&] { scaled_dot_product_attention(q, k3, k3, false, {}, true); }, {"[2, 4, 5, 8]", "[2, 3, 5, 8]", "divide", "hint:"});
  expect_msg([&] { scaled_dot_product_attention(q, k2, k2); }, {"[2, 4, 5, 8]", "[2, 2, 5, 8]", "enable_gqa"});
  expect_msg([&] { scaled_dot_product_attention(q, zeros({2, 2, 5, 4}), k2, false, {}, true); }, {"[2, 2, 5, 4]", "head dim"});
  expect_msg([&] { scaled_dot_product_attention(q, k2, zeros({2, 1, 5, 8}), false, {}, true); }, {"[2, 2, 5, 8]", "[2, 1, 5, 8]", "heads"});
}

}  // namespace athanor
