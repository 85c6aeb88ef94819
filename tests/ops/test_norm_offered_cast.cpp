// layer_norm under bf16/f16 autocast writes, in its kernel pass, y rounded to the autocast
// dtype and offers it to autocast (autocast_offer_cast): the next lower_precision op that
// casts y takes that copy instead of a cast pass of its own. Checked here: the copy is
// cast(y) bit for bit; taking it allocates nothing; the graph and every gradient are the
// same as with a fresh cast; the offer is taken once, and lapses when y changes in place,
// when a newer offer replaces it and when the region exits.
#include "athanor/core/allocator.h"
#include "athanor/ops/autocast.h"
#include "athanor/ops/linalg.h"
#include "athanor/ops/norm.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {

Tensor f32_leaf(const Shape& s, uint64_t seed, double offset = 0.0) {
  Generator g(seed);
  return add(randn(s, {}, g), offset).detach().requires_grad_(true);
}

bool same_values(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes() == b.sizes() && a.to_vector() == b.to_vector();
}

const Shape kX = {37, 80};  // 80 columns: 5 full vectors; 37 rows: both threads, uneven
}  // namespace

TEST(LayerNormOfferedCast, NextCastTakesTheCopyBitForBitWithoutAllocating) {
  for (DType low : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(low));
    const Tensor x = f32_leaf(kX, 1, 3.0), w = f32_leaf({80}, 2, 1.0), b = f32_leaf({80}, 3);
    autocast ac(low);
    const Tensor y = layer_norm(x, {80}, w, b);
    ASSERT_EQ(y.dtype(), DType::f32);
    const Tensor expected = [&] {
      NoGradGuard ng;
      return cast(y, low);  // what the consumer would otherwise compute
    }();
    Tensor taken;
    const std::size_t bytes = peak_alloc_delta([&] { taken = autocast_input(y, "linear"); });
    EXPECT_LT(bytes, taken.nbytes()) << "the offered copy should be taken, not a fresh cast made";
    EXPECT_TRUE(same_values(taken, expected));
    ASSERT_TRUE(taken.grad_fn());
    EXPECT_EQ(taken.grad_fn()->name(), "cast");
    // Taken once: a second cast of y is a fresh one (same numbers, a new buffer).
    Tensor again;
    const std::size_t again_bytes = peak_alloc_delta([&] { again = autocast_input(y, "linear"); });
    EXPECT_GE(again_bytes, again.nbytes());
    EXPECT_TRUE(same_values(again, expected));
  }
}

TEST(LayerNormOfferedCast, GradientsAndOutputEqualThoseThroughAFreshCast) {
  // Same computation twice: once taking the offered copy, once with the offer replaced
  // by another layer_norm's before the linear (so linear casts y itself).
  auto run = [](bool take_offer) {
    const Tensor x = f32_leaf(kX, 4, -2.0), w = f32_leaf({80}, 5, 1.0), b = f32_leaf({80}, 6);
    const Tensor W = f32_leaf({24, 80}, 7), bias = f32_leaf({24}, 8), g = f32_leaf({37, 24}, 9).detach();
    Tensor z;
    {
      autocast ac(DType::bf16);
      const Tensor y = layer_norm(x, {80}, w, b);
      const Tensor other = f32_leaf({4, 80}, 10);
      if (!take_offer) layer_norm(other, {80});
      z = linear(y, W, bias);
    }
    sum(mul(z, g)).backward();
    return std::vector<Tensor>{z.detach(), x.grad(), w.grad(), b.grad(), W.grad(), bias.grad()};
  };
  const auto offered = run(true), fresh = run(false);
  for (size_t i = 0; i < offered.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(same_values(offered[i], fresh[i]));
  }
  // And the result is linear on the rounded layer_norm output (an independent check of the
  // values: double layer_norm of x, rounded to bf16, times bf16 W, within bf16 output rounding).
  const Tensor x = f32_leaf(kX, 4, -2.0), w = f32_leaf({80}, 5, 1.0), b = f32_leaf({80}, 6);
  const Tensor W = f32_leaf({24, 80}, 7), bias = f32_leaf({24}, 8);
  const Tensor y64 = layer_norm(x.to(DType::f64), {80}, w.to(DType::f64), b.to(DType::f64));
  const Tensor ref = linear(y64.to(DType::bf16).to(DType::f64), W.to(DType::bf16).to(DType::f64),
                            bias.to(DType::bf16).to(DType::f64));
  EXPECT_CLOSE(offered[0].to(DType::f64), ref, 2e-2, 8e-3);
}

TEST(LayerNormOfferedCast, OfferLapsesOnInPlaceChangeNewerOfferAndRegionExit) {
  const Tensor x = f32_leaf(kX, 11, 0.5), w = f32_leaf({80}, 12, 1.0);
  {  // in-place change of y after the offer: the stale copy must not be used
    autocast ac(DType::bf16);
    Tensor y = layer_norm(x, {80}, w, Tensor());
    {
      NoGradGuard ng;
      y.fill_(0.75);
    }
    const Tensor c = autocast_input(y, "linear");
    EXPECT_TRUE(same_values(c, full(kX, 0.75, TensorOptions(DType::bf16))));
  }
  {  // a newer offer replaces it: y is cast afresh, to the same values
    autocast ac(DType::bf16);
    const Tensor y = layer_norm(x, {80}, w, Tensor());
    const Tensor y2 = layer_norm(mul(x, 2.0), {80}, w, Tensor());
    Tensor c;
    const std::size_t c_bytes = peak_alloc_delta([&] { c = autocast_input(y, "linear"); });
    EXPECT_GE(c_bytes, c.nbytes());
    NoGradGuard ng;
    EXPECT_TRUE(same_values(c, cast(y, DType::bf16)));
  }
  Tensor y;
  {
    autocast ac(DType::bf16);
    y = layer_norm(x, {80}, w, Tensor());
  }
  {  // the offer did not outlive its region
    autocast ac(DType::bf16);
    Tensor c;
    const std::size_t c_bytes = peak_alloc_delta([&] { c = autocast_input(y, "linear"); });
    EXPECT_GE(c_bytes, c.nbytes());
  }
}

TEST(LayerNormOfferedCast, OfferRejectsAMismatchedCopy) {
  const Tensor src = zeros({4, 8}), wrong_shape = zeros({8, 4}, TensorOptions(DType::bf16));
  autocast ac(DType::bf16);
  const std::string msg = error_message([&] { autocast_offer_cast(src, wrong_shape); });
  EXPECT_NE(msg.find("autocast_offer_cast"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[8, 4]"), std::string::npos) << msg;
  EXPECT_NE(error_message([&] { autocast_offer_cast(src, zeros({4, 8})); }).find("bf16/f16"), std::string::npos);
}

}  // namespace athanor
