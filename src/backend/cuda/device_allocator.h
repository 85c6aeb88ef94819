#pragma once
// The caching device allocator: one BlockPool (block_pool.h) per device over cudaMalloc /
// cudaFree (never managed memory), on the device's compute stream unless told otherwise.
// Tags, peaks, the out-of-memory breakdown and empty_cache are the pool's; this file adds
// the device's own numbers (cudaMemGetInfo) to the error and to mem_report().
#include <cstddef>
#include <string>

#include "backend/cuda/block_pool.h"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

class DeviceAllocator {
 public:
  static DeviceAllocator& get(int device);  // check_device() first: errors before any work
  void* allocate(std::size_t nbytes, MemTag tag, cudaStream_t stream = nullptr);  // nullptr: the compute stream
  // Frees in stream order: the block is reused only by later work on the stream it was
  // allocated for, which runs after every kernel already queued there.
  void deallocate(void* ptr);
  // The block is also used on `stream`: its reuse after deallocate waits (by an event, queried
  // without blocking) until `stream` has run the work queued before the free. An upload's
  // block belongs to the copy stream and is read on the compute stream (device_hooks.cpp).
  void record_stream(void* ptr, cudaStream_t stream) { pool_.record_stream(ptr, reinterpret_cast<StreamId>(stream)); }
  // The stream the block starting at ptr was allocated for (nullptr: no such live block).
  cudaStream_t stream_of(const void* ptr) const { return reinterpret_cast<cudaStream_t>(pool_.stream_of(ptr, 0)); }
  void retag(void* ptr, MemTag to) { pool_.retag(ptr, to); }
  MemoryStats stats() const { return pool_.stats(); }
  void reset_peak() { pool_.reset_peak(); }
  std::size_t largest_cached_block() const { return pool_.largest_cached_block(); }
  std::size_t cached_bytes() const { return pool_.cached_bytes(); }
  void set_limit(std::size_t bytes) { pool_.set_limit(bytes); }
  // Waits for the device (a counted host sync), then gives every wholly free segment back to
  // cudaFree.
  void empty_cache();
  MemInfo mem_info() const { return cuda::mem_info(device_); }
  int device() const { return device_; }

 private:
  explicit DeviceAllocator(int device);
  int device_;
  BlockPool pool_;
};

}  // namespace athanor::cuda
