#pragma once
// Shared machinery of the gpu tests: the skip (with the reason) where no device is present,
// device buffers from the caching allocator, copies, and a close-comparison with a report of
// the worst element.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/device_allocator.h"
#include "backend/cuda/runtime.h"

#define ATH_REQUIRE_GPU()                                                     \
  do {                                                                        \
    if (::athanor::cuda::device_count() == 0)                                 \
      GTEST_SKIP() << ::athanor::cuda::no_device_reason();                    \
  } while (0)

namespace athanor::gpu_test {

inline cudaStream_t stream() { return cuda::compute_stream(0); }

// A device buffer of n T's from the caching allocator (cuda:0), freed at scope end.
template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit DeviceBuffer(std::size_t count, MemTag tag = MemTag::activation) : n(count) {
    ptr = static_cast<T*>(cuda::DeviceAllocator::get(0).allocate(count * sizeof(T), tag));
  }
  explicit DeviceBuffer(const std::vector<T>& host, MemTag tag = MemTag::activation) : DeviceBuffer(host.size(), tag) {
    ATH_CUDA(cudaMemcpyAsync(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice, stream()));
  }
  ~DeviceBuffer() { cuda::DeviceAllocator::get(0).deallocate(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<T> host() const {
    std::vector<T> h(n);
    ATH_CUDA(cudaMemcpyAsync(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost, stream()));
    ATH_CUDA(cudaStreamSynchronize(stream()));
    return h;
  }
};

inline std::vector<float> random_vector(std::size_t n, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// |got - want| <= atol + rtol |want| for every element; reports the worst one.
template <class A, class B>
::testing::AssertionResult all_close(const std::vector<A>& got, const std::vector<B>& want, double atol, double rtol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << want.size();
  double worst = -1;
  std::size_t at = 0;
  bool ok = true;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    const double err = std::abs(g - w), tol = atol + rtol * std::abs(w);
    if (!(err <= tol)) ok = false;
    const double excess = std::isnan(err) ? 1e300 : err - tol;
    if (excess > worst || i == 0) {
      worst = excess;
      at = i;
    }
  }
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << at << ": got " << static_cast<double>(got[at]) << ", want "
                                       << static_cast<double>(want[at]) << " (atol " << atol << ", rtol " << rtol << ")";
}

}  // namespace athanor::gpu_test
