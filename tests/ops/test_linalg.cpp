// matmul and linear: transposed and non-contiguous operands, the GEMM against the naive reference, and shape errors.
// The f64 gradchecks over the op's registered shapes (broadcast, transposed, strided) are the
// op harness's (tests/ops/test_op_harness.cpp); this file keeps what the harness does not do.
#include "athanor/ops/autocast.h"
#include "backend/cpu/gemm.h"
#include "ops/op_utils.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

TEST(Matmul, TransposedAndNonContiguousOperands) {
  Tensor a = randn64({4, 3}, 3), b = randn64({5, 4}, 4);
  // a^T @ b^T via transposed views: the GEMM gets them with trans flags, no copy.
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& x) { return matmul(x[0].t(), x[1].t()); }, {a, b}));
  Tensor c = make_noncontiguous(randn64({2, 3, 4}, 5)), d = make_noncontiguous(randn64({2, 4, 2}, 6));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); }, {c, d}));
  // A strided slice-like layout that is neither N nor T for the GEMM (forces a copy).
  Tensor base = randn64({6, 8}, 7, false);
  Tensor e = make_view(base, {3, 4}, {16, 2}, 0);
  e.requires_grad_(true);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); }, {e, randn64({4, 2}, 8)}));
}

TEST(Matmul, MatchesNaiveReferenceInF32) {
  // f32 GEMM (oneDNN) vs a double-accumulating triple loop; K up to 300 so
  // rounding differences stay below ~1e-4 relative.
  Generator g(11);
  for (auto [M, N, K] : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {7, 13, 300}, {64, 48, 96}, {130, 3, 257}}) {
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + (ta ? " ta" : "") + (tb ? " tb" : ""));
        Tensor A = randn(ta ? Shape{K, M} : Shape{M, K}, {}, g), B = randn(tb ? Shape{N, K} : Shape{K, N}, {}, g);
        Tensor fast = full({M, N}, 0.5), ref = full({M, N}, 0.5);
        cpu::gemm(ta, tb, M, N, K, 1.5f, A.data_ptr<float>(), A.size(1), B.data_ptr<float>(), B.size(1), 0.25f,
                  fast.data_ptr<float>(), N);
        cpu::ref::gemm<float>(ta, tb, M, N, K, 1.5, A.data_ptr<float>(), A.size(1), B.data_ptr<float>(), B.size(1), 0.25,
                              ref.data_ptr<float>(), N);
        EXPECT_CLOSE(fast, ref, 1e-4, 1e-4);
      }
  }
}

TEST(Matmul, BatchedMatchesPerMatrixReference) {
  Generator g(12);
  Tensor a = randn({3, 1, 5, 7}, {}, g), b = randn({4, 7, 6}, {}, g);
  Tensor c = matmul(a, b);
  ASSERT_EQ(c.sizes(), (Shape{3, 4, 5, 6}));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j) {
      Tensor expect = empty({5, 6});
      Tensor ai = make_view(a, {5, 7}, {7, 1}, i * 35), bj = make_view(b, {7, 6}, {6, 1}, j * 42);
      cpu::ref::gemm<float>(false, false, 5, 6, 7, 1.0, ai.data_ptr<float>(), 7, bj.data_ptr<float>(), 6, 0.0,
                            expect.data_ptr<float>(), 6);
      Tensor got = make_view(c, {5, 6}, {6, 1}, c.storage_offset() + (i * 4 + j) * 30);
      EXPECT_CLOSE(got, expect, 1e-5, 1e-5);
    }
}

TEST(Matmul, ShapeErrorsNameTheOperands) {
  const std::string msg = error_message([] { matmul(zeros({2, 3}), zeros({4, 5})); });
  EXPECT_NE(msg.find("matmul"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4, 5]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
  EXPECT_NE(error_message([] { matmul(zeros({2, 3}), zeros({3, 2}, DType::f64)); }).find("dtype mismatch"), std::string::npos);
  EXPECT_NE(error_message([] { matmul(zeros({2, 3, 4}), zeros({3, 4, 5})); }).find("cannot be broadcast"), std::string::npos);
}

TEST(Linear, EqualsMatmulPlusBiasInF32) {
  Generator g(13);
  Tensor x = randn({33, 64}, {}, g), w = randn({48, 64}, {}, g), b = randn({48}, {}, g);
  EXPECT_CLOSE(linear(x, w, b), add(matmul(x, w.t()), b), 1e-5, 1e-5);
}

// [rows, cols] row-major values of t in double.
std::vector<double> values(const Tensor& t) { return t.to(DType::f64).to_vector(); }

TEST(Linear, Bf16AutocastWritesF32ParameterGradientsFromF32Accumulators) {
  // Mixed precision: f32 x, W, b under bf16 autocast. W and b are the node's inputs (no
  // cast node), dW and db come in f32 from the f32 sums of bf16 products, compared with a
  // double loop over the same bf16-rounded operands. K = 512 rows: a dW rounded to bf16 on
  // the way (the cast-back path) is off by up to 2^-9 relative, far outside the tolerance.
  const int64_t M = 512, in = 24, out = 16;
  Tensor x = random_leaf({M, in}, 21), w = random_leaf({out, in}, 22), b = random_leaf({out}, 23);
  Generator g(24);
  const Tensor dy = randn({M, out}, {}, g).to(DType::bf16);
  Tensor y;
  {
    autocast ac(DType::bf16);
    y = linear(x, w, b);
  }
  ASSERT_EQ(y.dtype(), DType::bf16);
  ASSERT_TRUE(y.grad_fn());
  EXPECT_EQ(y.grad_fn()->next_edges[0].node->name(), "cast");  // x: an activation, cast in the graph
  EXPECT_EQ(y.grad_fn()->next_edges[1].node->name(), "AccumulateGrad");
  EXPECT_EQ(y.grad_fn()->next_edges[2].node->name(), "AccumulateGrad");
  y.backward(dy);
  ASSERT_EQ(w.grad().dtype(), DType::f32);
  ASSERT_EQ(b.grad().dtype(), DType::f32);
  const std::vector<double> xb = values(x.detach().to(DType::bf16)), wb = values(w.detach().to(DType::bf16)),
                            bb = values(b.detach().to(DType::bf16)), dyb = values(dy);
  std::vector<double> y_ref(M * out), dx_ref(M * in, 0.0), dw_ref(out * in, 0.0), db_ref(out, 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t o = 0; o < out; ++o) {
      double s = bb[o];
      for (int64_t i = 0; i < in; ++i) {
        s += xb[m * in + i] * wb[o * in + i];
        dx_ref[m * in + i] += dyb[m * out + o] * wb[o * in + i];
        dw_ref[o * in + i] += dyb[m * out + o] * xb[m * in + i];
      }
      y_ref[m * out + o] = s;
      db_ref[o] += dyb[m * out + o];
    }
  const Tensor dw_expected = from_vector(dw_ref, {out, in}), db_expected = from_vector(db_ref, {out});
  EXPECT_CLOSE(w.grad(), dw_expected, 1e-4, 1e-4);
  EXPECT_CLOSE(b.grad(), db_expected, 1e-4, 1e-4);
  // The tolerance is tight enough to tell: the same gradients rounded to bf16 fail it.
  EXPECT_FALSE(all_close(dw_expected.to(DType::bf16).to(DType::f32), dw_expected, 1e-4, 1e-4));
  // y and dx are bf16 (one rounding of an f32 sum; x's gradient then cast to f32).
  EXPECT_CLOSE(y.to(DType::f32), from_vector(y_ref, {M, out}), 2e-2, 8e-3);
  EXPECT_CLOSE(x.grad(), from_vector(dx_ref, {M, in}), 2e-2, 8e-3);
}

TEST(Linear, F16AutocastAndFrozenWeightsKeepTheCastPath) {
  Tensor x = random_leaf({8, 12}, 31), w = random_leaf({6, 12}, 32), b = random_leaf({6}, 33);
  Tensor y;
  {
    autocast ac(DType::f16);  // no f16 GEMM with f32 output: W goes through a cast node
    y = linear(x, w, b);
  }
  EXPECT_EQ(y.dtype(), DType::f16);
  EXPECT_EQ(y.grad_fn()->next_edges[1].node->name(), "cast");
  y.backward(ones({8, 6}, TensorOptions(DType::f16)));
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_CLOSE(w.grad(), matmul(ones({6, 8}), x.detach()), 5e-2, 1e-2);
}

TEST(Linear, ErrorsNameShapes) {
  const std::string msg = error_message([] { linear(zeros({2, 5}), zeros({3, 4})); });
  EXPECT_NE(msg.find("linear"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 5]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 4]"), std::string::npos) << msg;
  EXPECT_NE(error_message([] { linear(zeros({2, 4}), zeros({3, 4}), zeros({4})); }).find("bias"), std::string::npos);
}

TEST(Transpose2d, MatchesIndexMappingOnRaggedTiles) {
  // 32 x 32 tiles, both threads: shapes with partial tiles on either side, one row, one column.
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 70}, {45, 1}, {33, 31}, {1024, 24}, {257, 300}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    std::vector<float> src(rows * cols), dst(rows * cols, -1.0f);
    for (int64_t i = 0; i < rows * cols; ++i) src[i] = static_cast<float>(i);
    detail::transpose_2d(src.data(), rows, cols, dst.data());
    int64_t wrong = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) wrong += dst[c * rows + r] != static_cast<float>(r * cols + c);
    EXPECT_EQ(wrong, 0);
  }
}

}  // namespace athanor
