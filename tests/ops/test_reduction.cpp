// Reductions: sum/mean (src/ops/sum.cpp), max/min/argmax (src/ops/minmax.cpp),
// var (src/ops/var.cpp). Values are compared with a naive f64 grouping of the
// input's elements written here.
// The f64 gradchecks over the op's registered shapes (broadcast, transposed, strided) are the
// op harness's (tests/ops/test_op_harness.cpp); this file keeps what the harness does not do.
#include <cmath>
#include <limits>

#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {

// Groups x's elements (logical row-major order) by their coordinates outside
// `dims` (already wrapped, any order): one group per output element, in the
// output's row-major order; each group lists its values in row-major order of
// the reduced coordinates (so the first element of a group is the first one).
std::vector<std::vector<double>> groups(const Tensor& x, const std::vector<int64_t>& dims) {
  const auto v = x.to_vector();
  const Shape& s = x.sizes();
  const int64_t nd = x.dim();
  auto reduced = [&](int64_t d) { return dims.empty() || std::find(dims.begin(), dims.end(), d) != dims.end(); };
  int64_t nout = 1;
  for (int64_t d = 0; d < nd; ++d)
    if (!reduced(d)) nout *= s[d];
  std::vector<std::vector<double>> out(nout);
  for (int64_t lin = 0; lin < static_cast<int64_t>(v.size()); ++lin) {
    int64_t rem = lin, key = 0, mult = 1;
    for (int64_t d = nd - 1; d >= 0; --d) {
      const int64_t c = rem % s[d];
      rem /= s[d];
      if (!reduced(d)) key += c * mult, mult *= s[d];
    }
    out[key].push_back(v[lin]);
  }
  return out;
}

std::vector<int64_t> wrap(std::vector<int64_t> dims, int64_t nd) {
  for (auto& d : dims) d = d < 0 ? d + nd : d;
  return dims;
}

Tensor expected(const std::vector<double>& vals, const Shape& shape) { return from_vector(vals, shape, DType::f64); }

Shape out_shape(const Shape& in, const std::vector<int64_t>& dims, bool keepdim) {
  Shape o;
  for (int64_t d = 0; d < static_cast<int64_t>(in.size()); ++d) {
    const bool r = dims.empty() || std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!r) o.push_back(in[d]);
    else if (keepdim) o.push_back(1);
  }
  return o;
}

struct DimCase {
  Shape shape;
  std::vector<int64_t> dims;
  bool keepdim;
};
const std::vector<DimCase> kDimCases = {
    {{3, 4, 5}, {}, false},   {{3, 4, 5}, {0}, false},     {{3, 4, 5}, {-1}, true},  {{3, 4, 5}, {1}, false},
    {{3, 4, 5}, {0, 2}, true}, {{3, 4, 5}, {-1, 0}, false}, {{3, 4, 5}, {1, 2}, false}, {{6}, {0}, true},
    {{2, 1, 3}, {1}, false},
};

}  // namespace

// ---------------------------------------------------------------- sum / mean

TEST(Sum, ValuesMatchNaiveGrouping) {
  for (const auto& c : kDimCases)
    for (bool noncontig : {false, true}) {
      SCOPED_TRACE(shape_str(c.shape) + " dims " + std::to_string(c.dims.size()) + (noncontig ? " strided" : ""));
      Tensor x = randn64(c.shape, 11, false);
      if (noncontig) x = make_noncontiguous(x);
      const auto g = groups(x, wrap(c.dims, x.dim()));
      std::vector<double> s, m;
      for (const auto& grp : g) {
        double acc = 0;
        for (double v : grp) acc += v;
        s.push_back(acc);
        m.push_back(acc / grp.size());
      }
      const Shape os = out_shape(c.shape, wrap(c.dims, x.dim()), c.keepdim);
      EXPECT_CLOSE(sum(x, c.dims, c.keepdim), expected(s, os), 1e-12, 1e-12);
      EXPECT_CLOSE(mean(x, c.dims, c.keepdim), expected(m, os), 1e-12, 1e-12);
    }
}

TEST(Sum, MethodsAndLowPrecision) {
  Tensor x = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::bf16);
  EXPECT_EQ(sum(x, {1}).dtype(), DType::bf16);
  EXPECT_CLOSE(sum(x, {1}), expected({6, 15}, {2}), 0, 0);
  EXPECT_CLOSE(mean(x, {0}), expected({2.5, 3.5, 4.5}, {3}), 0, 0);
  EXPECT_DOUBLE_EQ(x.sum().item(), 21.0);
  EXPECT_DOUBLE_EQ(x.mean().item(), 3.5);
}

TEST(Sum, IntegerInputIsRejected) {
  const std::string msg = error_message([] { sum(arange(0, 4, DType::i64)); });
  EXPECT_NE(msg.find("sum"), std::string::npos) << msg;
  EXPECT_NE(msg.find("i64"), std::string::npos) << msg;
}

// ---------------------------------------------------------------- max / min / argmax

TEST(MaxMin, ValuesAndFirstIndexMatchNaive) {
  const std::vector<std::tuple<Shape, int64_t, bool>> cases = {
      {{3, 4, 5}, 0, false}, {{3, 4, 5}, 1, true}, {{3, 4, 5}, -1, false}, {{7}, 0, true}, {{2, 40, 3}, 1, false}};
  for (auto& [shape, dim, keepdim] : cases)
    for (bool noncontig : {false, true}) {
      SCOPED_TRACE(shape_str(shape) + " dim " + std::to_string(dim) + (noncontig ? " strided" : ""));
      Generator gen(3);
      // Small integers: many ties, so "first index" is really exercised.
      Tensor x = randint(-3, 4, shape, gen).to(DType::f64);
      if (noncontig) x = make_noncontiguous(x);
      const int64_t d = dim < 0 ? dim + x.dim() : dim;
      const auto g = groups(x, {d});
      std::vector<double> mx, mn, amx;
      for (const auto& grp : g) {
        const auto itmax = std::max_element(grp.begin(), grp.end());  // first maximal element
        mx.push_back(*itmax);
        mn.push_back(*std::min_element(grp.begin(), grp.end()));
        amx.push_back(static_cast<double>(itmax - grp.begin()));
      }
      const Shape os = out_shape(shape, {d}, keepdim);
      EXPECT_CLOSE(max(x, dim, keepdim), expected(mx, os), 0, 0);
      EXPECT_CLOSE(min(x, dim, keepdim), expected(mn, os), 0, 0);
      Tensor am = argmax(x, dim, keepdim);
      EXPECT_EQ(am.dtype(), DType::i64);
      EXPECT_CLOSE(am, expected(amx, os), 0, 0);
    }
}

TEST(MaxMin, GradientGoesToFirstExtremalElement) {
  Tensor x = from_vector(std::vector<double>{1, 3, 3, 2, /**/ 5, 0, 5, 0}, {2, 4}, DType::f64).requires_grad_();
  max(x, 1).sum().backward();
  EXPECT_CLOSE(x.grad(), expected({0, 1, 0, 0, 1, 0, 0, 0}, {2, 4}), 0, 0);
  x.set_grad(Tensor());
  min(x, -1).sum().backward();
  EXPECT_CLOSE(x.grad(), expected({1, 0, 0, 0, 0, 1, 0, 0}, {2, 4}), 0, 0);
  x.set_grad(Tensor());
  max(x).backward();  // over all elements: 5 appears at flat 4 and 6
  EXPECT_CLOSE(x.grad(), expected({0, 0, 0, 0, 1, 0, 0, 0}, {2, 4}), 0, 0);
  x.set_grad(Tensor());
  min(x).backward();  // 0 at flat 5 and 7
  EXPECT_CLOSE(x.grad(), expected({0, 0, 0, 0, 0, 1, 0, 0}, {2, 4}), 0, 0);
}

TEST(MaxMin, NaNPropagatesWithItsIndex) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = from_vector(std::vector<double>{1, nan, 7, nan, /**/ 4, 2, 9, 3}, {2, 4}, DType::f32);
  Tensor m = max(x, 1);
  EXPECT_TRUE(std::isnan(m.to_vector()[0]));
  EXPECT_EQ(m.to_vector()[1], 9);
  EXPECT_CLOSE(argmax(x, 1), expected({1, 2}, {2}), 0, 0);
  EXPECT_TRUE(std::isnan(min(x, 1).to_vector()[0]));
  EXPECT_TRUE(std::isnan(max(x).item()));
}

TEST(MaxMin, LowPrecisionIntegerAndScalarInputs) {
  for (DType dt : {DType::bf16, DType::f16, DType::f32, DType::i32, DType::i64, DType::u8}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = from_vector(std::vector<double>{3, 1, 4, 1, 5, 9, 2, 6}, {2, 4}, dt);
    Tensor m = max(x, 1);
    EXPECT_EQ(m.dtype(), dt);
    EXPECT_CLOSE(m, expected({4, 9}, {2}), 0, 0);
    EXPECT_CLOSE(min(x, 0), expected({3, 1, 2, 1}, {4}), 0, 0);
    EXPECT_DOUBLE_EQ(max(x).item(), 9);
    EXPECT_DOUBLE_EQ(min(x).item(), 1);
    EXPECT_CLOSE(argmax(x, 0, true), expected({1, 1, 0, 1}, {1, 4}), 0, 0);
  }
  Tensor bf = from_vector(std::vector<double>{1.0078125, 1.015625, -3.5}, {3}, DType::bf16);  // values copied exactly
  EXPECT_DOUBLE_EQ(max(bf).item(), 1.015625);
  Tensor s = scalar_tensor(2.5, DType::f64);
  EXPECT_DOUBLE_EQ(max(s, 0).item(), 2.5);
  EXPECT_EQ(max(s, -1, true).dim(), 0);
  EXPECT_EQ(argmax(s, 0).item<int64_t>(), 0);
}

TEST(MaxMin, LowPrecisionGradientHasInputDtype) {
  Tensor x = from_vector(std::vector<double>{1, 5, 2, 7, 3, 0}, {2, 3}, DType::bf16).requires_grad_();
  sum(max(x, 1)).backward();
  EXPECT_EQ(x.grad().dtype(), DType::bf16);
  EXPECT_CLOSE(x.grad(), expected({0, 1, 0, 1, 0, 0}, {2, 3}), 0, 0);
}

TEST(MaxMin, LongRowsMatchNaive) {
  // Long rows take the chunked-parallel and the 16-lane paths of the fast kernel.
  Generator gen(5);
  Tensor x = randint(-1000, 1000, {3, 200003}, gen).to(DType::f32);
  const auto g = groups(x, {1});
  std::vector<double> mx, amx;
  for (const auto& grp : g) {
    const auto it = std::max_element(grp.begin(), grp.end());
    mx.push_back(*it);
    amx.push_back(static_cast<double>(it - grp.begin()));
  }
  EXPECT_CLOSE(max(x, 1), expected(mx, {3}), 0, 0);
  EXPECT_CLOSE(argmax(x, 1), expected(amx, {3}), 0, 0);
  Tensor row = reshape(x, {-1});
  const auto v = row.to_vector();
  const auto it = std::min_element(v.begin(), v.end());
  EXPECT_DOUBLE_EQ(min(row).item(), *it);
  Tensor r = row.detach().requires_grad_();
  min(r).backward();
  EXPECT_DOUBLE_EQ(r.grad().to_vector()[it - v.begin()], 1.0);
  EXPECT_DOUBLE_EQ(sum(r.grad()).item(), 1.0);
}

TEST(MaxMin, Errors) {
  std::string msg = error_message([] { max(zeros({2, 0}), 1); });
  EXPECT_NE(msg.find("max"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 0]"), std::string::npos) << msg;
  msg = error_message([] { min(zeros({0, 3})); });
  EXPECT_NE(msg.find("min"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[0, 3]"), std::string::npos) << msg;
  msg = error_message([] { argmax(zeros({2, 3}), 2); });
  EXPECT_NE(msg.find("argmax"), std::string::npos) << msg;
  msg = error_message([] { max(ones({2}, DType::boolean), 0); });
  EXPECT_NE(msg.find("bool"), std::string::npos) << msg;
}

// ---------------------------------------------------------------- var

TEST(Var, HandComputedValues) {
  Tensor x = from_vector(std::vector<double>{1, 2, 3, 4}, {4}, DType::f64);
  EXPECT_DOUBLE_EQ(var(x).item(), 5.0 / 3.0);               // sum of squared deviations 5, N-1 = 3
  EXPECT_DOUBLE_EQ(var(x, {}, 0).item(), 1.25);             // population: 5 / 4
  Tensor y = from_vector(std::vector<double>{1, 2, 3, 4, 6, 8}, {2, 3}, DType::f64);
  EXPECT_CLOSE(var(y, {1}), expected({1, 4}, {2}), 1e-15, 0);
  EXPECT_CLOSE(var(y, {0}, 0, true), expected({2.25, 4, 6.25}, {1, 3}), 1e-15, 0);
  EXPECT_TRUE(std::isnan(var(from_vector(std::vector<double>{3}, {1}, DType::f64)).item()));  // N - 1 = 0
}

TEST(Var, ValuesMatchNaiveGrouping) {
  for (const auto& c : kDimCases)
    for (int64_t corr : {0, 1, 2})
      for (bool noncontig : {false, true}) {
        SCOPED_TRACE(shape_str(c.shape) + " corr " + std::to_string(corr) + (noncontig ? " strided" : ""));
        Tensor x = add(randn64(c.shape, 31, false), 100.0);  // a large mean: a one-pass formula would cancel badly
        if (noncontig) x = make_noncontiguous(x);
        const auto g = groups(x, wrap(c.dims, x.dim()));
        std::vector<double> want;
        for (const auto& grp : g) {
          double m = 0, q = 0;
          for (double v : grp) m += v;
          m /= grp.size();
          for (double v : grp) q += (v - m) * (v - m);
          want.push_back(q / std::max<double>(static_cast<double>(grp.size()) - corr, 0.0));
        }
        const Shape os = out_shape(c.shape, wrap(c.dims, x.dim()), c.keepdim);
        EXPECT_CLOSE(var(x, c.dims, corr, c.keepdim), expected(want, os), 1e-11, 1e-11);
        Tensor xf = x.to(DType::f32);  // f32 path, tolerance of f32 rounding of inputs near 100
        EXPECT_CLOSE(var(xf, c.dims, corr, c.keepdim), expected(want, os), 1e-4, 1e-4);
      }
}

TEST(Var, LowPrecision) {
  Generator gen(8);
  Tensor x = randn({16, 300}, {}, gen);
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor xl = x.to(dt);
    Tensor v = var(xl, {1});
    EXPECT_EQ(v.dtype(), dt);
    EXPECT_CLOSE(v, var(xl.to(DType::f32), {1}), 0, 1e-2);  // one rounding of the f32 result to bf16/f16
    Tensor xr = xl.detach().requires_grad_();
    sum(var(xr, {1})).backward();
    EXPECT_EQ(xr.grad().dtype(), dt);
  }
}

TEST(Var, Errors) {
  std::string msg = error_message([] { var(arange(0, 4, DType::i32)); });
  EXPECT_NE(msg.find("var"), std::string::npos) << msg;
  msg = error_message([] { var(zeros({2, 3}), {}, -1); });
  EXPECT_NE(msg.find("correction"), std::string::npos) << msg;
  msg = error_message([] { var(zeros({2, 3}), {0, -2}); });
  EXPECT_NE(msg.find("var"), std::string::npos) << msg;
}

}  // namespace athanor
