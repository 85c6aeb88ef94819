// add/sub/mul/div: the scalar overloads, fast kernels vs the reference on large inputs of
// each special-cased layout, promotion, and the broadcast error. Gradchecks over broadcast
// and strided shapes are the op harness's (tests/ops/test_op_harness.cpp).
#include "backend/cpu/binary.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
using BinFn = Tensor (*)(const Tensor&, const Tensor&);
const std::vector<std::pair<const char*, BinFn>> kOps = {
    {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
    {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
    {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
    {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }},
};
}  // namespace

TEST(Binary, ScalarOverloadsKeepDtypeAndDifferentiate) {
  Tensor a = randn64({4}, 5);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& x) { return (2.0 - x[0]) * 3.0 + x[0] / 4.0 - 1.0; }, {a}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& x) { return 1.0 / x[0]; }, {uniform64({4}, 0.5, 2, 6)}));
  Tensor h = ones({3}, TensorOptions(DType::bf16));
  EXPECT_EQ((h * 2.0).dtype(), DType::bf16);
}

TEST(Binary, FastKernelsMatchReference) {
  // f32 results of the layouts the fast kernels special-case (same, scalar, row,
  // general broadcast) against the naive index-arithmetic reference in f64.
  const std::vector<std::pair<Shape, Shape>> layouts = {
      {{1000, 67}, {1000, 67}}, {{1000, 67}, {}}, {{}, {1000, 67}}, {{513, 67}, {67}}, {{67}, {513, 67}}, {{33, 1, 7}, {5, 1}}};
  for (auto& [name, fn] : kOps)
    for (auto& [sa, sb] : layouts) {
      SCOPED_TRACE(std::string(name) + " " + shape_str(sa) + " " + shape_str(sb));
      Generator g(7);
      Tensor a = randn(sa, {}, g), b = rand(sb, {}, g) + 0.5;
      const cpu::BinaryOp op = std::string(name) == "add"   ? cpu::BinaryOp::add
                               : std::string(name) == "sub" ? cpu::BinaryOp::sub
                               : std::string(name) == "mul" ? cpu::BinaryOp::mul
                                                            : cpu::BinaryOp::div;
      EXPECT_CLOSE(fn(a, b), cpu::ref::binary(op, a, b), 1e-6, 1e-6);  // f32 ops are exact per element here
    }
}

TEST(Binary, PromotionAndLowPrecision) {
  Tensor a = from_vector(std::vector<double>{1.5, 2.5}, {2}, TensorOptions(DType::bf16));
  Tensor b = from_vector(std::vector<double>{0.25, 4}, {2}, TensorOptions(DType::f32));
  Tensor c = add(a, b);
  EXPECT_EQ(c.dtype(), DType::f32);
  EXPECT_CLOSE(c, from_vector(std::vector<double>{1.75, 6.5}, {2}), 0, 0);
  EXPECT_EQ(add(a, from_vector(std::vector<double>{1, 1}, {2}, TensorOptions(DType::f16))).dtype(), DType::f32);
}

TEST(Binary, BroadcastErrorNamesOpAndShapes) {
  Tensor a = zeros({2, 3}), b = zeros({4});
  const std::string msg = error_message([&] { add(a, b); });
  EXPECT_NE(msg.find("add"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
}

}  // namespace athanor
