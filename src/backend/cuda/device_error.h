#pragma once
// Errors a kernel finds in its data (a class id out of range), reported without a host sync
// inside the step: the kernel records the first one in a per-device record in pinned,
// mapped host memory, and the host raises it as an athanor::Error at the next point where it
// waits for the device anyway — every device-to-host copy (the loss's read-back, item(),
// .cpu()) — or at once where the caller asks (check_device_errors after a sync: anomaly mode).
//
// Invariants:
//  - the first error wins (atomicCAS on `code`), later ones are dropped until it is raised;
//  - raising clears the record, so an error is reported once;
//  - reading the record costs no CUDA call: it is host memory the device wrote, read after a
//    synchronisation that already happened.
#include <cstdint>

namespace athanor::cuda {

enum class DeviceErrorCode : int32_t { none = 0, target_out_of_range = 1 };

struct DeviceErrorRecord {
  int32_t code = 0;
  int32_t pad = 0;
  int64_t a = 0, b = 0, c = 0;  // target_out_of_range: position, value, number of classes
};

// The device-side address of cuda:index's record (for kernels); allocated on first use.
DeviceErrorRecord* device_error_record(int index);
// Throws the recorded error (and clears it) when there is one. Call only after the device's
// queued work is known complete (a stream or event sync), else a late error is missed until
// the next call.
void check_device_errors(int index);

}  // namespace athanor::cuda
