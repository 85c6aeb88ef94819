#include "athanor/core/device_hooks.h"

#include <array>

#include "athanor/core/error.h"

namespace athanor {

namespace {
// Constant-initialised, so a backend's static registrar may install before main().
std::array<std::atomic<DeviceHooks*>, 2> g_hooks{};
}  // namespace

void set_device_hooks(DeviceType type, DeviceHooks* h) {
  g_hooks[static_cast<std::size_t>(type)].store(h, std::memory_order_release);
}

DeviceHooks* device_hooks(DeviceType type) { return g_hooks[static_cast<std::size_t>(type)].load(std::memory_order_acquire); }

DeviceHooks& require_device_hooks(Device device, const char* op) {
  ATH_CHECK(device.index >= 0, op, "device index ", device.index, " is negative", Hint{"use cuda:0, cuda:1, …"});
  DeviceHooks* h = device_hooks(device.type);
  ATH_CHECK(h != nullptr, op, device.str(), " was asked for, but this build has no CUDA",
            Hint{"reconfigure with nvcc (CUDA toolkit in /usr/local/cuda or on PATH) and -DATHANOR_CUDA=ON, "
                 "or keep tensors on the CPU"});
  h->check_device(device.index, op);
  return *h;
}

}  // namespace athanor
