#include "backend/cuda/device_allocator.h"

#include <array>
#include <cstdio>
#include <memory>
#include <mutex>
#include <vector>

#include "athanor/core/error.h"

namespace athanor::cuda {

namespace {
// Events for record_stream's blocks, reused: creating one per freed upload would cost a
// driver call each time.
class EventCache {
 public:
  explicit EventCache(int device) : device_(device) {}
  cudaEvent_t take() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    DeviceGuard g(device_);
    cudaEvent_t e = nullptr;
    ATH_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void give(cudaEvent_t e) {
    std::lock_guard<std::mutex> l(mu_);
    free_.push_back(e);
  }

 private:
  int device_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

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
  auto events = std::make_shared<EventCache>(device);
  r.record_event = [device, events](StreamId s) -> void* {
    cudaEvent_t e = events->take();
    DeviceGuard g(device);
    ATH_CUDA(cudaEventRecord(e, reinterpret_cast<cudaStream_t>(s)));
    return e;
  };
  r.event_done = [](void* e) {
    const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(e));  // never blocks
    if (err == cudaErrorNotReady) {
      cudaGetLastError();  // not sticky; cleared so a later launch check does not see it
      return false;
    }
    if (err != cudaSuccess) fail_cuda(err, "cudaEventQuery", __FILE__, __LINE__);
    return true;
  };
  r.wait_event = [device](void* e) {
    note_host_sync(device);  // only on the way to an out-of-memory error
    ATH_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(e)));
  };
  r.release_event = [events](void* e) { events->give(static_cast<cudaEvent_t>(e)); };
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
  note_host_sync(device_);
  ATH_CUDA(cudaDeviceSynchronize());
  pool_.empty_cache();
}

}  // namespace athanor::cuda
