// Checksums by library (checksum.h): XXH3-128 from libxxhash, SHA-256 from OpenSSL.
#include "ckpt/checksum.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "athanor/core/error.h"

namespace athanor::ckpt {

const char* checksum_name(Checksum c) { return c == Checksum::xxh3_128 ? "xxh3_128" : "sha256"; }

struct Hasher::State {
  XXH3_state_t* xxh = nullptr;
  EVP_MD_CTX* sha = nullptr;
};

Hasher::Hasher(Checksum c) : kind_(c), s_(std::make_unique<State>()) {
  if (c == Checksum::xxh3_128) {
    s_->xxh = XXH3_createState();
    ATH_CHECK(s_->xxh && XXH3_128bits_reset(s_->xxh) == XXH_OK, "checksum", "XXH3 could not be initialized");
  } else {
    s_->sha = EVP_MD_CTX_new();
    ATH_CHECK(s_->sha && EVP_DigestInit_ex(s_->sha, EVP_sha256(), nullptr) == 1, "checksum",
              "OpenSSL's SHA-256 could not be initialized");
  }
}

Hasher::~Hasher() {
  if (s_->xxh) XXH3_freeState(s_->xxh);
  if (s_->sha) EVP_MD_CTX_free(s_->sha);
}

void Hasher::update(const void* data, std::size_t n) {
  if (kind_ == Checksum::xxh3_128) XXH3_128bits_update(s_->xxh, data, n);
  else EVP_DigestUpdate(s_->sha, data, n);
}

std::string Hasher::hex() {
  unsigned char bytes[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (kind_ == Checksum::xxh3_128) {
    XXH128_canonical_t c;  // big-endian: high 64 bits first, as xxhsum --tag -H2 prints it
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(s_->xxh));
    std::memcpy(bytes, c.digest, sizeof c.digest);
    len = sizeof c.digest;
  } else {
    EVP_DigestFinal_ex(s_->sha, bytes, &len);
  }
  std::string out(2 * len, '0');
  for (unsigned i = 0; i < len; ++i) std::snprintf(&out[2 * i], 3, "%02x", bytes[i]);
  return out;
}

std::string checksum_hex(Checksum c, const void* data, std::size_t n) {
  Hasher h(c);
  h.update(data, n);
  return h.hex();
}

std::string checksum_file(Checksum c, const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ATH_CHECK(fd >= 0, "checksum", "cannot open '", path, "': ", std::strerror(errno),
            Hint{"check that the file exists and is readable"});
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  Hasher h(c);
  std::vector<char> buf(8 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      ATH_FAIL("checksum", "read error in '", path, "': ", std::strerror(err), Hint{"the disk may be failing"});
    }
    if (n == 0) break;
    h.update(buf.data(), static_cast<std::size_t>(n));
  }
  ::close(fd);
  return h.hex();
}

}  // namespace athanor::ckpt
