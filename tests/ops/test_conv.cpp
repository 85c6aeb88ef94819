// conv2d: gradcheck in f64 of the 1x1 direct path and a depthwise conv, the op against the naive reference, dtypes and errors.
// The f64 gradchecks over the op's registered shapes (broadcast, transposed, strided) are the
// op harness's (tests/ops/test_op_harness.cpp); this file keeps what the harness does not do.
#include "backend/cpu/conv.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
::testing::AssertionResult check_conv(const Shape& xs, const Shape& ws, bool bias, Pair stride, Pair padding,
                                      Pair dilation, int64_t groups, uint64_t seed) {
  Tensor x = randn64(xs, seed), w = randn64(ws, seed + 1), b = bias ? randn64({ws[0]}, seed + 2) : Tensor();
  std::vector<Tensor> in{x, w};
  if (bias) in.push_back(b);
  return gradcheck(
      [&](const std::vector<Tensor>& t) {
        return conv2d(t[0], t[1], t.size() > 2 ? t[2] : Tensor(), stride, padding, dilation, groups);
      },
      in);
}
}  // namespace

TEST(Conv2d, GradcheckOneByOneAndDepthwise) {
  EXPECT_TRUE(check_conv({2, 4, 3, 5}, {6, 2, 1, 1}, true, {1, 1}, {0, 0}, {1, 1}, 2, 4));  // direct path
  EXPECT_TRUE(check_conv({2, 3, 4, 4}, {3, 1, 3, 3}, false, {1, 1}, {1, 1}, {1, 1}, 3, 5));  // depthwise
}

TEST(Conv2d, MatchesReferenceF32) {
  Generator g(31);
  Tensor x = randn({3, 6, 11, 9}, {}, g), w = randn({4, 3, 3, 3}, {}, g), b = randn({4}, {}, g);
  cpu::Conv2dGeom geo;
  geo.N = 3, geo.C = 6, geo.H = 11, geo.W = 9, geo.OC = 4, geo.KH = 3, geo.KW = 3;
  geo.sh = 2, geo.sw = 1, geo.ph = 1, geo.pw = 2, geo.dh = 1, geo.dw = 2, geo.groups = 2;
  geo.OH = cpu::conv_out_size(11, 3, 2, 1, 1), geo.OW = cpu::conv_out_size(9, 3, 1, 2, 2);
  Tensor y = conv2d(x, w, b, {2, 1}, {1, 2}, {1, 2}, 2);
  EXPECT_EQ(y.sizes(), (Shape{3, 4, 6, 9}));
  EXPECT_CLOSE(y, cpu::ref::conv2d(x, w, b, geo), 1e-4, 1e-4);  // 27-term f32 sums
}

TEST(Conv2d, KnownValues) {
  // 1 channel 3x3 image, 2x2 all-ones kernel, bias 0.5: each output is its window's sum + 0.5.
  Tensor x = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  Tensor w = ones({1, 1, 2, 2}), b = full({1}, 0.5);
  EXPECT_CLOSE(conv2d(x, w, b), from_vector(std::vector<double>{12.5, 16.5, 24.5, 28.5}, {1, 1, 2, 2}), 0, 0);
  // padding 1, stride 2: corners of the zero-padded image
  EXPECT_CLOSE(conv2d(x, w, Tensor(), {2, 2}, {1, 1}), from_vector(std::vector<double>{1, 5, 11, 28}, {1, 1, 2, 2}), 0, 0);
}

TEST(Conv2d, LowPrecisionKeepsDtype) {
  Generator g(32);
  Tensor x = randn({2, 4, 6, 6}, {}, g), w = randn({4, 4, 3, 3}, {}, g);
  Tensor xh = x.to(DType::bf16), wh = w.to(DType::bf16);
  xh.requires_grad_(true);
  Tensor y = conv2d(xh, wh, Tensor(), {1, 1}, {1, 1});
  EXPECT_EQ(y.dtype(), DType::bf16);
  cpu::Conv2dGeom geo;
  geo.N = 2, geo.C = 4, geo.H = 6, geo.W = 6, geo.OC = 4, geo.KH = 3, geo.KW = 3, geo.ph = 1, geo.pw = 1, geo.OH = 6, geo.OW = 6;
  EXPECT_CLOSE(y, cpu::ref::conv2d(xh, wh, Tensor(), geo), 5e-2, 1e-2);  // bf16 rounding of the result
  y.sum().backward();
  EXPECT_EQ(xh.grad().dtype(), DType::bf16);
}

TEST(Conv2d, ErrorsNameOpAndShapes) {
  auto expect_msg = [](const std::function<void()>& fn, const std::vector<std::string>& parts) {
    const std::string msg = error_message(fn);
    EXPECT_NE(msg.find("conv2d"), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
  };
  Tensor x = zeros({2, 4, 5, 5});
  // channel mismatch
  expect_msg([&] { conv2d(x, zeros({6, 3, 3, 3})); }, {"[2, 4, 5, 5]", "[6, 3, 3, 3]", "hint:"});
  // groups do not divide the channels
  expect_msg([&] { conv2d(x, zeros({6, 1, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 3); }, {"groups", "[2, 4, 5, 5]"});
  // weight shape inconsistent with groups
  expect_msg([&] { conv2d(x, zeros({6, 4, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 2); }, {"[6, 4, 3, 3]", "groups = 2"});
  // kernel larger than the padded input
  expect_msg([&] { conv2d(x, zeros({2, 4, 7, 7})); }, {"larger than the padded input", "[2, 4, 5, 5]", "[2, 4, 7, 7]"});
  expect_msg([&] { conv2d(x, zeros({2, 4, 3, 3}), Tensor(), {1, 1}, {0, 0}, {3, 3}); }, {"larger than the padded input"});
  // bias of the wrong size, wrong rank
  expect_msg([&] { conv2d(x, zeros({2, 4, 3, 3}), zeros({3})); }, {"bias", "[3]"});
  expect_msg([&] { conv2d(zeros({4, 5, 5}), zeros({2, 4, 3, 3})); }, {"4-D", "[4, 5, 5]"});
}

}  // namespace athanor
