#pragma once
#include <string>

namespace athanor {

enum class DeviceType : uint8_t { cpu, cuda };

// Where a tensor's storage lives. Only CPU has kernels today; CUDA is reserved
// so that every API already carries a device.
struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {DeviceType::cuda, i}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool operator==(const Device&) const = default;
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

}  // namespace athanor
