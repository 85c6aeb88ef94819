// embedding with a bf16 or f16 table on cuda (issue 30's 16-bit training without f32 copies):
// the forward copies the table's rows bit for bit into a 16-bit output (no f32 copy of the
// table), and the backward sums the 16-bit gradient in f32 in token order and rounds once to
// the table's dtype, as the CPU does: both are compared with the CPU bit for bit, padding_idx
// included (its row's gradient stays zero).
#include <cstring>

#include "athanor/autograd/engine.h"
#include "athanor/ops.h"
#include "athanor/ops/embedding.h"
#include "gpu_test.h"

using namespace athanor;

namespace {
std::string bits(const Tensor& t) {
  const Tensor c = t.cpu().contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), c.nbytes());
}
}  // namespace

TEST(GpuTrainEmbedding16, SixteenBitTablesMatchTheCpuBitForBit) {
  ATH_REQUIRE_GPU();
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t V = 50, D = 24, B = 3, T = 40;
    std::vector<int64_t> ids(B * T);
    for (int64_t i = 0; i < B * T; ++i) ids[i] = (i * 7 + i / 5) % V;  // repeats: long sums per row
    const Tensor table = from_vector(gpu_test::random_vector(V * D, 21), {V, D}).to(dt);
    const Tensor seed = from_vector(gpu_test::random_vector(B * T * D, 22), {B, T, D}).to(dt);
    const Tensor hid = from_vector(ids, {B, T});
    Tensor hw = table.detach(), dw = table.cuda().detach();
    hw.requires_grad_(true), dw.requires_grad_(true);
    const Tensor hout = embedding(hw, hid, /*padding_idx=*/3), dout = embedding(dw, hid.cuda(), 3);
    EXPECT_EQ(dout.dtype(), dt);
    EXPECT_TRUE(bits(dout) == bits(hout)) << "the rows are copied, not converted";
    backward({hout}, {seed});
    backward({dout}, {seed.cuda()});
    ASSERT_TRUE(hw.grad().defined() && dw.grad().defined());
    EXPECT_EQ(dw.grad().dtype(), dt);
    EXPECT_TRUE(bits(dw.grad().to(dt)) == bits(hw.grad().to(dt))) << "not the CPU's f32 token-order sums rounded once";
    const std::vector<double> g = dw.grad().cpu().to_vector();
    for (int64_t c = 0; c < D; ++c) EXPECT_EQ(g[3 * D + c], 0.0) << "padding row";
  }
}
