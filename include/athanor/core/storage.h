#pragma once
// A contiguous block of bytes that tensors view. Storage is shared by a tensor
// and all of its views (and detached aliases); so is its version counter,
// which every in-place write bumps and autograd checks.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "athanor/core/allocator.h"
#include "athanor/core/device.h"

namespace athanor {

class DerivedCopies;  // athanor/core/derived.h

class Storage {
 public:
  // Owned memory from the tagged allocator.
  static std::shared_ptr<Storage> allocate(std::size_t nbytes, MemTag tag, Device device = Device::cpu());
  // Owned device memory that an upload will fill (DeviceHooks::allocate_upload): on cuda it
  // belongs to the copy stream, so the copy into it waits for no compute. The cpu's is allocate's.
  static std::shared_ptr<Storage> allocate_upload(std::size_t nbytes, MemTag tag, Device device);
  // Memory owned elsewhere (a memory-mapped file, a caller's buffer); `release`
  // runs when the last tensor viewing it goes away. Not counted under any tag.
  static std::shared_ptr<Storage> wrap(void* data, std::size_t nbytes, std::function<void(void*)> release,
                                       Device device = Device::cpu());
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  MemTag tag() const { return tag_; }
  void set_tag(MemTag tag);  // re-account this block under another tag
  bool owned() const { return owned_; }

  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

  // Copies derived from this storage's values (athanor/core/derived.h): made on first use.
  DerivedCopies& derived();
  DerivedCopies* derived_if_any() const { return derived_.load(std::memory_order_acquire); }

 private:
  Storage() = default;
  void* data_ = nullptr;
  std::size_t nbytes_ = 0;
  Device device_;
  MemTag tag_ = MemTag::other;
  bool owned_ = true;
  std::function<void(void*)> release_;
  std::atomic<uint64_t> version_{0};
  std::atomic<DerivedCopies*> derived_{nullptr};  // owned
};

}  // namespace athanor
