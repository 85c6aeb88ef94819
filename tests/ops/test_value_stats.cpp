// value_stats and its companions (athanor/ops/value_stats.h) on the CPU, against plain
// loops written here over the tensors' logical values (to_vector): the counts, sums,
// extremes and saturation of a tensor with NaN, ±inf and zeros, read through a transposed
// view and in bf16; the L2 norm's NaN/inf semantics; squared distances; the fired units
// (last dim and NCHW, OR-ed over two calls); histogram counts; the errors on bad input.
// tests/gpu/test_gpu_stats.cpp holds the CUDA kernels against these.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "athanor/ops.h"
#include "athanor/ops/value_stats.h"

namespace athanor {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN(), kInf = std::numeric_limits<double>::infinity();

std::vector<double> sample_values(int64_t n) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(std::sin(0.7 * static_cast<double>(i)) * (i % 5 == 0 ? 1.0 : 0.5) + 0.5);
  v[3] = 0, v[10] = 0, v[7] = kNaN, v[12] = kInf, v[20] = -kInf, v[21] = 0.995, v[22] = 0.005, v[23] = -0.999;
  return v;
}

// accumulate_fired_units into `rec` (a new record when undefined), returned.
Tensor fired_of(const Tensor& x, Tensor rec) {
  accumulate_fired_units(x, rec);
  return rec;
}

// The naive statistics of logical values.
TensorStats naive(const std::vector<double>& v, Saturation sat) {
  TensorStats s;
  s.numel = static_cast<int64_t>(v.size());
  for (double x : v) {
    if (std::isnan(x)) { s.nans += 1; continue; }
    if (std::isinf(x)) { s.infs += 1; continue; }
    s.finite += 1, s.sum += x, s.sum_squares += x * x;
    s.absmax = std::max(s.absmax, std::fabs(x)), s.min = std::min(s.min, x), s.max = std::max(s.max, x);
    if (x == 0) s.zeros += 1;
    if ((sat == Saturation::sigmoid && (x < 0.01 || x > 0.99)) || (sat == Saturation::tanh && std::fabs(x) > 0.99))
      s.saturated += 1;
  }
  return s;
}

void expect_stats(const TensorStats& got, const TensorStats& want, const char* what) {
  EXPECT_EQ(got.numel, want.numel) << what;
  EXPECT_EQ(got.finite, want.finite) << what;
  EXPECT_NEAR(got.sum, want.sum, 1e-12 * std::max(1.0, std::fabs(want.sum))) << what;
  EXPECT_NEAR(got.sum_squares, want.sum_squares, 1e-12 * std::max(1.0, want.sum_squares)) << what;
  EXPECT_EQ(got.absmax, want.absmax) << what;
  EXPECT_EQ(got.min, want.min) << what;
  EXPECT_EQ(got.max, want.max) << what;
  EXPECT_EQ(got.zeros, want.zeros) << what;
  EXPECT_EQ(got.saturated, want.saturated) << what;
  EXPECT_EQ(got.nans, want.nans) << what;
  EXPECT_EQ(got.infs, want.infs) << what;
}

TEST(ValueStats, MatchesAPlainLoopWithNonFiniteValuesStridesAndBf16) {
  const std::vector<double> v = sample_values(6 * 7);
  const Tensor x = from_vector(v, {6, 7}, TensorOptions(DType::f64)).to(DType::f32);
  for (Saturation sat : {Saturation::none, Saturation::sigmoid, Saturation::tanh}) {
    expect_stats(value_stats(x, sat), naive(x.to_vector(), sat), "f32");
    const Tensor xt = transpose(x, 0, 1);  // a strided view: its logical order differs from memory
    ASSERT_FALSE(xt.is_contiguous());
    expect_stats(value_stats(xt, sat), naive(xt.to_vector(), sat), "transposed");
    const Tensor xb = x.to(DType::bf16);
    expect_stats(value_stats(xb, sat), naive(xb.to_vector(), sat), "bf16");
  }
  const auto list = value_stats_list({x, x.to(DType::f16)}, Saturation::sigmoid);
  ASSERT_EQ(list.size(), 2u);
  expect_stats(list[1], naive(x.to(DType::f16).to_vector(), Saturation::sigmoid), "f16 in a list");
  const TensorStats e = value_stats(empty({0, 3}, DType::f32));
  EXPECT_EQ(e.numel, 0);
  EXPECT_EQ(e.finite, 0);
  EXPECT_EQ(e.min, kInf);
  EXPECT_EQ(e.max, -kInf);
}

TEST(ValueStats, L2NormIsNanWithANanAndInfWithAnInf) {
  const Tensor a = from_vector(std::vector<double>{3, 4}, {2}, TensorOptions(DType::f64));
  EXPECT_DOUBLE_EQ(value_stats(a).l2_norm(), 5.0);
  EXPECT_TRUE(std::isnan(value_stats(from_vector(std::vector<double>{kInf, kNaN}, {2}, TensorOptions(DType::f64))).l2_norm()));
  EXPECT_EQ(value_stats(from_vector(std::vector<double>{-kInf, 1}, {2}, TensorOptions(DType::f64))).l2_norm(), kInf);
}

TEST(ValueStats, SquaredDistancesAreTheSumOfSquaredDifferences) {
  const std::vector<double> a = {1, 2, 3, 4, 5, 6}, b = {1.5, 2, 2, 4, 8, 6};
  const Tensor ta = from_vector(a, {2, 3}, TensorOptions(DType::f64)), tb = from_vector(b, {2, 3}, TensorOptions(DType::f64));
  const std::vector<double> d = squared_distances({ta, transpose(ta, 0, 1)}, {tb, transpose(tb, 0, 1)});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_DOUBLE_EQ(d[0], 0.25 + 1 + 9);
  EXPECT_DOUBLE_EQ(d[1], 0.25 + 1 + 9);
  EXPECT_THROW(squared_distances({ta}, {transpose(tb, 0, 1)}), Error) << "the shapes differ";
  EXPECT_THROW(squared_distances({ta}, {}), Error) << "the lists differ in length";
}

TEST(ValueStats, FiredUnitsAreOredOverCallsAlongTheLastDimAndNchwChannels) {
  // [2, 3]: unit 0 fires in row 1, unit 1 never (0 and a NaN), unit 2 in row 0.
  const Tensor a = from_vector(std::vector<double>{-1, 0, 2, 3, kNaN, -4}, {2, 3}, TensorOptions(DType::f64));
  Tensor rec = fired_of(a, Tensor());
  EXPECT_EQ(rec.to_vector(), (std::vector<double>{1, 0, 1}));
  const Tensor b = from_vector(std::vector<double>{0, 0.5, 0}, {1, 3}, TensorOptions(DType::f64));
  rec = fired_of(b, rec);
  EXPECT_EQ(rec.to_vector(), (std::vector<double>{1, 1, 1})) << "the second call ORs into the record";
  // NCHW [2, 3, 2, 2]: a channel fires where one of its planes has a value > 0.
  std::vector<double> v(2 * 3 * 2 * 2, -1.0);
  v[1 * 12 + 1 * 4 + 1] = 0.1;  // sample 1, channel 1, (0, 1): flat 17, so 17 % 3 would name unit 2
  v[0 * 12 + 0 * 4 + 0] = 5.0;  // sample 0, channel 0, (0, 0)
  const Tensor c = from_vector(v, {2, 3, 2, 2}, TensorOptions(DType::f64)).to(DType::f32);
  EXPECT_EQ(fired_of(c, Tensor()).to_vector(), (std::vector<double>{1, 1, 0}));
  EXPECT_THROW(fired_of(c, rec.to(DType::f32)), Error) << "a record of another dtype";
  EXPECT_THROW(fired_of(from_vector(std::vector<double>{1, 2}, {2}, TensorOptions(DType::f64)), rec), Error)
      << "a record of another width";
}

TEST(ValueStats, HistogramCountsFollowTheBucketLimits) {
  const std::vector<double> v = {0, 0.1, 0.25, 0.5, 0.5000001, 0.75, 1.0, kNaN, kInf};
  const Tensor x = from_vector(v, {9}, TensorOptions(DType::f64));
  const std::vector<double> limits = {0.25, 0.5, 0.75, 1.0};
  // (−, 0.25] holds 0, 0.1, 0.25; (0.25, 0.5] 0.5; (0.5, 0.75] 0.5000001, 0.75; (0.75, 1] 1.0.
  EXPECT_EQ(histogram_counts(x, 0.0, 0.25, limits), (std::vector<double>{3, 1, 2, 1}));
  EXPECT_THROW(histogram_counts(x, 0.0, 0.0, limits), Error) << "zero width";
  EXPECT_THROW(histogram_counts(x, 0.0, 0.25, {}), Error) << "no buckets";
}

TEST(ValueStats, RejectsIntegerAndUndefinedTensors) {
  EXPECT_THROW(value_stats(from_vector(std::vector<int64_t>{1, 2}, {2})), Error);
  EXPECT_THROW(value_stats(Tensor()), Error);
}

}  // namespace
}  // namespace athanor
