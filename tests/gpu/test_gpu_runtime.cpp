// The device runtime and the cudaMalloc-backed caching allocator on a real GPU; the
// errors given before any work (a missing device, cuda:7) run everywhere.
#include <string>

#include "athanor/core/error.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;

TEST(GpuRuntime, MissingDeviceIsAClearErrorBeforeAnyWork) {
  // cuda:7 on this machine (0, 1 or a few GPUs): an Error that says how many there are.
  const int n = cuda::device_count();
  if (n > 7) GTEST_SKIP() << "this machine has " << n << " GPUs: cuda:7 exists";
  try {
    cuda::require_device(7, "trainer.device");
    FAIL() << "cuda:7 was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cuda:7 was asked for"), std::string::npos) << m;
    if (n == 0) EXPECT_NE(m.find("no usable CUDA device"), std::string::npos) << m;
    else EXPECT_NE(m.find("this machine has " + std::to_string(n) + " CUDA device"), std::string::npos) << m;
    EXPECT_FALSE(e.hint().empty());
  }
  EXPECT_THROW(cuda::require_device(-1), Error);
  if (n == 0) {
    EXPECT_NE(cuda::no_device_reason().find("cudaGetDeviceCount returned"), std::string::npos);
    EXPECT_THROW(cuda::DeviceAllocator::get(0), Error);
  }
}

TEST(GpuRuntime, DeviceInfoAndStreams) {
  ATH_REQUIRE_GPU();
  const auto info = cuda::device_info(0);
  std::printf("[ device ] %s\n", cuda::describe(info).c_str());
  EXPECT_GE(info.cc_major, 8);
  EXPECT_GT(info.sm_count, 0);
  EXPECT_GT(info.total_memory, std::size_t{1} << 30);
  EXPECT_NE(cuda::compute_stream(0), cuda::copy_stream(0));
  EXPECT_EQ(cuda::compute_stream(0), cuda::compute_stream(0));
  const auto m = cuda::mem_info(0);
  EXPECT_GT(m.free, 0u);
  EXPECT_EQ(m.total, info.total_memory);
}

TEST(GpuRuntime, CudaErrorsBecomeAthanorErrors) {
  ATH_REQUIRE_GPU();
  // A non-sticky error (the context stays usable): a device index past the last one.
  const int bad = cuda::device_count() + 10;
  try {
    ATH_CUDA(cudaSetDevice(bad));
    FAIL() << "cudaSetDevice(" << bad << ") passed";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cudaSetDevice(bad) failed: cudaErrorInvalidDevice"), std::string::npos) << m;
    EXPECT_NE(e.hint().find("CUDA_VISIBLE_DEVICES"), std::string::npos) << e.hint();
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the error was cleared";
  ATH_CUDA(cudaSetDevice(0));
}

TEST(GpuAllocator, AccountingAgreesWithCudaMemGetInfo) {
  ATH_REQUIRE_GPU();
  auto& a = cuda::DeviceAllocator::get(0);
  a.empty_cache();
  const auto before = a.mem_info();
  const auto s0 = a.stats();
  const std::size_t big = std::size_t{256} << 20;
  void* p = a.allocate(big, MemTag::parameter);
  void* q = a.allocate(1000, MemTag::gradient);
  const auto s1 = a.stats();
  const auto after = a.mem_info();
  EXPECT_EQ(s1.of(MemTag::parameter) - s0.of(MemTag::parameter), big);
  EXPECT_EQ(s1.of(MemTag::gradient) - s0.of(MemTag::gradient), 1000u);
  // The device lost what the allocator reserved, within the driver's 2 MiB granularity.
  const std::size_t reserved_delta = s1.reserved - s0.reserved;
  const double taken = static_cast<double>(before.free) - static_cast<double>(after.free);
  EXPECT_NEAR(taken, static_cast<double>(reserved_delta), 4.0 * (1 << 20));
  EXPECT_GE(reserved_delta, big + 1000);
  a.deallocate(p);
  a.deallocate(q);
  EXPECT_GE(a.largest_cached_block(), big);
  a.empty_cache();
  EXPECT_NEAR(static_cast<double>(a.mem_info().free), static_cast<double>(before.free), 4.0 * (1 << 20));
}

TEST(GpuAllocator, ReusesFreedBlocksWithoutCudaMalloc) {
  ATH_REQUIRE_GPU();
  auto& a = cuda::DeviceAllocator::get(0);
  void* p = a.allocate(std::size_t{64} << 20, MemTag::activation);
  a.deallocate(p);
  const auto mallocs = a.stats().system_allocs;
  void* q = a.allocate(std::size_t{64} << 20, MemTag::activation);
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.stats().system_allocs, mallocs);
  a.deallocate(q);
}

TEST(GpuAllocator, OutOfMemoryPrintsTheBreakdown) {
  ATH_REQUIRE_GPU();
  auto& a = cuda::DeviceAllocator::get(0);
  const auto m = a.mem_info();
  try {
    a.allocate(m.total + (std::size_t{1} << 30), MemTag::activation);
    FAIL() << "more than the device's memory was granted";
  } catch (const Error& e) {
    const std::string s = e.what();
    EXPECT_NE(s.find("cuda:0 out of memory"), std::string::npos) << s;
    EXPECT_NE(s.find("largest cached block"), std::string::npos) << s;
    EXPECT_NE(s.find("cudaMemGetInfo"), std::string::npos) << s;
    EXPECT_NE(s.find("parameter:"), std::string::npos) << s;
  }
  // The device still works after the failed cudaMalloc.
  void* p = a.allocate(1 << 20, MemTag::activation);
  EXPECT_NE(p, nullptr);
  a.deallocate(p);
}
