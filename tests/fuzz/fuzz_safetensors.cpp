// libFuzzer target for the safetensors reader: any byte string must either parse
// into tensors whose bytes are all readable, or raise athanor::Error — never
// crash, leak, hang or read out of bounds (built with ASan + UBSan).
#include <cstddef>
#include <cstdint>
#include <string>

#include "athanor/ckpt/safetensors.h"
#include "athanor/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const athanor::ckpt::SafetensorsFile f = athanor::ckpt::parse_safetensors(bytes, "fuzz-input");
    // Touch every byte of every tensor so an out-of-bounds view shows up under ASan.
    volatile uint8_t sink = 0;
    for (const auto& [name, t] : f.tensors) {
      const uint8_t* p = static_cast<const uint8_t*>(t.raw_data());
      for (size_t i = 0; i < t.nbytes(); ++i) sink = static_cast<uint8_t>(sink ^ p[i]);
      sink = static_cast<uint8_t>(sink ^ name.size());
    }
    for (const auto& [k, v] : f.metadata) sink = static_cast<uint8_t>(sink ^ k.size() ^ v.size());
  } catch (const athanor::Error&) {
    // Rejected with a message: the expected outcome for malformed input.
  }
  return 0;
}
