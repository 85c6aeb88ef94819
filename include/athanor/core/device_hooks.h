#pragma once
// Device hooks: how core reaches a device's memory without including the backend that
// owns it (the layer order in DESIGN.md). The CUDA backend installs its hooks at start-up
// when the build has CUDA (src/backend/cuda/device_hooks.cpp); Storage, copy_into, fill_
// and the host reads (item, to_vector, printing) of a non-CPU tensor go through them.
//
// Invariants:
//  - with no hooks installed for a device type, every use of that device is an Error given
//    before any work: "this build has no CUDA" (a CPU-only build) — never a null call;
//  - copies and fills are stream-ordered on the device's compute stream: a kernel queued
//    after them sees their result, and a host read (copy_to_host) waits for them;
//  - an upload into memory from allocate_upload waits for no queued compute (the memory is
//    the copy stream's, its reuse ordered after its last use on the compute stream), so the
//    next batch's copy overlaps the step still running; into other memory it waits for the
//    compute queued before it (that memory may have been freed by work still queued);
//  - host_syncs(index) counts every host synchronisation with the device: each copy_to_host
//    and each stream/event/device synchronize the backend makes.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "athanor/core/allocator.h"
#include "athanor/core/device.h"
#include "athanor/core/dtype.h"

namespace athanor {

// A strided region of one device's memory: `data` points at element 0.
struct StridedRegion {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::vector<int64_t> sizes, strides;  // strides in elements; a 0 stride broadcasts
};

class DeviceHooks {
 public:
  virtual ~DeviceHooks() = default;
  // Throws (naming `op`) unless device `index` exists: no device, or past the last one.
  virtual void check_device(int index, const char* op) = 0;
  virtual void* allocate(int index, std::size_t nbytes, MemTag tag) = 0;
  // Memory that copy_to_device will fill from the host and the compute stream then use
  // (Tensor::to(device) from the cpu). Released by deallocate.
  virtual void* allocate_upload(int index, std::size_t nbytes, MemTag tag) { return allocate(index, nbytes, tag); }
  virtual void deallocate(int index, void* ptr) = 0;
  virtual void retag(int index, void* ptr, MemTag to) = 0;
  // nbytes from host memory to the device, through pinned staging on the copy stream,
  // ordered before later work on the compute stream. `src` may be freed on return.
  virtual void copy_to_device(void* dst, int index, const void* src, std::size_t nbytes) = 0;
  // nbytes from the device to host memory, after the work queued on the compute stream;
  // returns when the bytes are on the host.
  virtual void copy_to_host(void* dst, const void* src, int index, std::size_t nbytes) = 0;
  // Between two devices of this type (or within one), stream-ordered.
  virtual void copy_between(void* dst, int dst_index, const void* src, int src_index, std::size_t nbytes) = 0;
  // dst = src element by element on one device, with src broadcast by 0 strides and the
  // dtype converted; throws naming `op` for a conversion the device cannot do.
  virtual void copy_strided(const StridedRegion& dst, const StridedRegion& src, int index, const char* op) = 0;
  // Every element of the region set to `value` (converted to the region's dtype).
  virtual void fill(const StridedRegion& dst, double value, int index) = 0;
  // acc += g, elementwise, both contiguous of n elements of `dtype` (gradient accumulation).
  virtual void add_into(void* acc, const void* g, DType dtype, int64_t n, int index, const char* op) = 0;
  // The host synchronisations with device `index` so far (see the invariants).
  virtual std::uint64_t host_syncs(int /*index*/) const { return 0; }
  // Timing marks for the profiler's device times: record_mark records a timing event on the
  // device's compute stream now (0: not supported) and never waits; mark_elapsed_ns(a, b) is
  // the device time from a to b, waiting for b (call it when reporting, never per op: a
  // counted host sync); release_mark gives a mark back for reuse.
  virtual std::uint64_t record_mark(int /*index*/) { return 0; }
  virtual int64_t mark_elapsed_ns(std::uint64_t /*a*/, std::uint64_t /*b*/) { return -1; }
  virtual void release_mark(std::uint64_t /*m*/) {}
};

// The hooks of a device type (null: none installed). Installing replaces the previous ones;
// `h` must live as long as the process.
void set_device_hooks(DeviceType type, DeviceHooks* h);
DeviceHooks* device_hooks(DeviceType type);
// The hooks of `device`'s type, after checking that the device exists (`op` names the
// caller in the error): the one check every device entry point makes before any work.
DeviceHooks& require_device_hooks(Device device, const char* op);

}  // namespace athanor
