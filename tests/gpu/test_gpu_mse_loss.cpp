// mse_loss on CUDA (src/ops/cuda/loss.cpp) beyond the op harness's cases (test_gpu_ops.cpp):
//  - reduction none and the backward give the CPU's bits in f32, bf16 and f16 (both compute
//    d = a - b, d^2 and (2 scale d) g in f32 with one rounding each, no fused multiply-add),
//    with a transposed input and an upstream gradient that is not contiguous;
//  - sum and mean are the f64 value rounded once (within 1e-6 of the CPU's f64 op; the CPU's
//    f32 op sums in f32 chunks), their backward the CPU's bits;
//  - an empty input gives 0 (sum) and NaN (mean), as on the CPU, and empty gradients;
//  - a shape or dtype mismatch is the CPU's error, before any work.
#include <cmath>
#include <vector>

#include "athanor/core/error.h"
#include "athanor/ops/elementwise.h"
#include "athanor/ops/loss.h"
#include "athanor/ops/shape.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;

namespace {
Tensor leaf(const Tensor& t) {
  Tensor l = t.detach();
  l.requires_grad_(true);
  return l;
}
}  // namespace

TEST(GpuMseLoss, NoneAndBackwardGiveTheCpuBits) {
  ATH_REQUIRE_GPU();
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a0 = from_vector(random_vector(6 * 7, 1, -3.0f, 3.0f), {7, 6}).to(dt);
    const Tensor b0 = from_vector(random_vector(6 * 7, 2, -3.0f, 3.0f), {6, 7}).to(dt);
    // a: [6, 7] transposed (a view of [7, 6]); the upstream gradient a transposed view too.
    Tensor ac = leaf(a0), bc = leaf(b0), ag = leaf(a0.cuda()), bg = leaf(b0.cuda());
    const Tensor lc = mse_loss(transpose(ac, 0, 1), bc, Reduction::none);
    const Tensor lg = mse_loss(transpose(ag, 0, 1), bg, Reduction::none);
    ASSERT_EQ(lg.device(), Device::cuda(0));
    EXPECT_EQ(lg.dtype(), dt);
    EXPECT_EQ(lg.cpu().to_vector(), lc.to_vector());
    const Tensor g76 = from_vector(random_vector(7 * 6, 3, -2.0f, 2.0f), {7, 6}).to(dt);
    lc.backward(transpose(g76, 0, 1));
    lg.backward(transpose(g76.cuda(), 0, 1));  // read in place at its strides
    EXPECT_EQ(ag.grad().cpu().to_vector(), ac.grad().to_vector());
    EXPECT_EQ(bg.grad().cpu().to_vector(), bc.grad().to_vector());
  }
}

TEST(GpuMseLoss, SumAndMeanFollowTheCpu) {
  ATH_REQUIRE_GPU();
  for (Reduction r : {Reduction::sum, Reduction::mean}) {
    const Tensor a0 = from_vector(random_vector(3000, 4, -3.0f, 3.0f), {30, 100});
    const Tensor b0 = from_vector(random_vector(3000, 5, -3.0f, 3.0f), {30, 100});
    Tensor ac = leaf(a0), ag = leaf(a0.cuda());
    const Tensor lc = mse_loss(ac, b0, r), lg = mse_loss(ag, b0.cuda(), r);
    EXPECT_EQ(lg.dim(), 0);
    EXPECT_EQ(lg.dtype(), DType::f32);
    const double v64 = mse_loss(a0.to(DType::f64), b0.to(DType::f64), r).item<double>(), vg = lg.item<double>();
    EXPECT_NEAR(vg, v64, 1e-6 * std::abs(v64)) << (r == Reduction::sum ? "sum" : "mean");
    lc.backward();
    lg.backward();
    EXPECT_EQ(ag.grad().cpu().to_vector(), ac.grad().to_vector());  // 2 scale d g: the same f32 roundings
  }
}

TEST(GpuMseLoss, EmptyInputAndBadArguments) {
  ATH_REQUIRE_GPU();
  const TensorOptions o = TensorOptions(DType::f32).with_device(Device::cuda(0));
  Tensor a = leaf(zeros({0, 3}, o));
  const Tensor b = zeros({0, 3}, o);
  EXPECT_EQ(mse_loss(a, b, Reduction::sum).item<double>(), 0.0);
  const Tensor m = mse_loss(a, b, Reduction::mean);
  EXPECT_TRUE(std::isnan(m.item<double>()));
  m.backward();
  ASSERT_TRUE(a.grad().defined());
  EXPECT_EQ(a.grad().sizes(), (Shape{0, 3}));
  EXPECT_EQ(mse_loss(a, b, Reduction::none).sizes(), (Shape{0, 3}));

  EXPECT_THROW((void)mse_loss(zeros({2, 3}, o), zeros({3, 2}, o)), Error);                             // shapes
  EXPECT_THROW((void)mse_loss(zeros({2, 3}, o), zeros({2, 3}, TensorOptions(DType::bf16).with_device(Device::cuda(0)))), Error);          // dtypes
  EXPECT_THROW((void)mse_loss(zeros({2, 3}, o), zeros({2, 3}, TensorOptions(DType::f32))), Error);     // devices
}
