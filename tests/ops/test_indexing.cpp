// index_select and gather (src/ops/indexing.cpp, kernels src/backend/cpu/index.cpp):
// values vs naive loops, duplicate indices accumulating in backward, fast kernels vs the references, and
// the out-of-range errors.
// The f64 gradchecks over the op's registered shapes (broadcast, transposed, strided) are the
// op harness's (tests/ops/test_op_harness.cpp); this file keeps what the harness does not do.
#include <omp.h>

#include <random>

#include "backend/cpu/index.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {



Tensor iota(const Shape& s) { return arange(0, shape_numel(s), DType::f64).reshape(s); }
Tensor idx64(const std::vector<int64_t>& v, const Shape& s) { return from_vector(v, s, DType::i64); }

// Naive index_select: out[c] = x[c with c[d] -> index[c[d]]].
Tensor naive_index_select(const Tensor& x, int64_t d, const std::vector<int64_t>& index) {
  Shape os = x.sizes();
  os[d] = static_cast<int64_t>(index.size());
  const auto xv = x.to_vector();
  std::vector<double> out;
  for_each_index(os, [&](const Shape& c) {
    Shape src = c;
    src[d] = index[c[d]];
    out.push_back(at(xv, x.sizes(), src));
  });
  return from_vector(out, os, DType::f64);
}

// Naive gather: out[c] = x[c with c[d] -> index[c]].
Tensor naive_gather(const Tensor& x, int64_t d, const Tensor& index) {
  const auto xv = x.to_vector(), iv = index.to_vector();
  std::vector<double> out;
  for_each_index(index.sizes(), [&](const Shape& c) {
    Shape src = c;
    src[d] = static_cast<int64_t>(at(iv, index.sizes(), c));
    out.push_back(at(xv, x.sizes(), src));
  });
  return from_vector(out, index.sizes(), DType::f64);
}

}  // namespace

// ---------------------------------------------------------------- index_select

TEST(IndexSelect, ValuesMatchNaive) {
  const Shape s = {3, 4, 5};
  const std::vector<int64_t> index = {2, 0, 2, 1};  // with a duplicate
  for (bool strided : {false, true})
    for (int64_t dim : {0, 1, -1, -3}) {
      SCOPED_TRACE(std::string(strided ? "strided " : "") + "dim " + std::to_string(dim));
      Tensor x = strided ? make_noncontiguous(iota(s)) : iota(s);
      const int64_t d = dim < 0 ? dim + 3 : dim;
      Tensor want = naive_index_select(iota(s), d, index);
      EXPECT_CLOSE(index_select(x, dim, idx64(index, {4})), want, 0, 0);
      EXPECT_CLOSE(index_select(x, dim, idx64(index, {4}).to(DType::i32)), want, 0, 0);
      // A strided index (every other element of a longer one).
      Tensor long_idx = idx64({2, 9, 0, 9, 2, 9, 1, 9}, {8});
      Tensor strided_idx = slice(long_idx, 0, 0, 8, 2);
      ASSERT_FALSE(strided_idx.is_contiguous());
      EXPECT_CLOSE(index_select(x, dim, strided_idx), want, 0, 0);
    }
  // 0-d index: the dim keeps size 1.
  EXPECT_EQ(index_select(iota({3, 2}), 0, scalar_tensor(2, DType::i64)).to_vector(), (std::vector<double>{4, 5}));
  // Every dtype is copied exactly.
  for (DType dt : {DType::bf16, DType::f16, DType::f32, DType::i32, DType::u8}) {
    Tensor x = iota({4, 3}).to(dt);
    Tensor y = index_select(x, 1, idx64({2, 2, 0}, {3}));
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_EQ(y.to_vector(), (std::vector<double>{2, 2, 0, 5, 5, 3, 8, 8, 6, 11, 11, 9}));
  }
}

TEST(IndexSelect, DuplicatesAccumulateInBackward) {
  Tensor x = from_vector(std::vector<double>{1, 2, 3, 4}, {4}, DType::f64).requires_grad_();
  Tensor y = index_select(x, 0, idx64({1, 1, 3, 1}, {4}));
  backward({y}, {from_vector(std::vector<double>{1, 10, 100, 1000}, {4}, DType::f64)});
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 1011, 0, 100}));
  // bf16: gradient in the input dtype, accumulated in f32 (256 + 1 + 1 is not representable step by step in bf16).
  Tensor xb = zeros({2}, DType::bf16).requires_grad_();
  Tensor yb = index_select(xb, 0, idx64({0, 0, 0}, {3}));
  backward({yb}, {from_vector(std::vector<double>{256, 1, 1}, {3}, DType::bf16)});
  EXPECT_EQ(xb.grad().dtype(), DType::bf16);
  EXPECT_EQ(xb.grad().to_vector(), (std::vector<double>{258, 0}));
}

TEST(IndexSelect, OutOfRangeErrorNamesIndexPositionAndSize) {
  Tensor x = zeros({5, 3});
  std::string msg = error_message([&] { index_select(x, 0, idx64({0, 4, 7, 1}, {4})); });
  EXPECT_NE(msg.find("index_select"), std::string::npos) << msg;
  EXPECT_NE(msg.find("index 7"), std::string::npos) << msg;
  EXPECT_NE(msg.find("position [2]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("size 5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[5, 3]"), std::string::npos) << msg;
  msg = error_message([&] { index_select(x, 1, idx64({-1}, {1}).to(DType::i32)); });
  EXPECT_NE(msg.find("index -1"), std::string::npos) << msg;
  msg = error_message([&] { index_select(x, 0, from_vector(std::vector<double>{1}, {1})); });
  EXPECT_NE(msg.find("i64"), std::string::npos) << msg;
  msg = error_message([&] { index_select(x, 0, idx64({0, 1}, {1, 2})); });
  EXPECT_NE(msg.find("1-D"), std::string::npos) << msg;
  msg = error_message([&] { index_select(x, 2, idx64({0}, {1})); });
  EXPECT_NE(msg.find("index_select"), std::string::npos) << msg;
}

// ---------------------------------------------------------------- gather

TEST(Gather, ValuesMatchNaive) {
  const Shape s = {3, 4, 5};
  std::mt19937 gen(1);
  for (bool strided : {false, true})
    for (int64_t dim : {0, 1, 2, -1}) {
      const int64_t d = dim < 0 ? dim + 3 : dim;
      // Index smaller than x in the other dims, longer along d, with repeats.
      Shape is = {2, 3, 4};
      is[d] = 7;
      std::vector<int64_t> iv(shape_numel(is));
      std::uniform_int_distribution<int64_t> u(0, s[d] - 1);
      for (auto& v : iv) v = u(gen);
      SCOPED_TRACE(std::string(strided ? "strided " : "") + "dim " + std::to_string(dim));
      Tensor x = strided ? make_noncontiguous(iota(s)) : iota(s);
      Tensor index = idx64(iv, is);
      Tensor want = naive_gather(iota(s), d, index);
      EXPECT_CLOSE(gather(x, dim, index), want, 0, 0);
      EXPECT_CLOSE(gather(x, dim, index.to(DType::i32)), want, 0, 0);
      EXPECT_CLOSE(gather(x, dim, make_noncontiguous(index)), want, 0, 0);
    }
  // The classic use: pick one class per row.
  Tensor logits = from_vector(std::vector<double>{0.1, 0.7, 0.2, 0.5, 0.3, 0.2}, {2, 3}, DType::f32);
  EXPECT_CLOSE(gather(logits, 1, idx64({1, 0}, {2, 1})), from_vector(std::vector<double>{0.7, 0.5}, {2, 1}), 0, 0);
}

TEST(Gather, DuplicatesAccumulateAndUnreachedPartIsZero) {
  Tensor x = zeros({3, 3}, DType::f64).requires_grad_();
  Tensor index = idx64({2, 2, 0, 1}, {2, 2});  // rows 0..1, columns 0..1 of x reachable
  Tensor y = gather(x, 1, index);
  backward({y}, {from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2}, DType::f64)});
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 0, 3, 3, 4, 0, 0, 0, 0}));
}

TEST(Gather, ErrorsNameIndexPositionAndShapes) {
  Tensor x = zeros({2, 4});
  std::string msg = error_message([&] { gather(x, 1, idx64({0, 3, 1, 9}, {2, 2})); });
  EXPECT_NE(msg.find("gather"), std::string::npos) << msg;
  EXPECT_NE(msg.find("index 9"), std::string::npos) << msg;
  EXPECT_NE(msg.find("position [1, 1]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("size 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 4]"), std::string::npos) << msg;
  msg = error_message([&] { gather(x, 1, idx64({0, 1}, {2})); });
  EXPECT_NE(msg.find("same number of dims"), std::string::npos) << msg;
  msg = error_message([&] { gather(x, 1, idx64({0, 0, 0}, {3, 1})); });
  EXPECT_NE(msg.find("[3, 1]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 4]"), std::string::npos) << msg;
}

// ---------------------------------------------------------------- kernels: fast vs reference

TEST(IndexKernels, FastMatchesReferenceF32) {
  // Exact comparisons: forward kernels copy; the adjoint kernels add, for every
  // output element, the same terms in the same (increasing j) order as the
  // reference, so even f32 sums agree bit for bit. Sizes >= 1e5 elements.
  std::mt19937 gen(3);
  std::normal_distribution<float> nd;
  struct Case { int64_t outer, x_dim, n_idx, inner; };
  for (const Case c : {Case{1, 1000, 5000, 64}, Case{16, 50, 300, 33}, Case{300, 40, 500, 1}, Case{2, 7, 20000, 5}}) {
    SCOPED_TRACE(std::to_string(c.outer) + "x" + std::to_string(c.x_dim) + "x" + std::to_string(c.n_idx) + "x" +
                 std::to_string(c.inner));
    std::uniform_int_distribution<int64_t> u(0, c.x_dim - 1);
    std::vector<float> x(c.outer * c.x_dim * c.inner), g(c.outer * c.n_idx * c.inner);
    for (auto& v : x) v = nd(gen);
    for (auto& v : g) v = nd(gen);
    std::vector<int64_t> idx(c.n_idx), gidx(g.size());
    for (auto& v : idx) v = u(gen) / 2;  // half the rows never selected: their gradient must be zero
    for (auto& v : gidx) v = u(gen);
    std::vector<float> f(g.size()), r(g.size()), fx(x.size(), 1.f), rx(x.size(), 2.f);
    cpu::index_select_3d<float, int64_t>(x.data(), idx.data(), f.data(), c.outer, c.x_dim, c.n_idx, c.inner);
    cpu::ref::index_select_3d<float, int64_t>(x.data(), idx.data(), r.data(), c.outer, c.x_dim, c.n_idx, c.inner);
    EXPECT_EQ(f, r);
    cpu::index_add_3d<float, int64_t>(g.data(), idx.data(), fx.data(), c.outer, c.x_dim, c.n_idx, c.inner);
    cpu::ref::index_add_3d<float, int64_t>(g.data(), idx.data(), rx.data(), c.outer, c.x_dim, c.n_idx, c.inner);
    EXPECT_EQ(fx, rx);
    cpu::gather_3d<float, int64_t>(x.data(), gidx.data(), f.data(), c.outer, c.x_dim, c.n_idx, c.inner);
    cpu::ref::gather_3d<float, int64_t>(x.data(), gidx.data(), r.data(), c.outer, c.x_dim, c.n_idx, c.inner);
    EXPECT_EQ(f, r);
    std::fill(fx.begin(), fx.end(), 1.f);
    cpu::scatter_add_3d<float, int64_t>(g.data(), gidx.data(), fx.data(), c.outer, c.x_dim, c.n_idx, c.inner);
    cpu::ref::scatter_add_3d<float, int64_t>(g.data(), gidx.data(), rx.data(), c.outer, c.x_dim, c.n_idx, c.inner);
    EXPECT_EQ(fx, rx);
  }
}

TEST(IndexKernels, ReferenceAdjointByHand) {
  // [1, 3, 2] gradient rows: idx {2, 0, 2} -> gx[0] = g[1], gx[1] = 0, gx[2] = g[0] + g[2].
  const std::vector<double> g = {1, 2, 10, 20, 100, 200};
  const std::vector<int64_t> idx = {2, 0, 2};
  std::vector<double> gx(6, -1), fx(6, -1);
  cpu::ref::index_add_3d<double, int64_t>(g.data(), idx.data(), gx.data(), 1, 3, 3, 2);
  cpu::index_add_3d<double, int64_t>(g.data(), idx.data(), fx.data(), 1, 3, 3, 2);
  EXPECT_EQ(gx, (std::vector<double>{10, 20, 0, 0, 101, 202}));
  EXPECT_EQ(fx, gx);
  std::vector<int64_t> pos = {0, 3, 1};
  EXPECT_EQ(cpu::first_out_of_range(pos.data(), 3, 3), 1);
  EXPECT_EQ(cpu::first_out_of_range(pos.data(), 3, 4), -1);
}

TEST(IndexKernels, BackwardIsDeterministicAcrossThreadCounts) {
  Generator gen(9);
  Tensor x = randn({64, 100}, {}, gen);  // 2e6 gradient elements flow back into 6400
  Tensor index = randint(0, 64, {20000}, gen);
  auto grad_with = [&](int threads) {
    const int prev = omp_get_max_threads();
    omp_set_num_threads(threads);
    Tensor xr = x.detach().requires_grad_();
    Tensor y = index_select(xr, 0, index);
    Generator wg(10);
    backward({y}, {randn(y.sizes(), {}, wg)});
    omp_set_num_threads(prev);
    return xr.grad().to_vector();
  };
  const auto g1 = grad_with(1), g2 = grad_with(2), g3 = grad_with(3);
  EXPECT_TRUE(g1 == g2);  // bitwise
  EXPECT_TRUE(g1 == g3);
}

// index_accumulate_rows (the engine's row-sparse gradient add) vs its reference: the dense
// zero-filled sum, then one add. Tolerance: exact — both sum each row from 0 in increasing
// position before adding it once, for any thread count.
TEST(IndexKernels, AccumulateRowsMatchesDenseSumThenAddBitwise) {
  const int64_t rows = 300, inner = 40, n = 5000;
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int64_t> pick(0, rows - 1);
  std::normal_distribution<float> normal;
  std::vector<int64_t> idx(n);
  for (auto& v : idx) v = pick(rng);
  idx[17] = rows - 1;  // the last row is touched, so the reference covers the whole table
  std::vector<int32_t> idx32(idx.begin(), idx.end());
  std::vector<float> g(n * inner), base(rows * inner);
  for (auto& v : g) v = normal(rng);
  for (auto& v : base) v = normal(rng);
  for (int64_t skip : {int64_t{-1}, int64_t{4}}) {
    std::vector<float> want = base;
    cpu::ref::index_accumulate_rows<float, int64_t>(g.data(), idx.data(), want.data(), n, inner, skip);
    for (int threads : {1, 3}) {
      const int prev = omp_get_max_threads();
      omp_set_num_threads(threads);
      std::vector<float> got = base, got32 = base;
      cpu::index_accumulate_rows<float, int64_t>(g.data(), idx.data(), got.data(), n, inner, skip);
      cpu::index_accumulate_rows<float, int32_t>(g.data(), idx32.data(), got32.data(), n, inner, skip);
      omp_set_num_threads(prev);
      EXPECT_TRUE(got == want) << "skip " << skip << ", " << threads << " threads";
      EXPECT_TRUE(got32 == want) << "i32 ids, skip " << skip << ", " << threads << " threads";
    }
    if (skip >= 0) {
      for (int64_t i = 0; i < inner; ++i) EXPECT_EQ(want[skip * inner + i], base[skip * inner + i]);
    }
  }
}

}  // namespace athanor
