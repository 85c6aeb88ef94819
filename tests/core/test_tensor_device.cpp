// CUDA tensors from the CPU side: what runs on a machine without a GPU (and in a build
// without CUDA). Every entry point that would touch a device checks it exists first and
// fails with a clear Error; a tensor that claims a CUDA device (wrapped host memory, so
// no GPU is needed to make one) is never read by host code. tests/gpu/test_gpu_tensor.cpp
// runs the same entry points on a real GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "athanor/core/device_hooks.h"
#include "athanor/core/error.h"
#include "athanor/core/tensor.h"
#include "athanor/ops/elementwise.h"
#include "athanor/ops/linalg.h"

using namespace athanor;

namespace {

// The message of the Error `fn` throws ("" when it throws none).
template <class Fn> std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return std::string(e.what()) + " | hint: " + e.hint();
  }
  return "";
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Is cuda:0 usable here? (A GPU machine runs the gpu tests instead of these.)
bool gpu_present() { return error_of([] { empty({1}, TensorOptions().with_device(Device::cuda(0))); }).empty(); }

// A [2, 3] f32 tensor whose storage says cuda:0 but is host memory: no GPU needed. Only
// the device checks may look at it; a read of its bytes through the device path would be
// a bug (these tests never get that far: every such path checks the device first).
Tensor fake_cuda_tensor(std::vector<float>& host) {
  host.assign(6, 1.0f);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::wrap(host.data(), host.size() * sizeof(float), nullptr, Device::cuda(0));
  impl->sizes = {2, 3};
  impl->strides = {3, 1};
  return Tensor(impl);
}

}  // namespace

TEST(TensorDevice, CudaWithoutAGpuIsAClearErrorBeforeAnyWork) {
  if (gpu_present()) GTEST_SKIP() << "a GPU is present: tests/gpu covers this machine";
  const Tensor x = ones({2, 3});
  for (const std::string& m : {error_of([] { empty({2}, TensorOptions().with_device(Device::cuda())); }),
                               error_of([] { zeros({2}, TensorOptions().with_device(Device::cuda())); }),
                               error_of([&] { (void)x.to(Device::cuda()); }), error_of([&] { (void)x.cuda(); })}) {
    ASSERT_FALSE(m.empty()) << "no error";
#ifdef ATHANOR_HAS_CUDA
    EXPECT_TRUE(has(m, "cuda:0 was asked for, but this machine has no usable CUDA device")) << m;
    EXPECT_TRUE(has(m, "hint: run on cpu")) << m;
#else
    EXPECT_TRUE(has(m, "cuda:0 was asked for, but this build has no CUDA")) << m;
    EXPECT_TRUE(has(m, "reconfigure with nvcc")) << m;
#endif
  }
  // The error names the entry point: the tensor move, not some later kernel.
  EXPECT_TRUE(has(error_of([&] { (void)x.cuda(7); }), "to:")) << error_of([&] { (void)x.cuda(7); });
  EXPECT_TRUE(has(error_of([&] { (void)x.cuda(7); }), "cuda:7 was asked for"));
  EXPECT_TRUE(has(error_of([&] { (void)x.to(Device::cuda(-1)); }), "negative"));
  // The CPU stays the CPU: to(cpu) of a CPU tensor is the tensor itself, no copy.
  EXPECT_TRUE(x.cpu().is_same(x));
}

TEST(TensorDevice, HostCodeNeverReadsADeviceTensor) {
  std::vector<float> host;
  const Tensor t = fake_cuda_tensor(host);
  EXPECT_EQ(t.device(), Device::cuda(0));
  const std::string m = error_of([&] { (void)t.data_ptr<float>(); });
  EXPECT_TRUE(has(m, "data_ptr")) << m;
  EXPECT_TRUE(has(m, "lives on cuda:0")) << m;
  EXPECT_TRUE(has(m, ".cpu()")) << m;
  EXPECT_TRUE(has(error_of([&] { (void)t.raw_data(); }), "lives on cuda:0"));
  // Reads that copy to the host (item, to_vector, printing) go through the device check.
  if (!gpu_present()) {
    for (const std::string& e : {error_of([&] { (void)t.to_vector(); }), error_of([&] { (void)t.to_string(); }),
                                 error_of([&] { (void)t.cpu(); })}) {
      ASSERT_FALSE(e.empty());
      EXPECT_TRUE(has(e, "cuda:0 was asked for")) << e;
    }
  }
}

TEST(TensorDevice, MixedDevicesAreAnErrorNamingTheOpAndEveryInput) {
  std::vector<float> host;
  const Tensor g = fake_cuda_tensor(host);
  const Tensor c = ones({2, 3});
  const std::string m = error_of([&] { (void)add(c, g); });
  EXPECT_TRUE(has(m, "add")) << m;
  EXPECT_TRUE(has(m, "inputs are on different devices: a on cpu, b on cuda:0")) << m;
  EXPECT_TRUE(has(m, "b.to(Device::cuda(0))") || has(m, "a.to(Device::cuda(0))")) << m;
  const std::string l = error_of([&] { (void)linear(c, g, Tensor()); });
  EXPECT_TRUE(has(l, "linear")) << l;
  EXPECT_TRUE(has(l, "x on cpu, weight on cuda:0")) << l;
}

TEST(TensorDevice, AnOpWithoutACudaKernelSaysSoBeforeTouchingTheData) {
  std::vector<float> host;
  const Tensor g = fake_cuda_tensor(host);
  const std::string m = error_of([&] { (void)exp(g); });  // exp: no CUDA kernel yet
  EXPECT_TRUE(has(m, "exp")) << m;
  EXPECT_TRUE(has(m, "has no cuda kernel (input x is on cuda:0)")) << m;
  EXPECT_TRUE(has(m, "athanor ops")) << m;
}

TEST(TensorDevice, DeviceHooksAreInstalledExactlyInACudaBuild) {
#ifdef ATHANOR_HAS_CUDA
  EXPECT_NE(device_hooks(DeviceType::cuda), nullptr) << "the CUDA backend's registrar did not run (link anchor)";
#else
  EXPECT_EQ(device_hooks(DeviceType::cuda), nullptr);
#endif
  EXPECT_EQ(device_hooks(DeviceType::cpu), nullptr);  // the CPU needs none: core owns its memory
}
