// The kernel-found errors of device_error.h.
#include "backend/cuda/device_error.h"

#include <mutex>
#include <string>

#include "athanor/core/error.h"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {
struct Slot {
  std::once_flag once;
  DeviceErrorRecord* device = nullptr;  // cudaMalloc'd, never freed (lives as long as the process)
  DeviceErrorRecord* host = nullptr;    // pinned mirror
};
Slot& slot(int index) {
  static Slot all[64];
  ATH_CHECK(index >= 0 && index < 64, "cuda", "cuda:", index, " is past the 64 devices supported");
  return all[index];
}
}  // namespace

DeviceErrorRecord* device_error_record(int index) {
  Slot& s = slot(index);
  std::call_once(s.once, [&] {
    DeviceGuard g(index);
    void* d = nullptr;
    ATH_CUDA(cudaMalloc(&d, sizeof(DeviceErrorRecord)));
    ATH_CUDA(cudaMemsetAsync(d, 0, sizeof(DeviceErrorRecord), compute_stream(index)));
    void* h = nullptr;
    ATH_CUDA(cudaMallocHost(&h, sizeof(DeviceErrorRecord)));
    s.host = new (h) DeviceErrorRecord();
    s.device = static_cast<DeviceErrorRecord*>(d);
  });
  return s.device;
}

void fetch_device_errors(int index, cudaStream_t stream) {
  Slot& s = slot(index);
  if (!s.device) return;  // no kernel has been given the record
  ATH_CUDA(cudaMemcpyAsync(s.host, s.device, sizeof(DeviceErrorRecord), cudaMemcpyDeviceToHost, stream));
}

void raise_device_errors(int index) {
  Slot& s = slot(index);
  if (!s.host || s.host->code == 0) return;
  const DeviceErrorRecord r = *s.host;
  *s.host = DeviceErrorRecord();
  {
    DeviceGuard g(index);
    ATH_CUDA(cudaMemsetAsync(s.device, 0, sizeof(DeviceErrorRecord), compute_stream(index)));
  }
  switch (static_cast<DeviceErrorCode>(r.code)) {
    case DeviceErrorCode::target_out_of_range:
      ATH_FAIL("cross_entropy", "target value ", r.b, " at position ", r.a, " is out of range for C = ", r.c,
               " classes (valid targets are 0 to ", r.c - 1, ", or ignore_index); found on cuda:", index,
               " and reported at this read from the device (the row was left out of the loss)",
               Hint{"check the label preprocessing and that the model's output size matches the number of classes; "
                    "anomaly mode raises it at the cross_entropy call itself"});
    case DeviceErrorCode::embedding_id_out_of_range:
      ATH_FAIL("embedding", "id ", r.b, " at (flat) position ", r.a, " of the ids is out of range for an embedding table of ",
               r.c, " rows; found on cuda:", index, " and reported at this read from the device (the row was left zero)",
               Hint{"ids must be in [0, " + std::to_string(r.c) +
                    "); check that the tokenizer's vocabulary size matches num_embeddings; anomaly mode raises it at "
                    "the embedding call itself"});
    default: ATH_FAIL("cuda", "a kernel on cuda:", index, " reported error code ", r.code);
  }
}

void check_device_errors_now(int index) {
  Slot& s = slot(index);
  if (!s.device) return;
  DeviceGuard g(index);
  const cudaStream_t cs = compute_stream(index);
  fetch_device_errors(index, cs);
  note_host_sync(index);
  ATH_CUDA(cudaStreamSynchronize(cs));
  raise_device_errors(index);
}

}  // namespace athanor::cuda
