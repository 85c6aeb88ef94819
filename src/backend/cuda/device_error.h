#pragma once
// Errors a kernel finds in its data (a class id out of range), reported without a host sync
// inside the step: the kernel records the first one in a small per-device record in device
// memory, and the host raises it as an athanor::Error at the next point where it waits for
// the device anyway — every device-to-host copy (the loss's read-back, item(), .cpu()), which
// fetches the record (a few bytes, queued before the copy's own wait) — or at once where the
// caller asks (check_device_errors_now: anomaly mode).
//
// Invariants:
//  - the first error wins (atomicCAS on `code`, in device memory), later ones are dropped
//    until it is raised;
//  - raising clears the record (device and host copies), so an error is reported once.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace athanor::cuda {

enum class DeviceErrorCode : int32_t { none = 0, target_out_of_range = 1, embedding_id_out_of_range = 2 };

struct DeviceErrorRecord {
  int32_t code = 0;
  int32_t pad = 0;
  int64_t a = 0, b = 0, c = 0;  // target_out_of_range: position, value, number of classes;
                                // embedding_id_out_of_range: position (flat), id, number of rows
};

// cuda:index's record in device memory (for kernels); allocated and zeroed on first use.
DeviceErrorRecord* device_error_record(int index);
// Queues the copy of the record to its pinned host mirror on `stream` (a no-op until a kernel
// has been given the record). The host may read the mirror once `stream` has been waited on.
void fetch_device_errors(int index, cudaStream_t stream);
// After such a wait: throws the error in the mirror, if any, and clears the record.
void raise_device_errors(int index);
// Synchronises cuda:index's compute stream, fetches the record and raises what it holds.
void check_device_errors_now(int index);

}  // namespace athanor::cuda
