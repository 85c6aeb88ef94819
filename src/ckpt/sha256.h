#pragma once
// SHA-256 (FIPS 180-4), for checkpoint manifests. Incremental: update() any
// number of times, then hex_digest() once. Tested against the NIST vectors
// ("", "abc", the 448-bit message, one million 'a').
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace athanor::ckpt {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  void update(const std::string& s) { update(s.data(), s.size()); }
  std::array<uint8_t, 32> digest();  // finalizes; the object must not be updated afterwards
  std::string hex_digest();

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;  // bytes
};

std::string sha256_hex(const std::string& bytes);
// Streams the file; an Error names it when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace athanor::ckpt
