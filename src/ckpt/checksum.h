#pragma once
// File checksums for checkpoint manifests, from libraries:
//  - xxh3_128: xxHash's XXH3 with a 128-bit result (libxxhash). Manifests are written with
//    it: it hashes far faster than a disk writes or reads, so checksumming costs a save or
//    a load next to nothing (bench/RESULTS.md, "Checkpoint save and load against cp").
//  - sha256: OpenSSL's SHA-256 (it uses the CPU's SHA extensions where present). Manifests
//    written before xxh3_128 hold SHA-256 digests; they verify as they are.
// Digests are lowercase hex. An unreadable file is an Error naming it.
#include <cstddef>
#include <memory>
#include <string>

namespace athanor::ckpt {

enum class Checksum { xxh3_128, sha256 };
const char* checksum_name(Checksum c);  // "xxh3_128", "sha256": the manifest's key for the digest

// Streaming digest: update() any number of times, then hex() once.
class Hasher {
 public:
  explicit Hasher(Checksum c);
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void update(const void* data, std::size_t n);
  std::string hex();

 private:
  struct State;
  Checksum kind_;
  std::unique_ptr<State> s_;
};

std::string checksum_hex(Checksum c, const void* data, std::size_t n);
std::string checksum_file(Checksum c, const std::string& path);
inline std::string sha256_hex(const std::string& bytes) { return checksum_hex(Checksum::sha256, bytes.data(), bytes.size()); }

}  // namespace athanor::ckpt
