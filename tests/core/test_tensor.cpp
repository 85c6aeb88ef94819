// Tensor handles: views share storage and the version counter, strides and
// contiguity, copy_ (broadcasting + dtype conversion), factories, dtype
// conversion values, and the errors for misuse.
#include <cmath>
#include <limits>

#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
std::vector<double> iota(int64_t n, double start = 0.0) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = start + static_cast<double>(i);
  return v;
}
}  // namespace

TEST(Tensor, ViewsShareStorageAndVersion) {
  Tensor a = from_vector(iota(6), {2, 3});
  Tensor views[] = {a.view({3, 2}), a.reshape({6}), a.transpose(0, 1), a.t(), a.permute({1, 0}),
                          expand(a.view({1, 2, 3}), {4, 2, 3}), make_view(a, {2}, {3}, 1), a.detach()};
  for (const Tensor& v : views) {
    SCOPED_TRACE(v.describe());
    EXPECT_EQ(v.storage().get(), a.storage().get());
  }
  const uint64_t v0 = a.version();
  Tensor col = make_view(a, {2}, {3}, 1);  // a[:, 1]
  col.fill_(-1.0);                         // writes through the view...
  EXPECT_EQ(a.to_vector(), (std::vector<double>{0, -1, 2, 3, -1, 5}));
  EXPECT_GT(a.version(), v0);              // ...and every alias sees the bump
  EXPECT_EQ(views[2].version(), a.version());
  EXPECT_EQ(views[2].to_vector(), (std::vector<double>{0, 3, -1, -1, 2, 5}));  // transposed order
  const uint64_t v1 = a.version();
  views[0].zero_();
  EXPECT_GT(a.version(), v1);
  EXPECT_EQ(a.to_vector(), std::vector<double>(6, 0.0));
}

TEST(Tensor, ContiguousStrides) {
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Shape{12, 4, 1}));
  EXPECT_EQ(contiguous_strides({5}), (Shape{1}));
  EXPECT_EQ(contiguous_strides({}), Shape{});
  EXPECT_EQ(contiguous_strides({2, 0, 3}), (Shape{3, 3, 1}));  // zero-size dims do not zero the strides
  Tensor t = empty({2, 3, 4});
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.stride(-1), 1);
  EXPECT_EQ(t.size(-3), 2);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.nbytes(), 24u * 4u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(shape_str({2, 3}), "[2, 3]");
  EXPECT_EQ(t.describe(), "[2, 3, 4] f32");
}

TEST(Tensor, IsContiguousForTransposedAndExpanded) {
  Tensor a = zeros({3, 4});
  EXPECT_FALSE(a.t().is_contiguous());
  EXPECT_TRUE(a.t().t().is_contiguous());
  EXPECT_TRUE(a.t().contiguous().is_contiguous());
  EXPECT_EQ(a.t().contiguous().strides(), (Shape{3, 1}));
  Tensor row = zeros({1, 4});
  Tensor e = expand(row, {5, 4});
  EXPECT_EQ(e.strides()[0], 0);
  EXPECT_FALSE(e.is_contiguous());
  EXPECT_TRUE(expand(zeros({4}), {1, 4}).is_contiguous());      // size-1 dims do not matter
  EXPECT_TRUE(make_view(a, {1, 4}, {999, 1}, 0).is_contiguous());  // whatever the stride of a size-1 dim
  EXPECT_FALSE(make_view(a, {3, 2}, {4, 2}, 0).is_contiguous());   // a[:, ::2]
  EXPECT_TRUE(scalar_tensor(1.0).is_contiguous());
}

TEST(Tensor, CopyBroadcastsAndConverts) {
  Tensor dst = zeros({2, 3}, DType::f64);
  dst.copy_(from_vector(std::vector<double>{1, 2, 3}, {3}, DType::i64));  // row broadcast + i64 -> f64
  EXPECT_EQ(dst.to_vector(), (std::vector<double>{1, 2, 3, 1, 2, 3}));
  dst.copy_(from_vector(std::vector<double>{7, 8}, {2, 1}, DType::f32));  // column broadcast
  EXPECT_EQ(dst.to_vector(), (std::vector<double>{7, 7, 7, 8, 8, 8}));
  dst.copy_(scalar_tensor(2.5, DType::bf16));                             // 0-d broadcast from bf16
  EXPECT_EQ(dst.to_vector(), std::vector<double>(6, 2.5));

  // Into a non-contiguous destination: the transposed view of a [3, 2] tensor.
  Tensor base = zeros({3, 2}, DType::i32);
  Tensor view = base.t();
  view.copy_(from_vector(iota(6, 1.0), {2, 3}));
  EXPECT_EQ(base.to_vector(), (std::vector<double>{1, 4, 2, 5, 3, 6}));

  // Float -> integer truncates toward zero, float -> bool is "non-zero", f32 -> f16 rounds.
  Tensor src = from_vector(std::vector<double>{-1.7, 0.0, 2.9, 0.1}, {4});
  Tensor i = zeros({4}, DType::i64), b = zeros({4}, DType::boolean), h = zeros({4}, DType::f16);
  i.copy_(src);
  b.copy_(src);
  h.copy_(src);
  EXPECT_EQ(i.to_vector(), (std::vector<double>{-1, 0, 2, 0}));
  EXPECT_EQ(b.to_vector(), (std::vector<double>{1, 0, 1, 1}));
  EXPECT_EQ(h.to_vector()[3], 0.0999755859375);

  const uint64_t v = dst.version();
  dst.copy_(ones({3}));
  EXPECT_GT(dst.version(), v);

  std::string msg = error_message([&] { dst.copy_(ones({4})); });
  EXPECT_NE(msg.find("copy_"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4] f32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3] f64"), std::string::npos) << msg;
  msg = error_message([&] { dst.copy_(ones({1, 2, 3})); });  // more dims than the destination
  EXPECT_NE(msg.find("broadcast"), std::string::npos) << msg;
}

TEST(Tensor, Factories) {
  Tensor z = zeros({2, 2});
  EXPECT_EQ(z.dtype(), DType::f32);
  EXPECT_EQ(z.to_vector(), std::vector<double>(4, 0.0));
  EXPECT_EQ(ones({3}, DType::bf16).to_vector(), std::vector<double>(3, 1.0));
  EXPECT_EQ(full({2}, -3.5, DType::f16).to_vector(), std::vector<double>(2, -3.5));
  Tensor s = scalar_tensor(4.0, DType::i32);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.item<int>(), 4);
  EXPECT_EQ(arange(2, 6, DType::i64).to_vector(), (std::vector<double>{2, 3, 4, 5}));
  EXPECT_EQ(arange(3, 3).numel(), 0);
  Tensor e = empty({0, 3});
  EXPECT_EQ(e.numel(), 0);
  EXPECT_TRUE(e.to_vector().empty());
  Tensor like = zeros_like(from_vector(iota(6), {2, 3}, DType::f64));
  EXPECT_EQ(like.sizes(), (Shape{2, 3}));
  EXPECT_EQ(like.dtype(), DType::f64);
  EXPECT_EQ(ones_like(like, DType::u8).dtype(), DType::u8);
  EXPECT_EQ(ones_like(like, DType::u8).to_vector(), std::vector<double>(6, 1.0));
  EXPECT_EQ(empty_like(like.t()).strides(), (Shape{2, 1}));  // contiguous whatever the source layout
  Tensor r = zeros({2}, TensorOptions(DType::f64).with_requires_grad());
  EXPECT_TRUE(r.requires_grad());
  EXPECT_TRUE(r.is_leaf());
  EXPECT_EQ(from_vector(std::vector<int64_t>{1, 2, 3}, {3}).dtype(), DType::i64);
  EXPECT_EQ(from_vector(std::vector<float>{1.5f, 2.5f}, {2, 1}).to_vector(), (std::vector<double>{1.5, 2.5}));
  EXPECT_NE(error_message([] { empty({2, -1}); }).find("[2, -1]"), std::string::npos);
  EXPECT_NE(error_message([] { arange(3, 1); }).find("arange"), std::string::npos);
}

TEST(Tensor, ToDtypeValues) {
  Tensor x = from_vector(std::vector<double>{1.0, -2.5, 3.14159265358979, 70000.0, 1e-8}, {5}, DType::f64);
  Tensor f = x.to(DType::f32);
  EXPECT_EQ(f.dtype(), DType::f32);
  EXPECT_EQ(f.to_vector()[2], static_cast<double>(3.14159265358979f));
  Tensor bf = x.to(DType::bf16);
  EXPECT_EQ(bf.to_vector(), (std::vector<double>{1.0, -2.5, 3.140625, 70144.0, static_cast<float>(bfloat16(1e-8f))}));
  Tensor h = x.to(DType::f16);
  const auto hv = h.to_vector();
  EXPECT_EQ(hv[2], 3.140625);
  EXPECT_TRUE(std::isinf(hv[3]));  // above f16's max (65504)
  EXPECT_EQ(hv[4], 0.0);           // below half the smallest f16 subnormal
  EXPECT_EQ(x.to(DType::i32).to_vector(), (std::vector<double>{1, -2, 3, 70000, 0}));
  EXPECT_EQ(x.to(DType::boolean).to_vector(), (std::vector<double>{1, 1, 1, 1, 1}));
  EXPECT_EQ(from_vector(std::vector<double>{0, 200.7, 255}, {3}).to(DType::u8).to_vector(), (std::vector<double>{0, 200, 255}));
  // A non-contiguous source converts in logical order.
  EXPECT_EQ(from_vector(iota(6), {2, 3}).t().to(DType::i64).to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  // The values do not alias: writing the converted tensor leaves the source alone.
  Tensor c = x.to(DType::f32);
  c.fill_(0.0);
  EXPECT_EQ(x.to_vector()[0], 1.0);
}

TEST(Tensor, ItemOnMultiElementTensorErrors) {
  EXPECT_EQ(from_vector(std::vector<double>{2.5}, {1, 1}).item(), 2.5);
  Tensor t = zeros({2, 3});
  const std::string msg = error_message([&] { (void)t.item(); });
  EXPECT_NE(msg.find("item"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3] f32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
  EXPECT_NE(error_message([] { (void)Tensor().item(); }).find("undefined"), std::string::npos);
}

TEST(Tensor, FromVectorSizeMismatchNamesTheShape) {
  const std::string msg = error_message([] { from_vector(std::vector<double>{1, 2, 3, 4, 5}, {2, 3}); });
  EXPECT_NE(msg.find("from_vector"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("6"), std::string::npos) << msg;
}

TEST(Tensor, DataPtrChecksDtype) {
  Tensor t = zeros({2}, DType::f64);
  EXPECT_NO_THROW(t.data_ptr<double>());
  const std::string msg = error_message([&] { t.data_ptr<float>(); });
  EXPECT_NE(msg.find("f64"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
  EXPECT_NE(error_message([] { Tensor().sizes(); }).find("undefined"), std::string::npos);
}

}  // namespace athanor
