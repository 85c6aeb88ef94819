#include "backend/cuda/device_allocator.h"

#include <array>
#include <cstdio>
#include <mutex>

#include "athanor/core/error.h"

namespace athanor::cuda {

namespace {
RawMemory cuda_raw(int device) {
  RawMemory r;
  r.device_name = "cuda:" + std::to_string(device);
  r.allocate = [device](std::size_t n) -> void* {
    DeviceGuard g(device);
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, n);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: the pool frees its cache and tries again
      return nullptr;
    }
    if (err != cudaSuccess) fail_cuda(err, "cudaMalloc", __FILE__, __LINE__);
    return p;
  };
  r.release = [device](void* p, std::size_t) {
    DeviceGuard g(device);
    ATH_CUDA(cudaFree(p));
  };
  r.describe_device = [device] {
    const MemInfo m = mem_info(device);
    char buf[160];
    std::snprintf(buf, sizeof buf, "cudaMemGetInfo: %.2f GiB free of %.2f GiB total (memory other processes hold "
                  "counts against the free figure)", m.free / 1073741824.0, m.total / 1073741824.0);
    return std::string(buf);
  };
  return r;
}
}  // namespace

DeviceAllocator::DeviceAllocator(int device) : device_(device), pool_(cuda_raw(device)) {}

DeviceAllocator& DeviceAllocator::get(int device) {
  check_device(device, "cuda allocator");
  static std::array<DeviceAllocator*, 64> all{};
  static std::mutex mu;
  std::lock_guard<std::mutex> l(mu);
  auto& a = all.at(static_cast<std::size_t>(device));
  // Never destroyed: segments outlive static destructors that may still free tensors.
  if (!a) a = new DeviceAllocator(device);
  return *a;
}

void* DeviceAllocator::allocate(std::size_t nbytes, MemTag tag, cudaStream_t stream) {
  if (!stream) stream = compute_stream(device_);
  return pool_.allocate(nbytes, tag, reinterpret_cast<StreamId>(stream));
}

void DeviceAllocator::deallocate(void* ptr) { pool_.deallocate(ptr); }

void DeviceAllocator::empty_cache() {
  DeviceGuard g(device_);
  ATH_CUDA(cudaDeviceSynchronize());
  pool_.empty_cache();
}

}  // namespace athanor::cuda
