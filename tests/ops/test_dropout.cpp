// dropout: mask against an independent Philox reference, thread-count
// independence, kept fraction, exact scaling, reproducibility from a saved
// generator state, gradient = mask / (1 - p), gradcheck, eval/p=0/p=1, errors.
#include <omp.h>

#include <cmath>

#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
// The documented mask, computed here straight from philox4x32.
bool keep_ref(GeneratorState s, int64_t i, double p) {
  const auto r = philox4x32(s.seed, s.offset + static_cast<uint64_t>(i / 4));
  return static_cast<double>(uint_to_unit_float(r[i % 4])) >= p;
}

}  // namespace

TEST(Dropout, MaskMatchesPhiloxReferenceAndScalingIsExact) {
  const int64_t n = 100003;  // not a multiple of 4 or 64
  const double p = 0.3;
  Generator data_gen(1);
  Tensor x = ones({n}) + rand({n}, {}, data_gen);  // values in [1, 2): never 0
  Generator gen(1234);
  gen.set_state({1234, 77});
  const GeneratorState s = gen.state();
  Tensor y = dropout(x, p, true, gen);
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  const float* xv = x.data_ptr<float>();
  const float* yv = y.data_ptr<float>();
  int64_t kept = 0, mismatched = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool k = keep_ref(s, i, p);
    kept += k;
    if (yv[i] != (k ? xv[i] * scale : 0.0f)) ++mismatched;  // exact: one f32 multiply
  }
  EXPECT_EQ(mismatched, 0);
  const double mean = n * (1 - p), sigma = std::sqrt(n * p * (1 - p));
  EXPECT_LT(std::fabs(kept - mean), 4 * sigma) << kept << " kept of " << n;
  EXPECT_EQ(gen.state().offset, 77u + (n + 3) / 4);  // one reserve of ceil(n / 4) blocks
}

TEST(Dropout, SameMaskForAnyThreadCount) {
  Generator g0(5);
  Tensor x = randn({300, 401}, {}, g0);
  Tensor y1, y2;
  {
    ThreadCount t(1);
    Generator gen(99);
    y1 = dropout(x, 0.5, true, gen);
  }
  {
    ThreadCount t(2);
    Generator gen(99);
    y2 = dropout(x, 0.5, true, gen);
  }
  EXPECT_CLOSE(y1, y2, 0, 0);
}

TEST(Dropout, ReproducibleFromSavedState) {
  Generator gen(7);
  Tensor x = randn({64, 33}, {}, gen);
  const GeneratorState saved = gen.state();
  Tensor a = dropout(x, 0.2, true, gen);
  Tensor b = dropout(x, 0.2, true, gen);  // the generator moved on: a different mask
  EXPECT_FALSE(all_close(a, b, 0, 0));
  gen.set_state(saved);
  EXPECT_CLOSE(dropout(x, 0.2, true, gen), a, 0, 0);
}

TEST(Dropout, GradientIsMaskOverKeepProbability) {
  const double p = 0.4;
  Tensor x = randn64({50, 7}, 8);
  Generator gen(3);
  const GeneratorState s = gen.state();
  Tensor y = dropout(x, p, true, gen);
  Tensor w = randn64({50, 7}, 9, false);
  (y * w).sum().backward();
  const auto gv = x.grad().to_vector(), wv = w.to_vector();
  for (int64_t i = 0; i < 350; ++i) EXPECT_EQ(gv[i], keep_ref(s, i, p) ? wv[i] / (1 - p) : 0.0) << i;
}

TEST(Dropout, GradcheckAndNonContiguous) {
  Tensor x = make_noncontiguous(randn64({6, 5}, 10));
  ASSERT_FALSE(x.is_contiguous());
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) {
    Generator gen(42);  // same mask on every evaluation
    return dropout(in[0], 0.3, true, gen);
  }, {x}));
  // the mask follows the logical (row-major) index, whatever the memory layout
  Generator g1(11), g2(11);
  EXPECT_CLOSE(dropout(x.detach(), 0.3, true, g1), dropout(x.detach().contiguous(), 0.3, true, g2), 0, 0);
}

TEST(Dropout, EvalZeroOneAndLowPrecision) {
  Tensor x = randn64({4, 4}, 12);
  Generator gen(1);
  EXPECT_TRUE(dropout(x, 0.5, false, gen).is_same(x));
  EXPECT_TRUE(dropout(x, 0.0, true, gen).is_same(x));
  EXPECT_EQ(gen.state().offset, 0u);  // nothing drawn
  Tensor z = dropout(x, 1.0, true, gen);
  for (double v : z.to_vector()) EXPECT_EQ(v, 0.0);
  z.sum().backward();
  for (double v : x.grad().to_vector()) EXPECT_EQ(v, 0.0);
  for (DType dt : {DType::bf16, DType::f16}) {
    Tensor xl = ones({1000}, TensorOptions(dt));
    Generator g(2);
    const GeneratorState s = g.state();
    Tensor yl = dropout(xl, 0.5, true, g);
    EXPECT_EQ(yl.dtype(), dt);
    const auto v = yl.to_vector();
    for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(v[i], keep_ref(s, i, 0.5) ? 2.0 : 0.0) << i;
  }
}

TEST(Dropout, ProbabilityOutOfRangeIsAnError) {
  Tensor x = zeros({2, 3});
  std::string msg = error_message([&] { dropout(x, 1.5, true); });
  EXPECT_NE(msg.find("dropout"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1.5"), std::string::npos) << msg;
  msg = error_message([&] { dropout(x, -0.1, true); });
  EXPECT_NE(msg.find("-0.1"), std::string::npos) << msg;
}

}  // namespace athanor
