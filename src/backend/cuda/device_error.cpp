// The kernel-found errors of device_error.h.
#include "backend/cuda/device_error.h"

#include <atomic>
#include <mutex>
#include <string>

#include "athanor/core/error.h"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {
struct Slot {
  std::once_flag once;
  DeviceErrorRecord* host = nullptr;
  DeviceErrorRecord* device = nullptr;
};
Slot& slot(int index) {
  static Slot all[64];  // never freed: the records live as long as the process
  ATH_CHECK(index >= 0 && index < 64, "cuda", "cuda:", index, " is past the 64 devices supported");
  return all[index];
}
Slot& ready_slot(int index) {
  Slot& s = slot(index);
  std::call_once(s.once, [&] {
    DeviceGuard g(index);
    void* p = nullptr;
    ATH_CUDA(cudaHostAlloc(&p, sizeof(DeviceErrorRecord), cudaHostAllocMapped | cudaHostAllocPortable));
    s.host = new (p) DeviceErrorRecord();
    void* d = nullptr;
    ATH_CUDA(cudaHostGetDevicePointer(&d, p, 0));
    s.device = static_cast<DeviceErrorRecord*>(d);
  });
  return s;
}
}  // namespace

DeviceErrorRecord* device_error_record(int index) { return ready_slot(index).device; }

void check_device_errors(int index) {
  Slot& s = slot(index);
  if (!s.host) return;  // no kernel has been given the record yet
  volatile DeviceErrorRecord* r = s.host;
  std::atomic_thread_fence(std::memory_order_acquire);
  const int32_t code = r->code;
  if (code == 0) return;
  const int64_t a = r->a, b = r->b, c = r->c;
  r->a = 0;
  r->b = 0;
  r->c = 0;
  std::atomic_thread_fence(std::memory_order_release);
  r->code = 0;
  switch (static_cast<DeviceErrorCode>(code)) {
    case DeviceErrorCode::target_out_of_range:
      ATH_FAIL("cross_entropy", "target value ", b, " at position ", a, " is out of range for C = ", c,
               " classes (valid targets are 0 to ", c - 1, ", or ignore_index); found on cuda:", index,
               " and reported at this read from the device (the row was left out of the loss)",
               Hint{"check the label preprocessing and that the model's output size matches the number of classes; "
                    "anomaly mode raises it at the cross_entropy call itself"});
    default: ATH_FAIL("cuda", "a kernel on cuda:", index, " reported error code ", code);
  }
}

}  // namespace athanor::cuda
