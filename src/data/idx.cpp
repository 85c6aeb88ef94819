// IDX reader over zlib's gz* interface. zlib reads non-gzip files
// transparently, so an uncompressed IDX file works too; a corrupt or truncated
// gzip stream is reported by gzerror after the last read.
#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "athanor/core/error.h"

namespace athanor::data {
namespace {
std::string hex_byte(uint8_t b) {
  static const char* digits = "0123456789abcdef";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}
}  // namespace

std::vector<uint8_t> read_gzip_file(const std::string& path, const std::string& op) {
  ATH_CHECK(std::filesystem::exists(path), op, "file not found: ", path, Hint{"check the path"});
  gzFile f = gzopen(path.c_str(), "rb");
  ATH_CHECK(f != nullptr, op, "cannot open ", path, ": ", std::strerror(errno), Hint{"check the file's permissions"});
  gzbuffer(f, 1 << 18);
  // A gzip file ends with the uncompressed size mod 2^32: a good first guess for the buffer.
  size_t guess = 1 << 20;
  {
    std::error_code ec;
    const auto file_size = std::filesystem::file_size(path, ec);
    std::FILE* raw = ec ? nullptr : std::fopen(path.c_str(), "rb");
    if (raw) {
      unsigned char tail[4];
      if (file_size >= 18 && std::fseek(raw, -4, SEEK_END) == 0 && std::fread(tail, 1, 4, raw) == 4) {
        const size_t isize = tail[0] | (size_t(tail[1]) << 8) | (size_t(tail[2]) << 16) | (size_t(tail[3]) << 24);
        if (isize < (size_t(1) << 32) && isize <= file_size * 1032 + 64) guess = std::max(guess, isize + 1);
      }
      std::fclose(raw);
    }
  }
  std::vector<uint8_t> out(guess);
  size_t used = 0;
  bool failed = false;
  std::string zmsg;
  for (;;) {
    if (out.size() - used < (1 << 16)) out.resize(out.size() * 2);
    const size_t want = std::min<size_t>(out.size() - used, size_t(1) << 30);
    const int n = gzread(f, out.data() + used, static_cast<unsigned>(want));
    if (n < 0) { failed = true; break; }
    if (n == 0) break;
    used += static_cast<size_t>(n);
  }
  out.resize(used);
  int errnum = Z_OK;
  const char* m = gzerror(f, &errnum);
  if (errnum != Z_OK && errnum != Z_STREAM_END) { failed = true; zmsg = m ? m : "unknown zlib error"; }
  gzclose(f);
  ATH_CHECK(!failed, op, path, " is not a valid gzip file or is truncated (zlib: ", zmsg.empty() ? "read error" : zmsg, ")",
            Hint{"the file is damaged; reinstall or re-download it"});
  return out;
}

IdxArray read_idx_u8(const std::string& path, int expected_ndim) {
  const char* op = "read_idx";
  std::vector<uint8_t> bytes = read_gzip_file(path, op);
  ATH_CHECK(bytes.size() >= 4, op, path, " is too short to be an IDX file (", bytes.size(), " bytes, the header alone needs ",
            4 + 4 * expected_ndim, ")", Hint{"the file is truncated or not an IDX file; reinstall or re-download it"});
  ATH_CHECK(bytes[0] == 0 && bytes[1] == 0, op, path, " has a bad IDX magic number (first bytes ", hex_byte(bytes[0]),
            " ", hex_byte(bytes[1]), ", expected 0x00 0x00)", Hint{"this is not an IDX file"});
  ATH_CHECK(bytes[2] == 0x08, op, path, " has IDX element type ", hex_byte(bytes[2]),
            ", expected 0x08 (unsigned byte)", Hint{"only u8 IDX files (MNIST-style) are supported"});
  const int ndim = bytes[3];
  ATH_CHECK(ndim == expected_ndim, op, path, " has ", ndim, " dimensions, expected ", expected_ndim,
            Hint{"images files have 3 dimensions (count, rows, cols), label files 1; check the file name"});
  const size_t header = 4 + 4 * static_cast<size_t>(ndim);
  ATH_CHECK(bytes.size() >= header, op, path, " is truncated: the header needs ", header, " bytes, the file has ",
            bytes.size(), Hint{"the file is damaged; reinstall or re-download it"});
  IdxArray a;
  uint64_t total = 1;
  for (int d = 0; d < ndim; ++d) {
    const uint8_t* p = bytes.data() + 4 + 4 * d;
    const uint32_t v = (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
    a.dims.push_back(static_cast<int64_t>(v));
    total *= v;
    ATH_CHECK(total < (uint64_t(1) << 40), op, path, " declares an implausible size (dimension ", d, " = ", v, ")",
              Hint{"the header is corrupt"});
  }
  const uint64_t have = bytes.size() - header;
  ATH_CHECK(have >= total, op, path, " is truncated: the header declares ", total, " data bytes, the file has ", have,
            Hint{"the file is damaged; reinstall or re-download it"});
  ATH_CHECK(have == total, op, path, " has ", have - total, " unexpected bytes after the ", total, " data bytes its header declares",
            Hint{"the file is damaged or not the file it is named after"});
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(header));
  a.data = std::move(bytes);
  return a;
}

}  // namespace athanor::data
