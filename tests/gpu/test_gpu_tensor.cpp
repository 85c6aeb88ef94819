// CUDA tensors on a real GPU: Storage from the caching allocator with its tags,
// Tensor::to / cuda / cpu through the pinned staging buffers (sizes past one staging
// buffer), fills, strided copies and casts on the device, host reads, autograd's seed
// and gradient accumulation on the device, and the mixed-device error. Without a GPU each
// test reports skipped with the reason (tests/core/test_tensor_device.cpp covers that side).
#include <cstring>
#include <string>
#include <vector>

#include "athanor/core/error.h"
#include "athanor/core/tensor.h"
#include "athanor/ops/elementwise.h"
#include "athanor/ops/linalg.h"
#include "athanor/ops/shape.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;

namespace {
const TensorOptions kCuda = TensorOptions().with_device(Device::cuda(0));

Tensor host_randn(const Shape& s, unsigned seed, DType dt = DType::f32) {
  const auto v = random_vector(static_cast<std::size_t>(shape_numel(s)), seed, -2.0f, 2.0f);
  return from_vector(v, s, TensorOptions(dt));
}
// Same bytes (logical order): exact equality, NaN-safe.
bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.raw_data(), bc.raw_data(), ac.nbytes()) == 0;
}
}  // namespace

TEST(GpuTensor, RoundTripIsExactAcrossStagingChunks) {
  ATH_REQUIRE_GPU();
  // 3 M floats = 12 MiB: three chunks through the two 4 MiB pinned buffers, both ways.
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    const Tensor h = host_randn({3, 1000, 1000}, 1, dt);
    const Tensor d = h.cuda();
    EXPECT_EQ(d.device(), Device::cuda(0));
    EXPECT_TRUE(d.is_contiguous());
    const Tensor back = d.cpu();
    EXPECT_EQ(back.device(), Device::cpu());
    EXPECT_TRUE(same_bits(back, h)) << dtype_name(dt);
  }
  const Tensor ids = from_vector(std::vector<int64_t>{3, -1, 7, 1LL << 40}, {4});
  EXPECT_TRUE(same_bits(ids.cuda().cpu(), ids));
  // A non-contiguous host tensor uploads its logical order.
  const Tensor ht = host_randn({64, 48}, 2).t();
  EXPECT_TRUE(same_bits(ht.cuda().cpu(), ht.contiguous()));
  // An empty tensor moves too.
  EXPECT_EQ(empty({0, 5}).cuda().cpu().sizes(), (Shape{0, 5}));
}

TEST(GpuTensor, FactoriesFillsAndHostReads) {
  ATH_REQUIRE_GPU();
  EXPECT_EQ(zeros({5, 7}, kCuda).cpu().to_vector(), std::vector<double>(35, 0.0));
  EXPECT_EQ(ones({3}, TensorOptions(DType::bf16).with_device(Device::cuda(0))).cpu().to_vector(), std::vector<double>(3, 1.0));
  EXPECT_EQ(full({2, 2}, -2.5, kCuda).to_vector(), std::vector<double>(4, -2.5));  // to_vector reads through the host
  EXPECT_EQ(full({}, 4.25, kCuda).item(), 4.25);
  EXPECT_EQ(arange(0, 6, TensorOptions(DType::i64).with_device(Device::cuda(0))).to_vector(),
            (std::vector<double>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(from_vector(std::vector<double>{1.5, 2.5}, {2}, kCuda).cpu().to_vector(), (std::vector<double>{1.5, 2.5}));
  EXPECT_NE(full({2}, 1.0, kCuda).to_string().find("1, 1"), std::string::npos);
  // fill_ of a strided view writes only the view's elements.
  Tensor d = zeros({4, 6}, kCuda);
  Tensor col = make_view(d, {4}, {6}, 2);  // column 2
  col.fill_(3.0);
  const auto v = d.cpu().to_vector();
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 6; ++c) EXPECT_EQ(v[r * 6 + c], c == 2 ? 3.0 : 0.0) << r << "," << c;
  // Host code asking for the device pointer gets an Error, not a crash.
  EXPECT_THROW((void)d.data_ptr<float>(), Error);
}

TEST(GpuTensor, StridedCopiesAndCastsMatchTheCpu) {
  ATH_REQUIRE_GPU();
  const Tensor h = host_randn({6, 5, 4}, 3);
  const Tensor d = h.cuda();
  // contiguous() of permuted / sliced views: the strided copy kernel.
  EXPECT_TRUE(same_bits(d.permute({2, 0, 1}).contiguous().cpu(), h.permute({2, 0, 1}).contiguous()));
  EXPECT_TRUE(same_bits(make_view(d, {3, 5}, {40, 4}, 1).contiguous().cpu(), make_view(h, {3, 5}, {40, 4}, 1).contiguous()));
  // copy_ with broadcasting on the device, and across devices both ways.
  Tensor dst = empty({3, 4}, kCuda);
  dst.copy_(from_vector(std::vector<float>{1, 2, 3, 4}, {4}).cuda());
  EXPECT_EQ(dst.cpu().to_vector(), (std::vector<double>{1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4}));
  Tensor hdst = empty({2, 3});
  hdst.copy_(full({3}, 7.0, kCuda));
  EXPECT_EQ(hdst.to_vector(), std::vector<double>(6, 7.0));
  // Casts between f32, bf16 and f16 give the CPU's bits (round to nearest even).
  for (DType to : {DType::bf16, DType::f16}) {
    EXPECT_TRUE(same_bits(d.to(to).cpu(), h.to(to))) << dtype_name(to);
    EXPECT_TRUE(same_bits(d.to(to).to(DType::f32).cpu(), h.to(to).to(DType::f32))) << dtype_name(to);
  }
  // A conversion the device cannot do is an Error naming it.
  try {
    (void)d.to(DType::i64);
    FAIL() << "f32 -> i64 on cuda was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not yet supported on cuda"), std::string::npos) << e.what();
  }
}

TEST(GpuTensor, StorageUsesTheCachingAllocatorWithTags) {
  ATH_REQUIRE_GPU();
  auto& alloc = cuda::DeviceAllocator::get(0);
  const auto before = alloc.stats();
  {
    const Tensor p = empty({1 << 20}, TensorOptions().with_device(Device::cuda(0)).with_tag(MemTag::parameter));
    const auto during = alloc.stats();
    EXPECT_GE(during.current[static_cast<int>(MemTag::parameter)] - before.current[static_cast<int>(MemTag::parameter)],
              std::size_t{4} << 20);
    // to(device) keeps the source's tag (a parameter moved to the GPU is a parameter there).
    const Tensor hp = empty({1024}, TensorOptions().with_tag(MemTag::optimizer_state));
    const Tensor dp = hp.cuda();
    EXPECT_EQ(dp.storage()->tag(), MemTag::optimizer_state);
  }
  EXPECT_EQ(alloc.stats().current[static_cast<int>(MemTag::parameter)], before.current[static_cast<int>(MemTag::parameter)]);
}

TEST(GpuTensor, AutogradSeedsAndAccumulatesOnTheDevice) {
  ATH_REQUIRE_GPU();
  const Tensor xh = host_randn({3, 3}, 4);
  Tensor x = xh.cuda().detach().requires_grad_(true);
  // y = x x + x (x used twice: the gradient is accumulated on the device) reduced to a
  // scalar by a [1, 9] x [9, 1] GEMM with ones, so backward() seeds a ones gradient there.
  const Tensor y = add(mul(x, x), x);
  const Tensor s = view(matmul(view(y, {1, 9}), ones({9, 1}, kCuda)), {});
  s.backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().device(), Device::cuda(0));
  const auto g = x.grad().cpu().to_vector(), xv = xh.to_vector();
  for (std::size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], 2 * xv[i] + 1, 1e-5) << i;
  // The gradient through to(): a CPU leaf gets its gradient back on the CPU.
  Tensor c = xh.detach().requires_grad_(true);
  const Tensor sc = view(matmul(view(mul(c.cuda(), c.cuda()), {1, 9}), ones({9, 1}, kCuda)), {});
  sc.backward();
  ASSERT_TRUE(c.grad().defined());
  EXPECT_EQ(c.grad().device(), Device::cpu());
  for (std::size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(c.grad().to_vector()[i], 2 * xv[i], 1e-5) << i;
}

TEST(GpuTensor, MixedDevicesAndMissingDevicesAreErrors) {
  ATH_REQUIRE_GPU();
  const Tensor d = ones({2, 3}, kCuda), h = ones({2, 3});
  try {
    (void)add(h, d);
    FAIL() << "cpu + cuda was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a on cpu, b on cuda:0"), std::string::npos) << e.what();
  }
  const int n = cuda::device_count();
  try {
    (void)h.to(Device::cuda(n));
    FAIL() << "cuda:" << n << " was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:" + std::to_string(n) + " was asked for"), std::string::npos) << e.what();
  }
}
