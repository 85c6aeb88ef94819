#include "athanor/core/storage.h"

#include "athanor/core/derived.h"
#include "athanor/core/device_hooks.h"
#include "athanor/core/error.h"

namespace athanor {

std::shared_ptr<Storage> Storage::allocate(std::size_t nbytes, MemTag tag, Device device) {
  std::shared_ptr<Storage> s(new Storage());
  // A device's memory comes from its caching allocator, reached through the hooks its
  // backend installed (core/device_hooks.h): the check that the device exists comes first.
  s->data_ = device.is_cpu() ? Allocator::cpu().allocate(nbytes, tag)
                             : require_device_hooks(device, "allocate").allocate(device.index, nbytes, tag);
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->tag_ = tag;
  return s;
}

std::shared_ptr<Storage> Storage::allocate_upload(std::size_t nbytes, MemTag tag, Device device) {
  if (device.is_cpu()) return allocate(nbytes, tag, device);
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = require_device_hooks(device, "allocate").allocate_upload(device.index, nbytes, tag);
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->tag_ = tag;
  return s;  // freed by the hooks' deallocate, as allocate's
}

std::shared_ptr<Storage> Storage::wrap(void* data, std::size_t nbytes, std::function<void(void*)> release, Device device) {
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = data;
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->owned_ = false;
  s->release_ = std::move(release);
  return s;
}

Storage::~Storage() {
  delete derived_.load(std::memory_order_acquire);
  if (owned_) {
    if (device_.is_cpu()) Allocator::cpu().deallocate(data_, nbytes_, tag_);
    else device_hooks(device_.type)->deallocate(device_.index, data_);  // owned: allocate() found the hooks
  }
  else if (release_) release_(data_);
}

DerivedCopies& Storage::derived() {
  if (DerivedCopies* d = derived_.load(std::memory_order_acquire)) return *d;
  auto* made = new DerivedCopies();
  DerivedCopies* expected = nullptr;
  if (derived_.compare_exchange_strong(expected, made, std::memory_order_acq_rel)) return *made;
  delete made;  // another thread made it first
  return *expected;
}

void Storage::set_tag(MemTag tag) {
  if (owned_) {
    if (device_.is_cpu()) Allocator::cpu().retag(nbytes_, tag_, tag);
    else device_hooks(device_.type)->retag(device_.index, data_, tag);
  }
  tag_ = tag;
}

}  // namespace athanor
