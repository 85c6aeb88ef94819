#pragma once
// The trainer's view of its device (trainer.device): the allocator's tags and peaks, freeing
// its cache, waiting for queued work, and the hardware's peak FLOP/s for MFU. One set of
// calls for cpu and cuda, so the trainer and the bench have one code path: on cpu they are
// the CPU allocator's (Allocator::cpu()) and no-ops; on cuda the caching device allocator's
// (src/backend/cuda/device_allocator.h). Compiled in every build; without CUDA a cuda
// device never gets here (trainer.device is refused before any work).
#include <string>

#include "athanor/core/allocator.h"
#include "athanor/core/device.h"
#include "athanor/core/dtype.h"

namespace athanor::train {

MemoryStats device_memory_stats(Device d);
void reset_device_memory_peak(Device d);
// Gives the cached, wholly free blocks back to the system (cudaFree after the device is
// idle; the CPU allocator's cache to free()). What trainer.empty_cache calls.
void empty_device_cache(Device d);
// "" on cpu; on cuda: "cuda:0 (NVIDIA H100 80GB HBM3): 1.2 GiB cached, 71.3 of 79.1 GiB free".
std::string device_memory_note(Device d);
// Returns when every kernel and copy queued on the device's compute stream has finished
// (nothing to wait for on cpu): the bench's step clock and the end of a run.
void synchronize_device(Device d);

struct DevicePeak {
  double flops = 0;  // FLOP/s; 0 = unknown (no MFU)
  std::string source;  // how it was obtained, for the log and the bench
};
// The hardware's dense peak for `compute` (the forward's GEMM dtype: f32, bf16, f16) on a
// cuda device, as DESIGN.md "Honest metrics" counts it: H100/H200 SXM 989 TFLOP/s bf16/f16,
// 67 TFLOP/s f32 (TF32 tensor cores are off: the GEMMs run exact f32); 0 for a GPU not in
// the table (set observe.peak_gflops). On cpu: {0, ""} (the caller uses cpu_peak).
DevicePeak cuda_peak_flops(Device d, DType compute);

}  // namespace athanor::train
