// rope: HF's convention pinned by hand (rotate_half pairs, the Llama 3 frequency bands),
// position_offset as a KV cache uses it, large positions in f32, gradchecks beyond the op
// harness's cases (odd T, non-contiguous, offset, llama3), and the errors.
#include <cmath>
#include <numbers>

#include "athanor/ops/rope.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
// The angle by which rope turns pair i at position p: from x = e_i (x[i] = 1, x[i + D/2] = 0)
// rope gives (cos a, sin a) at (i, i + D/2).
double turned_angle(const RopeOptions& opt, int64_t D, int64_t i) {
  std::vector<double> e(static_cast<size_t>(D), 0.0);
  e[i] = 1.0;
  const Tensor out = rope(from_vector(e, {1, 1, 1, D}, TensorOptions(DType::f64)), opt);
  const std::vector<double> o = out.to_vector();
  return std::atan2(o[i + D / 2], o[i]);
}
}  // namespace

TEST(Rope, RotateHalfConventionByHand) {
  // D = 4, theta 100: inv_freq = 1, 0.1. At position 2: angles 2 and 0.2.
  const Tensor x = from_vector(std::vector<double>{1, 2, 3, 4}, {1, 1, 1, 4}, TensorOptions(DType::f64));
  const RopeOptions opt{.theta = 100.0, .llama3 = std::nullopt, .position_offset = 2};
  const std::vector<double> got = rope(x, opt).to_vector();
  const double c0 = std::cos(2.0), s0 = std::sin(2.0), c1 = std::cos(0.2), s1 = std::sin(0.2);
  // out[i] = x[i] cos - x[i + 2] sin, out[i + 2] = x[i + 2] cos + x[i] sin
  const std::vector<double> want{1 * c0 - 3 * s0, 2 * c1 - 4 * s1, 3 * c0 + 1 * s0, 4 * c1 + 2 * s1};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(got[i], want[i], 1e-15) << i;
}

TEST(Rope, Llama3ScalingBandsByHand) {
  // theta 100, D 8: inv_freq 1, 10^-0.5, 0.1, 10^-1.5 (wavelengths 6.3, 19.9, 62.8, 198.7);
  // factor 4 with the band [64 / 8, 64 / 1] = [8, 64]: pair 0 (short wavelength) is kept, pairs 1
  // and 2 are interpolated with smooth = (64 / wavelen - 1) / (8 - 1), pair 3 is divided by 4.
  const RopeOptions opt{.theta = 100.0, .llama3 = RopeScaling{4.0, 1.0, 8.0, 64}, .position_offset = 1};
  const double pi = std::numbers::pi;
  auto smoothed = [&](double f) {
    const double smooth = (64.0 / (2 * pi / f) - 1.0) / 7.0;
    return (1 - smooth) * f / 4.0 + smooth * f;
  };
  const double want[4] = {1.0, smoothed(std::pow(10.0, -0.5)), smoothed(0.1), std::pow(10.0, -1.5) / 4.0};
  for (int64_t i = 0; i < 4; ++i) EXPECT_NEAR(turned_angle(opt, 8, i), want[i], 1e-14) << "pair " << i;
  // The value written out (Python, HF's formula): smooth 0.3172957 for pair 1, f = 0.1543102.
  EXPECT_NEAR(want[1], 0.1543102, 1e-7);
  // Without scaling the same positions turn by the plain frequencies.
  const RopeOptions plain{.theta = 100.0, .llama3 = std::nullopt, .position_offset = 1};
  EXPECT_NEAR(turned_angle(plain, 8, 3), std::pow(10.0, -1.5), 1e-14);
}

TEST(Rope, PositionOffsetContinuesTheSequence) {
  // Generation with a KV cache: rope of tokens 3..5 with offset 3 equals rows 3..5 of rope of
  // the whole sequence, bit for bit (the same angles).
  Generator g(5);
  const Tensor x = randn({2, 6, 3, 8}, {}, g);
  const Tensor whole = rope(x, {});
  const Tensor tail = rope(narrow(x, 1, 3, 3).contiguous(), {.theta = 10000.0, .llama3 = std::nullopt, .position_offset = 3});
  EXPECT_EQ(tail.to_vector(), narrow(whole, 1, 3, 3).contiguous().to_vector());
}

TEST(Rope, LargePositionsKeepTheirAngleInF32) {
  // Angles are computed in double: at position 500000 an f32 angle would be off by ~0.03 rad.
  Generator g(6);
  const Tensor x = randn({1, 2, 2, 16}, {}, g);
  const RopeOptions opt{.theta = 500000.0, .llama3 = RopeScaling{}, .position_offset = 500000};
  const Tensor want = rope(x.to(DType::f64), opt);
  EXPECT_CLOSE(rope(x, opt), want, 1e-6, 1e-6);
}

TEST(Rope, LowPrecisionRoundsOnce) {
  Generator g(7);
  const Tensor x = randn({2, 3, 2, 8}, DType::bf16, g);
  const Tensor out = rope(x, {});
  ASSERT_EQ(out.dtype(), DType::bf16);
  // f32 math rounded once: within half a bf16 ulp (at most 2^-8 relative) of the exact value,
  // plus the f32 error of the sums. (Rounding cos, sin and each product to bf16, as HF does in
  // bf16, can miss by several ulps.)
  const std::vector<double> got = out.to_vector(), want = rope(x.to(DType::f64), {}).to_vector();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], std::fabs(want[i]) * (1.0 / 256) + 1e-6) << i;
}

TEST(Rope, Gradchecks) {
  const RopeOptions l3{.theta = 100.0, .llama3 = RopeScaling{4.0, 1.0, 8.0, 64}, .position_offset = 5};
  // odd T; a [B, H, T, D] tensor seen as [B, T, H, D] (rows contiguous, read in place); a fully
  // reversed layout (copied); the llama3 scaling with an offset.
  Tensor a = randn64({2, 7, 3, 6}, 1), b = randn64({2, 3, 5, 4}, 2), c = make_noncontiguous(randn64({1, 3, 2, 8}, 3));
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& x) { return rope(x[0], {}); }, {a}));
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& x) { return rope(transpose(x[0], 1, 2), l3); }, {b}));
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& x) { return rope(x[0], l3); }, {c}));
}

TEST(Rope, Errors) {
  auto expect_msg = [&](const std::function<void()>& fn, const std::vector<std::string>& parts) {
    const std::string msg = error_message(fn);
    EXPECT_NE(msg.find("rope"), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
  };
  const Tensor x = zeros({1, 2, 3, 4});
  expect_msg([&] { rope(zeros({1, 2, 3, 5})); }, {"even", "[1, 2, 3, 5]", "hint:"});
  expect_msg([&] { rope(zeros({2, 3, 4})); }, {"[B, T, H, D]", "[2, 3, 4]", "hint:"});
  expect_msg([&] { rope(x, {.theta = 0.0, .llama3 = std::nullopt, .position_offset = 0}); }, {"theta", "> 0"});
  expect_msg([&] { rope(x, {.theta = -1.0, .llama3 = std::nullopt, .position_offset = 0}); }, {"theta", "-1"});
  expect_msg([&] { rope(x, {.theta = 1e4, .llama3 = RopeScaling{0.0, 1.0, 4.0, 8192}, .position_offset = 0}); }, {"factor", "> 0"});
  expect_msg([&] { rope(x, {.theta = 1e4, .llama3 = RopeScaling{8.0, 4.0, 4.0, 8192}, .position_offset = 0}); }, {"high_freq_factor", "low_freq_factor"});
  expect_msg([&] { rope(x, {.theta = 1e4, .llama3 = RopeScaling{8.0, 1.0, 4.0, 0}, .position_offset = 0}); }, {"original_max_position"});
  expect_msg([&] { rope(x, {.theta = 1e4, .llama3 = std::nullopt, .position_offset = -1}); }, {"position_offset", "-1"});
  expect_msg([&] { rope(zeros({1, 2, 3, 4}, DType::i64)); }, {"x"});
}

}  // namespace athanor
