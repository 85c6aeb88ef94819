// conv2d kernels (im2col + GEMM, direct 1x1) against the naive 7-loop reference in double,
// forward and backward, f32 on [4, 8, 17, 19] and f64 on small ragged shapes.
#include "backend/cpu/conv.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
struct ConvCase {
  int64_t OC, KH, KW, sh, sw, ph, pw, dh, dw, groups;
  bool bias;
  std::string name() const {
    return "OC " + std::to_string(OC) + " k " + std::to_string(KH) + "x" + std::to_string(KW) + " s " +
           std::to_string(sh) + "," + std::to_string(sw) + " p " + std::to_string(ph) + "," + std::to_string(pw) +
           " d " + std::to_string(dh) + "," + std::to_string(dw) + " g " + std::to_string(groups) +
           (bias ? " bias" : "");
  }
};

cpu::Conv2dGeom geom(const Shape& xs, const ConvCase& c) {
  cpu::Conv2dGeom g;
  g.N = xs[0], g.C = xs[1], g.H = xs[2], g.W = xs[3], g.OC = c.OC, g.KH = c.KH, g.KW = c.KW;
  g.sh = c.sh, g.sw = c.sw, g.ph = c.ph, g.pw = c.pw, g.dh = c.dh, g.dw = c.dw, g.groups = c.groups;
  g.OH = cpu::conv_out_size(g.H, g.KH, g.sh, g.ph, g.dh);
  g.OW = cpu::conv_out_size(g.W, g.KW, g.sw, g.pw, g.dw);
  return g;
}

template <class T> void check_case(const Shape& xs, const ConvCase& c, uint64_t seed, double atol, double rtol) {
  SCOPED_TRACE(c.name());
  const cpu::Conv2dGeom g = geom(xs, c);
  ASSERT_GT(g.OH, 0);
  ASSERT_GT(g.OW, 0);
  Generator gen(seed);
  const TensorOptions o(dtype_of<T>);
  Tensor x = randn(xs, o, gen), w = randn({c.OC, xs[1] / c.groups, c.KH, c.KW}, o, gen);
  Tensor b = c.bias ? randn({c.OC}, o, gen) : Tensor();
  Tensor dy = randn({g.N, g.OC, g.OH, g.OW}, o, gen);
  Tensor y = empty({g.N, g.OC, g.OH, g.OW}, o);
  cpu::conv2d_forward<T>(x.data_ptr<T>(), w.data_ptr<T>(), c.bias ? b.data_ptr<T>() : nullptr, y.data_ptr<T>(), g);
  EXPECT_CLOSE(y, cpu::ref::conv2d(x, w, b, g), atol, rtol);
  Tensor dx = empty(x.sizes(), o), dw = empty(w.sizes(), o), db = empty({c.OC}, o);
  dx.fill_(123.0), dw.fill_(123.0);  // the kernel must overwrite, not accumulate into, its outputs
  cpu::conv2d_backward<T>(x.data_ptr<T>(), w.data_ptr<T>(), dy.data_ptr<T>(), dx.data_ptr<T>(), dw.data_ptr<T>(),
                          db.data_ptr<T>(), g);
  const auto [rdx, rdw, rdb] = cpu::ref::conv2d_backward(x, w, dy, g);
  EXPECT_CLOSE(dx, rdx, atol, rtol);
  EXPECT_CLOSE(dw, rdw, atol, rtol);
  EXPECT_CLOSE(db, rdb, atol, rtol);
}

const std::vector<ConvCase> kCases = {
    {16, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},   // "same" 3x3
    {12, 3, 3, 2, 2, 1, 1, 2, 2, 2, true},   // stride 2, padding 1, dilation 2, groups 2
    {8, 3, 3, 1, 2, 0, 2, 1, 3, 4, false},   // mixed strides/paddings/dilations, groups 4
    {6, 1, 1, 1, 1, 0, 0, 1, 1, 2, true},    // 1x1 direct path (no im2col), grouped
    {8, 1, 1, 2, 2, 0, 0, 1, 1, 1, false},   // 1x1 with stride: im2col path
    {5, 2, 4, 3, 1, 2, 1, 1, 1, 1, true},    // rectangular kernel
    {8, 3, 3, 1, 1, 1, 1, 1, 1, 8, false},   // depthwise
};
}  // namespace

TEST(ConvKernels, FastMatchesReferenceF32) {
  // [4, 8, 17, 19]: each output sums at most 8 * 3 * 3 = 72 products of N(0,1) values (|y| ~ 10),
  // and dw sums 4 * 17 * 19 ~ 1300 (|dw| ~ 40). f32 keeps ~1e-6 relative per operation, so
  // atol 1e-4 / rtol 1e-4 leaves headroom while any index mistake shows up as O(1) errors.
  for (const ConvCase& c : kCases) check_case<float>({4, 8, 17, 19}, c, 21, 1e-4, 1e-4);
}

TEST(ConvKernels, FastMatchesReferenceF64) {
  for (const ConvCase& c : kCases) check_case<double>({3, 8, 7, 9}, c, 22, 1e-12, 1e-12);
  check_case<double>({1, 8, 5, 6}, kCases[1], 23, 1e-12, 1e-12);  // batch of one: no batch parallelism
}

TEST(ConvKernels, OutputSize) {
  EXPECT_EQ(cpu::conv_out_size(17, 3, 1, 1, 1), 17);
  EXPECT_EQ(cpu::conv_out_size(17, 3, 2, 1, 2), 8);  // (17 + 2 - 4 - 1) / 2 + 1
  EXPECT_EQ(cpu::conv_out_size(4, 5, 1, 0, 1), 0);
  EXPECT_EQ(cpu::conv_out_size(3, 3, 1, 0, 2), 0);    // dilated extent 5 > 3
}

}  // namespace athanor
