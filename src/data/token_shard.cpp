// Token shards in llm.c's format (karpathy/llm.c, dev/data/data_common.py):
//   int32 header[256]: [0] = 20240520 (magic), [1] = version (1: u16 tokens,
//   2: u32 tokens), [2] = token count; then the tokens, little-endian.
// Written to a temporary file and renamed into place, so a reader never sees a
// half-written shard. Read by mmap (read-only); the header, the file length and
// every token (< vocab_size) are validated once at open.
#include "athanor/data/token_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "athanor/core/error.h"

namespace athanor::data {
namespace {

constexpr int32_t kMagic = 20240520;
constexpr size_t kHeaderInts = 256;
constexpr size_t kHeaderBytes = kHeaderInts * sizeof(int32_t);

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string err = std::strerror(errno);
      ::close(fd);
      ::unlink(path.c_str());
      ATH_FAIL("write_token_shard", "cannot write ", path, ": ", err, Hint{"check free disk space and permissions"});
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size) {
  const char* op = "write_token_shard";
  ATH_CHECK(vocab_size > 0 && vocab_size <= (int64_t(1) << 31), op, "vocab_size ", vocab_size, " for ", path, " is out of range",
            Hint{"pass the tokenizer's vocab_size()"});
  ATH_CHECK(tokens.size() < (size_t(1) << 31), op, tokens.size(), " tokens do not fit one shard (", path,
            "; the header's count is an int32)", Hint{"split the tokens over several shards"});
  for (size_t i = 0; i < tokens.size(); ++i)
    ATH_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size, op, "token ", tokens[i], " at position ", i, " is outside the vocabulary 0..",
              vocab_size - 1, " (writing ", path, ")", Hint{"tokenize with the tokenizer whose vocab_size you pass"});
  const int version = vocab_size <= 65536 ? 1 : 2;
  int32_t header[kHeaderInts] = {};
  header[0] = kMagic;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ATH_CHECK(fd >= 0, op, "cannot create ", tmp, ": ", std::strerror(errno), Hint{"check that the directory exists and is writable"});
  write_all(fd, header, kHeaderBytes, tmp);
  if (version == 1) {
    std::vector<uint16_t> buf(tokens.begin(), tokens.end());
    write_all(fd, buf.data(), buf.size() * sizeof(uint16_t), tmp);
  } else {
    write_all(fd, tokens.data(), tokens.size() * sizeof(int32_t), tmp);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    ATH_FAIL(op, "cannot flush ", tmp, ": ", err, Hint{"check free disk space"});
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    ATH_FAIL(op, "cannot rename ", tmp, " to ", path, ": ", err, Hint{"check that the directory is writable"});
  }
}

TokenShard::TokenShard(const std::string& path, int64_t vocab_size) : path_(path) {
  const char* op = "TokenShard";
  ATH_CHECK(vocab_size > 0, op, "vocab_size must be positive, got ", vocab_size, " (opening ", path, ")",
            Hint{"pass the tokenizer's vocab_size()"});
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ATH_CHECK(fd >= 0, op, "cannot open token shard ", path, ": ", std::strerror(errno),
            Hint{"create shards with `athanor prepare` (prepare_text) or write_token_shard"});
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    const std::string err = std::strerror(errno);
    ::close(fd);
    ATH_FAIL(op, "cannot stat ", path, ": ", err, Hint{"check the file"});
  }
  const size_t file_bytes = static_cast<size_t>(st.st_size);
  if (file_bytes < kHeaderBytes) {
    ::close(fd);
    ATH_FAIL(op, path, " is truncated: expected at least ", kHeaderBytes, " bytes (the header), the file has ", file_bytes,
             Hint{"the shard is damaged; write it again"});
  }
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  ATH_CHECK(map != MAP_FAILED, op, "cannot mmap ", path, ": ", std::strerror(map_errno), Hint{"check the file and free address space"});
  map_ = map;
  map_bytes_ = file_bytes;
  try {
    int32_t header[kHeaderInts];
    std::memcpy(header, map, kHeaderBytes);
    ATH_CHECK(header[0] == kMagic, op, path, " has bad magic ", header[0], ", expected ", kMagic,
              Hint{"this is not an llm.c token shard; create shards with `athanor prepare` (prepare_text)"});
    ATH_CHECK(header[1] == 1 || header[1] == 2, op, path, " has unsupported version ", header[1],
              " (expected 1 = u16 tokens or 2 = u32 tokens)", Hint{"write the shard again with write_token_shard"});
    ATH_CHECK(header[2] >= 0, op, path, " has a negative token count ", header[2], Hint{"the header is corrupt; write the shard again"});
    bytes_per_token_ = header[1] == 1 ? 2 : 4;
    count_ = header[2];
    const size_t expected = kHeaderBytes + static_cast<size_t>(count_) * bytes_per_token_;
    ATH_CHECK(file_bytes >= expected, op, path, " is truncated: its header declares ", count_, " tokens, so expected ", expected,
              " bytes, but the file has ", file_bytes, Hint{"the shard is damaged or still being written; write it again"});
    ATH_CHECK(file_bytes == expected, op, path, " has ", file_bytes - expected, " bytes past the ", count_,
              " tokens its header declares (expected ", expected, " bytes, the file has ", file_bytes, ")",
              Hint{"the shard is damaged; write it again"});
    tokens_ = static_cast<const uint8_t*>(map) + kHeaderBytes;
    // One pass over all tokens: a bad id found now beats an embedding lookup out of range later.
    for (int64_t i = 0; i < count_; ++i) {
      int64_t t;
      if (bytes_per_token_ == 2) {
        uint16_t v;
        std::memcpy(&v, tokens_ + i * 2, 2);
        t = v;
      } else {
        uint32_t v;
        std::memcpy(&v, tokens_ + i * 4, 4);
        t = v;
      }
      ATH_CHECK(t < vocab_size, op, path, ": token ", t, " at position ", i, " is >= vocab_size ", vocab_size,
                Hint{"the shard was written with a larger vocabulary; use the tokenizer (and model vocab_size) it was made with"});
    }
  } catch (...) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw;
  }
}

TokenShard::~TokenShard() {
  if (map_) ::munmap(map_, map_bytes_);
}

int32_t TokenShard::operator[](int64_t i) const {
  ATH_CHECK(i >= 0 && i < count_, "TokenShard", "token index ", i, " is out of range for ", path_, " (", count_, " tokens)",
            Hint{"valid indices are 0 .. size()-1"});
  if (bytes_per_token_ == 2) {
    uint16_t v;
    std::memcpy(&v, tokens_ + i * 2, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, tokens_ + i * 4, 4);
  return static_cast<int32_t>(v);
}

}  // namespace athanor::data
