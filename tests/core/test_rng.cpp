// Philox4x32-10: known-answer vectors from the Random123 distribution
// (kat_vectors), thread-count independence of the tensor fills, the moments of
// the normal and uniform distributions, and generator state save/restore.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
// Random123's philox4x32_10 takes a 4-word counter and a 2-word key; athanor's
// philox4x32(seed, counter, stream) packs them as
//   counter = c0 | c1 << 32, stream = c2 | c3 << 32, seed = k0 | k1 << 32.
std::array<uint32_t, 4> r123(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  auto pack = [](uint32_t lo, uint32_t hi) { return static_cast<uint64_t>(lo) | static_cast<uint64_t>(hi) << 32; };
  return philox4x32(pack(k[0], k[1]), pack(c[0], c[1]), pack(c[2], c[3]));
}

std::vector<double> values_with_threads(int threads, bool normal, DType dt, int64_t n) {
  ThreadCount guard(threads);
  Generator g(1234);
  Tensor t = normal ? randn({n}, dt, g) : rand({n}, dt, g);
  return t.to_vector();
}
}  // namespace

TEST(Rng, PhiloxKnownAnswers) {
  using W = std::array<uint32_t, 4>;
  EXPECT_EQ(r123({0, 0, 0, 0}, {0, 0}), (W{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(r123({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
            (W{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(r123({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
            (W{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
  EXPECT_EQ(philox4x32(0, 0), philox4x32(0, 0, 0));  // stream defaults to 0
}

TEST(Rng, PhiloxBlocksAreDistinct) {
  // Neighbouring counters, seeds and streams give unrelated blocks.
  const auto a = philox4x32(1, 0), b = philox4x32(1, 1), c = philox4x32(2, 0), d = philox4x32(1, 0, 1);
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  EXPECT_EQ(uint_to_unit_float(0), 0.0f);
  EXPECT_LT(uint_to_unit_float(0xffffffffu), 1.0f);
}

TEST(Rng, FillsAreIndependentOfThreadCount) {
  // Sizes above the parallel thresholds (2^14 normals, 2^15 uniforms), odd so the last block is partial.
  const int64_t n = (1 << 17) + 3;
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    EXPECT_EQ(values_with_threads(1, true, dt, n), values_with_threads(2, true, dt, n));
    EXPECT_EQ(values_with_threads(1, false, dt, n), values_with_threads(2, false, dt, n));
  }
  // A small tensor (serial path) is the prefix of the same stream as a large one.
  Generator g1(1234), g2(1234);
  const auto small = randn({5}, DType::f64, g1).to_vector();
  const auto large = randn({n}, DType::f64, g2).to_vector();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(small[i], large[i]);
}

TEST(Rng, NormalAndUniformMoments) {
  const int64_t n = 1'000'000;
  Generator g(42);
  const auto z = randn({n}, DType::f64, g).to_vector();
  double s = 0, s2 = 0;
  for (double v : z) s += v;
  const double mean = s / n;
  for (double v : z) s2 += (v - mean) * (v - mean);
  const double sd = std::sqrt(s2 / (n - 1));
  // 4 standard errors: se(mean) = 1/sqrt(n), se(sd) ~= 1/sqrt(2n) for a normal.
  EXPECT_LT(std::abs(mean), 4.0 / std::sqrt(double(n))) << mean;
  EXPECT_LT(std::abs(sd - 1.0), 4.0 / std::sqrt(2.0 * n)) << sd;

  const auto u = rand({n}, DType::f64, g).to_vector();
  double us = 0, umin = 1, umax = 0;
  for (double v : u) { us += v; umin = std::min(umin, v); umax = std::max(umax, v); }
  EXPECT_LT(std::abs(us / n - 0.5), 4.0 * std::sqrt(1.0 / 12.0 / n));
  EXPECT_GE(umin, 0.0);
  EXPECT_LT(umax, 1.0);

  // normal_/uniform_ honour their parameters.
  Tensor t = empty({n}, DType::f64);
  normal_(t, 3.0, 0.5, g);
  EXPECT_NEAR(t.mean().item(), 3.0, 4 * 0.5 / std::sqrt(double(n)));
  uniform_(t, -2.0, 6.0, g);
  const auto w = t.to_vector();
  EXPECT_GE(*std::min_element(w.begin(), w.end()), -2.0);
  EXPECT_LT(*std::max_element(w.begin(), w.end()), 6.0);
  const auto ri = randint(-3, 4, {10000}, g).to_vector();
  EXPECT_EQ(*std::min_element(ri.begin(), ri.end()), -3);
  EXPECT_EQ(*std::max_element(ri.begin(), ri.end()), 3);
}

// uniform_ computes lo + (hi - lo)·u in double and rounds to the tensor's
// dtype; in bf16/f16 a u just below 1 would round up to `hi` (~0.2% of bf16
// draws) without the clamp to the largest value below hi. [lo, hi) for every dtype.
TEST(Rng, UniformStaysBelowHighInLowPrecision) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Generator g(0);
    const auto v = rand({1 << 20}, dt, g).to_vector();
    EXPECT_LT(*std::max_element(v.begin(), v.end()), 1.0);
    Tensor t = empty({1 << 20}, dt);
    uniform_(t, -2.0, 6.0, g);
    const auto w = t.to_vector();
    EXPECT_LT(*std::max_element(w.begin(), w.end()), 6.0);
  }
}

TEST(Rng, GeneratorStateSaveRestore) {
  Generator g(7);
  (void)randn({10}, {}, g);  // advance past the start
  const GeneratorState saved = g.state();
  const auto a = randn({1000}, DType::f64, g).to_vector();
  const auto b = rand({33}, DType::f32, g).to_vector();
  EXPECT_NE(g.state(), saved);
  g.set_state(saved);
  EXPECT_EQ(randn({1000}, DType::f64, g).to_vector(), a);
  EXPECT_EQ(rand({33}, DType::f32, g).to_vector(), b);

  // The state is exactly (seed, offset): a fresh generator given it continues the stream.
  Generator h(999);
  h.set_state(saved);
  EXPECT_EQ(randn({1000}, DType::f64, h).to_vector(), a);

  // reserve() hands out consecutive block ranges.
  Generator r(5);
  EXPECT_EQ(r.reserve(10), (GeneratorState{5, 0}));
  EXPECT_EQ(r.reserve(1), (GeneratorState{5, 10}));
  EXPECT_EQ(r.state(), (GeneratorState{5, 11}));
  r.manual_seed(6);
  EXPECT_EQ(r.state(), (GeneratorState{6, 0}));

  // The default generator is reseedable.
  manual_seed(11);
  const auto d1 = randn({8}).to_vector();
  manual_seed(11);
  EXPECT_EQ(randn({8}).to_vector(), d1);
}

}  // namespace athanor
