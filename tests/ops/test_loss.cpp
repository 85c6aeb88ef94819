// cross_entropy and mse_loss: cross_entropy's gradcheck (reductions, ignore_index, label
// smoothing, 1-D logits, non-contiguous), forward against independent
// computations and a PyTorch value, fast kernels against the reference (rows of
// 1..5000 classes, logits up to ±1e4), 16-bit dtypes, and the errors.
// The f64 gradchecks over the op's registered shapes (broadcast, transposed, strided) are the
// op harness's (tests/ops/test_op_harness.cpp); this file keeps what the harness does not do.
#include <cmath>

#include "backend/cpu/cross_entropy.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
Tensor targets(const std::vector<int64_t>& v) { return from_vector(v, {static_cast<int64_t>(v.size())}); }

// Independent cross-entropy per row, from log-softmax in double (PyTorch semantics).
std::vector<double> ce_rows(const Tensor& logits, const std::vector<int64_t>& t, int64_t ignore, double eps) {
  const auto v = logits.to_vector();
  const int64_t C = logits.size(-1), N = static_cast<int64_t>(t.size());
  std::vector<double> out(N, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    if (t[n] == ignore) continue;
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, v[n * C + c]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(v[n * C + c] - m);
    const double lse = m + std::log(s);
    double smooth = 0;
    for (int64_t c = 0; c < C; ++c) smooth += lse - v[n * C + c];
    out[n] = (1 - eps) * (lse - v[n * C + t[n]]) + eps * smooth / C;
  }
  return out;
}

}  // namespace

// ---- cross_entropy ---------------------------------------------------------------------------

TEST(CrossEntropy, GradcheckReductionsIgnoreSmoothing) {
  const std::vector<int64_t> t = {2, -100, 0, 4, 1, -100};
  for (Reduction red : {Reduction::mean, Reduction::sum, Reduction::none})
    for (double eps : {0.0, 0.1})
      for (int64_t ignore : {int64_t(-100), int64_t(4)}) {
        SCOPED_TRACE(::testing::Message() << "reduction " << static_cast<int>(red) << " eps " << eps << " ignore " << ignore);
        std::vector<int64_t> tt = t;
        for (auto& v : tt)
          if (v == -100) v = ignore == -100 ? -100 : 3;  // with ignore_index 4, row 3 is the ignored one
        Tensor logits = randn64({6, 5}, 1), target = targets(tt);
        EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], target, ignore, eps, red); }, {logits}));
      }
}

TEST(CrossEntropy, GradcheckOneDimAndNonContiguous) {
  Tensor l1 = randn64({7}, 2);
  Tensor t0 = from_vector(std::vector<int64_t>{3}, {});
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], t0, -100, 0.2); }, {l1}));
  Tensor ln = make_noncontiguous(randn64({4, 3}, 3));
  ASSERT_FALSE(ln.is_contiguous());
  Tensor t = targets({0, 2, 1, 2}).to(DType::i32);  // i32 targets are accepted
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], t, -100, 0.1, Reduction::none); }, {ln}));
}

TEST(CrossEntropy, ForwardMatchesDefinitionAndPyTorch) {
  // torch.nn.functional.cross_entropy(torch.tensor([[1., 2., 3.]]), torch.tensor([2]), label_smoothing=0.1) = 0.5076059...
  Tensor l = from_vector(std::vector<double>{1, 2, 3}, {1, 3});
  EXPECT_NEAR(cross_entropy(l, targets({2})).item(), 0.40760596444438, 1e-6);
  EXPECT_NEAR(cross_entropy(l, targets({2}), -100, 0.1).item(), 0.50760596444438, 1e-6);

  Generator g(4);
  Tensor logits = randn({8, 11}, {}, g) * 5.0;
  const std::vector<int64_t> t = {3, -100, 0, 10, 7, 7, -100, 1};
  const auto rows = ce_rows(logits, t, -100, 0.15);
  double total = 0;
  for (double r : rows) total += r;
  EXPECT_CLOSE(cross_entropy(logits, targets(t), -100, 0.15, Reduction::none), from_vector(rows, {8}, TensorOptions(DType::f64)), 1e-5, 1e-5);
  EXPECT_NEAR(cross_entropy(logits, targets(t), -100, 0.15, Reduction::sum).item(), total, 1e-4);
  EXPECT_NEAR(cross_entropy(logits, targets(t), -100, 0.15, Reduction::mean).item(), total / 6, 1e-5);  // 6 non-ignored
}

TEST(CrossEntropy, AllIgnoredMeanIsNaN) {
  Tensor logits = randn64({3, 4}, 5);
  Tensor loss = cross_entropy(logits, targets({-100, -100, -100}));
  EXPECT_TRUE(std::isnan(loss.item()));
  loss.backward();
  for (double v : logits.grad().to_vector()) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(cross_entropy(logits.detach(), targets({-100, -100, -100}), -100, 0.0, Reduction::sum).item(), 0.0);
}

TEST(CrossEntropy, GradientIsSoftmaxMinusSmoothedTarget) {
  // d(mean loss)/dlogits = (softmax - (1-eps) onehot - eps/C) / count, 0 for ignored rows
  Tensor logits = randn64({3, 4}, 6);
  const double eps = 0.2;
  cross_entropy(logits, targets({1, -100, 3}), -100, eps).backward();
  const auto sm = softmax(logits.detach(), 1).to_vector(), gr = logits.grad().to_vector();
  const int64_t tt[3] = {1, -1, 3};
  for (int n = 0; n < 3; ++n)
    for (int c = 0; c < 4; ++c) {
      const double want = n == 1 ? 0.0 : (sm[n * 4 + c] - (1 - eps) * (c == tt[n]) - eps / 4) / 2;
      EXPECT_NEAR(gr[n * 4 + c], want, 1e-12) << n << "," << c;
    }
}

TEST(CrossEntropy, LowPrecisionDtypes) {
  Generator g(7);
  Tensor logits = randn({6, 50}, {}, g) * 3.0;
  const std::vector<int64_t> t = {0, 49, 3, -100, 25, 8};
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor l = logits.to(dt);
    const auto rows = ce_rows(l, t, -100, 0.1);
    double total = 0;
    for (double r : rows) total += r;
    Tensor loss = cross_entropy(l, targets(t), -100, 0.1);
    EXPECT_EQ(loss.dtype(), dt);
    EXPECT_NEAR(loss.item(), total / 5, 0.02 * total / 5);  // the result is rounded to 16 bits
    Tensor lg = l.detach().requires_grad_();
    cross_entropy(lg, targets(t)).backward();
    EXPECT_EQ(lg.grad().dtype(), dt);
  }
}

TEST(CrossEntropy, FastKernelMatchesReference) {
  // f32, C = 1..5000, logits at scale 1, 20 and 1e4, every 7th target ignored,
  // smoothing 0 and 0.1. Tolerances: per-row loss atol 1e-4 + rtol 1e-5 (f32 sums
  // of C terms; the loss is formed from x - max, so 1e4 logits lose nothing to
  // the magnitude of logsumexp); gradient atol 1e-6 + rtol 1e-4.
  for (int64_t C : {1, 2, 16, 17, 100, 1000, 4999}) {
    for (double scale : {1.0, 20.0, 1e4}) {
      for (double eps : {0.0, 0.1}) {
        SCOPED_TRACE(::testing::Message() << "C " << C << " scale " << scale << " eps " << eps);
        const int64_t N = C > 1000 ? 5 : 29;
        const auto x = random_floats(N * C, 8 + C, scale);
        std::vector<int64_t> t(N);
        for (int64_t n = 0; n < N; ++n) t[n] = n % 7 == 3 ? -100 : (n * 31 + 5) % C;
        std::vector<float> st(2 * N), str(2 * N);
        std::vector<double> loss(N), lossr(N), grad(N);
        for (int64_t n = 0; n < N; ++n) grad[n] = 0.5 + 0.1 * n;
        cpu::cross_entropy_forward<float>(x.data(), t.data(), st.data(), loss.data(), N, C, -100, eps);
        cpu::ref::cross_entropy_forward<float>(x.data(), t.data(), str.data(), lossr.data(), N, C, -100, eps);
        for (int64_t n = 0; n < N; ++n) ASSERT_NEAR(loss[n], lossr[n], 1e-4 + 1e-5 * std::fabs(lossr[n])) << "row " << n;
        for (int64_t stride : {0, 1}) {
          std::vector<float> d(N * C), dr(N * C);
          cpu::cross_entropy_backward<float>(x.data(), t.data(), st.data(), grad.data(), stride, 0.25, d.data(), N, C, -100, eps);
          cpu::ref::cross_entropy_backward<float>(x.data(), t.data(), str.data(), grad.data(), stride, 0.25, dr.data(), N, C, -100, eps);
          for (int64_t i = 0; i < N * C; ++i) ASSERT_NEAR(d[i], dr[i], 1e-6 + 1e-4 * std::fabs(dr[i])) << "element " << i;
        }
      }
    }
  }
}

TEST(CrossEntropy, ErrorsNameOpShapesAndValue) {
  Tensor logits = zeros({3, 5});
  std::string msg = error_message([&] { cross_entropy(logits, targets({0, 7, 1})); });
  EXPECT_NE(msg.find("cross_entropy"), std::string::npos) << msg;
  EXPECT_NE(msg.find("target value 7"), std::string::npos) << msg;
  EXPECT_NE(msg.find("position 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("C = 5"), std::string::npos) << msg;
  msg = error_message([&] { cross_entropy(logits, targets({0, -1, 1})); });  // negative, not the ignore_index
  EXPECT_NE(msg.find("target value -1"), std::string::npos) << msg;
  msg = error_message([&] { cross_entropy(logits, targets({0, 1})); });
  EXPECT_NE(msg.find("cross_entropy"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 5]"), std::string::npos) << msg;
  msg = error_message([&] { cross_entropy(logits, zeros({3})); });
  EXPECT_NE(msg.find("integer class ids"), std::string::npos) << msg;
}

// ---- mse_loss -------------------------------------------------------------------------------

TEST(MseLoss, ForwardKernelsAndErrors) {
  Tensor a = from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2}), b = from_vector(std::vector<double>{0, 2, 5, 1}, {2, 2});
  EXPECT_CLOSE(mse_loss(a, b, Reduction::none), from_vector(std::vector<double>{1, 0, 4, 9}, {2, 2}), 0, 0);
  EXPECT_EQ(mse_loss(a, b, Reduction::sum).item(), 14.0);
  EXPECT_EQ(mse_loss(a, b).item(), 3.5);
  // fast kernels vs reference, f32, 1e5+3 elements (several chunks): sum rtol 1e-6
  const int64_t n = 100003;
  const auto x = random_floats(n, 13, 1.0), y = random_floats(n, 14, 1.0), g = random_floats(n, 15, 1.0);
  EXPECT_NEAR(cpu::mse_sum<float>(x.data(), y.data(), n), cpu::ref::mse_sum<float>(x.data(), y.data(), n), 1e-6 * 2 * n);
  std::vector<float> o(n), orf(n), da(n), dar(n), db(n), dbr(n);
  cpu::mse_forward<float>(x.data(), y.data(), o.data(), n);
  cpu::ref::mse_forward<float>(x.data(), y.data(), orf.data(), n);
  cpu::mse_backward<float>(x.data(), y.data(), g.data(), 1, 0.5, da.data(), db.data(), n);
  cpu::ref::mse_backward<float>(x.data(), y.data(), g.data(), 1, 0.5, dar.data(), dbr.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(o[i], orf[i], 1e-6 * std::fabs(orf[i]) + 1e-7) << i;
    ASSERT_NEAR(da[i], dar[i], 1e-6 * std::fabs(dar[i]) + 1e-7) << i;
    ASSERT_EQ(db[i], -da[i]) << i;
  }
  const std::string msg = error_message([] { mse_loss(zeros({2, 3}), zeros({3})); });
  EXPECT_NE(msg.find("mse_loss"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3]"), std::string::npos) << msg;
}

}  // namespace athanor
