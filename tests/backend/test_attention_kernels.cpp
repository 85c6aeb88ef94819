// Flash-attention kernels (backend/cpu/attention) against the naive reference that
// materializes the full score matrix in double: forward and backward, f32 on a
// realistic shape, f64 with tiny tiles on ragged shapes (tile edges, causal skipping,
// Tq != Tk), and bf16 inputs.
#include <cmath>
#include <tuple>

#include "backend/cpu/attention.h"
#include "backend/cpu/isa.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
struct Result {
  Tensor o, lse, dq, dk, dv;
};

// Runs the fast forward and backward on contiguous q, k, v, dout of dtype T.
template <class T>
Result run_fast(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, bool causal, double scale,
                cpu::AttentionTiles tiles = {}) {
  using C = cpu::attn_acc_t<T>;
  const cpu::AttentionDims d{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
  Result r;
  r.o = empty({d.B, d.H, d.Tq, d.Dv}, TensorOptions(q.dtype()));
  r.lse = empty({d.B, d.H, d.Tq}, TensorOptions(dtype_of<C>));
  cpu::attention_forward<T>(q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), r.o.data_ptr<T>(), r.lse.data_ptr<C>(),
                            d, causal, scale, tiles);
  r.dq = empty(q.sizes(), TensorOptions(q.dtype()));
  r.dk = empty(k.sizes(), TensorOptions(q.dtype()));
  r.dv = empty(v.sizes(), TensorOptions(q.dtype()));
  cpu::attention_backward<T>(q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), r.o.data_ptr<T>(),
                             dout.data_ptr<T>(), r.lse.data_ptr<C>(), r.dq.data_ptr<T>(), r.dk.data_ptr<T>(),
                             r.dv.data_ptr<T>(), d, causal, scale, tiles);
  return r;
}

// log sum_j exp(s_ij) computed naively in double (masked entries excluded).
std::vector<double> ref_lse(const Tensor& q, const Tensor& k, bool causal, double scale) {
  const auto qv = q.to_vector(), kv = k.to_vector();
  const int64_t BH = q.size(0) * q.size(1), Tq = q.size(2), Tk = k.size(2), D = q.size(3);
  std::vector<double> out;
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t i = 0; i < Tq; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < Tk && (!causal || j <= i); ++j) {
        double s = 0;
        for (int64_t c = 0; c < D; ++c) s += qv[(bh * Tq + i) * D + c] * kv[(bh * Tk + j) * D + c];
        sum += std::exp(s * scale);
      }
      out.push_back(std::log(sum));
    }
  return out;
}
}  // namespace

TEST(AttentionKernels, FastMatchesReferenceF32) {
  // B=2, H=4, T=257 (one row past four 64-row tiles), D=64. Tolerances: f32 tile products sum
  // at most 257 terms of magnitude ~1; the reference is exact double. Outputs (convex
  // combinations of N(0,1) values) agree to ~1e-6; gradients, whose elements reach ~10, to ~1e-5
  // relative. atol 2e-5 / rtol 1e-4 (forward) and 1e-4 / 1e-3 (backward) leave ~10x headroom and
  // still catch any wrong term (errors of those are O(0.1-1)).
  Generator g(11);
  const Shape s{2, 4, 257, 64};
  Tensor q = randn(s, {}, g), k = randn(s, {}, g), v = randn(s, {}, g), dout = randn(s, {}, g);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    const double scale = 0.125;
    const Result r = run_fast<float>(q, k, v, dout, causal, scale);
    EXPECT_CLOSE(r.o, cpu::ref::attention(q, k, v, causal, scale), 2e-5, 1e-4);
    EXPECT_CLOSE(r.lse, from_vector(ref_lse(q, k, causal, scale), {2, 4, 257}, DType::f64), 2e-5, 1e-5);
    const auto [dq, dk, dv] = cpu::ref::attention_backward(q, k, v, dout, causal, scale);
    EXPECT_CLOSE(r.dq, dq, 1e-4, 1e-3);
    EXPECT_CLOSE(r.dk, dk, 1e-4, 1e-3);
    EXPECT_CLOSE(r.dv, dv, 1e-4, 1e-3);
  }
}

// The f32 kernel's tile edges: 7 x 5 tiles, odd and non-power-of-two D and Dv, Tq != Tk, and
// key tiles wider than query tiles. Reference and tolerances as FastMatchesReferenceF32.
TEST(AttentionKernels, RaggedTilesF32MatchReference) {
  struct Case { Shape q; int64_t Tk, Dv; bool causal; cpu::AttentionTiles tiles; };
  const Case cases[] = {{{1, 2, 23, 24}, 23, 40, true, {7, 5}}, {{2, 1, 19, 33}, 30, 17, false, {7, 5}},
                        {{1, 1, 80, 64}, 80, 64, false, {16, 70}}};
  Generator g(41);
  for (const Case& c : cases) {
    SCOPED_TRACE("q " + shape_str(c.q) + " Tk " + std::to_string(c.Tk) + " Dv " + std::to_string(c.Dv));
    Tensor q = randn(c.q, {}, g), k = randn({c.q[0], c.q[1], c.Tk, c.q[3]}, {}, g),
           v = randn({c.q[0], c.q[1], c.Tk, c.Dv}, {}, g), dout = randn({c.q[0], c.q[1], c.q[2], c.Dv}, {}, g);
    const Result r = run_fast<float>(q, k, v, dout, c.causal, 0.2, c.tiles);
    EXPECT_CLOSE(r.o, cpu::ref::attention(q, k, v, c.causal, 0.2), 2e-5, 1e-4);
    const auto [dq, dk, dv] = cpu::ref::attention_backward(q, k, v, dout, c.causal, 0.2);
    EXPECT_CLOSE(r.dq, dq, 1e-4, 1e-3);
    EXPECT_CLOSE(r.dk, dk, 1e-4, 1e-3);
    EXPECT_CLOSE(r.dv, dv, 1e-4, 1e-3);
  }
}

// The f32 kernels' causal tile edges: diagonal tiles whose products skip the score columns and
// the P / dS terms past the diagonal (in 4-row blocks and 16-column vectors), with query and key
// tiles of different sizes (so diagonals at every offset within a tile), T not a multiple of
// the tile, T smaller than the tile, T = 1, and key tiles over 64 (the unfused softmax path).
// Reference and tolerances as FastMatchesReferenceF32 (errors of a wrongly skipped term are
// O(0.1-1)).
TEST(AttentionKernels, CausalDiagonalTilesF32MatchReference) {
  struct Case { int64_t T, D; cpu::AttentionTiles tiles; };
  const Case cases[] = {{100, 64, {}},      {20, 64, {}},       {1, 16, {}},        {130, 32, {16, 48}},
                        {130, 32, {48, 16}}, {61, 24, {7, 5}},  {97, 16, {64, 33}}, {90, 16, {32, 70}}};
  Generator g(53);
  for (const Case& c : cases) {
    for (bool causal : {true, false}) {
      SCOPED_TRACE("T " + std::to_string(c.T) + " D " + std::to_string(c.D) + " tiles " + std::to_string(c.tiles.q) +
                   "x" + std::to_string(c.tiles.k) + (causal ? " causal" : ""));
      const Shape s{1, 2, c.T, c.D};
      Tensor q = randn(s, {}, g), k = randn(s, {}, g), v = randn(s, {}, g), dout = randn(s, {}, g);
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
      const Result r = run_fast<float>(q, k, v, dout, causal, scale, c.tiles);
      EXPECT_CLOSE(r.o, cpu::ref::attention(q, k, v, causal, scale), 2e-5, 1e-4);
      EXPECT_CLOSE(r.lse, from_vector(ref_lse(q, k, causal, scale), {1, 2, c.T}, DType::f64), 2e-5, 1e-5);
      const auto [dq, dk, dv] = cpu::ref::attention_backward(q, k, v, dout, causal, scale);
      EXPECT_CLOSE(r.dq, dq, 1e-4, 1e-3);
      EXPECT_CLOSE(r.dk, dk, 1e-4, 1e-3);
      EXPECT_CLOSE(r.dv, dv, 1e-4, 1e-3);
    }
  }
}

// f16 inputs take the f32 tile path on converted tiles. Reference: the naive f64 kernel on the
// same f16 values; the extra error is rounding the results to f16 (relative 2^-11), 2e-3
// absolute/relative leaves ~4x headroom on these N(0, 1) inputs.
TEST(AttentionKernels, F16InputsMatchReference) {
  Generator g(59);
  const Shape s{1, 2, 77, 32};
  Tensor q = randn(s, DType::f16, g), k = randn(s, DType::f16, g), v = randn(s, DType::f16, g),
         dout = randn(s, DType::f16, g);
  const double scale = 1.0 / std::sqrt(32.0);
  const Result r = run_fast<float16>(q, k, v, dout, true, scale, {32, 32});
  ASSERT_EQ(r.o.dtype(), DType::f16);
  EXPECT_CLOSE(r.o, cpu::ref::attention(q, k, v, true, scale), 2e-3, 2e-3);
  const auto [dq, dk, dv] = cpu::ref::attention_backward(q, k, v, dout, true, scale);
  EXPECT_CLOSE(r.dq, dq, 4e-3, 4e-3);
  EXPECT_CLOSE(r.dk, dk, 4e-3, 4e-3);
  EXPECT_CLOSE(r.dv, dv, 4e-3, 4e-3);
}

TEST(AttentionKernels, RaggedTilesF64MatchReferenceExactly) {
  // Small tiles (5 query rows x 3 keys, and 7 x 16) on sizes that are not multiples of them,
  // causal and not, Tq < Tk and Tq > Tk, Dv != D. f64 accumulation: agreement to 1e-12.
  struct Case {
    int64_t Tq, Tk, D, Dv;
    bool causal;
    cpu::AttentionTiles tiles;
  };
  const std::vector<Case> cases = {{13, 13, 8, 8, true, {5, 3}},  {13, 13, 8, 8, false, {5, 3}},
                                   {9, 17, 4, 6, false, {5, 3}},  {9, 17, 4, 6, true, {5, 3}},
                                   {17, 9, 4, 6, true, {5, 3}},   {31, 23, 8, 8, true, {7, 16}},
                                   {1, 1, 3, 2, true, {64, 64}},  {20, 20, 16, 16, true, {1, 1}}};
  Generator g(5);
  for (const Case& c : cases) {
    SCOPED_TRACE("Tq " + std::to_string(c.Tq) + " Tk " + std::to_string(c.Tk) + (c.causal ? " causal" : "") +
                 " tiles " + std::to_string(c.tiles.q) + "x" + std::to_string(c.tiles.k));
    const TensorOptions f64(DType::f64);
    Tensor q = randn({2, 3, c.Tq, c.D}, f64, g), k = randn({2, 3, c.Tk, c.D}, f64, g),
           v = randn({2, 3, c.Tk, c.Dv}, f64, g), dout = randn({2, 3, c.Tq, c.Dv}, f64, g);
    const double scale = 0.7;
    const Result r = run_fast<double>(q, k, v, dout, c.causal, scale, c.tiles);
    EXPECT_CLOSE(r.o, cpu::ref::attention(q, k, v, c.causal, scale), 1e-12, 1e-12);
    EXPECT_CLOSE(r.lse, from_vector(ref_lse(q, k, c.causal, scale), {2, 3, c.Tq}, DType::f64), 1e-12, 1e-12);
    const auto [dq, dk, dv] = cpu::ref::attention_backward(q, k, v, dout, c.causal, scale);
    EXPECT_CLOSE(r.dq, dq, 1e-12, 1e-10);
    EXPECT_CLOSE(r.dk, dk, 1e-12, 1e-10);
    EXPECT_CLOSE(r.dv, dv, 1e-12, 1e-10);
  }
}

TEST(AttentionKernels, LargeLogitsDoNotOverflow) {
  // Scores of ~±1000: a softmax without the running max would overflow exp().
  Generator g(3);
  Tensor q = randn({1, 2, 70, 16}, {}, g), k = randn({1, 2, 70, 16}, {}, g), v = randn({1, 2, 70, 16}, {}, g);
  Tensor dout = randn({1, 2, 70, 16}, {}, g);
  const Result r = run_fast<float>(q, k, v, dout, true, 100.0, {16, 16});
  // f32 scores of magnitude ~1e3 carry ~1e-4 absolute error, which moves probabilities by ~1e-4.
  EXPECT_CLOSE(r.o, cpu::ref::attention(q, k, v, true, 100.0), 2e-3, 2e-3);
  for (double x : r.dq.to_vector()) ASSERT_TRUE(std::isfinite(x));
}

TEST(AttentionKernels, Bf16InputsComputeInF32) {
  Generator g(9);
  const Shape s{1, 2, 75, 32};
  Tensor q = randn(s, DType::bf16, g), k = randn(s, DType::bf16, g), v = randn(s, DType::bf16, g),
         dout = randn(s, DType::bf16, g);
  const Result r = run_fast<bfloat16>(q, k, v, dout, true, 0.2);
  ASSERT_EQ(r.o.dtype(), DType::bf16);
  ASSERT_EQ(r.lse.dtype(), DType::f32);
  // The reference sees the same bf16 values; the only extra error is rounding the results to
  // bf16 (8 bits of mantissa: relative 2^-8).
  EXPECT_CLOSE(r.o, cpu::ref::attention(q, k, v, true, 0.2), 1e-2, 1e-2);
  const auto [dq, dk, dv] = cpu::ref::attention_backward(q, k, v, dout, true, 0.2);
  EXPECT_CLOSE(r.dq, dq, 2e-2, 2e-2);
  EXPECT_CLOSE(r.dk, dk, 2e-2, 2e-2);
  EXPECT_CLOSE(r.dv, dv, 2e-2, 2e-2);
}

// The bf16 path on ragged shapes, at every level the CPU has: the bf16 tiles on vdpbf16ps
// (avx512_bf16), the same tiles with its sums in f32 FMAs (avx512), and the f32 tiles on
// widened slices (avx2). Tiles of 7 x 5 rows (odd key tiles: the bf16 pair padding), Tq !=
// Tk, D = 64 and Dv = 40 (operands padded to 16 columns), causal and not; and an odd head
// size (D = 5), which takes the f32 tile path. Reference: the naive f64 kernel on the same
// bf16 values. Tolerance: P and dS are rounded to bf16 (relative 2^-9) before their
// products, and the results to bf16; 2e-2 absolute/relative covers both with ~3x headroom
// on these N(0, 1) inputs.
TEST(AttentionKernels, Bf16TilesOnRaggedShapesMatchReference) {
  for_each_isa_level([](int) {
  struct Case { Shape q, kv; int64_t Dv; bool causal; cpu::AttentionTiles tiles; };
  const Case cases[] = {{{1, 2, 23, 64}, {1, 2, 23, 64}, 40, true, {7, 5}},
                        {{2, 1, 19, 64}, {2, 1, 30, 64}, 40, false, {7, 5}},
                        {{1, 2, 130, 64}, {1, 2, 130, 64}, 64, true, {}},
                        {{1, 1, 17, 5}, {1, 1, 17, 5}, 3, true, {4, 3}},
                        // head dims of 17 and 9 pairs (16-word transpose blocks plus a tail), a
                        // 33-key tile (3 column blocks of 16, the last one of 1)
                        {{1, 2, 70, 34}, {1, 2, 70, 34}, 18, true, {9, 33}}};
  Generator g(31);
  for (const Case& c : cases) {
    SCOPED_TRACE("q " + shape_str(c.q) + " Tk " + std::to_string(c.kv[2]) + " Dv " + std::to_string(c.Dv) +
                 (c.causal ? " causal" : ""));
    Shape vs = c.kv;
    vs[3] = c.Dv;
    Shape os = c.q;
    os[3] = c.Dv;
    Tensor q = randn(c.q, DType::bf16, g), k = randn(c.kv, DType::bf16, g), v = randn(vs, DType::bf16, g),
           dout = randn(os, DType::bf16, g);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.q[3]));
    const Result r = run_fast<bfloat16>(q, k, v, dout, c.causal, scale, c.tiles);
    EXPECT_CLOSE(r.o, cpu::ref::attention(q, k, v, c.causal, scale), 2e-2, 2e-2);
    EXPECT_CLOSE(r.lse, from_vector(ref_lse(q, k, c.causal, scale), r.lse.sizes(), DType::f64), 1e-3, 1e-3);
    const auto [dq, dk, dv] = cpu::ref::attention_backward(q, k, v, dout, c.causal, scale);
    EXPECT_CLOSE(r.dq, dq, 2e-2, 2e-2);
    EXPECT_CLOSE(r.dk, dk, 2e-2, 2e-2);
    EXPECT_CLOSE(r.dv, dv, 2e-2, 2e-2);
  }
  });
}

// Without AVX512_BF16 the bf16 tiles make vdpbf16ps's sums in two f32 FMAs, in its order (the
// odd element's product first), and round P and dS to bf16 in integer arithmetic: on inputs
// without subnormals (which the instruction flushes and the FMAs keep) every output is the
// same bit for bit. Runs where the CPU has AVX512_BF16, to compare the two.
TEST(AttentionKernels, Bf16TilesWithoutAvx512Bf16GiveTheInstructionsBits) {
  if (cpu::isa_supported() != cpu::Isa::avx512_bf16) GTEST_SKIP() << "this CPU has no AVX512_BF16 to compare with";
  Generator g(33);
  const Shape s{2, 3, 77, 64};
  Tensor q = randn(s, DType::bf16, g), k = randn(s, DType::bf16, g), v = randn(s, DType::bf16, g),
         dout = randn(s, DType::bf16, g);
  auto at = [&](cpu::Isa level) {
    const cpu::ScopedIsa scoped(level);
    return run_fast<bfloat16>(q, k, v, dout, true, 0.125, {16, 32});
  };
  const Result native = at(cpu::Isa::avx512_bf16), emulated = at(cpu::Isa::avx512);
  for (auto [a, b, what] : {std::tuple{&native.o, &emulated.o, "o"}, {&native.lse, &emulated.lse, "lse"},
                            {&native.dq, &emulated.dq, "dq"}, {&native.dk, &emulated.dk, "dk"},
                            {&native.dv, &emulated.dv, "dv"}})
    EXPECT_EQ(a->to_vector(), b->to_vector()) << what;
}

// The strided layout GPT uses: q, k, v read in place from one packed [B, T, 3 H D] tensor, O
// written as [B, T, H D], dq, dk, dv into one packed gradient. Reference: the naive f64 kernel on
// the heads split out as contiguous [B, H, T, D] tensors. f64 with tiny tiles (exact up to
// rounding), f32 (oneDNN tile products), bf16 (tile products on vdpbf16ps where available).
template <class T>
void check_packed_layout(int64_t B, int64_t Tt, int64_t H, int64_t hd, cpu::AttentionTiles tiles, double tol) {
  using C = cpu::attn_acc_t<T>;
  const int64_t dm = H * hd;
  Generator g(37);
  Tensor qkv = randn({B, Tt, 3 * dm}, dtype_of<T>, g), dout = randn({B, Tt, dm}, dtype_of<T>, g);
  const cpu::AttentionDims d{B, H, Tt, Tt, hd, hd};
  const cpu::AttentionLayout L = cpu::AttentionLayout::packed_qkv(d);
  Tensor o = empty({B, Tt, dm}, TensorOptions(dtype_of<T>)), lse = empty({B, H, Tt}, TensorOptions(dtype_of<C>));
  Tensor dqkv = full({B, Tt, 3 * dm}, 1e30, TensorOptions(dtype_of<T>));  // every element must be written
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  const T* base = qkv.data_ptr<T>();
  T* gb = dqkv.data_ptr<T>();
  cpu::attention_forward<T>(base, base + dm, base + 2 * dm, o.data_ptr<T>(), lse.data_ptr<C>(), d, L, true, scale, tiles);
  cpu::attention_backward<T>(base, base + dm, base + 2 * dm, o.data_ptr<T>(), dout.data_ptr<T>(), lse.data_ptr<C>(), gb,
                             gb + dm, gb + 2 * dm, d, L, true, scale, tiles);
  auto heads = [&](const Tensor& x, int64_t which) {  // column block `which` as [B, H, T, hd]
    return slice(x, 2, which * dm, (which + 1) * dm).reshape({B, Tt, H, hd}).transpose(1, 2).contiguous();
  };
  auto merge = [&](const Tensor& x) { return x.transpose(1, 2).contiguous().reshape({B, Tt, dm}); };
  const Tensor q = heads(qkv, 0), k = heads(qkv, 1), v = heads(qkv, 2), g4 = heads(dout, 0);
  EXPECT_CLOSE(o, merge(cpu::ref::attention(q, k, v, true, scale)), tol, tol);
  EXPECT_CLOSE(lse, from_vector(ref_lse(q, k, true, scale), {B, H, Tt}, DType::f64), tol, tol);
  const auto [dq, dk, dv] = cpu::ref::attention_backward(q, k, v, g4, true, scale);
  EXPECT_CLOSE(dqkv, cat({merge(dq), merge(dk), merge(dv)}, 2), tol, tol);
}

TEST(AttentionKernels, PackedQkvLayoutMatchesReference) {
  {
    SCOPED_TRACE("f64, 5 x 3 tiles");
    check_packed_layout<double>(2, 13, 3, 4, {5, 3}, 1e-12);
  }
  {
    SCOPED_TRACE("f32, 64 x 64 tiles, ragged T");  // tolerances as FastMatchesReferenceF32 (backward)
    check_packed_layout<float>(2, 70, 2, 16, {}, 1e-4);
  }
  {
    SCOPED_TRACE("f32, 64 x 64 tiles, GPT head size, T past a tile");
    check_packed_layout<float>(1, 200, 3, 64, {}, 1e-4);
  }
  {
    SCOPED_TRACE("bf16, 64 x 64 tiles, ragged T");  // tolerance as Bf16TilesOnRaggedShapesMatchReference
    check_packed_layout<bfloat16>(2, 130, 2, 64, {}, 2e-2);
  }
  {
    SCOPED_TRACE("bf16, 7 x 5 tiles, hd 34");
    check_packed_layout<bfloat16>(1, 23, 2, 34, {7, 5}, 2e-2);
  }
}

}  // namespace athanor
